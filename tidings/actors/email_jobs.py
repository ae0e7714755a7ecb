"""What the send worker of one team does with its leased emails (``SendJob``),
and what one attempt keeps as it goes (``Underway``); the process's email
side is ``tidings.actors.emails``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

import trio

from tidings.actors.duework import Batch, Due
from tidings.config import Config
from tidings.providers.email import EmailProvider, Progress
from tidings.storage import emails_sending as store
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database
from tidings.storage.domains import verified_domain_ids
from tidings.storage.emails import Change, Clock
from tidings.storage.errors import outage

log = logging.getLogger("tidings.emails")

# How soon a lease renewal that storage failed is tried again.
RENEW_RETRY_SECONDS = 0.5

FOLLOWUPS = "followups"


class Emails(Protocol):
    """What a send job needs of the process's email side
    (``tidings.actors.emails.Emails``)."""

    db: Database
    config: Config
    provider: EmailProvider
    owner: UUID  # the lease owner: this process
    followups: Due[str] | None

    async def attempt(
        self, email: store.Claimed, domain_id: UUID | None, underway: Underway | None = None
    ) -> store.Attempted: ...

    def cut_short(self, email: store.Claimed, underway: Underway) -> store.Attempted | None: ...


@dataclass
class Underway:
    """An attempt as it goes: what it will record besides the provider's
    outcomes (the email's ``queued``, its suppressed recipients), and what
    the provider has done so far (``Emails.cut_short``)."""

    progress: Progress = field(default_factory=Progress)
    changes: list[Change] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)
    data: dict[str, Any] = field(default_factory=dict)
    recipients: tuple[str, ...] = ()
    # The attempt ran to its end: only its recording can have failed.
    finished: bool = False




async def claim_with_domains(
    conn: AsyncioConnection, team_id: UUID, owner: UUID, lease_seconds: float, limit: int
) -> tuple[list[store.Claimed], float | None, dict[str, UUID]]:
    """``store.claim``, and which of the claimed emails' domains are verified
    domains of the team at this moment (by name, with their ids): a domain
    deleted or failed a moment ago sends nothing more, in any process."""
    claimed, next_in = await store.claim(conn, team_id, owner, lease_seconds, limit)
    verified = await verified_domain_ids(conn, team_id, {item.domain for item in claimed})
    return claimed, next_in, verified


class SendJob:
    """What the actor of one team does with its leased emails.

    While emails wait for the provider (its connections may all be busy) or
    are being sent, their leases are renewed every third of the lease, so
    that another process never takes up an email this one is still sending.
    An email whose lease was lost anyway (this process stalled) is not sent,
    and nothing is recorded for it. An email handed back after its attempt
    began (cut short, or not recorded) may have reached some recipients: it
    is given back as taken up (``store.give_back``), never as scheduled.
    """

    def __init__(self, team_id: UUID, emails: Emails) -> None:
        self._team_id = team_id
        self._emails = emails
        self._held: set[UUID] = set()
        self._lost: set[UUID] = set()
        # When each held lease ends at the latest, on trio's clock as this
        # process last took or renewed it (the clock started before the
        # statement, so never later than PostgreSQL's): a process that
        # stalled past it begins no hand-over (``may_begin``).
        self._ends: dict[UUID, float] = {}
        # Held emails whose attempt began, as it goes; those skipped because
        # their lease was lost.
        self._begun: dict[UUID, Underway] = {}
        # What attempts that ran to their end are to record, until they are.
        self._finished: dict[UUID, store.Attempted] = {}
        self._skipped: set[UUID] = set()
        # Of each claimed email, its verified domain's id as the claim found it.
        self._domain_ids: dict[UUID, UUID | None] = {}
        self._told_outage = False

    @property
    def lease_seconds(self) -> float:
        return self._emails.config.email_lease_seconds

    @asynccontextmanager
    async def open(self) -> AsyncIterator[object]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew)
            yield None
            nursery.cancel_scope.cancel()

    async def _renew(self) -> None:
        emails = self._emails
        lease = emails.config.email_lease_seconds
        wait = lease / 3
        while True:
            await trio.sleep(wait)
            wait = lease / 3
            held = list(self._held)
            if held:
                asked = trio.current_time()
                try:
                    kept = await emails.db.run(store.renew, held, emails.owner, lease)
                except Exception as error:
                    if not outage(error):
                        raise
                    # Storage is down: the leases stay as they were, and no
                    # hand-over begins past their ends (``may_begin``), as
                    # after a stall. Raising would cut every send under way
                    # short, and the recipient mid-transaction of each could
                    # get the message twice.
                    wait = RENEW_RETRY_SECONDS
                    continue
                # Not those recorded or released meanwhile: their leases ended here.
                self._lost.update((set(held) - kept) & self._held)
                self._ends.update((key, asked + lease) for key in kept & self._held)

    async def claim(self, limit: int) -> Batch[store.Claimed]:
        emails = self._emails
        asked = trio.current_time()
        sending = set(self._held)
        claimed, next_in, verified = await emails.db.run(
            claim_with_domains, self._team_id, emails.owner,
            emails.config.email_lease_seconds, limit,
        )
        ends = asked + emails.config.email_lease_seconds
        self._ends.update((item.id, ends) for item in claimed)
        # An email this actor is still sending, whose lease ended while the
        # process stalled and that the claim took again: the attempt under
        # way goes on under the new lease; a second would send it twice.
        again = {item.id for item in claimed} & self._held
        self._lost -= again
        # One whose attempt was recorded while the claim ran: the claim may
        # have taken it before the record (which then ended the new lease
        # too), so it is not begun again but skipped, as a lost one is, and
        # its lease released with the next record; were it recorded first
        # and due again at once, the next claim takes it.
        self._lost |= {item.id for item in claimed} & (sending - self._held)
        claimed = [item for item in claimed if item.id not in again]
        self._held.update(item.id for item in claimed)
        self._domain_ids.update({item.id: verified.get(item.domain) for item in claimed})
        return Batch(claimed, next_in)

    async def perform(self, item: store.Claimed) -> store.Attempted:
        domain_id = self._domain_ids.pop(item.id, None)
        if item.id in self._lost:
            # Another process may have it now: leave it alone. Nothing is
            # recorded for it: an attempt that sent nothing must not write
            # the email as done, were the lease this process's after all.
            return self._skip(item)
        underway = self._begun[item.id] = Underway()
        underway.progress.may_begin = lambda: self._holds(item.id)
        attempted = await self._emails.attempt(item, domain_id, underway)
        if underway.progress.stopped:
            # What was handed over is recorded (if the lease is still this
            # process's), the rest tried again at once; nothing handed over:
            # the email is released, as if never claimed.
            cut = self._emails.cut_short(item, underway)
            if cut is None:
                return self._skip(item)
            attempted = cut
        underway.finished = True
        return attempted

    def _skip(self, item: store.Claimed) -> store.Attempted:
        """An attempt that handed nothing over: nothing is recorded for it,
        and the email is released if its lease is still this process's."""
        self._skipped.add(item.id)
        return store.Attempted(item, None, None, None, None, self._emails.provider.name, [])

    def _holds(self, key: UUID) -> bool:
        """Whether this process surely still holds the email's lease: not
        lost at a renewal, and not past its end with a margin for the
        hand-over to begin (a stall of the process, a long wait for a
        connection)."""
        margin = min(1.0, self._emails.config.email_lease_seconds / 10)
        return key not in self._lost and trio.current_time() < self._ends.get(key, 0) - margin

    async def record(self, done: Sequence[tuple[store.Claimed, store.Attempted]]) -> None:
        emails = self._emails
        attempted = [outcome for item, outcome in done if item.id not in self._skipped]
        self._finished.update((a.email.id, a) for a in attempted)
        skipped = [item.id for item, _outcome in done if item.id in self._skipped]
        # Not recorded, the batch is handed back (``release``), which forgets it.
        await emails.db.run(store.record_attempts, emails.owner, attempted, skipped)
        self._forget([item for item, _outcome in done])
        if any(a.followups for a in attempted) and emails.followups is not None:
            emails.followups.wake(FOLLOWUPS)

    async def release(self, items: Sequence[store.Claimed]) -> None:
        emails = self._emails
        begun = [item for item in items if item.id in self._begun]
        unbegun = [item.id for item in items if item.id not in self._begun]
        # What the provider finished with before the attempt was cut
        # short is recorded; the rest is tried again at once.
        # An attempt that ran to its end and whose recording was cut short
        # (a shutdown) is recorded as it was; one cut short, as far as it got.
        partial = [
            attempted for item in begun
            if (attempted := self._finished.get(item.id) or (
                None if self._begun[item.id].finished
                else emails.cut_short(item, self._begun[item.id])
            )) is not None
        ]
        recorded: set[UUID] = set()
        if partial:
            try:
                await emails.db.run(store.record_attempts, emails.owner, partial)
                recorded = {attempted.email.id for attempted in partial}
            except Exception as error:
                if outage(error):
                    # Not given back meanwhile (it would be sent again): the
                    # hand-back is tried again until storage answers.
                    if not self._told_outage:
                        self._told_outage = True
                        log.warning("could not record %d attempts cut short: %s; trying "
                                    "again until storage answers", len(partial), error)
                    raise
                log.warning("could not record %d attempts cut short", len(partial),
                            exc_info=True)
        back = [item.id for item in begun if item.id not in recorded]
        if back:
            await emails.db.run(store.give_back, back, emails.owner)
        if unbegun:
            await emails.db.run(store.release, unbegun, emails.owner)
        # Kept until handed back: a hand-back that failed (storage down) is
        # tried again (``tidings.actors.handback``) with what it knew.
        self._forget(items)

    def _forget(self, items: Sequence[store.Claimed]) -> None:
        for item in items:
            for ids in (self._held, self._lost, self._skipped):
                ids.discard(item.id)
            self._begun.pop(item.id, None)
            self._finished.pop(item.id, None)
            self._ends.pop(item.id, None)


