"""The webhook HTTP client against raw HTTP/1.1 servers on loopback."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import pytest
import trio
import trustme

from tidings.webhooks.client import (
    DRAIN_LIMIT,
    ConnectFailed,
    ConnectionFailed,
    Pool,
    UnsupportedUrl,
    parse_target,
    request_bytes,
)
from tidings.webhooks.safety import Guard

BODY = b'{"id":"x"}'
# (the request as received, the connection's number) -> bytes to answer, or None to close.
Answer = Callable[[bytes, int], Awaitable[bytes | None]]


class RawServer:
    """Answers each request on a connection with whatever ``answer`` says."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        # Connections (by number) the server closes right after its first answer.
        self.close_after_answer: set[int] = set()

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        number = self.connections
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                self.requests.append(head + b"\r\n\r\n" + buffer[:length])
                buffer = buffer[length:]
                reply = await self.answer(self.requests[-1], number)
                if reply is None:
                    await stream.aclose()
                    return
                await stream.send_all(reply)
                if number in self.close_after_answer:
                    await stream.aclose()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def serve(nursery: trio.Nursery, server: RawServer, *, tls: ssl.SSLContext | None = None
                ) -> int:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port: int = listeners[0].socket.getsockname()[1]
    if tls is not None:
        wrapped = [trio.SSLListener(listener, tls) for listener in listeners]
        nursery.start_soon(trio.serve_listeners, server.handle, wrapped)
    else:
        nursery.start_soon(trio.serve_listeners, server.handle, listeners)
    return port


def pool(context: ssl.SSLContext | None = None) -> Pool:
    return Pool(
        Guard(allow_private=True), context or ssl.create_default_context(), keep_idle=4
    )


async def post(p: Pool, url: str, body: bytes = BODY, keep: int = 2048) -> tuple[int, bytes]:
    target = parse_target(url)
    request = request_bytes(target, [(b"X-Test", b"1")], body)
    with trio.fail_after(5):
        response = await p.post(target, request, keep=keep)
    return response.status, response.body


def ok(payload: bytes = b"fine", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(payload), extra, payload)


async def test_the_request_is_one_post_with_host_and_length() -> None:
    async def answer(_request: bytes, _n: int) -> bytes:
        return ok()

    server = RawServer(answer)
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(pool(), f"http://127.0.0.1:{port}/hook?a=1") == (200, b"fine")
        nursery.cancel_scope.cancel()
    [request] = server.requests
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /hook?a=1 HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}".encode() in lines
    assert b"Content-Length: %d" % len(BODY) in lines
    assert b"X-Test: 1" in lines
    assert body == BODY


async def test_a_kept_alive_connection_carries_the_next_requests() -> None:
    async def answer(_request: bytes, _n: int) -> bytes:
        return ok()

    server = RawServer(answer)
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        for _ in range(3):
            assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"fine")
        nursery.cancel_scope.cancel()
    assert server.connections == 1
    await p.aclose()


async def test_connection_close_and_a_body_to_the_close_are_not_reused() -> None:
    async def answer(_request: bytes, n: int) -> bytes | None:
        if n == 1:
            return ok(extra=b"Connection: close\r\n")
        return None

    server = RawServer(answer)
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"fine")
        # The second connection closes without an answer: no retry on a fresh connection.
        with pytest.raises(ConnectionFailed):
            await post(p, f"http://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def answer(_request: bytes, n: int) -> bytes:
        return ok(b"again" if n > 1 else b"fine")

    server = RawServer(answer)
    server.close_after_answer.add(1)  # as a server's idle timeout would
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"fine")
        await trio.sleep(0.1)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"again")
        nursery.cancel_scope.cancel()
    assert server.connections == 2
    assert len(server.requests) == 2


async def test_chunked_bodies_are_read_and_kept_to_the_limit() -> None:
    chunks = b"4\r\nabcd\r\n6;x=y\r\nefghij\r\n0\r\nTrailer: t\r\n\r\n"

    async def answer(_request: bytes, _n: int) -> bytes:
        return b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks

    server = RawServer(answer)
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(p, f"http://127.0.0.1:{port}/", keep=7) == (202, b"abcdefg")
        assert await post(p, f"http://127.0.0.1:{port}/") == (202, b"abcdefghij")
        nursery.cancel_scope.cancel()
    assert server.connections == 1  # read to the end: kept


