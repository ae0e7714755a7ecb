"""The SMS send worker: due messages handed to the SMS provider, statuses recorded.

Two kinds of due work on the runtime (``tidings.actors.duework``), shaped as
the email worker's:

* ``sms-senders``: one actor per team with due messages (queued, scheduled
  and now due, or retrying). It claims them with a lease, moves each to
  ``processing``, hands it to the provider (``TIDINGS_SMS_CONCURRENCY`` in
  flight), and records finished attempts in batches, each batch in one
  transaction with its status moves and the statuses and replies the
  provider announced for later (``sms_followups``); then, with a provider
  that calls back, the statuses it reported before the batch's provider
  ids were stored (``sms_early_reports``). A provider that did
  not take the message (HTTP 429, 5xx, unreachable) is tried again after
  ``TIDINGS_SMS_RETRY_SCHEDULE`` (or its ``Retry-After``, if later, up to
  a day); after the last step the message is ``failed``. An answer that
  cannot be made into an outcome fails that message alone (or makes it
  ``unknown``, if the provider took it): an attempt never raises, since
  one that did would end the team's actor and cut short the sends in
  flight beside it, which the provider may have taken, to be sent again.
  Accepting a message NOTIFYs its team's actor.
* ``sms-followups``: one actor per process (``tidings.actors.drain``) that
  records followups as they fall due, many per transaction.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from uuid import UUID

import trio

from tidings.actors.drain import Drain
from tidings.actors.duework import Batch, Due, DueWork, LeasedWorker
from tidings.actors.runtime import Runtime
from tidings.config import Config
from tidings.gathering import Gathering
from tidings.ids import new_id
from tidings.providers.sms import (
    MAX_RETRY_AFTER,
    AnswerLost,
    OutgoingSms,
    Retry,
    SmsProvider,
    SmsResult,
    SmsStatus,
)
from tidings.storage import sms_sending as store
from tidings.storage.db import Database
from tidings.storage.sms import DUE_CHANNEL, NewSms, Report, Sms
from tidings.storage.sms_group import accept_group

log = logging.getLogger("tidings.sms")

IDLE_SECONDS = 30.0
FOLLOWUPS = "followups"
STATUS_CALLBACK_PATH = "/providers/twilio/status"
# The code of an attempt whose provider's answer could not be recorded.
UNRECORDABLE = "unrecordable_answer"
# The code of a message whose send began and whose answer was lost.
ANSWER_LOST = "answer_lost"


class SmsSide:
    """The SMS side of one process: its provider and its due work."""

    def __init__(self, db: Database, config: Config, provider: SmsProvider) -> None:
        self.db = db
        self.config = config
        self.provider = provider
        # Leases this process writes carry this id.
        self.owner = new_id()
        self.senders: Due[UUID] | None = None
        self.followups: Due[str] | None = None
        # Attempts by what they recorded: submitted, retrying, failed, ...
        self.attempts: Counter[str] = Counter()
        # Concurrent sends of a team, stored together (asyncio side).
        self.accepting: Gathering[UUID, NewSms, Sms] = Gathering(
            lambda conn, team_id, messages: accept_group(conn, team_id, messages, config.quotas)
        )

    @property
    def status_callback(self) -> str | None:
        """Where the provider reports statuses, for providers that call back."""
        if self.provider.name == "sandbox":
            return None
        return self.config.public_url + STATUS_CALLBACK_PATH

    def callback_for(self, sms_id: UUID) -> str | None:
        """The status callback of one message: it names the message, so that
        its statuses find it even when the answer with its provider id was
        lost (``answer_lost``). Signed by the provider with the rest of the URL."""
        base = self.status_callback
        return None if base is None else f"{base}?sms={sms_id}"

    def retry_at(self, attempt: int, now: datetime, at_least: timedelta | None) -> datetime | None:
        """When attempt ``attempt`` (from 1) is followed by another; None: it was the last."""
        schedule = self.config.sms_retry_schedule
        if attempt > len(schedule):
            return None
        wait = timedelta(seconds=schedule[attempt - 1] * random.uniform(1.0, 1.1))
        if at_least is not None and at_least > wait:
            # Never past a day, whatever the provider asked: a longer wait
            # could fall past the last date there is.
            wait = max(wait, min(at_least, MAX_RETRY_AFTER))
        return now + wait

    async def attempt(self, sms: store.Claimed, claimed_at: datetime) -> store.Attempted:
        """Send ``sms`` once; what to record."""
        name = self.provider.name
        processing = [] if sms.status != "queued" else [
            Report(sms.id, "processing", name, occurred_at=claimed_at)
        ]
        if sms.send_begun_at is not None:
            # Its send began and the answer was lost (the process stopped, or
            # the provider did not answer in time): the provider may have
            # texted the person, so it is never sent again.
            return self._answer_lost(sms, name, processing, "the process sending it stopped")
        refusal = None
        if sms.opted_out:
            refusal = ("opted_out", "the recipient has opted out of messages from the team")
        elif not sms.sender_ok:
            refusal = ("sender_not_approved", f"{sms.from_sender!r} is not an approved sender ID")
        if refusal is not None:
            self.attempts["failed"] += 1
            failed = Report(sms.id, "failed", name, *refusal)
            return store.Attempted(sms, name, None, [*processing, failed])
        outgoing = OutgoingSms(
            message_id=sms.id, team_id=sms.team_id, to=sms.to_number, sender=sms.from_sender,
            body=sms.body, status_callback=self.callback_for(sms.id),
        )
        if self.provider.texts_people and not await self.db.run(
            store.begin_send, sms.id, self.owner
        ):
            return store.Attempted(sms, name, None, [])  # no longer ours: nothing to record
        # A send that takes longer than half the lease is given up, whatever
        # the provider's own timeouts (they bound each read, not the whole
        # answer), so its message is recorded before another process could
        # take it up again.
        seconds = self.config.sms_lease_seconds / 2
        with trio.move_on_after(seconds) as deadline:
            try:
                result = await self.provider.send(outgoing)
            except AnswerLost as lost:
                return self._answer_lost(sms, name, processing, str(lost))
            except Exception as failure:  # a provider bug: retried, never a stuck message
                log.exception("sending SMS %s failed unexpectedly", sms.id)
                result = SmsResult(name, None, retry=Retry(
                    None, f"the provider failed: {type(failure).__name__}: {failure}"
                ))
        if deadline.cancelled_caught:
            return self._answer_lost(sms, name, processing,
                                     f"the provider did not answer within {seconds:g} s")
        try:
            return self._finish(sms, result, list(processing))
        except Exception:  # one bad answer: this message alone, never the team's actor
            log.exception("SMS %s: the provider's answer could not be recorded", sms.id)
            return self._unrecordable(sms, result, processing)

    def _answer_lost(
        self, sms: store.Claimed, provider: str, processing: list[Report], why: str
    ) -> store.Attempted:
        """``unknown``: the provider may have taken the message (not sent again)."""
        self.attempts["unknown"] += 1
        log.warning("SMS %s: the answer to its send was lost (%s): unknown", sms.id, why)
        lost = Report(sms.id, "unknown", provider, ANSWER_LOST,
                      f"the answer to the send was lost ({why}); not sent again, which could "
                      "text the person twice")
        return store.Attempted(sms, provider, None, [*processing, lost])

    def _unrecordable(
        self, sms: store.Claimed, result: SmsResult, processing: list[Report]
    ) -> store.Attempted:
        """What to record when ``_finish`` failed on the provider's answer:
        ``failed`` when the provider did not take the message, ``unknown``
        when it may have (sending again could text the person twice). The
        provider's own words stay in the log."""
        taken = result.retry is None or result.provider_message_id is not None
        status: SmsStatus = "unknown" if taken else "failed"
        self.attempts[status] += 1
        report = Report(
            sms.id, status, result.provider, UNRECORDABLE,
            "the provider's answer could not be recorded", message_id=result.provider_message_id,
        )
        return store.Attempted(sms, result.provider, None, [*processing, report])

    def _finish(
        self, sms: store.Claimed, result: SmsResult, reports: list[Report]
    ) -> store.Attempted:
        now = datetime.now(UTC)
        if result.retry is not None:
            retry_at = self.retry_at(sms.attempt_count + 1, now, result.retry.after)
            if retry_at is not None:
                log.info("SMS %s: retry at %s: %s", sms.id, retry_at, result.retry.message)
                self.attempts["retrying"] += 1
                return store.Attempted(sms, result.provider, retry_at, reports)
            self.attempts["failed"] += 1
            reports.append(Report(sms.id, "failed", result.provider, result.retry.code,
                                  result.retry.message))
            return store.Attempted(sms, result.provider, None, reports)
        # At the answer's time (a microsecond apart, in order), not when the
        # batch is recorded: the statuses that follow are due from it, and a
        # recording that lags (a stalled or restarting process) must not put
        # `submitted` after them.
        for n, update in enumerate(result.now(), start=1):
            reports.append(Report(sms.id, update.status, result.provider, update.code,
                                  update.message, message_id=result.provider_message_id,
                                  occurred_at=now + timedelta(microseconds=n)))
        followups = [
            store.Followup(sms.id, "status", now + u.after, result.provider, u.status,
                           code=u.code, message=u.message)
            for u in result.later()
        ] + [
            store.Followup(sms.id, "inbound", now + i.after, result.provider, body=i.body)
            for i in result.inbound
        ]
        self.attempts[reports[-1].status if reports else "sent"] += 1
        return store.Attempted(sms, result.provider, None, reports, followups)


