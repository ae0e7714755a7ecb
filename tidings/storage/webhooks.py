"""Webhook endpoints, their deliveries and the attempts of each delivery.

Delivery state lives here, not in actor memory. A process claims due
deliveries with ``FOR UPDATE SKIP LOCKED`` and writes a lease (owner and
expiry) on them; an attempt's result is recorded only by the owner of a
live lease, together with the delivery's next state and, when the delivery
succeeds or is exhausted, the endpoint's failure count and status. A lease
left by a process that died expires, and any process takes the delivery up
again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

ENDPOINT_COLUMNS = """
id, team_id, url, events, description, status, secret, previous_secret,
previous_secret_until, consecutive_failures, last_failure_at, disabled_reason,
disabled_at, created_at, updated_at
"""

DELIVERY_COLUMNS = """
id, team_id, endpoint_id, event_id, event_type, status, attempt_count, next_attempt_at,
response_status, response_body, error, created_at, updated_at
"""

ATTEMPT_COLUMNS = "number, started_at, duration_ms, response_status, response_body, error"

DELIVERY_STATUSES = ("pending", "retrying", "succeeded", "failed")

# Every process LISTENs here; the payload is the id of an endpoint with a
# delivery due now. Sent by the statements that make one due, so it goes out
# when (and only if) their transaction commits.
DUE_CHANNEL = "tidings_webhooks_due"


@dataclass(frozen=True)
class Endpoint:
    id: UUID
    team_id: UUID
    url: str
    events: list[str]
    description: str | None
    status: str
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    consecutive_failures: int
    last_failure_at: datetime | None
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Endpoint:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Attempt:
    number: int
    started_at: datetime
    duration_ms: int
    response_status: int | None
    response_body: str | None
    error: str | None


@dataclass(frozen=True)
class Delivery:
    id: UUID
    team_id: UUID
    endpoint_id: UUID
    event_id: UUID
    event_type: str
    status: str
    attempt_count: int
    next_attempt_at: datetime | None
    response_status: int | None
    response_body: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    attempts: list[Attempt] | None = None

    @classmethod
    def from_row(cls, row: Any, attempts: list[Attempt] | None = None) -> Delivery:
        fields = {name: row[name] for name in cls.__dataclass_fields__ if name != "attempts"}
        return cls(**fields, attempts=attempts)


# --- endpoints ---------------------------------------------------------------


async def create_endpoint(
    conn: Any,
    team_id: UUID,
    *,
    url: str,
    events: Sequence[str],
    description: str | None,
    secret: str,
) -> Endpoint:
    row = await conn.fetchrow(
        f"""
        INSERT INTO webhook_endpoints (team_id, url, events, description, secret)
        VALUES ($1, $2, $3, $4, $5)
        RETURNING {ENDPOINT_COLUMNS}
        """,
        team_id,
        url,
        list(events),
        description,
        secret,
    )
    return Endpoint.from_row(row)


async def get_endpoint(conn: Any, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    row = await conn.fetchrow(
        f"SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE team_id = $1 AND id = $2",
        team_id,
        endpoint_id,
    )
    return None if row is None else Endpoint.from_row(row)


async def list_endpoints(conn: Any, team_id: UUID, limit: int, offset: int) -> list[Endpoint]:
    rows = await conn.fetch(
        f"""
        SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE team_id = $1
        ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3
        """,
        team_id,
        limit,
        offset,
    )
    return [Endpoint.from_row(row) for row in rows]


async def update_endpoint(
    conn: Any,
    team_id: UUID,
    endpoint_id: UUID,
    *,
    url: str | None,
    events: Sequence[str] | None,
    description: str | None,
    set_description: bool,
) -> Endpoint | None:
    row = await conn.fetchrow(
        f"""
        UPDATE webhook_endpoints SET
            url = coalesce($3, url),
            events = coalesce($4, events),
            description = CASE WHEN $6 THEN $5 ELSE description END,
            updated_at = now()
        WHERE team_id = $1 AND id = $2
        RETURNING {ENDPOINT_COLUMNS}
        """,
        team_id,
        endpoint_id,
        url,
        None if events is None else list(events),
        description,
        set_description,
    )
    return None if row is None else Endpoint.from_row(row)


async def delete_endpoint(conn: Any, team_id: UUID, endpoint_id: UUID) -> bool:
    """Delete an endpoint with its deliveries and attempts; events stay."""
    deleted = await conn.fetchval(
        "DELETE FROM webhook_endpoints WHERE team_id = $1 AND id = $2 RETURNING id",
        team_id,
        endpoint_id,
    )
    return deleted is not None


async def disable_endpoint(conn: Any, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    """Disable by hand. Disabling a disabled endpoint changes nothing."""
    row = await conn.fetchrow(
        f"""
        UPDATE webhook_endpoints SET
            status = 'disabled',
            disabled_reason = CASE WHEN status = 'enabled' THEN 'manual' ELSE disabled_reason END,
            disabled_at = CASE WHEN status = 'enabled' THEN now() ELSE disabled_at END,
            updated_at = CASE WHEN status = 'enabled' THEN now() ELSE updated_at END
        WHERE team_id = $1 AND id = $2
        RETURNING {ENDPOINT_COLUMNS}
        """,
        team_id,
        endpoint_id,
    )
    return None if row is None else Endpoint.from_row(row)


async def enable_endpoint(conn: Any, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    """Re-enable: the failure count starts over and the reason is cleared.

    Deliveries that were pending or retrying when it was disabled were
    kept, and are claimed again from now on.
    """
    row = await conn.fetchrow(
        f"""
        WITH endpoint AS (
            UPDATE webhook_endpoints SET
                status = 'enabled', consecutive_failures = 0, disabled_reason = NULL,
                disabled_at = NULL, updated_at = now()
            WHERE team_id = $1 AND id = $2
            RETURNING {ENDPOINT_COLUMNS}
        )
        SELECT endpoint.*, pg_notify('{DUE_CHANNEL}', endpoint.id::text) FROM endpoint
        """,
        team_id,
        endpoint_id,
    )
    return None if row is None else Endpoint.from_row(row)


async def rotate_secret(
    conn: Any, team_id: UUID, endpoint_id: UUID, secret: str, overlap_seconds: float
) -> Endpoint | None:
    """Give the endpoint a new secret; the current one keeps signing for a while."""
    row = await conn.fetchrow(
        f"""
        UPDATE webhook_endpoints SET
            previous_secret = secret,
            previous_secret_until = now() + $4 * interval '1 second',
            secret = $3,
            updated_at = now()
        WHERE team_id = $1 AND id = $2
        RETURNING {ENDPOINT_COLUMNS}
        """,
        team_id,
        endpoint_id,
        secret,
        overlap_seconds,
    )
    return None if row is None else Endpoint.from_row(row)


# --- deliveries, as the API shows them ---------------------------------------


async def list_deliveries(
    conn: Any,
    team_id: UUID,
    endpoint_id: UUID,
    limit: int,
    offset: int,
    status: str | None = None,
) -> list[Delivery]:
    rows = await conn.fetch(
        f"""
        SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
        WHERE team_id = $1 AND endpoint_id = $2 AND ($3::text IS NULL OR status = $3)
        ORDER BY created_at DESC, id DESC LIMIT $4 OFFSET $5
        """,
        team_id,
        endpoint_id,
        status,
        limit,
        offset,
    )
    return [Delivery.from_row(row) for row in rows]


async def deliveries_of_event(conn: Any, team_id: UUID, event_id: UUID) -> list[Delivery]:
    rows = await conn.fetch(
        f"""
        SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
        WHERE team_id = $1 AND event_id = $2 ORDER BY created_at, id
        """,
        team_id,
        event_id,
    )
    return [Delivery.from_row(row) for row in rows]


async def get_delivery(conn: Any, team_id: UUID, delivery_id: UUID) -> Delivery | None:
    row = await conn.fetchrow(
        f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE team_id = $1 AND id = $2",
        team_id,
        delivery_id,
    )
    if row is None:
        return None
    attempts = await conn.fetch(
        f"SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE delivery_id = $1 ORDER BY number",
        delivery_id,
    )
    return Delivery.from_row(row, [Attempt(**dict(attempt)) for attempt in attempts])


class NotFailed(Exception):
    """A manual retry of a delivery that is not in ``failed``."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def retry_delivery(conn: Any, team_id: UUID, delivery_id: UUID) -> Delivery | None:
    """Send a failed delivery once more: back to ``pending``, due now.

    Raises NotFailed for a delivery in any other state.
    """
    row = await conn.fetchrow(
        f"""
        WITH found AS (
            SELECT id, status FROM webhook_deliveries
            WHERE team_id = $1 AND id = $2 FOR UPDATE
        ), retried AS (
            UPDATE webhook_deliveries d SET
                status = 'pending', retry_base = d.attempt_count, next_attempt_at = now(),
                updated_at = now()
            FROM found WHERE d.id = found.id AND found.status = 'failed'
            RETURNING d.*
        )
        SELECT found.status AS found_status, retried.*,
               CASE WHEN retried.id IS NOT NULL
                    THEN pg_notify('{DUE_CHANNEL}', retried.endpoint_id::text) END
        FROM found LEFT JOIN retried ON true
        """,
        team_id,
        delivery_id,
    )
    if row is None:
        return None
    if row["found_status"] != "failed":
        raise NotFailed(row["found_status"])
    return Delivery.from_row(row)


