"""The service: storage, then actors, then HTTP, in one nursery, in that order."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tidings.actors.idempotency import IdempotencyKeys, open_idempotency
from tidings.actors.revocations import RevocationListener
from tidings.actors.supervisor import Actor, open_supervisor
from tidings.actors.webhooks import Webhooks, open_webhooks
from tidings.auth import TokenCache
from tidings.config import Config
from tidings.http.app import create_app
from tidings.http.ratelimit import RateLimiter
from tidings.metrics import Metrics
from tidings.storage.db import Database, open_database
from tidings.webhooks.safety import Guard, Resolver, system_resolve

log = logging.getLogger("tidings")

# Hypercorn's share of the shutdown grace: time for in-flight requests.
HTTP_DRAIN_SECONDS = 4.0


@dataclass(frozen=True)
class Service:
    config: Config
    db: Database
    tokens: TokenCache
    idempotency: IdempotencyKeys
    rate_limiter: RateLimiter
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
                        rate_limiter=RateLimiter(
                            config.rate_limit_per_second, config.rate_limit_burst
                        ),
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


async def serve_http(
    service: Service,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API of ``service`` until ``shutdown_trigger`` returns.

    Reports the bound addresses (``http://host:port``) once it accepts
    requests. On shutdown it stops accepting and lets in-flight requests
    finish, for up to HTTP_DRAIN_SECONDS.
    """
    http_config = HypercornConfig()
    http_config.bind = [f"{host}:{port}"]
    http_config.graceful_timeout = HTTP_DRAIN_SECONDS
    http_config.accesslog = None
    http_config.errorlog = logging.getLogger("hypercorn.error")
    http_config.keep_alive_timeout = 75
    await hypercorn_serve(
        create_app(service),
        http_config,
        shutdown_trigger=shutdown_trigger or trio.sleep_forever,
        task_status=task_status,
    )


async def serve(
    config: Config,
    host: str,
    port: int,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the whole service until ``shutdown_trigger`` returns (or forever).

    Storage first, then the actors, then HTTP; they stop in reverse order.
    """
    async with open_service(config) as service, trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                service, host, port, shutdown_trigger=shutdown_trigger, task_status=task_status
            )
        )
        log.info("Tidings is serving on %s", ", ".join(binds))
        task_status.started(binds)
