"""Leases on rows of due work: the one way Tidings hands out durable work.

A table of due work has ``lease_owner uuid`` and ``leased_until
timestamptz`` columns, a key, an owner column (the key of the actor that
does the rows: an endpoint for webhook deliveries, a broadcast for its
recipients) and an expression saying when a row is due. :func:`lease_sql`
writes, once per table at import time, the statements of the pattern:

* ``claim``: rows of one owner that are due and not leased, locked with
  ``FOR UPDATE SKIP LOCKED`` so concurrent claimers never wait for or take
  each other's rows, are given a lease (owner and expiry) and returned;
* ``record``: the table's own update of a row after its work, applied only
  if the caller still holds the lease, and clearing it;
* ``release``: hand rows back unworked (shutdown);
* ``renew``: extend the leases a long piece of work still holds, never
  waiting for a row that another statement holds locked;
* ``due_owners`` and ``next_due``: what a dispatcher polls for, and when an
  actor should look again.

``due_owners`` reads one index entry per owner when the table has an index
led by the owner column over its pending rows (``owners_index``: that
index's predicate, naming columns without a table). It skips from owner to
owner through the index (a recursive CTE, a "loose index scan") and asks
each whether a row of its own is due, so a poll costs the same with ten
rows due or a million. Without one it reads every due row.

A claim walks the due index in its order and stops at its limit
(:func:`claim_rows`): with bitmap scans the planner, whose statistics lag
behind a burst (a broadcast queues 100,000 emails in seconds, and
autovacuum analyzes a table at most once a minute), read every due row of
the owner and sorted them, on every claim, so that draining a queue cost
its square.

A lease left by a process that died expires; the next claim takes the row.
A process whose lease was taken over cannot record: the owner changed.

Parameters: the table's own fragments (``due``, ``pending``, ``now``) may
use ``$1..$n`` (``extra`` of them); every statement that contains them
passes those first, and its own parameters follow, numbered after them.
``now`` is PostgreSQL's clock unless a table says otherwise (the runtime's
tests put the leases on trio's virtual clock that way).

Table, column and fragment text are written in code, never taken from input;
the names are checked to be plain identifiers all the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from tidings.storage.connection import Connection
from tidings.storage.rows import Row

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class LeaseSql:
    """The statements of the lease pattern for one table.

    With ``k`` extra parameters of the table:

    * ``claim``: extras, then owner key, lease owner, lease seconds, limit;
    * ``due_owners``: extras, then limit; returns column ``owner``;
    * ``next_due``: extras, then owner key; one value, a timestamptz or NULL;
    * ``seconds_to_next_due``: the same, as seconds from ``now`` (float or NULL);
    * ``record``: key, lease owner, then the table's record parameters;
    * ``release``: keys (array), lease owner;
    * ``renew``: extras, then keys (array), lease owner, lease seconds;
      returns the keys still held.
    """

    claim: str
    due_owners: str
    next_due: str
    seconds_to_next_due: str
    record: str
    release: str
    renew: str


def _name(value: str) -> str:
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"{value!r} is not a plain SQL identifier")
    return value


def lease_sql(
    table: str,
    *,
    owner: str,
    due: str,
    pending: str,
    key: str = "id",
    extra: int = 0,
    now: str = "now()",
    order: str | None = None,
    claimed: str = "SELECT * FROM claimed",
    record_set: str = "",
    record_where: str = "",
    recorded: str = "SELECT count(*) AS recorded FROM recorded",
    owners_index: str | None = None,
    ahead: str | None = None,
) -> LeaseSql:
    """The lease statements of ``table``.

    ``due`` and ``pending`` are expressions over the table's row, named
    ``t``: when a row is due, and whether it still has work (a row leaves
    the pattern when its work is done). ``claimed`` reads the CTE
    ``claimed`` (the leased rows) and may join what the work needs.
    ``record_set`` are the table's assignments after a piece of work and
    ``record_where`` an extra condition (``AND ...``), over parameters from
    ``$3``; ``recorded`` reads the CTE ``recorded`` and may add CTEs before
    its SELECT by starting with ``, name AS (...)``. ``ahead`` is a
    condition over the row: the due rows that hold it are claimed before
    the others, whenever they fell due (an index over the due rows that
    hold it keeps that walk short).
    """
    table, owner, key = _name(table), _name(owner), _name(key)
    first = extra + 1  # the first parameter of a statement's own

    def p(offset: int) -> str:
        return f"${first + offset}"

    free = f"(t.leased_until IS NULL OR t.leased_until < {now})"
    order_by = order or due
    where = f"t.{owner} = {p(0)} AND {pending} AND {due} <= {now} AND {free}"
    taken = f"ORDER BY {order_by} LIMIT {{limit}} FOR UPDATE OF t SKIP LOCKED"
    if ahead is None:
        due_rows = f"""due AS (
    SELECT t.{key} FROM {table} t WHERE {where} {taken.format(limit=p(3))}
)"""
    else:
        due_rows = f"""ahead AS (
    SELECT t.{key} FROM {table} t WHERE {where} AND {ahead} {taken.format(limit=p(3))}
), behind AS (
    SELECT t.{key} FROM {table} t WHERE {where} AND NOT ({ahead})
    {taken.format(limit=f"{p(3)} - (SELECT count(*) FROM ahead)")}
), due AS (SELECT {key} FROM ahead UNION ALL SELECT {key} FROM behind)"""
    claim = f"""
