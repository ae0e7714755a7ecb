"""Idempotency records: one per (credential, key), unique in PostgreSQL.

The unique primary key is what guarantees that two processes on one database
never both execute one key; the shard actors only serialise the attempts
within a process.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID, uuid4

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
    claim = uuid4()
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