async def test_a_body_past_the_drain_limit_is_cut_and_the_connection_closed() -> None:
    big = b"z" * (DRAIN_LIMIT + 1)

    async def answer(_request: bytes, _n: int) -> bytes:
        return ok(big)

    server = RawServer(answer)
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"z" * 2048)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"z" * 2048)
        nursery.cancel_scope.cancel()
    assert server.connections == 2


async def test_interim_answers_are_skipped_and_redirects_returned_as_they_are() -> None:
    async def answer(_request: bytes, _n: int) -> bytes:
        return (
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://elsewhere/\r\n"
            b"Content-Length: 0\r\n\r\n"
        )

    server = RawServer(answer)
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(pool(), f"http://127.0.0.1:{port}/") == (307, b"")
        nursery.cancel_scope.cancel()
    assert len(server.requests) == 1


async def test_lines_ended_by_a_bare_lf_are_read_as_lines() -> None:
    """RFC 9112 §2.2 lets a recipient take a bare LF for a line's end; some
    servers end theirs so, and their 200 is a success, not a timeout."""
    async def answer(_request: bytes, n: int) -> bytes:
        if n == 1:
            return b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"
        return (b"HTTP/1.1 100 Continue\n\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\n"
                b"\n2\nok\n1;x=y\r\n!\n0\nTrailer: t\n\r\n")

    server = RawServer(answer)
    server.close_after_answer.add(1)
    p = pool()
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        assert await post(p, f"http://127.0.0.1:{port}/") == (200, b"ok")
        await trio.sleep(0.1)
        assert await post(p, f"http://127.0.0.1:{port}/") == (201, b"ok!")
        assert await post(p, f"http://127.0.0.1:{port}/") == (201, b"ok!")
        nursery.cancel_scope.cancel()
    assert server.connections == 2  # the chunked answers read to their end: kept


@pytest.mark.parametrize("head", [
    b"SMTP ready", b"HTTP/1.1 0200 OK", b"HTTP/1.1 2000 OK", b"HTTP/1.1 20 OK",
    b"HTTP/1.1 +200 OK", b"HTTP/1.1 600 OK", b"HTTP/1.10 200 OK", b"HTTPS/1.1 200 OK",
])
async def test_a_garbled_answer_is_a_failed_connection(head: bytes) -> None:
    """A status is three digits (RFC 9112 §4): "0200" is no 200, and no success."""
    async def answer(_request: bytes, _n: int) -> bytes:
        return head + b"\r\nContent-Length: 0\r\n\r\n"

    server = RawServer(answer)
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server)
        with pytest.raises(ConnectionFailed, match="not HTTP"):
            await post(pool(), f"http://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()


async def test_https_goes_through_tls_with_the_name_checked() -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)

    async def answer(_request: bytes, _n: int) -> bytes:
        return ok(b"secure")

    server = RawServer(answer)
    p = pool(client_context)
    async with trio.open_nursery() as nursery:
        port = await serve(nursery, server, tls=server_context)
        for _ in range(2):
            assert await post(p, f"https://localhost:{port}/") == (200, b"secure")
        assert server.connections == 1
        # The certificate names localhost, not 127.0.0.1: refused.
        with pytest.raises(ConnectFailed, match="TLS"):
            await post(pool(client_context), f"https://127.0.0.1:{port}/")
        # Nobody vouches for the certificate: refused.
        with pytest.raises(ConnectFailed, match="TLS"):
            await post(pool(), f"https://localhost:{port}/")
        nursery.cancel_scope.cancel()
    await p.aclose()


async def test_forbidden_addresses_are_refused_before_connecting() -> None:
    guarded = Pool(Guard(allow_private=False), ssl.create_default_context(), keep_idle=1)
    with pytest.raises(ConnectFailed, match="loopback"):
        await post(guarded, "http://127.0.0.1:9/")


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "http:///nohost", "http://example.com:99999/"]
)
def test_urls_that_are_not_http_are_refused(url: str) -> None:
    with pytest.raises(UnsupportedUrl):
        parse_target(url)
