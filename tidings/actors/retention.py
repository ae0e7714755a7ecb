"""The retention sweeper: one singleton that deletes what is past its retention.

Each kind of record has its own interval: idempotency records (short-lived,
many) every ``idempotency_sweep_seconds``; events and finished webhook
deliveries every ``retention_sweep_seconds``. A sweep deletes in batches
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
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database

log = logging.getLogger("tidings.retention")


@dataclass(frozen=True)
class Sweep:
    """One kind of record: what deletes it (returns how many), and how often."""

    name: str
    every: float
    delete: Callable[[AsyncioConnection], Awaitable[int]]


def sweeps(config: Config) -> list[Sweep]:
    batch = config.retention_batch_size

    async def idempotency(conn: AsyncioConnection) -> int:
        return await store.delete_idempotency_records(conn, batch)

    async def events(conn: AsyncioConnection) -> int:
        return await store.delete_events(conn, config.event_retention_seconds, batch)

    async def deliveries(conn: AsyncioConnection) -> int:
        return await store.delete_deliveries(
            conn, config.webhook_delivery_retention_seconds, batch
        )

    return [
        Sweep("idempotency records", config.idempotency_sweep_seconds, idempotency),
        Sweep("events", config.retention_sweep_seconds, events),
        Sweep("webhook deliveries", config.retention_sweep_seconds, deliveries),
    ]


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
                    removed = await self._db.run(sweep.delete)
                    if removed:
                        log.info("removed %d %s past their retention", removed, sweep.name)
                    due[sweep.name] = trio.current_time() + sweep.every
            await trio.sleep_until(min(due.values()))


def start_retention(db: Database, config: Config) -> Callable[[], Awaitable[None]]:
    """The body of the retention singleton (a fresh sweeper on each restart)."""
    return lambda: RetentionSweeper(db, sweeps(config)).run()
