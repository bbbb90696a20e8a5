"""commbench: measure what gradient synchronisation costs in data-parallel training."""

__version__ = "0.1.0"

# Bumped whenever a record field changes meaning or disappears; readers check it.
SCHEMA_VERSION = 1
