"""Webhook delivery: due work of the runtime, one owner actor per endpoint.

Deliveries are due work (``duework.py``) owned by their endpoint: the
runtime's dispatcher wakes an endpoint's actor on the NOTIFY that a
committed event (or a re-enable, or a manual retry) sends with the
endpoint's id, and when its poll finds deliveries nobody announced. The
actor is a :class:`~tidings.actors.duework.LeasedWorker` around an
:class:`EndpointJob`: it claims the endpoint's due deliveries with a lease,
posts them with at most ``webhook_concurrency`` in flight over its own
connection pool, and records each attempt (in batches shared by every
endpoint, ``tidings/webhooks/recording.py``). A slow or dead endpoint ties
up only its own actor. Once the process stops, attempts in flight get
``STOP_SECONDS``; those cut short are given back, not recorded.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import lru_cache
from uuid import UUID

import httpx
import trio

from tidings.actors.duework import Batch, Due, DueWork, LeasedWorker, Wake
from tidings.actors.mailbox import Mailbox
from tidings.actors.runtime import Runtime
from tidings.config import Config
from tidings.ids import new_id
from tidings.storage import webhook_delivery as store
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database
from tidings.storage.webhooks import DUE_CHANNEL
from tidings.webhooks.client import (
    AttemptError,
    ConnectFailed,
    Pool,
    UnsupportedUrl,
    parse_target,
    request_bytes,
)
from tidings.webhooks.recording import Recorded, SharedRecorder
from tidings.webhooks.recording import RecordFailed as RecordFailed  # raised by record
from tidings.webhooks.safety import Guard
from tidings.webhooks.signing import Signer

log = logging.getLogger("tidings.webhooks")

USER_AGENT = b"Tidings-Webhooks/1"
CONTENT_TYPE = b"application/json"
# What an attempt keeps of the response body.
RESPONSE_BODY_LIMIT = 2048
# An endpoint actor with nothing to do for this long stops.
IDLE_SECONDS = 30.0
# A claim leases up to this many times the in-flight limit, in one round trip;
# what is not sent at once waits in the actor's backlog ...
CLAIM_AHEAD = 4
# ... for at most this long: older claimed deliveries are given back unattempted,
# so an endpoint disabled or changed meanwhile sees at most this much of the old.
# When that happens the actor claims less ahead (halving, down to the in-flight
# limit), and more again (a limit's worth per claim) while its backlog keeps up.
BACKLOG_SECONDS = 1.0

# A claimed delivery, with where it goes.
Item = tuple[store.Target, store.Claimed]
# Once the process stops, attempts in flight get this long to finish. One
# still waiting for its receiver then is cut short: not recorded, and its
# delivery given back for the next process to send.
STOP_SECONDS = 5.0
# The status of an attempt's outcome when it was cut short: never recorded.
CUT_SHORT = "cut short"


class Webhooks:
    """The webhook side of one process."""

    def __init__(self, db: Database, config: Config, guard: Guard) -> None:
        self.db = db
        self.config = config
        self.guard = guard
        # Leases this process writes carry this id.
        self.owner = new_id()
        # Long enough for an attempt to finish (the timeout) and be recorded.
        self.lease_seconds = 2 * config.webhook_timeout_seconds + 5
        # The schedule's first number: the wait before a delivery's first attempt.
        self.first_delay = config.webhook_retry_schedule[0]
        self.ssl_context = httpx.create_ssl_context()
        self.due: Due[UUID] | None = None
        # Attempts made by this process, by the state they moved their delivery to.
        self.attempts: Counter[str] = Counter()
        self.recorder = SharedRecorder(self._write_attempts)

    async def _write_attempts(self, done: list[Recorded]) -> None:
        await self.db.run(
            store.record_attempts, done, self.owner, self.config.webhook_auto_disable_after
        )

    def wake(self, endpoint_id: UUID) -> None:
        """Tell the endpoint's actor to look for due deliveries (start it if needed)."""
        if self.due is not None:
            self.due.wake(endpoint_id)

    async def due_endpoints(self, conn: AsyncioConnection, limit: int) -> list[UUID]:
        return await store.due_endpoints(conn, limit, self.first_delay)

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