class SendJob:
    """What the actor of one team does with its leased messages. A send is
    one HTTP request given up after half the lease (``SmsSide.attempt``),
    so leases are not renewed."""

    def __init__(self, team_id: UUID, side: SmsSide) -> None:
        self._team_id = team_id
        self._side = side
        self._claimed_at: dict[UUID, datetime] = {}

    @property
    def lease_seconds(self) -> float:
        return self._side.config.sms_lease_seconds

    def open(self) -> AbstractAsyncContextManager[object]:
        return nullcontext()

    async def claim(self, limit: int) -> Batch[store.Claimed]:
        side = self._side
        claimed, next_in = await side.db.run(
            store.claim, self._team_id, side.owner, side.config.sms_lease_seconds, limit
        )
        now = datetime.now(UTC)
        for item in claimed:
            self._claimed_at[item.id] = now
        return Batch(claimed, next_in)

    async def perform(self, item: store.Claimed) -> store.Attempted:
        return await self._side.attempt(item, self._claimed_at.pop(item.id, datetime.now(UTC)))

    async def record(self, done: Sequence[tuple[store.Claimed, store.Attempted]]) -> None:
        side = self._side
        attempted = [outcome for _item, outcome in done]
        await side.db.run(store.record_attempts, side.owner, attempted,
                          calls_back=side.status_callback is not None)
        if any(a.followups for a in attempted) and side.followups is not None:
            side.followups.wake(FOLLOWUPS)

    async def release(self, items: Sequence[store.Claimed]) -> None:
        for item in items:
            self._claimed_at.pop(item.id, None)
        await self._side.db.run(store.release, [item.id for item in items], self._side.owner)


def start_sms(runtime: Runtime, db: Database, config: Config, provider: SmsProvider) -> SmsSide:
    """Register SMS sending with the runtime: one actor per team, and the followups."""
    side = SmsSide(db, config, provider)

    def sender(team_id: UUID) -> LeasedWorker[store.Claimed, store.Attempted]:
        return LeasedWorker(
            SendJob(team_id, side), concurrency=config.sms_concurrency, idle_seconds=IDLE_SECONDS
        )

    side.senders = runtime.due(
        DueWork(
            name="sms-senders",
            channel=DUE_CHANNEL,
            due=store.due_teams,
            parse=UUID,
            actor=sender,
            poll_seconds=config.sms_poll_seconds,
        )
    )
    side.followups = runtime.due(
        DueWork(
            name="sms-followups",
            channel=f"{DUE_CHANNEL}_followups",
            due=store.followups_due,
            parse=str,
            actor=lambda _key: Drain(db, store.record_due_followups, idle_seconds=IDLE_SECONDS),
            poll_seconds=config.sms_poll_seconds,
        )
    )
    return side
