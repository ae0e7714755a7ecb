"""Webhook endpoints, and their deliveries and attempts as the API shows them.

Delivery state lives here, not in actor memory. The delivery actors claim
and record deliveries with the statements of ``webhook_delivery.py`` (the
lease pattern of ``leases.py``); this module is what the HTTP handlers use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.rows import Queries, Row, build

ENDPOINT_COLUMNS = """
id, team_id, url, events, description, status, secret, previous_secrets,
previous_secrets_until, consecutive_failures, last_failure_at, disabled_reason,
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

CREATE_ENDPOINT = f"""
INSERT INTO webhook_endpoints (team_id, url, events, description, secret)
VALUES ($1, $2, $3, $4, $5)
RETURNING {ENDPOINT_COLUMNS}
"""

SELECT_ENDPOINT = (
    f"SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE team_id = $1 AND id = $2"
)

LIST_ENDPOINTS = f"""
SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE team_id = $1
ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3
"""

UPDATE_ENDPOINT = f"""
UPDATE webhook_endpoints SET
    url = coalesce($3, url),
    events = coalesce($4, events),
    description = CASE WHEN $6 THEN $5 ELSE description END,
    updated_at = now()
WHERE team_id = $1 AND id = $2
RETURNING {ENDPOINT_COLUMNS}
"""

DELETE_ENDPOINT = "DELETE FROM webhook_endpoints WHERE team_id = $1 AND id = $2 RETURNING id"

DISABLE_ENDPOINT = f"""
UPDATE webhook_endpoints SET
    status = 'disabled',
    disabled_reason = CASE WHEN status = 'enabled' THEN 'manual' ELSE disabled_reason END,
    disabled_at = CASE WHEN status = 'enabled' THEN now() ELSE disabled_at END,
    updated_at = CASE WHEN status = 'enabled' THEN now() ELSE updated_at END
WHERE team_id = $1 AND id = $2
RETURNING {ENDPOINT_COLUMNS}
"""

# Enabling an enabled endpoint changes nothing: its failure count stays.
ENABLE_ENDPOINT = f"""
WITH endpoint AS (
    UPDATE webhook_endpoints SET
        status = 'enabled',
        consecutive_failures = CASE WHEN status = 'disabled' THEN 0
                                    ELSE consecutive_failures END,
        disabled_reason = NULL,
        disabled_at = NULL,
        updated_at = CASE WHEN status = 'disabled' THEN now() ELSE updated_at END
    WHERE team_id = $1 AND id = $2
    RETURNING {ENDPOINT_COLUMNS}
)
SELECT endpoint.*, pg_notify('{DUE_CHANNEL}', endpoint.id::text) FROM endpoint
"""

# The secrets that keep signing after a rotation: the one rotated out (for
# $4 seconds) and those rotated out before whose time has not run out, newest
# first, at most ROTATED_KEPT. Computed from the row as locked, so two
# rotations at once keep each other's secret.
_KEPT = """(
    SELECT coalesce(array_agg(kept.{column} ORDER BY kept.until DESC), '{{}}') FROM (
        SELECT p.secret, p.until FROM unnest(
            ARRAY[secret] || previous_secrets,
            ARRAY[now() + $4 * interval '1 second'] || previous_secrets_until
        ) AS p(secret, until)
        WHERE p.until > now() ORDER BY p.until DESC LIMIT $5
    ) AS kept
)"""

ROTATE_SECRET = f"""
UPDATE webhook_endpoints SET
    previous_secrets = {_KEPT.format(column="secret")},
    previous_secrets_until = {_KEPT.format(column="until")},
    secret = $3,
    updated_at = now()
WHERE team_id = $1 AND id = $2
RETURNING {ENDPOINT_COLUMNS}
"""

# Rotated-out secrets that sign beside the current one, at most: each adds a
# ``v1=`` to every delivery's signature header.
ROTATED_KEPT = 10

LIST_DELIVERIES = f"""
SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
WHERE team_id = $1 AND endpoint_id = $2 AND ($3::text IS NULL OR status = $3)
ORDER BY created_at DESC, id DESC LIMIT $4 OFFSET $5
"""

DELIVERIES_OF_EVENT = f"""
SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
WHERE team_id = $1 AND event_id = $2 ORDER BY created_at, id
"""

SELECT_DELIVERY = (
    f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE team_id = $1 AND id = $2"
)

SELECT_ATTEMPTS = (
    f"SELECT {ATTEMPT_COLUMNS} FROM webhook_attempts WHERE delivery_id = $1 ORDER BY number"
)

RETRY_DELIVERY = f"""
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
"""


@dataclass(frozen=True)
class Endpoint:
    id: UUID
    team_id: UUID
    url: str
    events: list[str]
    description: str | None
    status: str
    secret: str
    previous_secrets: list[str]  # newest first, each signing until
    previous_secrets_until: list[datetime]  # the time of the same place
    consecutive_failures: int
    last_failure_at: datetime | None
    disabled_reason: str | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime


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


