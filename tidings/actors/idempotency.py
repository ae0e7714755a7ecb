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
import time
from dataclasses import dataclass
from functools import partial
from uuid import UUID

import trio

from tidings.actors.handback import hand_back
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
LOCK_LOST = (
    "the idempotency lock of this request expired before it completed; retry the request"
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
            message.scope,
            message.key,
            message.fingerprint,
            self._config.idempotency_lock_seconds,
            self._config.idempotency_retention_seconds,
        )
        message.reply.send(opened(self._sealer, message.scope, message.key, decision))


def seal_context(scope: UUID, key: str) -> bytes:
    """What a sealed body is bound to: its credential and its key."""
    return scope.bytes + key.encode()


def opened(sealer: Sealer, scope: UUID, key: str, decision: Decision) -> Decision:
    """``decision`` with a sealed replay opened, or refused when this process
    lacks the key that sealed it. Pure: safe on either side of the bridge."""
    if not isinstance(decision, Replay) or not is_sealed(decision.body):
        return decision
    plain = sealer.open(decision.body, seal_context(scope, key))
    return Refuse(SEALED_UNREADABLE) if plain is None else Replay(decision.status, plain)


async def decide(
    conn: AsyncioConnection,
    scope: UUID,
    key: str,
    fingerprint: bytes,
    lock: float,
    retention: float,
) -> Decision:
    """Claim ``key`` or say why not. Awaits only ``conn``: it runs whole on the
    storage side, from a shard or from a request's storage unit."""
    attempt = await records.begin(
        conn, scope, key, fingerprint, lock_seconds=lock, retention_seconds=retention
    )
    if isinstance(attempt, records.Claimed):
        return Proceed(attempt.claim)
    return await answer_held(conn, scope, key, fingerprint, attempt)


async def answer_held(
    conn: AsyncioConnection,
    scope: UUID,
    key: str,
    fingerprint: bytes,
    held: records.Completed | records.Processing,
) -> Replay | Refuse:
    """What a request with ``key`` gets when a record already holds it."""
    match held:
        case _ if held.fingerprint != fingerprint:
            return Refuse(DIFFERENT_REQUEST)
        case records.Completed(status=status, body=body):
            return Replay(status, body)
        case records.Processing(lock_expired=True):
            # Drop the stale claim so that the client's retry runs.
            await records.drop_expired_lock(conn, scope, key)
            return Refuse(LOCK_EXPIRED)
        case _:
            return Refuse(STILL_PROCESSING)


@dataclass(eq=False)
class Running:
    """A storage unit's attempt at a key, running in this process."""

    started: float
    fingerprint: bytes
    lost: bool = False  # its lock expired and a later request said so


class RunningKeys:
    """The keys of the storage units running in this process.

    A storage unit holds no ``processing`` record (it writes its record once,
    when it commits), so this is how a second request with the key, in this
    process, learns that the first is still processing, or that it has run
    past the processing lock. It is used only on the storage loop, one
    thread, so it needs no lock.
    """

    def __init__(self) -> None:
        self._running: dict[tuple[UUID, str], Running] = {}

    def enter(self, scope: UUID, key: str, fingerprint: bytes) -> tuple[Running, bool]:
        """The request's own attempt and True; or the attempt that runs
        with the key already, and False."""
        held = self._running.get((scope, key))
        if held is not None:
            return held, False
        running = self._running[scope, key] = Running(time.monotonic(), fingerprint)
        return running, True

    def get(self, scope: UUID, key: str) -> Running | None:
        return self._running.get((scope, key))

    def expire(self, scope: UUID, key: str, running: Running, lock_seconds: float) -> bool:
        """Whether ``running`` outlived its lock; if so it must not commit,
        and the key is free for the client's retry."""
        if time.monotonic() - running.started < lock_seconds:
            return False
        running.lost = True
        self.leave(scope, key, running)
        return True

    def leave(self, scope: UUID, key: str, running: Running) -> None:
        if self._running.get((scope, key)) is running:
            del self._running[scope, key]


class Releases:
    """Claims of failed requests that could not be released at once (storage
    was down): released as soon as storage answers again, so that the
    client's retry runs instead of meeting "still processing" until the
    claim's lock expires. One singleton per process works through them."""

    def __init__(self, db: Database, lock_seconds: float) -> None:
        self._db = db
        self._lock_seconds = lock_seconds
        self._send, self._receive = trio.open_memory_channel[tuple[float, UUID, str, UUID]](1024)

    def later(self, scope: UUID, key: str, claim: UUID) -> None:
        try:
            self._send.send_nowait((trio.current_time() + self._lock_seconds, scope, key, claim))
        except trio.WouldBlock:  # its lock frees the key in time anyway
            log.warning("too many idempotency claims wait for their release; this one waits "
                        "for its lock to expire")

    async def run(self) -> None:
        async for deadline, scope, key, claim in self._receive:
            # Not shielded: nothing is cut short by a shutdown here, and the
            # claim's lock frees the key then anyway.
            await hand_back(partial(self._release, scope, key, claim), until=deadline,
                            stopping=lambda: False, shield=False)

    async def _release(self, scope: UUID, key: str, claim: UUID) -> None:
        async with self._db.acquire() as conn:
            await records.release(conn, scope, key, claim)


class IdempotencyKeys:
    """The shards, as HTTP handlers see them."""

    def __init__(
        self, shards: Supervisor[int, Begin], count: int, sealer: Sealer, releases: Releases
    ) -> None:
        self._shards = shards
        self._count = count
        self._sealer = sealer
        self.releases = releases
        self.running = RunningKeys()

    async def begin(self, scope: UUID, key: str, fingerprint: bytes) -> Decision:
        shard = self._shards.handle(hash((scope, key)) % self._count)
        return await shard.ask(lambda reply: Begin(scope, key, fingerprint, reply))

    def opened(self, scope: UUID, key: str, decision: Decision) -> Decision:
        """A decision made on a request's own connection, with its replay opened."""
        return opened(self._sealer, scope, key, decision)

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
    releases = Releases(db, config.idempotency_lock_seconds)
    runtime.singleton("idempotency-releases", releases.run)
    return IdempotencyKeys(shards, config.idempotency_shards, sealer, releases)


__all__ = [
    "Decision", "IdempotencyKeys", "Proceed", "Refuse", "Releases", "Replay", "Running",
    "RunningKeys",
    "answer_held", "decide", "start_idempotency",
]