# --- what the endpoint actors use ---------------------------------------------


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
    # When the earliest delivery of the endpoint that is not due yet becomes due.
    next_due: datetime | None


def due_at(delay_parameter: str) -> str:
    """When a delivery is due: its next attempt time, and for a first attempt
    the first wait of the retry schedule after that (events record deliveries
    at commit time, without knowing the schedule)."""
    return (
        "d.next_attempt_at + CASE WHEN d.attempt_count = 0 "
        f"THEN {delay_parameter} * interval '1 second' ELSE interval '0' END"
    )


CLAIM_DUE = f"""
WITH due AS (
    SELECT d.id FROM webhook_deliveries d
    JOIN webhook_endpoints endpoint ON endpoint.id = d.endpoint_id
    WHERE d.endpoint_id = $1
      AND endpoint.status = 'enabled'
      AND d.status IN ('pending', 'retrying')
      AND {due_at("$5")} <= now()
      AND (d.leased_until IS NULL OR d.leased_until < now())
    ORDER BY d.next_attempt_at
    LIMIT $2
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
SET leased_until = now() + $3 * interval '1 second', lease_owner = $4
FROM due, events e
WHERE d.id = due.id AND e.id = d.event_id
RETURNING d.id, d.endpoint_id, d.attempt_count, d.retry_base, d.event_type,
          e.id AS event_id, e.type, e.channel, e.message_id, e.recipient, e.occurred_at,
          e.data::text AS data
"""

