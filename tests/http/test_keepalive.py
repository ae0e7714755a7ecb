"""Kept-alive connections: every request is answered, and a close is a real close.

A pooled client reuses one connection for many requests. These tests talk to
the real server over loopback sockets the way such clients do (request head
and body written separately), including requests that the service answers
without reading their body (unknown route, invalid token, rate limit, body
too large). Every response must arrive within a strict timeout; a response
that keeps the connection alive must be followed by an answer to the next
request on it; a response that says ``Connection: close`` must be followed by
the server closing the socket.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from tests.conftest import MakeToken
from tidings.config import Config
from tidings.service import Service

ROUNDS = 1000
# Far above an answer's time on loopback; a hang fails the test quickly.
TIMEOUT = 2.0
BODY = json.dumps({"email": "ada@example.com", "first_name": "Ada"}).encode()


@pytest.fixture
def config(database_url: str) -> Config:
    # One request per token and then 429 for a long time: the limited token
    # answers every request after its first without reading the body.
    return Config(
        database_url=database_url,
        db_pool_size=4,
        rate_limit_per_second=0.001,
        rate_limit_burst=1,
        shutdown_grace_seconds=2,
    )


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


class Client:
    """One HTTP/1.1 connection at a time, reopened only when the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buffer = bytearray()
        self.connections = 0

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def _fill(self) -> None:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise AssertionError("the server closed a kept-alive connection without answering")
        self.buffer += data

    async def _read_reply(self) -> Reply:
        while b"\r\n\r\n" not in self.buffer:
            await self._fill()
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        self.buffer = bytearray(rest)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            await self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return Reply(int(status_line.split()[1]), headers, body)

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        *,
        late_body: bool = False,
        half_close: bool = False,
    ) -> Reply:
        """Send one request (head and body in separate writes) and read its answer.

        ``late_body``: the body follows only once the server has done all it
        can with the head, so a server that answers without the body has
        answered before the body arrives. ``half_close``: the client then
        shuts its side of the connection (``shutdown(SHUT_WR)``) and waits
        for the answer.
        """
        if self.stream is None:
            self.stream = await trio.open_tcp_stream(self.host, self.port)
            self.connections += 1
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body or method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        with trio.fail_after(TIMEOUT):
            await self.stream.send_all(head)
            if late_body:
                await trio.testing.wait_all_tasks_blocked()
            if body:
                await self.stream.send_all(body)
            if half_close:
                await self.stream.send_eof()
            reply = await self._read_reply()
            if reply.closes:
                await self.expect_close()
        return reply

    async def expect_close(self) -> None:
        """The server closes the connection (within the timeout), sending nothing more."""
        assert self.stream is not None
        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                assert not data, f"unexpected bytes after a closing response: {data[:80]!r}"
                if not data:
                    break
        await self.aclose()
        self.buffer.clear()


@pytest.fixture
async def raw(base_url: str) -> AsyncIterator[Client]:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    client = Client(host, int(port))
    try:
        yield client
    finally:
        await client.aclose()


async def test_requests_answered_without_reading_the_body_leave_the_connection_usable(
    raw: Client, make_token: MakeToken
) -> None:
    limited = await make_token(team="limited")
    limited_headers = {"Authorization": f"Bearer {limited.secret}"}
    first = await raw.request("POST", "/contacts", limited_headers, BODY)
    assert first.status == 201, first.body
    unread = [
        ("/no-such-route", {}, 404),
        ("/contacts", {"Authorization": "Bearer svc_team_not-a-token"}, 401),
        ("/contacts", limited_headers, 429),
    ]
    for round_ in range(ROUNDS):
        assert (await raw.request("GET", "/healthz")).status == 200
        for path, headers, status in (unread[round_ % 3], unread[(round_ + 1) % 3]):
            reply = await raw.request("POST", path, headers, BODY, late_body=True)
            assert reply.status == status, reply.body
            assert json.loads(reply.body)["success"] is False
        assert (await raw.request("GET", "/healthz")).status == 200
    # Answering without reading the body does not cost the connection;
    # hypercorn ends a connection after every 1,000 requests.
    assert raw.connections == 1 + (1 + ROUNDS * 4) // 1000


async def test_a_get_after_a_refused_large_body_is_answered(
    raw: Client, make_token: MakeToken
) -> None:
    large = b'{"email": "a@example.com", "first_name": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    for attempt in range(5):
        token = await make_token(team=f"uploads-{attempt}")  # each has one request
        headers = {"Authorization": f"Bearer {token.secret}"}
        refused = await raw.request("POST", "/contacts", headers, large, late_body=True)
        assert refused.status == 413
        assert json.loads(refused.body)["error"]["code"] == "PAYLOAD_TOO_LARGE"
        assert (await raw.request("GET", "/healthz")).status == 200


