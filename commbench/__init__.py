"""commbench: measure what gradient synchronisation costs in data-parallel training."""

__version__ = "0.1.0"

# Bumped whenever a record field changes meaning or disappears, or fields are added;
# readers check it (``analysis.load.READABLE_SCHEMAS``).
#   1: the first records.
#   2: wait vs transfer inside the step: sync_transfer_s, sync_wait_s, sync_wait_max_s,
#      collectives, imbalance_s, straggler_rank (ranks.sync_wait_s, ranks.collectives);
#      only added.
#   3: the real workload is called "real" (it runs any model), no longer "resnet";
#      async's per-step fields are listed per rank under ranks; config.step_timeout in
#      every tool's records.
#   4: time dilation and the host's load: ``dilation`` in every record (every duration is
#      emulated time, wall / dilation), ``host`` and ``bound`` (link-bound or host-bound)
#      in summaries and microbenchmark rows; only added.
SCHEMA_VERSION = 5
