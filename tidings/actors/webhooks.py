"""Webhook delivery: one actor per endpoint, woken by a dispatcher.

The dispatcher of each process LISTENs for the NOTIFY that a committed
event (or a re-enable, or a manual retry) sends with the endpoint's id, and
polls now and then for deliveries nobody told it about: retries that fell
due, leases left by a process that died, notifications lost while its
connection was down. Either way it wakes the endpoint's actor.

An endpoint actor claims its due deliveries (a lease in PostgreSQL, so
that processes sharing a database never attempt one delivery at the same
time), posts them with at most ``webhook_concurrency`` in flight over its own
connection pool, records each attempt, and sleeps until the next delivery
of its endpoint falls due. A slow or dead endpoint ties up only its own
actor. An actor with nothing in flight and nothing scheduled stops after a
while; the next wake starts it again.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID, uuid4

import httpcore
import httpx
import trio
import triopg

from tidings.actors.mailbox import ActorStopped, Mailbox, MailboxFull
from tidings.actors.supervisor import Actor, Supervisor, open_supervisor
from tidings.config import Config
from tidings.storage import webhooks as store
from tidings.storage.db import Database
from tidings.webhooks.safety import Guard, GuardedBackend
from tidings.webhooks.signing import signature_header

log = logging.getLogger("tidings.webhooks")

USER_AGENT = b"Tidings-Webhooks/1"
# What an attempt keeps of the response body.
RESPONSE_BODY_LIMIT = 2048
# An endpoint actor with nothing to do for this long stops.
IDLE_SECONDS = 30.0
# How many endpoints one poll wakes at most.
POLL_BATCH = 1000


@dataclass(frozen=True)
class Wake:
    """There may be deliveries due for this endpoint."""


WAKE = Wake()


class Webhooks:
    """The webhook side of one process."""

    def __init__(self, db: Database, config: Config, guard: Guard) -> None:
        self.db = db
        self.config = config
        self.guard = guard
        # Leases this process writes carry this id.
        self.owner = uuid4()
        # Long enough for an attempt to finish (the timeout) and be recorded.
        self.lease_seconds = 2 * config.webhook_timeout_seconds + 5
        # The schedule's first number: the wait before a delivery's first attempt.
        self.first_delay = config.webhook_retry_schedule[0]
        self.ssl_context = httpx.create_ssl_context()
        self.endpoints: Supervisor[UUID, Wake] | None = None
        self.dispatcher: Supervisor[str, None] | None = None
        # Attempts made by this process, by the state they moved their delivery to.
        self.attempts: Counter[str] = Counter()

    def supervisors(self) -> list[Supervisor[UUID, Wake] | Supervisor[str, None]]:
        return [s for s in (self.endpoints, self.dispatcher) if s is not None]

    def wake(self, endpoint_id: UUID) -> None:
        """Tell the endpoint's actor to look for due deliveries (start it if needed)."""
        if self.endpoints is None:
            return
        try:
            self.endpoints.handle(endpoint_id).try_send(WAKE)
        except MailboxFull:
            pass  # a wake is already waiting
        except ActorStopped:
            pass  # shutting down

    def outcome_of(
        self,
        claimed: store.Claimed,
        started_at: datetime,
        duration_ms: int,
        status: int | None,
        body: str | None,
        error: str | None,
    ) -> store.Outcome:
        """The delivery's next state after this attempt."""
        if status is not None and 200 <= status < 300:
            return store.Outcome(started_at, duration_ms, status, body, error, "succeeded")
        if error is None:
            error = f"the endpoint answered {status}"
        schedule = self.config.webhook_retry_schedule
        # Which attempt this was in its round: the schedule's, or a manual retry's one.
        number = claimed.attempt_count + 1
        if claimed.retry_base == 0 and number < len(schedule):
            delay = schedule[number] * random.uniform(1.0, 1.1)
            return store.Outcome(
                started_at, duration_ms, status, body, error, "retrying", delay
            )
        return store.Outcome(started_at, duration_ms, status, body, error, "failed")


