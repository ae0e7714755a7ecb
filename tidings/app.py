"""Serving HTTP on top of the service: hypercorn, the Quart app, the run loop."""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tidings.config import Config
from tidings.http import lean_connections
from tidings.http.app import create_app
from tidings.http.connection import SoundConnections
from tidings.http.protocol_errors import CONFIG_OBSERVE
from tidings.service import Service, open_service

log = logging.getLogger("tidings")

# The time requests in flight get to finish after a shutdown begins; Tidings
# passes its TIDINGS_SHUTDOWN_GRACE_SECONDS.
DEFAULT_GRACE_SECONDS = 30.0
# How long an idle kept-alive connection stays open (longer than the 60 s that
# load balancers commonly keep theirs, so the server is not the one to close
# a connection a balancer is about to reuse).
KEEP_ALIVE_SECONDS = 75.0


def reusable_socket(host: str, port: int) -> int:
    """A TCP socket bound with SO_REUSEPORT, as a file descriptor for hypercorn.

    Several processes bound this way share the port; the kernel spreads new
    connections across them.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock.detach()


async def serve_asgi(
    app: Any,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    keep_alive_seconds: float = KEEP_ALIVE_SECONDS,
    write_seconds: float = lean_connections.WRITE_SECONDS,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    observe: Callable[[str, str, int], None] | None = None,
    max_connections: int | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` on hypercorn, as Tidings serves its own.
    ``observe(method, route, status)`` counts the answers given before the
    app saw the request (a request that could not be read). At most
    ``max_connections`` client connections are open at once (None: as many
    as the open-file limit leaves room for; ``lean_connections.ConnectionCap``).

    Reports the bound addresses (``http://host:port``) once it accepts
    requests. On shutdown it stops accepting and lets in-flight requests
    finish, for up to ``grace_seconds`` (``TIDINGS_SHUTDOWN_GRACE_SECONDS`` for
    Tidings). (``python -m bench api`` serves its bare comparison app with
    this too.)
    """
    lean_connections.install()
    http_config = HypercornConfig()
    http_config.bind = [f"fd://{reusable_socket(host, port)}" if reuse_port else f"{host}:{port}"]
    http_config.graceful_timeout = grace_seconds
    http_config.accesslog = None
    http_config.errorlog = logging.getLogger("hypercorn.error")
    http_config.keep_alive_timeout = keep_alive_seconds
    setattr(http_config, lean_connections.CONFIG_WRITE_SECONDS, write_seconds)  # noqa: B010
    setattr(http_config, CONFIG_OBSERVE, observe)  # noqa: B010
    cap = lean_connections.ConnectionCap(
        max_connections or lean_connections.default_max_connections()
    )
    setattr(http_config, lean_connections.CONFIG_CONNECTIONS, cap)
    stopping = trio.Event()

    async def stop_when_triggered() -> None:
        await (shutdown_trigger or trio.sleep_forever)()
        stopping.set()  # responses from now on close their connections

    await hypercorn_serve(
        SoundConnections(app, stopping),  # type: ignore[arg-type]
        http_config,
        shutdown_trigger=stop_when_triggered,
        task_status=task_status,
    )


async def serve_http(
    service: Service,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP API of ``service`` until ``shutdown_trigger`` returns."""
    await serve_asgi(
        create_app(service), host, port, reuse_port=reuse_port,
        grace_seconds=service.config.shutdown_grace_seconds,
        shutdown_trigger=shutdown_trigger, task_status=task_status,
        observe=lambda method, route, status: service.metrics.observe(method, route, status, 0.0),
        max_connections=service.config.max_connections,
    )


def freeze_startup_objects() -> None:
    """Keep what start-up built (modules, routes, models, the pool) out of
    every later garbage collection.

    A full collection walks every tracked object: about 100,000 after
    start-up, 55 ms of CPU during which no request moves, and such a pause
    lands in the tail latency of every request in flight. Frozen objects are
    never collected; they live as long as the process anyway.
    """
    gc.collect()
    gc.freeze()


async def serve(
    config: Config,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the whole service until ``shutdown_trigger`` returns (or forever).

    Storage first, then the actors, then HTTP; they stop in reverse order.
    """
    async with open_service(config) as service, trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_http(
                service, host, port, reuse_port=reuse_port, shutdown_trigger=shutdown_trigger,
                task_status=task_status,
            )
        )
        freeze_startup_objects()
        log.info("Tidings is serving on %s", ", ".join(binds))
        task_status.started(binds)