class EndpointJob:
    """What the actor of one endpoint does with its leased deliveries."""

    def __init__(self, endpoint_id: UUID, webhooks: Webhooks) -> None:
        self._id = endpoint_id
        self._webhooks = webhooks
        self._pool: Pool | None = None
        self._signer: Signer | None = None
        # Claimed deliveries not yet handed out, with when they were claimed.
        self._backlog: deque[tuple[Item, float]] = deque()
        limit = webhooks.config.webhook_concurrency
        self._most_ahead = CLAIM_AHEAD * limit
        # How many deliveries a claim asks for now.
        self._ahead = self._most_ahead
        # The attempts in flight, and when they are cut short (once stopping).
        self._attempts: set[trio.CancelScope] = set()
        self._stop_at = math.inf
        self.lease_seconds = webhooks.lease_seconds

    def stop_within(self, seconds: float) -> None:
        """Cut the attempts in flight short if they are not done in ``seconds``."""
        self._stop_at = min(self._stop_at, trio.current_time() + seconds)
        for attempt in self._attempts:
            attempt.deadline = min(attempt.deadline, self._stop_at)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[object]:
        webhooks = self._webhooks
        pool = Pool(
            webhooks.guard,
            webhooks.ssl_context,
            keep_idle=webhooks.config.webhook_concurrency,
            keepalive_seconds=30.0,
        )
        self._pool = pool
        try:
            yield pool
        finally:
            with trio.CancelScope(shield=True):
                await pool.aclose()
                left = [item for item, _at in self._backlog]
                self._backlog.clear()
                if left:
                    with trio.move_on_after(2):
                        await self.release(left)

    async def claim(self, limit: int) -> Batch[Item]:
        """Hand out up to ``limit`` claimed deliveries, claiming ahead in one round trip."""
        webhooks = self._webhooks
        backlog = self._backlog
        now = trio.current_time()
        stale = []
        while backlog and now - backlog[0][1] > BACKLOG_SECONDS:
            stale.append(backlog.popleft()[0])
        step = webhooks.config.webhook_concurrency
        if stale:
            await self.release(stale)
            self._ahead = max(step, self._ahead // 2)
        next_due_in: float | None = 0.0
        if len(backlog) < limit:
            if not stale:
                self._ahead = min(self._most_ahead, self._ahead + step)
            want = max(limit, self._ahead) - len(backlog)
            claim = await webhooks.db.run(
                store.claim_due,
                self._id,
                webhooks.owner,
                want,
                webhooks.lease_seconds,
                webhooks.first_delay,
            )
            target = claim.target
            if target is None:
                # Disabled or deleted: what was claimed before is not sent either.
                left = [item for item, _at in backlog]
                backlog.clear()
                if left:
                    await self.release(left)
                return Batch([], None)
            backlog.extend(((target, claimed), now) for claimed in claim.deliveries)
            next_due_in = claim.next_due_in
        items = [backlog.popleft()[0] for _ in range(min(limit, len(backlog)))]
        return Batch(items, next_due_in)

    async def perform(self, item: Item) -> store.Outcome:
        with trio.CancelScope(deadline=self._stop_at) as attempt:
            self._attempts.add(attempt)
            try:
                outcome = await self._post(*item)
            finally:
                self._attempts.discard(attempt)
        if attempt.cancelled_caught:
            # Cut short by the stop: given back by ``record``, not recorded.
            return store.Outcome(datetime.now(UTC), 0, None, None, None, CUT_SHORT)
        self._webhooks.attempts[outcome.status] += 1
        return outcome

    async def record(self, done: Sequence[tuple[Item, store.Outcome]]) -> None:
        """Record finished attempts; give back the deliveries of those cut short."""
        cut = [item for item, outcome in done if outcome.status == CUT_SHORT]
        finished = [
            (claimed, outcome) for (_target, claimed), outcome in done
            if outcome.status != CUT_SHORT
        ]
        if cut:
            await self.release(cut)
        if finished:
            await self._webhooks.recorder.record(finished)

    async def release(self, items: Sequence[Item]) -> None:
        webhooks = self._webhooks
        await webhooks.db.run(
            store.release, [claimed.id for _target, claimed in items], webhooks.owner
        )

    def _sign(self, target: store.Target, timestamp: int, body: bytes) -> bytes:
        signer = self._signer
        if signer is None or signer.secrets != target.secrets:
            signer = self._signer = Signer(target.secrets)
        return signer.header(timestamp, body)

    async def _post(self, target: store.Target, claimed: store.Claimed) -> store.Outcome:
        assert self._pool is not None
        webhooks = self._webhooks
        timeout = webhooks.config.webhook_timeout_seconds
        started_at = datetime.now(UTC)
        began = trio.current_time()
        status: int | None = None
        body: str | None = None
        error: str | None = None
        with trio.move_on_after(timeout) as scope:
            try:
                where = parse_target(target.url)
                signature = self._sign(target, int(time.time()), claimed.body)
                request = request_bytes(
                    where,
                    [
                        (b"Content-Type", CONTENT_TYPE),
                        (b"User-Agent", USER_AGENT),
                        (b"X-Service-Event", claimed.event_type.encode()),
                        (b"X-Service-Signature", signature),
                        (b"X-Service-Delivery", str(claimed.id).encode()),
                    ],
                    claimed.body,
                )
                response = await self._pool.post(where, request, keep=RESPONSE_BODY_LIMIT)
                status = response.status
                body = _text(response.body)
            except ConnectFailed as failure:
                error = _text(f"could not connect: {failure}")
            except UnsupportedUrl as failure:
                error = _text(f"unsupported URL: {failure}")
            except AttemptError as failure:
                error = _text(f"connection failed: {failure}")
            except Exception as failure:  # recorded as a failed attempt, never a stuck delivery
                log.exception("attempt of delivery %s failed unexpectedly", claimed.id)
                error = _text(f"request failed: {type(failure).__name__}: {failure}")
        if scope.cancelled_caught and status is None:
            error = f"no response within {timeout:g} s"
        duration_ms = round((trio.current_time() - began) * 1000)
        return webhooks.outcome_of(claimed, started_at, duration_ms, status, body, error)


class EndpointWorker(LeasedWorker[Item, store.Outcome]):
    """The actor of one endpoint: a LeasedWorker whose attempts in flight get
    ``STOP_SECONDS`` once the process stops, rather than their whole timeout."""

    def __init__(self, job: EndpointJob, *, concurrency: int, idle_seconds: float) -> None:
        super().__init__(job, concurrency=concurrency, idle_seconds=idle_seconds)
        self._endpoint_job = job

    async def _loop(self, nursery: trio.Nursery, mailbox: Mailbox[Wake]) -> None:
        # The loop returns once the actor claims no more: when asked to stop,
        # what is in flight then is what the bound applies to.
        await super()._loop(nursery, mailbox)
        if mailbox.stopping:
            self._endpoint_job.stop_within(STOP_SECONDS)


@lru_cache(maxsize=4096)
def _endpoint_id(payload: str) -> UUID:
    """The endpoint a notification names (the same few, many times a second)."""
    return UUID(payload)


def start_webhooks(runtime: Runtime, db: Database, config: Config, guard: Guard) -> Webhooks:
    """Register webhook delivery with the runtime: its due work, one actor per endpoint."""
    webhooks = Webhooks(db, config, guard)

    def endpoint_actor(endpoint_id: UUID) -> EndpointWorker:
        return EndpointWorker(
            EndpointJob(endpoint_id, webhooks),
            concurrency=config.webhook_concurrency,
            idle_seconds=IDLE_SECONDS,
        )

    webhooks.due = runtime.due(
        DueWork(
            name="webhook-endpoints",
            channel=DUE_CHANNEL,
            due=webhooks.due_endpoints,
            parse=_endpoint_id,
            actor=endpoint_actor,
            poll_seconds=config.webhook_poll_seconds,
        )
    )
    return webhooks
