"""The send worker: due emails handed to the email provider, outcomes recorded.

Two kinds of due work on the runtime (``tidings.actors.duework``):

* ``email-senders``: one actor per team with due emails (queued, scheduled
  and now due, or retrying). It claims them with a lease, hands each to the
  provider (``TIDINGS_EMAIL_CONCURRENCY`` in flight), and records finished
  attempts in batches: each batch in one transaction with its events, the
  outcomes the provider announced for later (as ``email_followups`` rows),
  and the suppressions that bounces and complaints cause. Deferred
  recipients are tried again after ``TIDINGS_EMAIL_RETRY_SCHEDULE`` and
  fail after its last step. Accepting an email NOTIFYs its team's actor.
* ``email-followups``: one actor per process that records followups as
  they fall due, many per transaction; any process may take any of them.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from tidings.actors.drain import Drain
from tidings.actors.duework import Due, DueWork, LeasedWorker
from tidings.actors.email_jobs import SendJob, Underway
from tidings.actors.runtime import Runtime
from tidings.actors.service_keys import SharedKey
from tidings.config import Config
from tidings.email.bounce_addresses import KEY_NAME, BounceKey
from tidings.gathering import Gathering
from tidings.ids import new_id
from tidings.providers.email import (
    Deferral,
    DkimKey,
    EmailProvider,
    EmailResult,
    OutgoingEmail,
    Progress,
)
from tidings.storage import emails_sending as store
from tidings.storage.db import Database
from tidings.storage.domains import SendingDomain, domain_key
from tidings.storage.emails import DUE_CHANNEL, Change, Clock, recipients_text
from tidings.storage.emails_accept import NewEmail, accept

log = logging.getLogger("tidings.emails")

IDLE_SECONDS = 30.0
FOLLOWUP_BATCH = 1000


class Emails:
    """The email side of one process."""

    def __init__(self, db: Database, config: Config, provider: EmailProvider) -> None:
        self.db = db
        self.config = config
        self.provider = provider
        # Leases this process writes carry this id.
        self.owner = new_id()
        self.senders: Due[UUID] | None = None
        self.followups: Due[str] | None = None
        # Attempts by what they recorded: sent, retrying, failed, suppressed.
        self.attempts: Counter[str] = Counter()
        self._keys: dict[UUID, SendingDomain] = {}
        self._bounce_key = SharedKey(
            db, config.secret_key, KEY_NAME, BounceKey, BounceKey.derived
        )
        # Concurrent single sends of a team, stored together (asyncio side).
        self.accepting: Gathering[UUID, NewEmail, NewEmail] = Gathering(
            lambda conn, team_id, emails: accept(conn, team_id, emails, config.quotas)
        )

    async def bounce_key(self) -> BounceKey:
        """The key that tags bounce addresses (``tidings.actors.service_keys``)."""
        return await self._bounce_key.get()

    async def domain(self, domain_id: UUID | None) -> SendingDomain | None:
        """The key of the verified domain ``domain_id`` (None: not verified).

        Whether a domain is verified is read with every claim (``claim``);
        only its name and key, which never change, are kept here.
        """
        if domain_id is None:
            return None
        found = self._keys.get(domain_id)
        if found is None:
            found = await self.db.run(domain_key, domain_id)
            if found is None:
                return None  # deleted since the claim
            if len(self._keys) > 10_000:
                self._keys.clear()
            self._keys[domain_id] = found
        return found

    def retry_at(self, attempt: int, now: datetime) -> datetime | None:
        """When attempt ``attempt`` (from 1) is followed by another; None: it was the last."""
        schedule = self.config.email_retry_schedule
        if attempt > len(schedule):
            return None
        return now + timedelta(seconds=schedule[attempt - 1] * random.uniform(1.0, 1.1))

    async def attempt(
        self, email: store.Claimed, domain_id: UUID | None, underway: Underway | None = None
    ) -> store.Attempted:
        """Send ``email`` once to its recipients still to try, from its domain
        ``domain_id`` (None: not a verified domain of the team); what to record.
        ``underway`` keeps what the attempt has done as it goes (``cut_short``)."""
        provider = self.provider.name
        underway = Underway() if underway is None else underway
        clock = underway.clock
        data = underway.data = email.data()
        blocked = set(email.send_to if email.unsubscribed else email.suppressed)
        reason = ("the contact has unsubscribed from this mail" if email.unsubscribed
                  else "the address is on the team's suppression list")
        changes = underway.changes
        if email.status == "scheduled" and email.attempt_count == 0:
            # Fallen due: queued now, as an email sent at once is when accepted.
            changes.append(Change(email.id, email.team_id, "queued",
                                  recipients_text(email.to_addresses), clock.tick(), provider,
                                  data))
        changes.extend(
            Change(email.id, email.team_id, "suppressed", address, clock.tick(), provider, data,
                   message=reason)
            for address in email.send_to if address in blocked
        )
        recipients = [a for a in email.send_to if a not in blocked]
        underway.recipients = tuple(recipients)
        domain = await self.domain(domain_id) if recipients else None
        if not recipients:
            result = EmailResult(provider, None)
        elif domain is None:
            result = EmailResult(provider, None, deferred=tuple(
                Deferral(r, None, f"{email.domain} is not a verified sending domain any more")
                for r in recipients
            ))
            # Nothing to wait for: fail now.
            return self._finish(email, result, changes, clock, data, final=True)
        else:
            result = await self._send(email, domain, tuple(recipients), underway.progress)
        return self._finish(email, result, list(changes), clock, data, final=False)

    def cut_short(self, email: store.Claimed, underway: Underway) -> store.Attempted | None:
        """What to record of an attempt cut short after the provider had
        finished with some recipients (None: it had finished with none). The
        others are tried again at once, the finished ones never: sending them
        the message again is what recording this avoids. Such an attempt
        uses no step of the retry schedule; one cut short after every
        recipient's transaction ended is recorded as it would have been."""
        progress = underway.progress
        done = progress.done()
        if not done:
            return None
        rest = tuple(
            Deferral(r, None, "the attempt was cut short before this recipient")
            for r in underway.recipients if r not in done
        )
        result = EmailResult(self.provider.name, progress.provider_message_id,
                             tuple(progress.outcomes), tuple(progress.deferred) + rest)
        return self._finish(email, result, list(underway.changes), underway.clock,
                            underway.data, final=False, at_once=bool(rest))

    async def _send(
        self, email: store.Claimed, domain: SendingDomain, recipients: tuple[str, ...],
        progress: Progress,
    ) -> EmailResult:
        key = await self.bounce_key()
        outgoing = OutgoingEmail(
            message_id=email.id,
            team_id=email.team_id,
            sender=email.from_address,
            return_paths={r: key.address(email.id, r, domain.return_path) for r in recipients},
            recipients=recipients,
            to=tuple(email.to_addresses),
            subject=email.subject,
            cc=tuple(email.cc),
            reply_to=tuple(email.reply_to),
            html=email.html,
            text=email.text,
            headers=tuple(email.headers.items()),
            dkim=DkimKey(domain.name, domain.dkim_selector, domain.dkim_private_key),
        )
        try:
            return await self.provider.send(outgoing, progress)
        except Exception as failure:  # a provider bug: retried, never a stuck email
            log.exception("sending email %s failed unexpectedly", email.id)
            message = f"the provider failed: {type(failure).__name__}: {failure}"
            return EmailResult(
                self.provider.name, None,
                deferred=tuple(Deferral(r, None, message) for r in recipients),
            )

    def _finish(
        self,
        email: store.Claimed,
        result: EmailResult,
        changes: list[Change],
        clock: Clock,
        data: dict[str, Any],
        *,
        final: bool,
        at_once: bool = False,
    ) -> store.Attempted:
        now = datetime.now(UTC)
        for o in result.now():
            changes.append(Change(email.id, email.team_id, o.type, o.recipient, clock.tick(),
                                  result.provider, data, code=o.code, message=o.message))
        followups = [
            store.Followup(email.id, o.recipient, o.type, now + o.after, result.provider,
                           o.code, o.message)
            for o in result.later()
        ]
        retry_at = None if final else self.retry_at(email.attempt_count + 1, now)
        if at_once:  # an attempt cut short: the rest at once, and not counted
            retry_at = now
        deferred = [d.recipient for d in result.deferred]
        error = "; ".join(sorted({d.message for d in result.deferred})) or None
        if deferred and retry_at is None:
            for d in result.deferred:
                changes.append(Change(email.id, email.team_id, "failed", d.recipient,
                                      clock.tick(), result.provider, data, code=d.code,
                                      message=d.message))
            deferred = []
        elif deferred and not at_once:
            # A try the receiving side put off (SMTP 4xx, no connection): the
            # team hears of it now, as from a provider, not only after the
            # last try.
            for d in result.deferred:
                changes.append(Change(email.id, email.team_id, "delivery_delayed", d.recipient,
                                      clock.tick(), result.provider, data, code=d.code,
                                      message=d.message))
        if not email.send_to:
            changes.append(Change(email.id, email.team_id, "failed",
                                  recipients_text(email.to_addresses), clock.tick(),
                                  result.provider, data, message="no recipient left to send to"))
        self.attempts["retrying" if deferred else (changes[-1].type if changes else "sent")] += 1
        return store.Attempted(
            email=email,
            status=changes[-1].type if changes else None,
            status_at=changes[-1].occurred_at if changes else None,
            next_at=retry_at if deferred else None,
            error=error,
            provider=result.provider,
            send_to=deferred,
            changes=changes,
            followups=followups,
            counted=not at_once,
        )


def start_emails(
    runtime: Runtime, db: Database, config: Config, provider: EmailProvider
) -> Emails:
    """Register sending with the runtime: one actor per team, and the followups."""
    emails = Emails(db, config, provider)

    def sender(team_id: UUID) -> LeasedWorker[store.Claimed, store.Attempted]:
        return LeasedWorker(
            SendJob(team_id, emails),
            concurrency=config.email_concurrency,
            idle_seconds=IDLE_SECONDS,
        )

    emails.senders = runtime.due(
        DueWork(
            name="email-senders",
            channel=DUE_CHANNEL,
            due=store.due_teams,
            parse=UUID,
            actor=sender,
            poll_seconds=config.email_poll_seconds,
        )
    )
    emails.followups = runtime.due(
        DueWork(
            name="email-followups",
            channel=f"{DUE_CHANNEL}_followups",
            due=store.followups_due,
            parse=str,
            actor=lambda _key: Drain(db, store.record_due_followups, batch=FOLLOWUP_BATCH,
                                     idle_seconds=IDLE_SECONDS),
            poll_seconds=config.email_poll_seconds,
        )
    )
    return emails

