"""A TCP proxy to a test database that a test can cut and restore: the
database, as a process on the other side of it sees it, goes down and up."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import trio

from tests.test_e2e import free_port


class DatabaseProxy:
    def __init__(self, database_url: str) -> None:
        parts = urlsplit(database_url)
        socket_dir = parse_qs(parts.query).get("host", [""])[0]
        self._unix = f"{socket_dir}/.s.PGSQL.{parts.port or 5432}" if socket_dir else None
        self._tcp = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.port = free_port()
        user = parts.username or "postgres"
        password = f":{parts.password}" if parts.password else ""
        self.url = urlunsplit((parts.scheme, f"{user}{password}@127.0.0.1:{self.port}",
                               parts.path, "", ""))
        self._scope: trio.CancelScope | None = None

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Accept and relay connections until ``cut``. Start it with ``nursery.start``."""
        with trio.CancelScope() as self._scope:
            await trio.serve_tcp(self._relay, self.port, host="127.0.0.1",
                                 task_status=task_status)

    def cut(self) -> None:
        """Refuse new connections and end every open one."""
        assert self._scope is not None
        self._scope.cancel()

    async def _relay(self, client: trio.SocketStream) -> None:
        if self._unix:
            server: trio.abc.Stream = await trio.open_unix_socket(self._unix)
        else:
            server = await trio.open_tcp_stream(*self._tcp)
        async with client, server, trio.open_nursery() as nursery:
            for source, sink in ((client, server), (server, client)):
                nursery.start_soon(_pipe, source, sink, nursery.cancel_scope)


async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream, done: trio.CancelScope) -> None:
    try:
        async for chunk in source:
            await sink.send_all(chunk)
    except trio.BrokenResourceError:
        pass
    finally:
        done.cancel()
