"""GET /sms: a team's messages, newest first, by any set of filters.

Each set of filters has its own statement, written once at import from the
fixed fragments below (as ``tidings.storage.leases`` writes its statements),
so that PostgreSQL plans each one for what it filters on, and a cached
generic plan never has to serve every combination:

* no filter, ``status``, ``sender`` and the date range walk an index of
  (team, [status | sender,] created_at DESC) and stop after the page;
* ``search`` matches the lowercased ``search`` column (recipient, sender,
  body, provider id) with LIKE, in two steps, because the planner cannot
  tell a common term from a rare one (it multiplies the frequencies of a
  term's pieces as if they were independent, and takes a term in a quarter
  of the rows for a rare one). First the newest WINDOW rows of the other
  filters, in index order: a common term fills its page there. If it does
  not, the term is rare (under 1% of the newest rows), and the rows holding
  all of its three-character pieces (``sms_grams``, a GIN index) are found
  and sorted, which reads no more than those. A term of one or two
  characters has no pieces: the walk in index order goes on to the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import product
from uuid import UUID

from tidings.storage.connection import Connection
from tidings.storage.contacts import like_pattern
from tidings.storage.sms import SMS_COLUMNS, Sms

# The shortest term the piece index serves.
GRAM = 3
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
    ("search", "search LIKE lower({p})"),
    ("grams", "sms_grams(search) @> sms_grams(lower({p}))"),
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
    newest WINDOW rows of the other filters; ``indexed``: by the piece index."""
    numbers = {name: number for number, name in enumerate(present, start=4)}
    if shape == "window":
        others = tuple(name for name in present if name not in ("search", "grams"))
        # Not materialized: the walk stops as soon as the page is full.
        return f"""
SELECT {SMS_COLUMNS} FROM (
    SELECT * FROM sms_messages
    WHERE {_conditions(others, numbers)}
    {ORDER}
    LIMIT {WINDOW}
) newest
WHERE search LIKE lower(${numbers["search"]})
{ORDER}
LIMIT $2 OFFSET $3
"""
    return f"""
SELECT {SMS_COLUMNS} FROM sms_messages
WHERE {_conditions(present, numbers)}
{SORTED if shape == "indexed" else ORDER}
LIMIT $2 OFFSET $3
"""


def _combinations() -> dict[tuple[tuple[str, ...], str], str]:
    names = [name for name, _ in _FILTERS]
    statements = {}
    for chosen in product((False, True), repeat=len(names)):
        present = tuple(name for name, on in zip(names, chosen, strict=True) if on)
        if "grams" in present and "search" not in present:
            continue
        shapes = ["plain"]
        if "search" in present:
            shapes.append("window")
        if "grams" in present:
            shapes.append("indexed")
        for shape in shapes:
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
        values.append(like_pattern(where.search))
        if len(where.search) >= GRAM and shape != "window":
            present.append("grams")
            values.append(where.search)
    return SELECT_BY_FILTERS[tuple(present), shape], values


async def list_sms(
    conn: Connection, team_id: UUID, where: SmsFilter, limit: int, offset: int
) -> list[Sms]:
    """The team's messages matching every filter given, newest first.

    A search first reads the newest rows in index order (a common term fills
    the page there); when they do not fill the page, the piece index finds
    the rest (a rare term), or, for a term shorter than a piece, the walk
    goes on through every message of the filters.
    """
    if where.search is not None and SEPARATOR in where.search:
        return []  # the fields are kept apart by it: no match may span two
    if where.search is not None and offset + limit <= WINDOW:
        statement, values = statement_for(where, "window")
        rows = await conn.fetch(statement, team_id, limit, offset, *values)
        if len(rows) == limit:
            return [Sms.from_row(row) for row in rows]
    shape = "indexed" if where.search is not None and len(where.search) >= GRAM else "plain"
    statement, values = statement_for(where, shape)
    rows = await conn.fetch(statement, team_id, limit, offset, *values)
    return [Sms.from_row(row) for row in rows]
