"""The service of one process: storage, then the actors, in one nursery.

``open_service`` opens storage and registers every group's actors with the
runtime, in one place (:func:`start_actors`); HTTP is served on top of it by
``tidings.app``. Nothing here imports ``tidings.http``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from tidings.actors.broadcasts import Broadcasts, start_broadcasts
from tidings.actors.emails import Emails, start_emails
from tidings.actors.idempotency import IdempotencyKeys, start_idempotency
from tidings.actors.retention import start_retention
from tidings.actors.revocations import RevocationListener
from tidings.actors.runtime import Runtime, open_runtime
from tidings.actors.sender_ids import review_sender_ids
from tidings.actors.sms import SmsSide, start_sms
from tidings.actors.upkeep import keep_indexes
from tidings.actors.webhooks import Webhooks, start_webhooks
from tidings.auth import TokenCache
from tidings.config import Config
from tidings.email.verification import recheck_domains
from tidings.metrics import Metrics
from tidings.providers.email import EmailProvider
from tidings.providers.select import open_email_provider, open_sms_provider
from tidings.providers.sms import SmsProvider
from tidings.storage.db import Database, open_database
from tidings.webhooks.safety import Guard, Resolver, system_resolve

log = logging.getLogger("tidings")


@dataclass(frozen=True)
class Service:
    config: Config
    db: Database
    tokens: TokenCache
    idempotency: IdempotencyKeys
    metrics: Metrics
    webhooks: Webhooks
    runtime: Runtime
    emails: Emails
    sms: SmsSide
    broadcasts: Broadcasts


@dataclass(frozen=True)
class Actors:
    """What the groups registered, as the rest of the service reaches it."""

    tokens: TokenCache
    idempotency: IdempotencyKeys
    webhooks: Webhooks
    emails: Emails
    sms: SmsSide
    broadcasts: Broadcasts


def start_actors(
    runtime: Runtime,
    db: Database,
    config: Config,
    resolve: Resolver,
    email_provider: EmailProvider,
    sms_provider: SmsProvider,
) -> Actors:
    """Every group's actors and due work, registered with the runtime.

    Singletons (a listener, a sweeper) start here; keyed actors start when
    their first message comes; due work starts its dispatcher here and its
    owner actors when woken. A new group adds its lines here.
    """
    tokens = TokenCache(lookups=max(1, config.db_pool_size // 2))  # half the pool at most
    runtime.singleton("revocations", lambda: RevocationListener(db.url, tokens).run())
    idempotency = start_idempotency(runtime, db, config)
    guard = Guard(allow_private=config.webhook_allow_private_urls, resolve=resolve)
    webhooks = start_webhooks(runtime, db, config, guard)
    runtime.singleton("retention", start_retention(db, config))
    runtime.singleton("index-upkeep", lambda: keep_indexes(db))
    emails = start_emails(runtime, db, config, email_provider)
    broadcasts = start_broadcasts(runtime, db, config, emails)
    runtime.singleton("domain-recheck", lambda: recheck_domains(db, config))
    sms = start_sms(runtime, db, config, sms_provider)
    if not sms_provider.approves_sender_ids_instantly:
        runtime.singleton(
            "sender-id-review", lambda: review_sender_ids(db, config, sms_provider)
        )
    return Actors(
        tokens=tokens, idempotency=idempotency, webhooks=webhooks, emails=emails, sms=sms,
        broadcasts=broadcasts,
    )


@asynccontextmanager
async def open_service(
    config: Config, *, resolve: Resolver = system_resolve
) -> AsyncIterator[Service]:
    """Open storage and start the actors; stop them when the block ends.

    On the way out every actor finishes its current message, within
    ``config.shutdown_grace_seconds``; after that it is cancelled.
    ``resolve`` is how webhook target names are looked up.
    """
    async with (
        open_database(config) as db,
        open_email_provider(config) as email_provider,
        open_sms_provider(config) as sms_provider,
    ):
        with trio.CancelScope() as stopping:
            async with open_runtime(db) as runtime:
                actors = start_actors(
                    runtime, db, config, resolve, email_provider, sms_provider
                )
                webhooks = actors.webhooks
                try:
                    yield Service(
                        config=config,
                        db=db,
                        tokens=actors.tokens,
                        idempotency=actors.idempotency,
                        metrics=Metrics(
                            runtime.children, webhook_attempts=lambda: webhooks.attempts
                        ),
                        webhooks=webhooks,
                        runtime=runtime,
                        emails=actors.emails,
                        sms=actors.sms,
                        broadcasts=actors.broadcasts,
                    )
                finally:
                    stopping.deadline = trio.current_time() + config.shutdown_grace_seconds
