"""Idempotency shard actors.

A request with an ``Idempotency-Key`` is decided by the shard that owns
``hash(credential, key)``: the shard claims the key in PostgreSQL or says why
it cannot (replay, a different request, still processing, an expired lock).
One shard handles one decision at a time, so concurrent requests with one
key in a process are serialised before they reach the database; the unique
key in PostgreSQL does the same across processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

from tidings.actors.mailbox import Reply
from tidings.actors.runtime import Runtime
from tidings.actors.supervisor import Actor, Supervisor
from tidings.config import Config
from tidings.sealing import Sealer, is_sealed, load_key
from tidings.storage import idempotency as records
from tidings.storage.db import AsyncioConnection, Database

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
SEALED_UNREADABLE = (
    "the request with this Idempotency-Key completed, but its response carried a secret "
    "that is stored encrypted with a key this process does not have (TIDINGS_SECRET_KEY "
    "changed, or differs between processes), so it cannot be shown again; the operation "
    "is not repeated. Use a new Idempotency-Key for a new one"
)


@dataclass(frozen=True)
class Begin:
    scope: UUID
    key: str
    fingerprint: bytes
    reply: Reply[Decision]


class IdempotencyShard(Actor[Begin]):
    idle_timeout = 300.0

    def __init__(self, db: Database, config: Config, sealer: Sealer) -> None:
        self._db = db
        self._config = config
        self._sealer = sealer

    async def handle(self, message: Begin) -> None:
        decision = await self._db.run(
            decide,
            message,
            self._config.idempotency_lock_seconds,
            self._config.idempotency_retention_seconds,
        )
        if isinstance(decision, Replay) and is_sealed(decision.body):
            plain = self._sealer.open(decision.body, seal_context(message.scope, message.key))
            decision = Refuse(SEALED_UNREADABLE) if plain is None else Replay(
                decision.status, plain
            )
        message.reply.send(decision)


def seal_context(scope: UUID, key: str) -> bytes:
    """What a sealed body is bound to: its credential and its key."""
    return scope.bytes + key.encode()


async def decide(conn: AsyncioConnection, begin: Begin, lock: float, retention: float) -> Decision:
    """Claim the key of ``begin`` or say why not. Runs whole on the storage side."""
    attempt = await records.begin(
        conn, begin.scope, begin.key, begin.fingerprint,
        lock_seconds=lock, retention_seconds=retention,
    )
    match attempt:
        case records.Claimed(claim=claim):
            return Proceed(claim)
        case _ if attempt.fingerprint != begin.fingerprint:
            return Refuse(DIFFERENT_REQUEST)
        case records.Completed(status=status, body=body):
            return Replay(status, body)
        case records.Processing(lock_expired=True):
            # Drop the stale claim so that the client's retry runs.
            await records.drop_expired_lock(conn, begin.scope, begin.key)
            return Refuse(LOCK_EXPIRED)
        case _:
            return Refuse(STILL_PROCESSING)


class IdempotencyKeys:
    """The shards, as HTTP handlers see them."""

    def __init__(self, shards: Supervisor[int, Begin], count: int, sealer: Sealer) -> None:
        self._shards = shards
        self._count = count
        self._sealer = sealer

    async def begin(self, scope: UUID, key: str, fingerprint: bytes) -> Decision:
        shard = self._shards.handle(hash((scope, key)) % self._count)
        return await shard.ask(lambda reply: Begin(scope, key, fingerprint, reply))

    def stored_body(self, scope: UUID, key: str, body: bytes, *, secret: bool) -> bytes:
        """What to store as the replayable response: ``body``, or, when the
        route shows a secret or the body holds one, ``body`` sealed."""
        if secret or records.holds_secret(body):
            return self._sealer.seal(body, seal_context(scope, key))
        return body

    @property
    def supervisor(self) -> Supervisor[int, Begin]:
        return self._shards


def start_idempotency(runtime: Runtime, db: Database, config: Config) -> IdempotencyKeys:
    """Register the shards with the runtime."""

    sealer = Sealer(load_key(config))

    def shard(_index: int) -> Actor[Begin]:
        return IdempotencyShard(db, config, sealer)

    shards: Supervisor[int, Begin] = runtime.keyed("idempotency", shard, mailbox_size=256)
    return IdempotencyKeys(shards, config.idempotency_shards, sealer)


__all__ = ["Decision", "IdempotencyKeys", "Proceed", "Refuse", "Replay", "start_idempotency"]