SELECT_TARGET = """
SELECT url, status, secret,
       CASE WHEN previous_secret_until > now() THEN previous_secret END AS previous_secret
FROM webhook_endpoints WHERE id = $1
"""

NEXT_DUE = f"""
SELECT min({due_at("$2")}) FROM webhook_deliveries d
JOIN webhook_endpoints endpoint ON endpoint.id = d.endpoint_id
WHERE d.endpoint_id = $1 AND endpoint.status = 'enabled'
  AND d.status IN ('pending', 'retrying')
  AND (d.leased_until IS NULL OR d.leased_until < now())
"""


def event_body(row: Any) -> bytes:
    """The request body receivers get (CONTRACT §4); the same on every attempt."""
    occurred: datetime = row["occurred_at"]
    document = {
        "id": str(row["event_id"]),
        "event": row["type"],
        "message_id": None if row["message_id"] is None else str(row["message_id"]),
        "channel": row["channel"],
        "to": row["recipient"],
        "occurred_at": occurred.isoformat().replace("+00:00", "Z"),
        "data": json.loads(row["data"]),
    }
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


async def claim_due(
    conn: Any,
    endpoint_id: UUID,
    owner: UUID,
    limit: int,
    lease_seconds: float,
    first_delay: float,
) -> Claim:
    """Lease up to ``limit`` due deliveries of an enabled endpoint.

    Runs on a raw asyncpg connection (inside ``Database.run``).
    """
    target_row = await conn.fetchrow(SELECT_TARGET, endpoint_id)
    if target_row is None or target_row["status"] != "enabled":
        return Claim(None, [], None)
    secrets = [target_row["secret"]]
    if target_row["previous_secret"] is not None:
        secrets.append(target_row["previous_secret"])
    target = Target(target_row["url"], tuple(secrets))
    rows = await conn.fetch(CLAIM_DUE, endpoint_id, limit, lease_seconds, owner, first_delay)
    claimed = [
        Claimed(
            id=row["id"],
            endpoint_id=row["endpoint_id"],
            attempt_count=row["attempt_count"],
            retry_base=row["retry_base"],
            event_type=row["event_type"],
            body=event_body(row),
        )
        for row in rows
    ]
    next_due = None
    if len(claimed) < limit:
        next_due = await conn.fetchval(NEXT_DUE, endpoint_id, first_delay)
    return Claim(target, claimed, next_due)


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


