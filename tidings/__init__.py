"""Tidings: transactional email and SMS, audiences, broadcasts and signed webhooks."""

import os

__version__ = "0.1.0"

# prometheus_client picks where metric values live when it is first imported:
# with PROMETHEUS_MULTIPROC_DIR set, in files there. Only the workers of
# ``tidings serve --workers N`` share such files, in a directory their parent
# makes for them (tidings.workers, tidings.metrics); a value left in the
# environment for another program would make a single process write its
# counters into that program's files, or fail to start when the directory is
# gone.
if "TIDINGS_WORKER_PARENT" not in os.environ:
    for _name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        os.environ.pop(_name, None)
