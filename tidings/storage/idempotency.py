"""Idempotency records: one per (credential, key), unique in PostgreSQL.

The unique primary key is what guarantees that two processes on one database
never both execute one key; the shard actors and the storage units' running
attempts only serialise the attempts within a process.

Two ways to hold a key. A route that waits outside its transaction (a
provider call) claims it first (``begin``: a ``processing`` record, committed
on its own) and completes the claim with its response. A storage unit, whose
whole work is one transaction, records its response once, at the end
(``record``), in that transaction: the unique key then decides between two
attempts, and the loser rolls back and answers from the winner's record
(``look_up``).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from tidings.ids import new_id
from tidings.storage.connection import Connection

# One round trip: claim the key (new, or its old record past retention), or
# read the live record that holds it. ``{quick}``: see ``begin``.
_BEGIN = """
WITH quick AS MATERIALIZED (
    SELECT {quick} AS value
), claimed AS (
    INSERT INTO idempotency_keys AS k
        (scope, key, fingerprint, claim, status, locked_until, expires_at)
    VALUES ($1, $2, $3, $6, 'processing',
            now() + make_interval(secs => $4), now() + make_interval(secs => $5))
    ON CONFLICT (scope, key) DO UPDATE
        SET fingerprint = EXCLUDED.fingerprint, claim = EXCLUDED.claim, status = 'processing',
            locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at,
            response_status = NULL, response_body = NULL, created_at = now()
        WHERE k.expires_at <= now()
    RETURNING 1
)
SELECT true AS claimed, NULL::bytea AS fingerprint, NULL::text AS status,
       NULL::boolean AS lock_expired, NULL::integer AS response_status,
       NULL::bytea AS response_body
FROM claimed, quick
UNION ALL
SELECT false, fingerprint, status, locked_until <= now(), response_status, response_body
FROM idempotency_keys
WHERE scope = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
"""
BEGIN = _BEGIN.format(quick="''")
BEGIN_ALONE = _BEGIN.format(quick="set_config('synchronous_commit', 'off', true)")

COMPLETE = """
UPDATE idempotency_keys
SET status = 'completed', response_status = $4, response_body = $5
WHERE scope = $1 AND key = $2 AND claim = $3 AND status = 'processing'
"""

# A storage unit's response, written once in its transaction. An expired
# record in the way is replaced; a live one (or a concurrent attempt's,
# waited for until it commits) returns no row.
RECORD = """
INSERT INTO idempotency_keys AS k
    (scope, key, fingerprint, claim, status, locked_until, expires_at,
     response_status, response_body)
VALUES ($1, $2, $3, $4, 'completed', now(), now() + make_interval(secs => $5), $6, $7)
ON CONFLICT (scope, key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint, claim = EXCLUDED.claim, status = 'completed',
        locked_until = EXCLUDED.locked_until, expires_at = EXCLUDED.expires_at,
        response_status = EXCLUDED.response_status, response_body = EXCLUDED.response_body,
        created_at = now()
    WHERE k.expires_at <= now()
RETURNING 1
"""

LOOK_UP = """
SELECT fingerprint, status, locked_until <= now() AS lock_expired, response_status, response_body
FROM idempotency_keys
WHERE scope = $1 AND key = $2 AND expires_at > now()
"""

RELEASE = """
DELETE FROM idempotency_keys
WHERE scope = $1 AND key = $2 AND claim = $3 AND status = 'processing'
"""

DROP_EXPIRED_LOCK = """
DELETE FROM idempotency_keys
WHERE scope = $1 AND key = $2 AND status = 'processing' AND locked_until <= now()
"""

# The prefixes of the secrets Tidings shows (tokens, webhook signing secrets):
# a response that holds one is never stored in plain text.
SECRET_MARKERS = (b"svc_team_", b"whsec_")


def holds_secret(body: bytes) -> bool:
    return any(marker in body for marker in SECRET_MARKERS)


@dataclass(frozen=True)
class Claimed:
    """The key is ours: execute the request, then complete or release the claim."""

    claim: UUID


@dataclass(frozen=True)
class Completed:
    """The key already holds a completed response."""

    fingerprint: bytes
    status: int
    body: bytes


@dataclass(frozen=True)
class Processing:
    """Another request with this key has not finished."""

    fingerprint: bytes
    lock_expired: bool


Attempt = Claimed | Completed | Processing


async def begin(
    conn: Connection,
    scope: UUID,
    key: str,
    fingerprint: bytes,
    *,
    lock_seconds: float,
    retention_seconds: float,
) -> Attempt:
    """Claim ``key`` for a new request, or report what already holds it."""
    claim = new_id()
    # A claim made on its own, outside a transaction (as every caller does),
    # commits without waiting for its WAL to reach the disk: it is visible to
    # a concurrent duplicate at once all the same, and nothing that depends on
    # it is answered before the request's own transaction commits, whose flush
    # takes the claim's WAL (written earlier) with it. A crash in between
    # loses both, and the key is free again. The setting is local: it ends
    # with the claim's own transaction.
    statement = BEGIN if conn.is_in_transaction() else BEGIN_ALONE
    while True:
        row = await conn.fetchrow(
            statement, scope, key, fingerprint, lock_seconds, retention_seconds, claim
        )
        if row is None:
            # A concurrent claim committed after this statement's snapshot:
            # ask again and see it.
            continue
        if row["claimed"]:
            return Claimed(claim)
        if row["status"] == "completed":
            return Completed(bytes(row["fingerprint"]), row["response_status"],
                             bytes(row["response_body"]))
        return Processing(bytes(row["fingerprint"]), row["lock_expired"])


async def record(
    conn: Connection, scope: UUID, key: str, fingerprint: bytes, status: int, body: bytes,
    *, retention_seconds: float,
) -> bool:
    """Store a storage unit's response in its transaction. False when a live
    record holds the key: the caller rolls back and answers from it."""
    row = await conn.fetchrow(
        RECORD, scope, key, fingerprint, new_id(), retention_seconds, status, body
    )
    return row is not None


async def look_up(conn: Connection, scope: UUID, key: str) -> Completed | Processing | None:
    """The live record that holds ``key``, if any."""
    row = await conn.fetchrow(LOOK_UP, scope, key)
    if row is None:
        return None
    if row["status"] == "completed":
        return Completed(bytes(row["fingerprint"]), row["response_status"],
                         bytes(row["response_body"]))
    return Processing(bytes(row["fingerprint"]), row["lock_expired"])


async def complete(
    conn: Connection, scope: UUID, key: str, claim: UUID, status: int, body: bytes
) -> bool:
    """Store the response. False if the claim was lost (its lock expired and
    it was dropped): the caller must roll back."""
    result: str = await conn.execute(COMPLETE, scope, key, claim, status, body)
    return result == "UPDATE 1"


async def release(conn: Connection, scope: UUID, key: str, claim: UUID) -> None:
    """Forget a claim whose request failed, so a retry runs again."""
    await conn.execute(RELEASE, scope, key, claim)


async def drop_expired_lock(conn: Connection, scope: UUID, key: str) -> None:
    await conn.execute(DROP_EXPIRED_LOCK, scope, key)
