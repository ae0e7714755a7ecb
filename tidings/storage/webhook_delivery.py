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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.leases import claim_rows, lease_sql, owners_of
from tidings.storage.rows import Queries, Row, build

# A delivery is due at its next attempt time; a first attempt waits the
# schedule's first delay ($1) after that, because events record deliveries at
# commit time without knowing the schedule.
_DUE = """(t.next_attempt_at + CASE WHEN t.attempt_count = 0
                                 THEN $1 * interval '1 second'
                                 ELSE interval '0' END)"""
_PENDING = """t.status IN ('pending', 'retrying') AND EXISTS (
        SELECT 1 FROM webhook_endpoints endpoint
        WHERE endpoint.id = t.endpoint_id AND endpoint.status = 'enabled')"""
LEASES = lease_sql(
    "webhook_deliveries",
    owner="endpoint_id",
    extra=1,
    due=_DUE,
    pending=_PENDING,
    owners_index="status IN ('pending', 'retrying')",  # webhook_deliveries_due
    order="t.next_attempt_at",
    # One round trip: the claimed deliveries with their events, where they go
    # (no row at all when the endpoint is not enabled; one row without a
    # delivery when nothing was due), and, when fewer than the limit ($5) were
    # due, the seconds until the next delivery not claimed falls due.
    claimed="""
, next_due AS (
    SELECT extract(epoch FROM min(""" + _DUE + """) - now())::float8 AS seconds
    FROM webhook_deliveries t
    WHERE (SELECT count(*) FROM claimed) < $5
      AND t.endpoint_id = $2 AND """ + _PENDING + """
      AND (t.leased_until IS NULL OR t.leased_until < now())
      AND t.id NOT IN (SELECT id FROM claimed)
), target AS (
    SELECT url, secret,
           ARRAY(SELECT p.secret FROM unnest(previous_secrets, previous_secrets_until)
                     AS p(secret, until)
                 WHERE p.until > now() ORDER BY p.until DESC) AS previous_secrets
    FROM webhook_endpoints WHERE id = $2 AND status = 'enabled'
)
SELECT target.url, target.secret, target.previous_secrets,
       (SELECT seconds FROM next_due) AS next_due_in, c.*
FROM target LEFT JOIN (
    SELECT claimed.id, claimed.endpoint_id, claimed.attempt_count, claimed.retry_base,
           claimed.event_type, e.id AS event_id, e.type, e.channel, e.message_id,
           e.recipient, e.occurred_at, e.data::text AS data
    FROM claimed JOIN events e ON e.id = claimed.event_id
    ORDER BY claimed.next_attempt_at
) c ON true
""",
)