def _endpoint(row: Row | None) -> Endpoint | None:
    return None if row is None else build(Endpoint, row)


# --- endpoints ---------------------------------------------------------------


async def create_endpoint(
    conn: Queries,
    team_id: UUID,
    *,
    url: str,
    events: Sequence[str],
    description: str | None,
    secret: str,
) -> Endpoint:
    row = await conn.fetchrow(CREATE_ENDPOINT, team_id, url, list(events), description, secret)
    assert row is not None
    return build(Endpoint, row)


async def get_endpoint(conn: Queries, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    return _endpoint(await conn.fetchrow(SELECT_ENDPOINT, team_id, endpoint_id))


async def list_endpoints(
    conn: Queries, team_id: UUID, limit: int, offset: int
) -> list[Endpoint]:
    rows = await conn.fetch(LIST_ENDPOINTS, team_id, limit, offset)
    return [build(Endpoint, row) for row in rows]


async def update_endpoint(
    conn: Queries,
    team_id: UUID,
    endpoint_id: UUID,
    *,
    url: str | None,
    events: Sequence[str] | None,
    description: str | None,
    set_description: bool,
) -> Endpoint | None:
    row = await conn.fetchrow(
        UPDATE_ENDPOINT,
        team_id,
        endpoint_id,
        url,
        None if events is None else list(events),
        description,
        set_description,
    )
    return _endpoint(row)


async def delete_endpoint(conn: Queries, team_id: UUID, endpoint_id: UUID) -> bool:
    """Delete an endpoint with its deliveries and attempts; events stay."""
    return await conn.fetchval(DELETE_ENDPOINT, team_id, endpoint_id) is not None


async def disable_endpoint(conn: Queries, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    """Disable by hand. Disabling a disabled endpoint changes nothing."""
    return _endpoint(await conn.fetchrow(DISABLE_ENDPOINT, team_id, endpoint_id))


async def enable_endpoint(conn: Queries, team_id: UUID, endpoint_id: UUID) -> Endpoint | None:
    """Re-enable: the failure count starts over and the reason is cleared.
    Enabling an endpoint that is enabled changes nothing (its failure count
    stays, so it cannot be kept from reaching the threshold this way).

    Deliveries that were pending or retrying when it was disabled were
    kept, and are claimed again from now on.
    """
    return _endpoint(await conn.fetchrow(ENABLE_ENDPOINT, team_id, endpoint_id))


async def rotate_secret(
    conn: Queries, team_id: UUID, endpoint_id: UUID, secret: str, overlap_seconds: float
) -> Endpoint | None:
    """Give the endpoint a new secret; the current one keeps signing for
    ``overlap_seconds``, beside those rotated out before whose time is not up
    (at most ``ROTATED_KEPT``, the newest)."""
    row = await conn.fetchrow(
        ROTATE_SECRET, team_id, endpoint_id, secret, overlap_seconds, ROTATED_KEPT
    )
    return _endpoint(row)


# --- deliveries, as the API shows them ---------------------------------------


async def list_deliveries(
    conn: Queries,
    team_id: UUID,
    endpoint_id: UUID,
    limit: int,
    offset: int,
    status: str | None = None,
) -> list[Delivery]:
    rows = await conn.fetch(LIST_DELIVERIES, team_id, endpoint_id, status, limit, offset)
    return [build(Delivery, row, attempts=None) for row in rows]


async def deliveries_of_event(conn: Queries, team_id: UUID, event_id: UUID) -> list[Delivery]:
    rows = await conn.fetch(DELIVERIES_OF_EVENT, team_id, event_id)
    return [build(Delivery, row, attempts=None) for row in rows]


async def get_delivery(conn: Queries, team_id: UUID, delivery_id: UUID) -> Delivery | None:
    row = await conn.fetchrow(SELECT_DELIVERY, team_id, delivery_id)
    if row is None:
        return None
    attempts = await conn.fetch(SELECT_ATTEMPTS, delivery_id)
    return build(Delivery, row, attempts=[build(Attempt, attempt) for attempt in attempts])


class NotFailed(Exception):
    """A manual retry of a delivery that is not in ``failed``."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def retry_delivery(conn: Queries, team_id: UUID, delivery_id: UUID) -> Delivery | None:
    """Send a failed delivery once more: back to ``pending``, due now.

    Raises NotFailed for a delivery in any other state.
    """
    row = await conn.fetchrow(RETRY_DELIVERY, team_id, delivery_id)
    if row is None:
        return None
    if row["found_status"] != "failed":
        raise NotFailed(str(row["found_status"]))
    return build(Delivery, row, attempts=None)
