"""Pending sender IDs asked about again, until the provider decides.

A sender ID is reviewed by the provider when it is created (Twilio: does the
account own the number or short code). When the provider cannot be asked
(unreachable, or an error answer), the sender ID stays ``pending`` and
cannot send. This singleton of the runtime asks again about every pending
sender ID not asked about for ``TIDINGS_SENDER_ID_REVIEW_SECONDS``, so that
an outage of the provider resolves itself once it ends, without the team
deleting and creating the sender ID again. Several processes share the
pending ones: each takes (and marks asked) different ones.
"""

from __future__ import annotations

import logging

import trio

from tidings.config import Config
from tidings.providers.sms import SenderIdDecision, SmsProvider
from tidings.storage import sender_ids as store
from tidings.storage.db import Database
from tidings.storage.sender_ids import SenderId

log = logging.getLogger("tidings.sms")

# Sender IDs asked about in one round, and at once.
REVIEW_BATCH = 100
REVIEW_CONCURRENCY = 4


async def review_due(db: Database, config: Config, provider: SmsProvider) -> list[SenderId]:
    """Ask the provider again about the pending sender IDs that are due;
    store its decisions and return the sender IDs they changed."""
    due = await db.run(store.take_due_reviews, config.sender_id_review_seconds, REVIEW_BATCH)
    if not due:
        return []
    decisions: list[tuple[SenderId, SenderIdDecision]] = []
    limiter = trio.CapacityLimiter(REVIEW_CONCURRENCY)

    async def one(sender: SenderId) -> None:
        async with limiter:
            decisions.append((sender, await provider.review_sender_id(sender.value, sender.type)))

    async with trio.open_nursery() as nursery:
        for sender in due:
            nursery.start_soon(one, sender)
    decided = [(sender.id, status) for sender, status in decisions if status != "pending"]
    if not decided:
        log.info("%d pending sender IDs: the provider still cannot be asked", len(due))
        return []
    changed = await db.run(store.record_reviews, decided)
    for sender in changed:
        log.info("sender ID %s (%s) of team %s is now %s",
                 sender.value, sender.type, sender.team_id, sender.status)
    return changed


async def review_sender_ids(db: Database, config: Config, provider: SmsProvider) -> None:
    """Review due sender IDs forever (a singleton of the runtime), every
    ``sender_id_review_seconds`` and at most a minute apart."""
    while True:
        await review_due(db, config, provider)
        await trio.sleep(min(config.sender_id_review_seconds, 60.0))