def _text(raw: bytes | str) -> str:
    """Text PostgreSQL can store: valid UTF-8 without NUL characters."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return text.replace("\x00", "")


class EndpointActor(Actor[Wake]):
    # The actor decides itself when it is idle: not while attempts are in flight.
    idle_timeout = None

    def __init__(self, endpoint_id: UUID, runtime: Webhooks) -> None:
        self._id = endpoint_id
        self._runtime = runtime
        self._limit = runtime.config.webhook_concurrency
        self._in_flight = 0
        self._poked = trio.Event()
        # Attempts made and not yet recorded, and the recorder's wake-up.
        self._outcomes: list[tuple[store.Claimed, store.Outcome]] = []
        self._to_record = trio.Event()
        self._closing = False

    async def run(self, mailbox: Mailbox[Wake]) -> None:
        runtime = self._runtime
        pool = httpcore.AsyncConnectionPool(
            ssl_context=runtime.ssl_context,
            max_connections=self._limit,
            max_keepalive_connections=self._limit,
            keepalive_expiry=30.0,
            retries=0,
            network_backend=GuardedBackend(runtime.guard),
        )
        async with pool, trio.open_nursery() as nursery:
            listening = trio.CancelScope()
            nursery.start_soon(self._listen, mailbox, listening)
            nursery.start_soon(self._recorder)
            try:
                await self._loop(nursery, pool, mailbox)
            finally:
                listening.cancel()
                # In-flight attempts finish and are recorded before the actor ends.
                self._closing = True
                self._to_record.set()

    async def _listen(self, mailbox: Mailbox[Wake], scope: trio.CancelScope) -> None:
        with scope:
            async for _wake in mailbox:
                self._poked.set()
        self._poked.set()  # asked to stop

    async def _loop(
        self, nursery: trio.Nursery, pool: httpcore.AsyncConnectionPool, mailbox: Mailbox[Wake]
    ) -> None:
        runtime = self._runtime
        idle_deadline = trio.current_time() + IDLE_SECONDS
        while not mailbox.stopping:
            self._poked = trio.Event()
            deadline = math.inf
            free = self._limit - self._in_flight
            if free > 0:
                claim = await runtime.db.run(
                    store.claim_due,
                    self._id,
                    runtime.owner,
                    free,
                    runtime.lease_seconds,
                    runtime.first_delay,
                )
                for claimed in claim.deliveries:
                    self._in_flight += 1
                    nursery.start_soon(self._attempt, pool, claim.target, claimed)
                if claim.deliveries:
                    idle_deadline = trio.current_time() + IDLE_SECONDS
                if len(claim.deliveries) == free:
                    continue  # there may be more: claim again once a slot frees
                if claim.next_due is not None:
                    wait = (claim.next_due - datetime.now(UTC)).total_seconds()
                    deadline = trio.current_time() + max(wait, 0.005)
            if self._in_flight == 0 and deadline == math.inf:
                deadline = idle_deadline
            with trio.move_on_at(deadline):
                await self._poked.wait()
            if (
                not self._poked.is_set()
                and self._in_flight == 0
                and trio.current_time() >= idle_deadline
            ):
                return  # idle: nothing in flight, nothing scheduled

    async def _attempt(
        self,
        pool: httpcore.AsyncConnectionPool,
        target: store.Target | None,
        claimed: store.Claimed,
    ) -> None:
        made = False
        try:
            assert target is not None
            outcome = await self._post(pool, target, claimed)
            self._runtime.attempts[outcome.status] += 1
            self._outcomes.append((claimed, outcome))
            made = True
        finally:
            self._in_flight -= 1
            if not made:
                # Cut short (shutdown): give the delivery back for another attempt now.
                with trio.move_on_after(2, shield=True):
                    await self._runtime.db.run(store.release, [claimed.id], self._runtime.owner)
            self._to_record.set()

    async def _recorder(self) -> None:
        """Record finished attempts: all those waiting, in one round trip.

        While one batch is written the next gathers, so a busy endpoint
        writes many attempts per round trip and an idle one waits for none.
        """
        runtime = self._runtime
        while True:
            await self._to_record.wait()
            self._to_record = trio.Event()
            batch, self._outcomes = self._outcomes, []
            if batch:
                try:
                    await runtime.db.run(
                        store.record_attempts,
                        batch,
                        runtime.owner,
                        runtime.config.webhook_auto_disable_after,
                    )
                except BaseException:
                    # Not recorded (shutdown cut it short, or storage failed):
                    # hand the deliveries back rather than wait for the leases.
                    with trio.move_on_after(2, shield=True):
                        await runtime.db.run(
                            store.release, [claimed.id for claimed, _ in batch], runtime.owner
                        )
                    raise
                self._poked.set()  # a retry due at once may be claimable now
            if self._closing and self._in_flight == 0 and not self._outcomes:
                return

    async def _post(
        self, pool: httpcore.AsyncConnectionPool, target: store.Target, claimed: store.Claimed
    ) -> store.Outcome:
        runtime = self._runtime
        timeout = runtime.config.webhook_timeout_seconds
        started_at = datetime.now(UTC)
        began = trio.current_time()
        headers = [
            (b"Content-Type", b"application/json"),
            (b"User-Agent", USER_AGENT),
            (b"X-Service-Event", claimed.event_type.encode()),
            (
                b"X-Service-Signature",
                signature_header(target.secrets, int(time.time()), claimed.body).encode(),
            ),
            (b"X-Service-Delivery", str(claimed.id).encode()),
        ]
        status: int | None = None
        body: str | None = None
        error: str | None = None
        with trio.move_on_after(timeout) as scope:
            try:
                async with pool.stream(
                    "POST",
                    target.url,
                    headers=headers,
                    content=claimed.body,
                    extensions={"timeout": {"connect": timeout, "read": timeout,
                                            "write": timeout, "pool": timeout}},
                ) as response:
                    status = response.status
                    collected = bytearray()
                    async for chunk in response.aiter_stream():
                        collected += chunk
                        if len(collected) >= RESPONSE_BODY_LIMIT:
                            break
                    body = _text(bytes(collected[:RESPONSE_BODY_LIMIT]))
            except httpcore.TimeoutException:
                error = f"no response within {timeout:g} s"
            except httpcore.ConnectError as failure:
                error = _text(f"could not connect: {failure}")
            except (httpcore.NetworkError, httpcore.ProtocolError) as failure:
                error = _text(f"connection failed: {failure or type(failure).__name__}")
            except httpcore.UnsupportedProtocol as failure:
                error = _text(f"unsupported URL: {failure}")
            except Exception as failure:  # recorded as a failed attempt, never a stuck delivery
                log.exception("attempt of delivery %s failed unexpectedly", claimed.id)
                error = _text(f"request failed: {type(failure).__name__}: {failure}")
        if scope.cancelled_caught and status is None:
            error = f"no response within {timeout:g} s"
        duration_ms = round((trio.current_time() - began) * 1000)
        return runtime.outcome_of(claimed, started_at, duration_ms, status, body, error)


class Dispatcher(Actor[None]):
    """Wakes endpoint actors: on NOTIFY at once, and by polling as a safety net."""

    idle_timeout = None

    def __init__(self, runtime: Webhooks) -> None:
        self._runtime = runtime
        self._poll_now = trio.Event()

    async def run(self, mailbox: Mailbox[None]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen)
            nursery.start_soon(self._poll)
            await mailbox.sleep(math.inf)  # until the supervisor says stop
            nursery.cancel_scope.cancel()

    async def _listen(self) -> None:
        runtime = self._runtime
        async with triopg.connect(runtime.db.url) as conn:
            async with conn.listen(store.DUE_CHANNEL, max_buffer_size=10_000) as due:
                # Anything that fell due while nobody listened is found by a poll.
                self._poll_now.set()
                async for payload in due:
                    if isinstance(payload, str):
                        runtime.wake(UUID(payload))
                    else:  # the buffer overflowed: some were missed
                        self._poll_now.set()

    async def _poll(self) -> None:
        runtime = self._runtime
        while True:
            self._poll_now = trio.Event()
            due = await runtime.db.run(store.due_endpoints, POLL_BATCH, runtime.first_delay)
            for endpoint_id in due:
                runtime.wake(endpoint_id)
            with trio.move_on_after(runtime.config.webhook_poll_seconds):
                await self._poll_now.wait()


@asynccontextmanager
async def open_webhooks(db: Database, config: Config, guard: Guard) -> AsyncIterator[Webhooks]:
    """Run the dispatcher and the endpoint actors of this process."""
    runtime = Webhooks(db, config, guard)
    endpoint: Callable[[UUID], Actor[Wake]] = lambda key: EndpointActor(key, runtime)  # noqa: E731
    dispatcher: Callable[[str], Actor[None]] = lambda _key: Dispatcher(runtime)  # noqa: E731
    async with (
        open_supervisor("webhook-endpoints", endpoint, mailbox_size=1) as endpoints,
        open_supervisor("webhook-dispatcher", dispatcher, mailbox_size=1) as dispatchers,
    ):
        runtime.endpoints = endpoints
        runtime.dispatcher = dispatchers
        dispatchers.start("dispatcher")
        yield runtime
