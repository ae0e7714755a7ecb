"""Serving HTTP on top of the service: hypercorn, the Quart app, the run loop."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tidings.config import Config
from tidings.http.app import create_app
from tidings.service import Service, open_service

log = logging.getLogger("tidings")


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
    finish, for up to ``TIDINGS_SHUTDOWN_GRACE_SECONDS``.
    """
    http_config = HypercornConfig()
    http_config.bind = [f"{host}:{port}"]
    http_config.graceful_timeout = service.config.shutdown_grace_seconds
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
