"""Upkeep of the GIN indexes' pending lists, between writes.

A GIN index takes a new row's entries into a pending list, cheaply, and
merges the list into the index when it grows past ``gin_pending_list_limit``
(4 MB): the insert that finds it full does the merge, tens of milliseconds
for a text message's search pieces, and every send of its team waits in
line behind that statement. Merging it from a task of its own, every half
second (``tidings.actors.upkeep``), keeps inserts from ever finding it full
(``docs/benchmarks.md``, "The pending lists merged by an upkeep").
"""

from __future__ import annotations

from tidings.storage.connection import Connection

# The GIN indexes that take every accepted message: the search pieces of text
# messages, the recipients of emails.
PENDING_LISTS = ("sms_search", "emails_to")

# Merging takes the index's own lock: an insert never waits for it (one that
# finds the list full while it is held leaves the merge to its holder), and
# two merges, from two processes, take turns.
CLEAN = """
SELECT coalesce(sum(gin_clean_pending_list(to_regclass(name))), 0)::bigint
FROM unnest($1::text[]) AS name WHERE to_regclass(name) IS NOT NULL
"""


async def clean_pending_lists(conn: Connection) -> int:
    """Merge the pending lists into their indexes; how many pages they held."""
    cleaned: int = await conn.fetchval(CLEAN, list(PENDING_LISTS))
    return cleaned
