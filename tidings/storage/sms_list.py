"""GET /sms: a team's messages, newest first, by any set of filters.

Each set of filters has its own statement, written once at import from the
fixed fragments below (as ``tidings.storage.leases`` writes its statements),
so that PostgreSQL plans each one for what it filters on, and a cached
generic plan never has to serve every combination:

* no filter, ``status``, ``sender`` and the date range walk an index of
  (team, [status | sender,] created_at DESC) and stop after the page;
* ``search`` matches the folded ``search`` column (recipient, sender,
  body, provider id) with strpos, in two steps, because the planner cannot
  tell a common term from a rare one. First the newest WINDOW rows of the
  other filters, in index order: a common term fills its page there. If it
  does not, the term is rare (under 1% of the newest rows), and the rows the
  piece index (``sms_pieces``, migration 0014) names are found and sorted,
  which reads no more than those. The index answers a term of any length:
  one of up to four characters as a prefix of the pieces, a longer one by
  all of its four-character pieces; a term that never occurred costs one
  look-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import product
from uuid import UUID

from tidings.storage.connection import Connection
from tidings.storage.sms import SMS_COLUMNS, Sms

# What keeps the fields apart in the search column (see the migration).
SEPARATOR = "\x1f"

# How many of the newest messages (after the other filters) a search reads
# first, in index order, before it asks the piece index.
WINDOW = 5000

# name -> condition over the filter's parameter, written as {p}.
_FILTERS: tuple[tuple[str, str], ...] = (
    ("status", "status = {p}"),
    ("sender", "from_sender = {p}"),
    ("start", "created_at >= {p}"),
    ("end", "created_at <= {p}"),
    # strpos, not LIKE: a plain substring search (the column's collation is
    # deterministic), several times faster than LIKE's pattern matching.
    ("search", "strpos(search, sms_fold({p})) > 0"),
    ("pieces", "sms_pieces(search) @@ sms_pieces_query({p})"),
)
ORDER = "ORDER BY created_at DESC, id DESC"
# The same order, in a form no index provides: the planner must find the rows
# first (by the piece index) and sort them.
SORTED = "ORDER BY created_at + interval '0 seconds' DESC, id DESC"


def _conditions(present: tuple[str, ...], numbers: dict[str, int]) -> str:
    conditions = ["team_id = $1"]
    for name in present:
        conditions.append(dict(_FILTERS)[name].format(p=f"${numbers[name]}"))
    return "\n  AND ".join(conditions)


def _statement(present: tuple[str, ...], shape: str) -> str:
    """``plain``: one walk in index order; ``window``: the search within the
    newest WINDOW rows of the other filters; ``indexed``: by the piece index.

    A search finds the page's rows over narrow ones first (the id, the time
    and the search column: carrying every column of thousands of rows it
    rejects costs more than the search), then reads those rows whole by
    their place in the table (``ctid``: one statement, one snapshot, so the
    place still holds the version it found).
    """
    numbers = {name: number for number, name in enumerate(present, start=4)}
    if shape == "plain":
        return f"""
SELECT {SMS_COLUMNS} FROM sms_messages
WHERE {_conditions(present, numbers)}
{ORDER}
LIMIT $2 OFFSET $3
"""
    if shape == "window":
        others = tuple(name for name in present if name not in ("search", "pieces"))
        # Not materialized: the walk stops as soon as the page is full.
        page = f"""
    SELECT ctid FROM (
        SELECT ctid, id, created_at, search FROM sms_messages
        WHERE {_conditions(others, numbers)}
        {ORDER}
        LIMIT {WINDOW}
    ) newest
    WHERE strpos(search, sms_fold(${numbers["search"]})) > 0
    {ORDER}
    LIMIT $2 OFFSET $3"""
    else:
        page = f"""
    SELECT ctid FROM sms_messages
    WHERE {_conditions(present, numbers)}
    {SORTED}
    LIMIT $2 OFFSET $3"""
    return f"""
SELECT {SMS_COLUMNS} FROM sms_messages
WHERE ctid = ANY (ARRAY ({page}
))
{ORDER}
"""


def _combinations() -> dict[tuple[tuple[str, ...], str], str]:
    """Without ``search``: ``plain``; with it: ``window``, and ``indexed``
    (``search`` and ``pieces`` both present)."""
    names = [name for name, _ in _FILTERS]
    statements = {}
    for chosen in product((False, True), repeat=len(names)):
        present = tuple(name for name, on in zip(names, chosen, strict=True) if on)
        if "search" not in present:
            shape = "plain" if "pieces" not in present else ""
        else:
            shape = "indexed" if "pieces" in present else "window"
        if shape:
            statements[present, shape] = _statement(present, shape)
    return statements


SELECT_BY_FILTERS = _combinations()


@dataclass(frozen=True)
class SmsFilter:
    """Every filter is optional; ``search`` is matched case-insensitively anywhere."""

    status: str | None = None
    sender: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    search: str | None = None


def statement_for(where: SmsFilter, shape: str = "plain") -> tuple[str, list[object]]:
    """The statement of this shape for these filters and its filter parameters (from $4)."""
    present: list[str] = []
    values: list[object] = []
    for name, value in (
        ("status", where.status), ("sender", where.sender),
        ("start", where.start), ("end", where.end),
    ):
        if value is not None:
            present.append(name)
            values.append(value)
    if where.search is not None:
        present.append("search")
        # Lowercased by PostgreSQL, as the column is: the same rules on both sides.
        values.append(where.search)
        if shape == "indexed":
            present.append("pieces")
            values.append(where.search)
    return SELECT_BY_FILTERS[tuple(present), shape], values


async def list_sms(
    conn: Connection, team_id: UUID, where: SmsFilter, limit: int, offset: int
) -> list[Sms]:
    """The team's messages matching every filter given, newest first.

    A search first reads the newest rows in index order (a common term fills
    the page there); when they do not fill the page, the piece index finds
    the rest (a rare term).
    """
    if where.search is not None and SEPARATOR in where.search:
        return []  # the fields are kept apart by it: no match may span two
    if where.search is not None and offset + limit <= WINDOW:
        statement, values = statement_for(where, "window")
        rows = await conn.fetch(statement, team_id, limit, offset, *values)
        if len(rows) == limit:
            return [Sms.from_row(row) for row in rows]
    shape = "indexed" if where.search is not None else "plain"
    statement, values = statement_for(where, shape)
    rows = await conn.fetch(statement, team_id, limit, offset, *values)
    return [Sms.from_row(row) for row in rows]