WITH {due_rows}, claimed AS (
    UPDATE {table} t
    SET lease_owner = {p(1)}, leased_until = {now} + {p(2)} * interval '1 second'
    FROM due WHERE t.{key} = due.{key}
    RETURNING t.*
)
{claimed}
"""
    due_owners = f"""
SELECT DISTINCT t.{owner} AS owner FROM {table} t
WHERE {pending} AND {due} <= {now} AND {free}
LIMIT {p(0)}
"""
    if owners_index is not None:
        due_owners = f"""
WITH RECURSIVE owners AS (
    (SELECT s.{owner} AS owner FROM {table} s WHERE {owners_index} ORDER BY s.{owner} LIMIT 1)
    UNION ALL
    SELECT (SELECT s.{owner} FROM {table} s
            WHERE {owners_index} AND s.{owner} > walk.owner ORDER BY s.{owner} LIMIT 1)
    FROM owners walk WHERE walk.owner IS NOT NULL
)
SELECT walk.owner FROM owners walk
WHERE walk.owner IS NOT NULL AND EXISTS (
    SELECT 1 FROM {table} t
    WHERE t.{owner} = walk.owner AND {pending} AND {due} <= {now} AND {free}
)
LIMIT {p(0)}
"""
    next_due = f"""
SELECT min({due}) FROM {table} t
WHERE t.{owner} = {p(0)} AND {pending} AND {free}
"""
    seconds_to_next_due = f"""
SELECT extract(epoch FROM min({due}) - {now})::float8 FROM {table} t
WHERE t.{owner} = {p(0)} AND {pending} AND {free}
"""
    assignments = f"{record_set}, " if record_set else ""
    record = f"""
WITH recorded AS (
    UPDATE {table} t SET {assignments}lease_owner = NULL, leased_until = NULL
    WHERE t.{key} = $1 AND t.lease_owner = $2 {record_where}
    RETURNING t.*
){recorded}
"""
    release = f"""
UPDATE {table} SET lease_owner = NULL, leased_until = NULL
WHERE {key} = ANY($1) AND lease_owner = $2
"""
    # Never waits for a row another statement holds: that one is recording
    # or changing the row now (waiting could deadlock with it, both locking
    # rows of one batch in different orders), and such a row still held
    # counts as kept as of this statement's snapshot.
    renew = f"""
WITH held AS (
    SELECT {key} FROM {table}
    WHERE {key} = ANY({p(0)}) AND lease_owner = {p(1)}
), renewable AS (
    SELECT {key} FROM {table}
    WHERE {key} IN (SELECT {key} FROM held) AND lease_owner = {p(1)}
    FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE {table} t SET leased_until = {now} + {p(2)} * interval '1 second'
    FROM renewable r WHERE t.{key} = r.{key}
)
SELECT {key} AS key FROM held
"""
    return LeaseSql(claim, due_owners, next_due, seconds_to_next_due, record, release, renew)


def owners_of(rows: Sequence[Row]) -> list[UUID]:
    """The ``owner`` column of ``due_owners`` rows, as UUIDs."""
    found: list[UUID] = []
    for row in rows:
        value = row["owner"]
        if not isinstance(value, UUID):
            raise TypeError(f"a due owner must be a uuid, not {type(value).__name__}")
        found.append(value)
    return found


def keys_of(rows: Sequence[Row]) -> list[UUID]:
    """The ``key`` column of ``renew`` rows, as UUIDs."""
    found: list[UUID] = []
    for row in rows:
        value = row["key"]
        if not isinstance(value, UUID):
            raise TypeError(f"a leased key must be a uuid, not {type(value).__name__}")
        found.append(value)
    return found


# For the claim alone (see the module's docstring): neither a bitmap nor a
# sequential scan (which reads the whole table where the statistics say it
# is empty) when an index gives the rows in their order.
_ORDERED = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off"
_DEFAULTS = "SET LOCAL enable_bitmapscan = DEFAULT; SET LOCAL enable_seqscan = DEFAULT"


async def claim_rows(conn: Connection, claim: str, *args: object) -> list[Row]:
    """Run a statement that takes the first due rows of a queue (a ``claim``
    of :func:`lease_sql`, or the like) walking its index in order: in a
    transaction of its own, or in the caller's, which gets its settings back."""
    if not conn.is_in_transaction():
        async with conn.transaction():
            await conn.execute(_ORDERED)
            return list(await conn.fetch(claim, *args))
    await conn.execute(_ORDERED)
    rows = list(await conn.fetch(claim, *args))
    await conn.execute(_DEFAULTS)
    return rows
