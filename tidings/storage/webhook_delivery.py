"""What the webhook delivery actors do in PostgreSQL: claim, record, release.

Deliveries are leased rows (``leases.py``): an endpoint's actor claims its
due deliveries of an enabled endpoint with a lease, and an attempt's result
is recorded only while that lease is still this process's, together with
the delivery's next state and, when the delivery succeeds or is exhausted,
the endpoint's failure count and status. Every function here takes a raw
connection and runs whole inside ``Database.run``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.leases import lease_sql, owners_of
from tidings.storage.rows import Queries, Row, build

# A delivery is due at its next attempt time; a first attempt waits the
# schedule's first delay ($1) after that, because events record deliveries at
# commit time without knowing the schedule.
LEASES = lease_sql(
    "webhook_deliveries",
    owner="endpoint_id",
    extra=1,
    due="""(t.next_attempt_at + CASE WHEN t.attempt_count = 0
                                     THEN $1 * interval '1 second'
                                     ELSE interval '0' END)""",
    pending="""t.status IN ('pending', 'retrying') AND EXISTS (
        SELECT 1 FROM webhook_endpoints endpoint
        WHERE endpoint.id = t.endpoint_id AND endpoint.status = 'enabled')""",
    order="t.next_attempt_at",
    claimed="""
SELECT claimed.id, claimed.endpoint_id, claimed.attempt_count, claimed.retry_base,
       claimed.event_type, e.id AS event_id, e.type, e.channel, e.message_id, e.recipient,
       e.occurred_at, e.data::text AS data
FROM claimed JOIN events e ON e.id = claimed.event_id
""",
    # $3 the attempt count claimed, $4 the next status, $5 seconds to the retry,
    # $6-$8 what the endpoint answered, $9-$10 when and how long,
    # $11 exhausted deliveries in a row that disable the endpoint.
    record_set="""
        attempt_count = t.attempt_count + 1,
        status = $4,
        next_attempt_at = CASE WHEN $4 = 'retrying' THEN now() + $5 * interval '1 second' END,
        response_status = $6,
        response_body = $7,
        error = $8,
        updated_at = now()""",
    record_where="AND t.attempt_count = $3",
    recorded="""
, attempt AS (
    INSERT INTO webhook_attempts
        (delivery_id, number, started_at, duration_ms, response_status, response_body, error)
    SELECT id, attempt_count, $9, $10, $6, $7, $8 FROM recorded
), endpoint AS (
    UPDATE webhook_endpoints endpoint SET
        consecutive_failures = CASE WHEN $4 = 'succeeded' THEN 0
                                    ELSE endpoint.consecutive_failures + 1 END,
        last_failure_at = CASE WHEN $4 = 'failed' THEN now()
                               ELSE endpoint.last_failure_at END,
        status = CASE WHEN $4 = 'failed' AND endpoint.status = 'enabled'
                           AND endpoint.consecutive_failures + 1 >= $11
                      THEN 'disabled' ELSE endpoint.status END,
        disabled_reason = CASE WHEN $4 = 'failed' AND endpoint.status = 'enabled'
                                    AND endpoint.consecutive_failures + 1 >= $11
                               THEN 'failure_threshold' ELSE endpoint.disabled_reason END,
        disabled_at = CASE WHEN $4 = 'failed' AND endpoint.status = 'enabled'
                                AND endpoint.consecutive_failures + 1 >= $11
                           THEN now() ELSE endpoint.disabled_at END,
        updated_at = now()
    FROM recorded
    WHERE endpoint.id = recorded.endpoint_id
      AND ($4 = 'failed' OR ($4 = 'succeeded' AND endpoint.consecutive_failures <> 0))
    RETURNING endpoint.status
)
SELECT (SELECT count(*) FROM recorded) AS recorded, (SELECT status FROM endpoint) AS endpoint
""",
)

SELECT_TARGET = """
SELECT url, status, secret,
       CASE WHEN previous_secret_until > now() THEN previous_secret END AS previous_secret
