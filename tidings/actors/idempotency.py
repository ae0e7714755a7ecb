"""Idempotency shard actors and the sweeper of expired records.

A request with an ``Idempotency-Key`` is decided by the shard that owns
``hash(credential, key)``: the shard claims the key in PostgreSQL or says why
it cannot (replay, a different request, still processing, an expired lock).
One shard handles one decision at a time, so concurrent requests with one
key in a process are serialised before they reach the database; the unique
key in PostgreSQL does the same across processes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from uuid import UUID

from tidings.actors.mailbox import Mailbox, Reply
from tidings.actors.supervisor import Actor, Supervisor, open_supervisor
from tidings.config import Config
from tidings.storage import idempotency as records
from tidings.storage.db import Connection, Database

log = logging.getLogger("tidings.idempotency")


@dataclass(frozen=True)
class Proceed:
    """Execute the request; the key is claimed for it by ``claim``."""

    claim: UUID


@dataclass(frozen=True)
class Replay:
    """Answer with the stored response, without executing anything."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Refuse:
    """Answer 409 CONFLICT with this message."""

    message: str


Decision = Proceed | Replay | Refuse

DIFFERENT_REQUEST = (
    "this Idempotency-Key was already used with a different request "
    "(method, path, query or body differ); use a new key for a new operation"
)
STILL_PROCESSING = "a request with this Idempotency-Key is still processing; retry later"
LOCK_EXPIRED = (
    "the previous attempt with this Idempotency-Key expired before it completed; "
    "retry the request"
)


@dataclass(frozen=True)
class Begin:
    scope: UUID
    key: str
    fingerprint: bytes
    reply: Reply[Decision]


class IdempotencyShard(Actor[Begin]):
    idle_timeout = 300.0

    def __init__(self, db: Database, config: Config) -> None:
        self._db = db
        self._config = config

    async def handle(self, message: Begin) -> None:
        decision = await self._db.run(
            decide,
            message.scope,
            message.key,
            message.fingerprint,
            self._config.idempotency_lock_seconds,
            self._config.idempotency_retention_seconds,
        )
        message.reply.send(decision)


async def decide(
    conn: Connection, scope: UUID, key: str, fingerprint: bytes, lock: float, retention: float
) -> Decision:
    """Claim ``key`` or say why not. Awaits only ``conn``: it runs whole on the
    storage side, from a shard or from a request's storage unit."""
    attempt = await records.begin(
        conn, scope, key, fingerprint, lock_seconds=lock, retention_seconds=retention
    )
    match attempt:
        case records.Claimed(claim=claim):
            return Proceed(claim)
        case _ if attempt.fingerprint != fingerprint:
            return Refuse(DIFFERENT_REQUEST)
        case records.Completed(status=status, body=body):
            return Replay(status, body)
        case records.Processing(lock_expired=True):
            # Drop the stale claim so that the client's retry runs.
            await records.drop_expired_lock(conn, scope, key)
            return Refuse(LOCK_EXPIRED)
        case _:
            return Refuse(STILL_PROCESSING)


class IdempotencySweeper(Actor[None]):
    """Deletes records past their retention, every ``interval`` seconds."""

    idle_timeout = None

    def __init__(self, db: Database, interval: float) -> None:
        self._db = db
        self._interval = interval

    async def run(self, mailbox: Mailbox[None]) -> None:
        while not mailbox.stopping:
            async with self._db.acquire() as conn:
                removed = await records.sweep(conn)
            if removed:
                log.info("removed %d expired idempotency records", removed)
            await mailbox.sleep(self._interval)


class IdempotencyKeys:
    """The shards, as HTTP handlers see them."""

    def __init__(self, shards: Supervisor[int, Begin], count: int) -> None:
        self._shards = shards
        self._count = count

    async def begin(self, scope: UUID, key: str, fingerprint: bytes) -> Decision:
        shard = self._shards.handle(hash((scope, key)) % self._count)
        return await shard.ask(lambda reply: Begin(scope, key, fingerprint, reply))

    @property
    def supervisor(self) -> Supervisor[int, Begin]:
        return self._shards


@asynccontextmanager
async def open_idempotency(db: Database, config: Config) -> AsyncIterator[IdempotencyKeys]:
    """Run the shards and the sweeper for the duration of the block."""
    shards: Callable[[int], Actor[Begin]] = lambda _key: IdempotencyShard(db, config)  # noqa: E731
    sweeper: Callable[[str], Actor[None]] = lambda _key: IdempotencySweeper(  # noqa: E731
        db, config.idempotency_sweep_seconds
    )
    async with open_supervisor("idempotency", shards, mailbox_size=256) as shard_supervisor:
        async with open_supervisor("idempotency-sweeper", sweeper, mailbox_size=1) as sweepers:
            sweepers.start("sweeper")
            yield IdempotencyKeys(shard_supervisor, config.idempotency_shards)


__all__ = [
    "Decision", "IdempotencyKeys", "Proceed", "Refuse", "Replay", "decide", "open_idempotency"
]
