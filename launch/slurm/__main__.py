import sys

from launch.slurm import main

sys.exit(main())
