"""A webhook receiver for tests: a real HTTP/1.1 server on loopback.

It records every request it gets and answers as its ``respond`` function
says (by default 200 at once), with keep-alive like a real server.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=trio.current_time)

    @property
    def event(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.body)
        return document


class HangUp(Exception):
    """Raised by ``respond``: the connection closes with no answer (a server
    that read the request, maybe acted on it, and went away)."""


# What to answer: (status, body, extra headers).
Answer = tuple[int, bytes, dict[str, str]]
Respond = Callable[[Received], Awaitable[Answer]]


async def ok(_request: Received) -> Answer:
    return 200, b"ok", {}


class Receiver:
    def __init__(self, respond: Respond = ok) -> None:
        self.respond = respond
        self.requests: list[Received] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.url = ""
        self._changed = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        task_status.started(self.url)
        await trio.serve_listeners(self._connection, listeners)

    async def wait_for(self, count: int, within: float = 10) -> list[Received]:
        """Wait until ``count`` requests have arrived; all of them."""
        with trio.fail_after(within):
            while len(self.requests) < count:
                self._changed = trio.Event()
                await self._changed.wait()
        return self.requests

    async def _connection(self, stream: trio.SocketStream) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                body, buffer = buffer[:length], buffer[length:]
                request = Received(method, path, headers, body)
                self.requests.append(request)
                self._changed.set()
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    status, payload, extra = await self.respond(request)
                except HangUp:
                    await stream.aclose()
                    return
                finally:
                    self.in_flight -= 1
                lines = [f"HTTP/1.1 {status} Status", f"Content-Length: {len(payload)}"]
                lines += [f"{name}: {value}" for name, value in extra.items()]
                await stream.send_all("\r\n".join(lines).encode() + b"\r\n\r\n" + payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