RECORD_ATTEMPT = """
WITH delivery AS (
    UPDATE webhook_deliveries SET
        attempt_count = attempt_count + 1,
        status = $4,
        next_attempt_at = CASE WHEN $4 = 'retrying'
                               THEN now() + $5 * interval '1 second' END,
        leased_until = NULL,
        lease_owner = NULL,
        response_status = $6,
        response_body = $7,
        error = $8,
        updated_at = now()
    WHERE id = $1 AND lease_owner = $2 AND attempt_count = $3
    RETURNING id, endpoint_id, attempt_count
), attempt AS (
    INSERT INTO webhook_attempts
        (delivery_id, number, started_at, duration_ms, response_status, response_body, error)
    SELECT id, attempt_count, $9, $10, $6, $7, $8 FROM delivery
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
    FROM delivery
    WHERE endpoint.id = delivery.endpoint_id
      AND ($4 = 'failed' OR ($4 = 'succeeded' AND endpoint.consecutive_failures <> 0))
    RETURNING endpoint.status
)
SELECT (SELECT count(*) FROM delivery) AS recorded, (SELECT status FROM endpoint) AS endpoint
"""


async def record_attempts(
    conn: Any,
    attempts: Sequence[tuple[Claimed, Outcome]],
    owner: UUID,
    auto_disable_after: int,
) -> None:
    """Record attempts and move their deliveries (and maybe endpoints) on.

    One statement per attempt, in order, pipelined in one round trip and
    one transaction. An attempt whose lease this process no longer holds
    (it expired and another process took the delivery, or the endpoint was
    deleted) records nothing. Runs on a raw asyncpg connection.
    """
    await conn.executemany(
        RECORD_ATTEMPT,
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


async def release(conn: Any, delivery_ids: Sequence[UUID], owner: UUID) -> None:
    """Give claimed deliveries back unattempted (on shutdown)."""
    await conn.execute(
        """
        UPDATE webhook_deliveries SET leased_until = NULL, lease_owner = NULL
        WHERE id = ANY($1) AND lease_owner = $2
        """,
        list(delivery_ids),
        owner,
    )
async def due_endpoints(conn: Any, limit: int, first_delay: float) -> list[UUID]:
    """Enabled endpoints with a delivery due now that nobody holds."""
    rows = await conn.fetch(
        f"""
        SELECT DISTINCT d.endpoint_id FROM webhook_deliveries d
        JOIN webhook_endpoints endpoint ON endpoint.id = d.endpoint_id
        WHERE d.status IN ('pending', 'retrying')
          AND {due_at("$2")} <= now()
          AND (d.leased_until IS NULL OR d.leased_until < now())
          AND endpoint.status = 'enabled'
        LIMIT $1
        """,
        limit,
        first_delay,
    )
    return [row["endpoint_id"] for row in rows]
