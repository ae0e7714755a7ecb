"""The index upkeep: a singleton that merges the GIN indexes' pending lists
every half second (``tidings/storage/upkeep.py``), so that no accepting
statement pays for the merge.

Each process runs one; their merges take turns in PostgreSQL. A role that
does not own the indexes may not merge them: the upkeep then says so once
and stops, and inserts merge the lists as PostgreSQL does by default.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from asyncpg import InsufficientPrivilegeError

from tidings.storage import upkeep as store
from tidings.storage.db import Database

log = logging.getLogger("tidings.upkeep")

# Every half second took the p99 of POST /sms from 42 to 31 ms; every
# second moved it less clearly (medians 32 against 37 ms) in as many runs
# (``docs/benchmarks.md``).
PENDING_LIST_SECONDS = 0.5


async def keep_indexes(
    db: Database, every: float = PENDING_LIST_SECONDS,
    cleaned: Callable[[int], None] | None = None,
) -> None:
    """Merge the pending lists, then again every ``every`` seconds;
    ``cleaned`` is told each time how many pages they held."""
    while True:
        try:
            pages = await db.run(store.clean_pending_lists)
        except InsufficientPrivilegeError as refused:
            log.warning("the GIN pending lists are left to inserts to merge: %s", refused)
            return
        if cleaned is not None:
            cleaned(pages)
        await trio.sleep(every)