async def test_connection_close_closes_the_socket(raw: Client) -> None:
    for _ in range(20):
        reply = await raw.request("GET", "/healthz", {"Connection": "close"})
        assert reply.status == 200
        assert reply.closes
        # request() has seen the server close the socket.
        assert raw.stream is None
    reply = await raw.request("POST", "/no-such-route", {"Connection": "close"}, BODY)
    assert reply.status == 404
    assert raw.stream is None


async def test_a_client_that_half_closes_after_its_request_gets_the_answer(
    raw: Client, make_token: MakeToken, service: Service
) -> None:
    # The client has said all it will say: that is not a disconnect. The
    # request is carried out and answered, and then the connection closes.
    for n in range(10):
        token = await make_token(team=f"half-{n}")
        headers = {"Authorization": f"Bearer {token.secret}"}
        body = json.dumps({"email": f"half-{n}@example.com"}).encode()
        reply = await raw.request("POST", "/contacts", headers, body, half_close=True)
        assert reply.status == 201, reply.body
        if raw.stream is not None:  # request() has not seen the close yet
            await raw.expect_close()
        async with service.db.transaction() as conn:
            emails = await conn.fetch("SELECT email FROM contacts WHERE team_id = $1",
                                      token.team_id)
        assert [row["email"] for row in emails] == [f"half-{n}@example.com"]
    # Routes answered by Quart and by hypercorn itself, and Connection: close.
    for path, extra, status in (("/healthz", {}, 200), ("/no-such-route", {}, 404),
                                ("/healthz", {"Connection": "close"}, 200)):
        reply = await raw.request("GET", path, extra, half_close=True)
        assert reply.status == status, reply.body
        if raw.stream is not None:
            await raw.expect_close()


async def _send_head(client: Client, head: str, body: bytes = b"") -> Reply:
    """Send a request head of one's own (and part of a body); the answer."""
    client.stream = await trio.open_tcp_stream(client.host, client.port)
    await client.stream.send_all(head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body)
    return await client._read_reply()


# A body that is announced and never finished; answered within this (the
# body timeout is 60 s), the wait for the rest of the body included.
UNREAD_WITHIN = 2 * 2.0 + 1


@pytest.mark.parametrize("path", ["/contacts", "/broadcasts"])
async def test_a_request_without_a_valid_token_is_refused_before_its_body(
    raw: Client, path: str
) -> None:
    """401 at once whatever the body: one that never finishes (a client
    without a token holds no place while it sends it), one far over the
    limit (not 413), and two Idempotency-Keys (not 400)."""
    bogus = "Authorization: Bearer svc_team_not-a-token"
    heads = [
        (f"POST {path} HTTP/1.1\nHost: x\n{bogus}\nContent-Length: 100", b"{"),
        (f"POST {path} HTTP/1.1\nHost: x\n{bogus}\nContent-Length: 5000000", b""),
        (f"POST {path} HTTP/1.1\nHost: x\n{bogus}\nIdempotency-Key: a\nIdempotency-Key: b\n"
         "Content-Length: 2", b"{}"),
    ]
    for head, body in heads:
        with trio.fail_after(UNREAD_WITHIN):
            reply = await _send_head(raw, head, body)
            assert reply.status == 401, (head, reply.body)
            assert json.loads(reply.body)["error"]["code"] == "UNAUTHORIZED"
            if reply.closes:
                await raw.expect_close()
        await raw.aclose()


async def test_a_get_whose_announced_body_never_arrives_is_answered(
    raw: Client, make_token: MakeToken
) -> None:
    """A route that takes no body does not wait for one: it answers, and the
    connection closes after it (the rest of the body cannot be told from a
    next request)."""
    for path, status in (("/contacts", 200), ("/broadcasts", 200), ("/contacts", 401)):
        token = await make_token(team="getter")  # each token has one request here
        secret = token.secret if status == 200 else "svc_team_not-a-token"
        head = f"GET {path} HTTP/1.1\nHost: x\nAuthorization: Bearer {secret}\nContent-Length: 10"
        with trio.fail_after(UNREAD_WITHIN):
            reply = await _send_head(raw, head)
            assert reply.status == status, (path, reply.body)
            assert reply.closes
            await raw.expect_close()
