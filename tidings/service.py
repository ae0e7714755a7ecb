"""The service of one process: storage, then the actors, in one nursery.

``open_service`` opens storage and starts every group's actors; HTTP is
served on top of it by ``tidings.app``. Nothing here imports ``tidings.http``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from tidings.actors.idempotency import IdempotencyKeys, open_idempotency
from tidings.actors.revocations import RevocationListener
from tidings.actors.supervisor import Actor, open_supervisor
from tidings.actors.webhooks import Webhooks, open_webhooks
from tidings.auth import TokenCache
from tidings.config import Config
from tidings.metrics import Metrics
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


@asynccontextmanager
async def open_service(
    config: Config, *, resolve: Resolver = system_resolve
) -> AsyncIterator[Service]:
    """Open storage and start the actors; stop them when the block ends.

    On the way out every actor finishes its current message, within
    ``config.shutdown_grace_seconds``; after that it is cancelled.
    ``resolve`` is how webhook target names are looked up.
    """
    tokens = TokenCache()
    guard = Guard(allow_private=config.webhook_allow_private_urls, resolve=resolve)
    async with open_database(config) as db:
        listener: Callable[[str], Actor[None]] = lambda _key: RevocationListener(  # noqa: E731
            db.url, tokens
        )
        with trio.CancelScope() as stopping:
            async with (
                open_supervisor("revocations", listener, mailbox_size=1) as revocations,
                open_idempotency(db, config) as idempotency,
                open_webhooks(db, config, guard) as webhooks,
            ):
                revocations.start("listener")
                try:
                    yield Service(
                        config=config,
                        db=db,
                        tokens=tokens,
                        idempotency=idempotency,
                        metrics=Metrics(
                            lambda: [
                                revocations,
                                idempotency.supervisor,
                                *webhooks.supervisors(),
                            ],
                            webhook_attempts=lambda: webhooks.attempts,
                        ),
                        webhooks=webhooks,
                    )
                finally:
                    stopping.deadline = trio.current_time() + config.shutdown_grace_seconds


