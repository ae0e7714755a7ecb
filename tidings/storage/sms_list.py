"""GET /sms: a team's messages, newest first, by any set of filters.

Each set of filters has its own statement, written once at import from the
fixed fragments below (as ``tidings.storage.leases`` writes its statements),
so that PostgreSQL plans each one for what it filters on, and a cached
generic plan never has to serve every combination:

* no filter, ``status``, ``sender`` and the date range walk an index of
  (team, [status | sender,] created_at DESC) and stop after the page;
* ``search`` matches the lowercased ``search`` column (recipient, sender,
  body, provider id) with LIKE. A term of three characters or more also
  asks for rows holding all of its three-character pieces
  (``sms_grams``, a GIN index), which finds rare text without reading the
  team's every message; the planner takes the GIN index or the ordered walk
  by how common the pieces are.
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

# name -> condition over the filter's parameter, written as {p}.
_FILTERS: tuple[tuple[str, str], ...] = (
    ("status", "status = {p}"),
    ("sender", "from_sender = {p}"),
    ("start", "created_at >= {p}"),
    ("end", "created_at <= {p}"),
    ("search", "search LIKE lower({p})"),
    ("grams", "sms_grams(search) @> sms_grams(lower({p}))"),
)


def _statement(present: tuple[str, ...]) -> str:
    conditions = ["team_id = $1"]
    for number, name in enumerate(present, start=4):
        condition = dict(_FILTERS)[name]
        conditions.append(condition.format(p=f"${number}"))
    where = "\n  AND ".join(conditions)
    return f"""
SELECT {SMS_COLUMNS} FROM sms_messages
WHERE {where}
ORDER BY created_at DESC, id DESC
LIMIT $2 OFFSET $3
"""


def _combinations() -> dict[tuple[str, ...], str]:
    names = [name for name, _ in _FILTERS]
    statements = {}
    for chosen in product((False, True), repeat=len(names)):
        present = tuple(name for name, on in zip(names, chosen, strict=True) if on)
        if "grams" in present and "search" not in present:
            continue
        statements[present] = _statement(present)
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


def statement_for(where: SmsFilter) -> tuple[str, list[object]]:
    """The statement for these filters and its filter parameters (from $4)."""
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
        if len(where.search) >= GRAM:
            present.append("grams")
            values.append(where.search)
    return SELECT_BY_FILTERS[tuple(present)], values


async def list_sms(
    conn: Connection, team_id: UUID, where: SmsFilter, limit: int, offset: int
) -> list[Sms]:
    """The team's messages matching every filter given, newest first."""
    if where.search is not None and SEPARATOR in where.search:
        return []  # the fields are kept apart by it: no match may span two
    statement, values = statement_for(where)
    rows = await conn.fetch(statement, team_id, limit, offset, *values)
    return [Sms.from_row(row) for row in rows]