# Attempts of one batch, recorded together: $1-$9 arrays, one element per
# attempt in the order they finished (the delivery, the attempt count claimed,
# the next status, seconds to the retry, what the endpoint answered, when and
# how long); $10 the lease owner; $11 exhausted deliveries in a row that
# disable the endpoint. A delivery whose lease this process no longer holds
# records nothing. The endpoint's failure count moves as if the attempts were
# recorded one by one in that order: a success resets it, an exhausted
# delivery adds one, and the endpoint is disabled if the count reached the
# threshold at any point.
RECORD_BATCH = """
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::float8[], $5::int[],
                         $6::text[], $7::text[], $8::timestamptz[], $9::int[])
        WITH ORDINALITY AS i(id, attempt_count, status, retry_in, response_status,
                             response_body, error, started_at, duration_ms, ord)
), recorded AS (
    UPDATE webhook_deliveries t SET
        attempt_count = t.attempt_count + 1,
        status = i.status,
        next_attempt_at = CASE WHEN i.status = 'retrying'
                               THEN now() + i.retry_in * interval '1 second' END,
        response_status = i.response_status,
        response_body = i.response_body,
        error = i.error,
        updated_at = now(),
        lease_owner = NULL,
        leased_until = NULL
    FROM input i
    WHERE t.id = i.id AND t.lease_owner = $10 AND t.attempt_count = i.attempt_count
    RETURNING t.id, t.endpoint_id, t.attempt_count AS number, i.status, i.ord, i.started_at,
              i.duration_ms, i.response_status, i.response_body, i.error
), attempt AS (
    INSERT INTO webhook_attempts
        (delivery_id, number, started_at, duration_ms, response_status, response_body, error)
    SELECT id, number, started_at, duration_ms, response_status, response_body, error
    FROM recorded
), ends AS (
    -- Outcomes that move the endpoint's count; resets: successes up to this one.
    SELECT endpoint_id, status,
           count(*) FILTER (WHERE status = 'succeeded')
               OVER (PARTITION BY endpoint_id ORDER BY ord) AS resets
    FROM recorded WHERE status IN ('succeeded', 'failed')
), runs AS (
    SELECT endpoint_id, resets, count(*) FILTER (WHERE status = 'failed') AS fails
    FROM ends GROUP BY endpoint_id, resets
), summary AS (
    SELECT endpoint_id,
           max(resets) AS resets,
           coalesce(sum(fails) FILTER (WHERE resets = 0), 0) AS first_fails,
           max(fails) FILTER (WHERE resets > 0 AND fails > 0) AS later_peak,
           sum(fails) > 0 AS any_failed
    FROM runs GROUP BY endpoint_id
), last_run AS (
    SELECT r.endpoint_id, r.fails FROM runs r
    JOIN summary s ON s.endpoint_id = r.endpoint_id AND s.resets = r.resets
), endpoint AS (
    UPDATE webhook_endpoints endpoint SET
        consecutive_failures = CASE WHEN s.resets > 0 THEN l.fails
                                    ELSE endpoint.consecutive_failures + s.first_fails END,
        last_failure_at = CASE WHEN s.any_failed THEN now() ELSE endpoint.last_failure_at END,
        status = CASE WHEN endpoint.status = 'enabled' AND greatest(
                          CASE WHEN s.first_fails > 0
                               THEN endpoint.consecutive_failures + s.first_fails END,
                          s.later_peak) >= $11
                      THEN 'disabled' ELSE endpoint.status END,
        disabled_reason = CASE WHEN endpoint.status = 'enabled' AND greatest(
                                   CASE WHEN s.first_fails > 0
                                        THEN endpoint.consecutive_failures + s.first_fails END,
                                   s.later_peak) >= $11
                               THEN 'failure_threshold' ELSE endpoint.disabled_reason END,
        disabled_at = CASE WHEN endpoint.status = 'enabled' AND greatest(
                               CASE WHEN s.first_fails > 0
                                    THEN endpoint.consecutive_failures + s.first_fails END,
                               s.later_peak) >= $11
                           THEN now() ELSE endpoint.disabled_at END,
        updated_at = now()
    FROM summary s JOIN last_run l ON l.endpoint_id = s.endpoint_id
    WHERE endpoint.id = s.endpoint_id
      AND (s.any_failed OR endpoint.consecutive_failures <> 0)
    RETURNING endpoint.id
)
SELECT (SELECT count(*) FROM recorded) AS recorded, (SELECT count(*) FROM endpoint) AS endpoints
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


# Event bodies made lately, by event id: an event going to several endpoints
# (or attempted again) is serialised once. Events never change.
_BODIES: OrderedDict[UUID, bytes] = OrderedDict()
_BODIES_KEPT = 4096


def _body_of(row: Row) -> bytes:
    event_id = row["event_id"]
    assert isinstance(event_id, UUID)
    body = _BODIES.get(event_id)
    if body is None:
        body = _BODIES[event_id] = event_body(row)
        if len(_BODIES) > _BODIES_KEPT:
            _BODIES.popitem(last=False)
    return body


def _target(row: Row) -> Target:
    return Target(str(row["url"]), (str(row["secret"]), *row["previous_secrets"]))


async def claim_due(
    conn: Queries,
    endpoint_id: UUID,
    owner: UUID,
    limit: int,
    lease_seconds: float,
    first_delay: float,
) -> Claim:
    """Lease up to ``limit`` due deliveries of an enabled endpoint, in one statement."""
    rows = await claim_rows(
        conn, LEASES.claim, first_delay, endpoint_id, owner, lease_seconds, limit
    )
    if not rows:
        return Claim(None, [], None)
    claimed = [
        build(Claimed, row, body=_body_of(row)) for row in rows if row["id"] is not None
    ]
    seconds = rows[0]["next_due_in"]
    next_due_in = None if seconds is None else float(str(seconds))
    return Claim(_target(rows[0]), claimed, next_due_in)


async def record_attempts(
    conn: Queries,
    attempts: Sequence[tuple[Claimed, Outcome]],
    owner: UUID,
    auto_disable_after: int,
) -> None:
    """Record attempts and move their deliveries (and maybe endpoints) on.

    One set-based statement for the whole batch (``RECORD_BATCH``). An
    attempt whose lease this process no longer holds (another process took
    the delivery, or the endpoint was deleted) records nothing.
    """
    if not attempts:
        return
    await conn.execute(
        RECORD_BATCH,
        [claimed.id for claimed, _ in attempts],
        [claimed.attempt_count for claimed, _ in attempts],
        [outcome.status for _, outcome in attempts],
        [outcome.retry_in_seconds for _, outcome in attempts],
        [outcome.response_status for _, outcome in attempts],
        [outcome.response_body for _, outcome in attempts],
        [outcome.error for _, outcome in attempts],
        [outcome.started_at for _, outcome in attempts],
        [outcome.duration_ms for _, outcome in attempts],
        owner,
        auto_disable_after,
    )


async def release(conn: Queries, delivery_ids: Sequence[UUID], owner: UUID) -> None:
    """Give claimed deliveries back unattempted (on shutdown)."""
    await conn.execute(LEASES.release, list(delivery_ids), owner)


async def due_endpoints(conn: Queries, limit: int, first_delay: float) -> list[UUID]:
    """Enabled endpoints with a delivery due now that nobody holds."""
    return owners_of(await conn.fetch(LEASES.due_owners, first_delay, limit))