FROM webhook_endpoints WHERE id = $1
"""


@dataclass(frozen=True)
class Target:
    """Where and how an endpoint's claimed deliveries are sent."""

    url: str
    # The secrets that sign, newest first.
    secrets: tuple[str, ...]


@dataclass(frozen=True)
class Claimed:
    """A delivery this process now owns the next attempt of."""

    id: UUID
    endpoint_id: UUID
    attempt_count: int
    # Attempts made before the last manual retry.
    retry_base: int
    event_type: str
    body: bytes


@dataclass(frozen=True)
class Claim:
    target: Target | None
    deliveries: list[Claimed]
    # Seconds until the earliest delivery of the endpoint that is not due yet.
    next_due_in: float | None


@dataclass(frozen=True)
class Outcome:
    """What one attempt found, and what follows from it."""

    started_at: datetime
    duration_ms: int
    response_status: int | None
    response_body: str | None
    error: str | None
    # The delivery's next state: succeeded, retrying (with a delay) or failed.
    status: str
    retry_in_seconds: float | None = None


def event_body(row: Row) -> bytes:
    """The request body receivers get (CONTRACT §4); the same on every attempt."""
    occurred = row["occurred_at"]
    assert isinstance(occurred, datetime)
    message_id = row["message_id"]
    document = {
        "id": str(row["event_id"]),
        "event": row["type"],
        "message_id": None if message_id is None else str(message_id),
        "channel": row["channel"],
        "to": row["recipient"],
        "occurred_at": occurred.isoformat().replace("+00:00", "Z"),
        "data": json.loads(str(row["data"])),
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def _target(row: Row) -> Target:
    secrets = [str(row["secret"])]
    if row["previous_secret"] is not None:
        secrets.append(str(row["previous_secret"]))
    return Target(str(row["url"]), tuple(secrets))


async def claim_due(
    conn: Queries,
    endpoint_id: UUID,
    owner: UUID,
    limit: int,
    lease_seconds: float,
    first_delay: float,
) -> Claim:
    """Lease up to ``limit`` due deliveries of an enabled endpoint."""
    target_row = await conn.fetchrow(SELECT_TARGET, endpoint_id)
    if target_row is None or target_row["status"] != "enabled":
        return Claim(None, [], None)
    rows = await conn.fetch(
        LEASES.claim, first_delay, endpoint_id, owner, lease_seconds, limit
    )
    claimed = [build(Claimed, row, body=event_body(row)) for row in rows]
    next_due_in = None
    if len(claimed) < limit:
        seconds = await conn.fetchval(LEASES.seconds_to_next_due, first_delay, endpoint_id)
        next_due_in = None if seconds is None else float(str(seconds))
    return Claim(_target(target_row), claimed, next_due_in)


async def record_attempts(
    conn: Queries,
    attempts: Sequence[tuple[Claimed, Outcome]],
    owner: UUID,
    auto_disable_after: int,
) -> None:
    """Record attempts and move their deliveries (and maybe endpoints) on.

    One statement per attempt, in order, pipelined in one round trip and
    one transaction. An attempt whose lease this process no longer holds
    (another process took the delivery, or the endpoint was deleted)
    records nothing.
    """
    await conn.executemany(
        LEASES.record,
        [
            (
                claimed.id,
                owner,
                claimed.attempt_count,
                outcome.status,
                outcome.retry_in_seconds,
                outcome.response_status,
                outcome.response_body,
                outcome.error,
                outcome.started_at,
                outcome.duration_ms,
                auto_disable_after,
            )
            for claimed, outcome in attempts
        ],
    )


async def release(conn: Queries, delivery_ids: Sequence[UUID], owner: UUID) -> None:
    """Give claimed deliveries back unattempted (on shutdown)."""
    await conn.execute(LEASES.release, list(delivery_ids), owner)


async def due_endpoints(conn: Queries, limit: int, first_delay: float) -> list[UUID]:
    """Enabled endpoints with a delivery due now that nobody holds."""
    return owners_of(await conn.fetch(LEASES.due_owners, first_delay, limit))
