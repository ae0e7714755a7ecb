"""Deleting what is past its retention, in batches that hold no lock for long.

Each statement deletes at most ``batch`` rows, chosen by ``ctid`` in a
subquery, and commits on its own (autocommit), so a sweep of millions of
rows is many short transactions rather than one long one, and rows that
concurrent work is changing are simply left for the next sweep.

* Events older than their retention go with their deliveries and attempts
  (the foreign keys cascade), except events with a delivery still pending or
  retrying, or finished but within its own retention: a delivery is never
  deleted before its time with its event.
* Finished deliveries (succeeded or failed) whose last change is older than
  their retention go with their attempts; their events stay until their own
  retention.
* Idempotency records go once past the ``expires_at`` written when their key
  was claimed (``IDEMPOTENCY_RETENTION_SECONDS``).
* Status reports a provider made about an id that no message has
  (``sms_early_reports``, kept in case the id was about to be stored) go once
  older than their retention.
"""

from __future__ import annotations

from tidings.storage.rows import Queries

# $1 the events' retention, $2 the deliveries' retention, $3 the batch: an
# event stays while one of its deliveries is unfinished or within its own
# retention (a delivery goes with its event: the foreign key cascades).
DELETE_EVENTS = """
DELETE FROM events WHERE ctid IN (
    SELECT e.ctid FROM events e
    WHERE e.created_at < now() - $1 * interval '1 second'
      AND NOT EXISTS (
          SELECT 1 FROM webhook_deliveries d
          WHERE d.event_id = e.id
            AND (d.status IN ('pending', 'retrying')
                 OR d.updated_at >= now() - $2 * interval '1 second'))
    LIMIT $3
)
"""

DELETE_DELIVERIES = """
DELETE FROM webhook_deliveries WHERE ctid IN (
    SELECT ctid FROM webhook_deliveries
    WHERE status IN ('succeeded', 'failed') AND updated_at < now() - $1 * interval '1 second'
    LIMIT $2
)
"""

DELETE_IDEMPOTENCY_RECORDS = """
DELETE FROM idempotency_keys WHERE ctid IN (
    SELECT ctid FROM idempotency_keys WHERE expires_at <= now() LIMIT $1
)
"""

DELETE_EARLY_SMS_REPORTS = """
DELETE FROM sms_early_reports WHERE ctid IN (
    SELECT e.ctid FROM sms_early_reports e
    WHERE e.received_at < now() - $1 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM sms_messages m WHERE m.message_id = e.message_id)
    LIMIT $2
)
"""


async def _in_batches(conn: Queries, statement: str, *args: object) -> int:
    total = 0
    batch = args[-1]
    assert isinstance(batch, int) and batch > 0
    while True:
        status = await conn.execute(statement, *args)
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < batch:
            return total


async def delete_events(
    conn: Queries, retention_seconds: float, batch: int,
    delivery_retention_seconds: float | None = None,
) -> int:
    """Delete events past retention (with their deliveries); returns how many events.

    An event is kept while one of its deliveries is unfinished or changed
    within ``delivery_retention_seconds`` (None: the events' own retention).
    """
    kept_for = retention_seconds if delivery_retention_seconds is None else (
        delivery_retention_seconds
    )
    return await _in_batches(conn, DELETE_EVENTS, retention_seconds, kept_for, batch)


async def delete_deliveries(conn: Queries, retention_seconds: float, batch: int) -> int:
    """Delete finished deliveries past retention (with their attempts); returns how many."""
    return await _in_batches(conn, DELETE_DELIVERIES, retention_seconds, batch)


async def delete_idempotency_records(conn: Queries, batch: int) -> int:
    """Delete idempotency records past their expiry; returns how many."""
    return await _in_batches(conn, DELETE_IDEMPOTENCY_RECORDS, batch)


async def delete_early_sms_reports(conn: Queries, retention_seconds: float, batch: int) -> int:
    """Delete kept SMS status reports that still match no message past
    retention; returns how many."""
    return await _in_batches(conn, DELETE_EARLY_SMS_REPORTS, retention_seconds, batch)
