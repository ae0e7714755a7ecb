"""Tidings: transactional email and SMS, audiences, broadcasts and signed webhooks."""

import os

__version__ = "0.1.0"

# Set in the workers of ``tidings serve --workers N``: their parent's pid
# (tidings.workers).
PARENT_ENV = "TIDINGS_WORKER_PARENT"
# prometheus_client reads it when it is imported: values in files there.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# prometheus_client picks where metric values live when it is first imported.
# Only the workers of a set share such files, in a directory their parent
# makes for them (tidings.workers, tidings.metrics); a value left in the
# environment for another program would make a single process write its
# counters into that program's files, or fail to start when the directory is
# gone.
if PARENT_ENV not in os.environ:
    for _name in (MULTIPROC_ENV, MULTIPROC_ENV.lower()):
        os.environ.pop(_name, None)
