"""Broadcast fanout on the runtime: one actor per broadcast with fanout to do.

Due work ``broadcast-fanout`` (``tidings.actors.duework``): a broadcast is
due while it is ``queued``, or ``scheduled`` and its time has come. Sending
one NOTIFYs every process; the dispatchers also poll every second, so a
scheduled broadcast starts within about a second of its time, and one whose
process died is taken up when its lease ends.

The actor of a broadcast leases it (so one process at a time works on it),
promotes it from scheduled to queued, takes the audience snapshot, and
queues its emails batch by batch (``tidings.storage.broadcasts_fanout``),
each batch one statement in one transaction with the team's quota claim.
A batch that finds the broadcast canceled, or its lease taken, ends the
actor; the last one makes it ``sent``. What cannot go on (the segment or
topic is gone, the domain is no longer verified, the quota is used up)
makes it ``failed``; so does a crash that repeats more than
``INTENSITY.restarts`` times within ``INTENSITY.within`` seconds, through
the supervisor's ``on_give_up``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

import trio

from tidings.actors.duework import LEASE_MARGIN, Due, DueWork, Wake
from tidings.actors.emails import Emails
from tidings.actors.handback import hand_back
from tidings.actors.mailbox import Mailbox
from tidings.actors.policy import Intensity
from tidings.actors.runtime import Runtime
from tidings.actors.service_keys import SharedKey
from tidings.actors.supervisor import Actor
from tidings.addresses import Mailbox as Sender
from tidings.config import Config
from tidings.ids import new_id
from tidings.storage import broadcasts_fanout as fanout
from tidings.storage.broadcasts import DUE_CHANNEL, Broadcast
from tidings.storage.broadcasts_batch import Batch, queue_counted
from tidings.storage.broadcasts_render import Plan, Renderer
from tidings.storage.db import Database
from tidings.storage.domains import sending_domain
from tidings.storage.quotas import QuotaExceeded
from tidings.unsubscribe import KEY_NAME, TokenKey, unsubscribe_url

log = logging.getLogger("tidings.broadcasts")

INTENSITY = Intensity(restarts=5, within=60.0)
IDLE_SECONDS = 30.0
# The failure of a fanout whose sending domain is gone, at its start or later
# (deleted, or no longer verified: checked by every chunk).
NO_DOMAIN = "from_email is not on a verified sending domain of the team"


class Broadcasts:
    """The broadcast side of one process: its fanout and the unsubscribe key."""

    def __init__(self, db: Database, config: Config, emails: Emails) -> None:
        self.db = db
        self.config = config
        self.emails = emails
        # Leases this process writes carry this id.
        self.owner = new_id()
        self.fanout: Due[UUID] | None = None
        self._key = SharedKey(db, config.secret_key, KEY_NAME, TokenKey, TokenKey.derived)

    async def token_key(self) -> TokenKey:
        """The unsubscribe signing key (``tidings.actors.service_keys``)."""
        return await self._key.get()

    def wake(self, broadcast_id: UUID) -> None:
        if self.fanout is not None:
            self.fanout.wake(broadcast_id)

    async def fail(self, broadcast_id: UUID, reason: str) -> None:
        failed = await self.db.run(fanout.fail, broadcast_id, reason)
        if failed is not None:
            log.warning("broadcast %s failed: %s", broadcast_id, reason)


@dataclass
class _Ended:
    """Why the batches of a fanout stopped early, as the first one to stop saw it."""

    lost: bool = False  # canceled, or the lease taken over
    failure: str | None = None


class FanoutActor(Actor[Wake]):
    """The actor of one broadcast."""

    idle_timeout = IDLE_SECONDS

    def __init__(self, broadcast_id: UUID, broadcasts: Broadcasts) -> None:
        self._id = broadcast_id
        self._b = broadcasts
        # When the lease was last taken or renewed (by a batch), on trio's
        # clock as the statement began: it ends no earlier than a lease after.
        self._leased_at = 0.0

    async def run(self, mailbox: Mailbox[Wake]) -> None:
        while await mailbox.next() is not None:
            while not mailbox.stopping:
                wait = await self._work(mailbox)
                if wait is None or wait > IDLE_SECONDS:
                    break  # the dispatcher's poll wakes it when it is due
                # Due soon: wait for then, or for a wake before it (the
                # broadcast sent now, canceled or scheduled again).
                await mailbox.next(within=max(wait, 0.01))

    async def _work(self, mailbox: Mailbox[Wake]) -> float | None:
        """Fan out if the broadcast is ours to; else seconds until it is due
        (None: nothing to wait for)."""
        b = self._b
        asked = trio.current_time()
        claimed = await b.db.run(fanout.claim, self._id, b.owner, b.config.broadcast_lease_seconds)
        if claimed is None:
            return await b.db.run(fanout.seconds_to_next_due, self._id)
        self._leased_at = asked
        try:
            await self._fan_out(claimed, mailbox)
        except BaseException:
            # Crashed or cut short: hand the broadcast on now, not when the
            # lease ends (the cursor is in the database); while storage is
            # down, again once it answers (``tidings.actors.handback``).
            await hand_back(
                lambda: b.db.run(fanout.release, self._id, b.owner),
                until=self._leased_at + b.config.broadcast_lease_seconds - LEASE_MARGIN,
                stopping=lambda: mailbox.stopping,
            )
            raise
        return None

    async def _fan_out(self, claimed: fanout.Claimed, mailbox: Mailbox[Wake]) -> None:
        b, broadcast = self._b, claimed.broadcast
        if broadcast.status == "scheduled":
            promoted = await b.db.run(fanout.promote, self._id, b.owner)
            if promoted is None:
                return
            broadcast = promoted
        if not claimed.snapshotted:
            snap = await b.db.run(
                fanout.snapshot, self._id, b.owner, b.config.broadcast_batch_size
            )
            if not snap.held:
                return
            if not snap.segment_found:
                return await b.fail(self._id, "the broadcast's segment no longer exists")
            if not snap.topic_found:
                return await b.fail(self._id, "the broadcast's topic no longer exists")
        domain = await b.db.run(
            sending_domain, broadcast.team_id, broadcast.from_email.rpartition("@")[2]
        )
        if domain is None:
            return await b.fail(self._id, NO_DOMAIN)
        batch = await self._batch(broadcast, domain.name)
        ended = _Ended()
        async with trio.open_nursery() as nursery:
            for _ in range(b.config.broadcast_connections):
                nursery.start_soon(self._queue_chunks, batch, mailbox, ended)
        if ended.failure is not None:
            return await b.fail(self._id, ended.failure)
        if ended.lost:
            return  # canceled, or no longer ours
        if mailbox.stopping:
            await b.db.run(fanout.release, self._id, b.owner)
            return
        finished = await b.db.run(fanout.finish, self._id, b.owner)
        if finished is not None:
            log.info("broadcast %s sent: %d queued, %d failed", self._id,
                     finished.queued_count, finished.failed_count)

    async def _queue_chunks(
        self, batch: Batch, mailbox: Mailbox[Wake], ended: _Ended
    ) -> None:
        """Queue chunks on one connection until none is left, a batch finds
        the broadcast gone or over quota (``ended``), or the process stops."""
        b = self._b
        while not mailbox.stopping and not ended.lost and ended.failure is None:
            asked = trio.current_time()
            try:
                done = await b.db.run(queue_counted, batch, b.config.quotas)
            except QuotaExceeded as exceeded:
                ended.failure = f"team quota exhausted: {exceeded}"
                return
            if not done.held:
                ended.lost = True
                return
            self._leased_at = max(self._leased_at, asked)  # the batch renewed it
            if done.domain_gone:
                ended.failure = NO_DOMAIN
                return
            if not done.handled:
                return  # every chunk is done or in another batch

    async def _batch(self, broadcast: Broadcast, domain: str) -> Batch:
        b = self._b
        fallbacks = await b.db.run(fanout.property_fallbacks, broadcast.team_id)
        plan = Plan.of(
            broadcast.subject, broadcast.html, broadcast.text, broadcast.preview_text,
            broadcast.variable_bindings, fallbacks,
        )
        renderer = Renderer(
            plan, await b.token_key(), unsubscribe_url(b.config.public_url, ""),
            broadcast.team_id, broadcast.topic_id,
        )
        return Batch(
            broadcast_id=self._id, owner=b.owner, team_id=broadcast.team_id,
            renderer=renderer,
            sender=Sender(broadcast.from_name, broadcast.from_email).formatted,
            from_email=broadcast.from_email,
            reply_to=[broadcast.reply_to_email] if broadcast.reply_to_email else [],
            domain=domain, provider=b.emails.provider.name,
            lease_seconds=b.config.broadcast_lease_seconds,
        )


def start_broadcasts(
    runtime: Runtime, db: Database, config: Config, emails: Emails
) -> Broadcasts:
    """Register the fanout with the runtime: one actor per broadcast with work."""
    broadcasts = Broadcasts(db, config, emails)

    async def give_up(broadcast_id: UUID, error: Exception) -> None:
        # The team sees that it failed, not the internal error: the log has it.
        log.error("broadcast %s: the fanout failed repeatedly, last with %s: %s",
                  broadcast_id, type(error).__name__, error)
        await broadcasts.fail(
            broadcast_id, "the fanout failed repeatedly with an internal error; "
            "the service's log names it"
        )

    broadcasts.fanout = runtime.due(
        DueWork(
            name="broadcast-fanout",
            channel=DUE_CHANNEL,
            due=fanout.due_broadcasts,
            parse=UUID,
            actor=lambda broadcast_id: FanoutActor(broadcast_id, broadcasts),
            poll_seconds=1.0,
            intensity=INTENSITY,
            on_give_up=give_up,
        )
    )
    return broadcasts
