"""The retention sweeper: one singleton that deletes what is past its retention.

Each kind of record has its own interval: idempotency records (short-lived,
many) every ``idempotency_sweep_seconds``; events and finished webhook
deliveries every ``retention_sweep_seconds``, and with them the SMS status
reports kept for a provider id no message has. A sweep deletes in batches
(``tidings/storage/retention.py``), each its own short transaction, so it
never holds locks for long; cut short by shutdown, the next run goes on.
Several processes may sweep at once: a row deleted by one is skipped by the
others.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from tidings.config import Config
from tidings.storage import retention as store
from tidings.storage import sms_status
from tidings.storage.db import Database

log = logging.getLogger("tidings.retention")

# A status callback names a message whose provider id the send worker stores
# within seconds; a report that matches none after a day never will.
EARLY_SMS_REPORT_RETENTION_SECONDS = 86400
# A kept report this old whose message has its id by now was left behind by a
# callback or a send worker stopped between its two steps: the sweep applies it.
LEFT_BEHIND_SECONDS = 60.0


@dataclass(frozen=True)
class Sweep:
    """One kind of record: what deletes it (returns how many), and how often."""

    name: str
    every: float
    delete: Callable[[Database], Awaitable[int]]


def sweeps(config: Config) -> list[Sweep]:
    batch = config.retention_batch_size

    async def idempotency(db: Database) -> int:
        return await db.run(store.delete_idempotency_records, batch)

    async def events(db: Database) -> int:
        return await db.run(store.delete_events, config.event_retention_seconds, batch,
                            config.webhook_delivery_retention_seconds)

    async def deliveries(db: Database) -> int:
        return await db.run(
            store.delete_deliveries, config.webhook_delivery_retention_seconds, batch
        )

    return [
        Sweep("idempotency records", config.idempotency_sweep_seconds, idempotency),
        Sweep("events", config.retention_sweep_seconds, events),
        Sweep("webhook deliveries", config.retention_sweep_seconds, deliveries),
    ]


def early_sms_report_sweep(config: Config) -> Sweep:
    """Kept SMS status reports: those left behind are applied, those that
    match no message after a day are deleted (the count returned)."""
    batch = config.retention_batch_size

    async def early_sms_reports(db: Database) -> int:
        applied = await db.run(sms_status.apply_left_behind_reports, LEFT_BEHIND_SECONDS, batch)
        if applied:
            log.warning("applied %d SMS status reports left behind", applied)
        return await db.run(
            store.delete_early_sms_reports, EARLY_SMS_REPORT_RETENTION_SECONDS, batch
        )

    return Sweep("unmatched SMS status reports", config.retention_sweep_seconds,
                 early_sms_reports)


class RetentionSweeper:
    """Runs every sweep when it falls due, one after the other."""

    def __init__(self, db: Database, sweeps: list[Sweep]) -> None:
        self._db = db
        self._sweeps = sweeps

    async def run(self) -> None:
        due = {sweep.name: trio.current_time() for sweep in self._sweeps}
        while True:
            for sweep in self._sweeps:
                if due[sweep.name] <= trio.current_time():
                    removed = await sweep.delete(self._db)
                    if removed:
                        log.info("removed %d %s past their retention", removed, sweep.name)
                    due[sweep.name] = trio.current_time() + sweep.every
            await trio.sleep_until(min(due.values()))


def start_retention(db: Database, config: Config) -> Callable[[], Awaitable[None]]:
    """The body of the retention singleton (a fresh sweeper on each restart)."""
    every = [*sweeps(config), early_sms_report_sweep(config)]
    return lambda: RetentionSweeper(db, every).run()
