"""The connection bookkeeping of ``tidings/http/lean_connections.py``, on a real server.

A plain ASGI function is served by ``tidings.app.serve_asgi`` (hypercorn's
trio worker with Tidings' connection classes) on a loopback port, with a
short keep-alive timeout, and raw sockets play the client: the keep-alive
timer closes an idle connection on time and never a busy or recently used
one, the server's stop closes idle connections at once, a connection the
client closed ends on the server too, and a small response arrives in one
write.
"""

from __future__ import annotations

import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio

from bench import bare
from tidings.app import serve_asgi
from tidings.http.departure import Departure, departure_of

KEEP_ALIVE = 0.5
WRITE = 1.0
BIG = 32 * 1024 * 1024


# What the app of a ``/watch`` request saw: the Departure, and whether its
# wait was cut short by it.
WATCHED: dict[str, Any] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await bare.asgi_app(scope, receive, send)  # start-up and shutdown only
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/watch":  # waits, without reading receive, until the client goes
        departure = WATCHED["departure"] = departure_of(scope)
        assert departure is not None
        with trio.CancelScope() as block:
            departure.watch(block)
            WATCHED["waiting"].set()
            await trio.sleep(30)
        WATCHED["cancelled"] = block.cancelled_caught
        WATCHED["done"].set()
        return
    if scope["path"].startswith("/slow"):
        gone = False
        async with trio.open_nursery() as nursery:  # as Quart: a disconnect cancels

            async def watch() -> None:
                nonlocal gone
                gone = (await receive())["type"] == "http.disconnect"
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await trio.sleep(float(scope["path"].rsplit("/", 1)[1]))
            nursery.cancel_scope.cancel()
        if gone:
            return
    body = b'{"path": "%s"}' % scope["path"].encode()
    if scope["path"] == "/big":
        body = b"x" * BIG
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Server:
    def __init__(self, port: int, stop: trio.Event, stopped: trio.Event) -> None:
        self.port = port
        self.stop = stop
        self.stopped = stopped

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.port)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Server]:
    stop = trio.Event()
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await serve_asgi(app, "127.0.0.1", 0, grace_seconds=5, keep_alive_seconds=KEEP_ALIVE,
                             write_seconds=WRITE, shutdown_trigger=stop.wait,
                             task_status=task_status)
        finally:
            stopped.set()

    binds = await nursery.start(run)
    yield Server(int(binds[0].rsplit(":", 1)[1]), stop, stopped)
    stop.set()


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()


async def read_response(stream: trio.SocketStream) -> bytes:
    """One whole response, however many reads it takes."""
    data = b""
    with trio.fail_after(5):
        while True:
            chunk = await stream.receive_some(65536)
            assert chunk, f"the server closed the connection mid-response: {data!r}"
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if _ and len(body) >= int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
                return data


async def closed_within(stream: trio.SocketStream, seconds: float) -> bool:
    with trio.move_on_after(seconds):
        return await stream.receive_some(65536) == b""
    return False


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(server: Server) -> None:
    stream = await server.connect()
    await stream.send_all(request("/a"))
    await read_response(stream)
    started = trio.current_time()
    assert await closed_within(stream, KEEP_ALIVE + 2)
    assert trio.current_time() - started >= KEEP_ALIVE * 0.9


async def test_a_connection_in_use_outlives_the_timeout(server: Server) -> None:
    stream = await server.connect()
    started = trio.current_time()
    for n in range(8):  # 8 × 0.2 s: each request rearms the timer
        await stream.send_all(request(f"/{n}"))
        assert b'"/%d"' % n in await read_response(stream)
        await trio.sleep(KEEP_ALIVE * 0.4)
    assert trio.current_time() - started > KEEP_ALIVE * 3


async def test_a_request_longer_than_the_timeout_is_answered(server: Server) -> None:
    stream = await server.connect()
    await stream.send_all(request(f"/slow/{KEEP_ALIVE * 2.5}"))
    assert b"HTTP/1.1 200 " in await read_response(stream)
    await stream.send_all(request("/after"))
    assert b'"/after"' in await read_response(stream)


async def test_a_connection_its_client_closed_ends_on_the_server(server: Server) -> None:
    await trio.sleep(0.1)
    before = trio.lowlevel.current_statistics().tasks_living
    streams = [await server.connect() for _ in range(10)]
    for stream in streams:
        await stream.send_all(request("/x"))
        await read_response(stream)
    assert trio.lowlevel.current_statistics().tasks_living > before
    for stream in streams:
        await stream.aclose()
    # Well before the keep-alive timeout, every task of those connections is gone.
    with trio.fail_after(KEEP_ALIVE * 0.6):
        while trio.lowlevel.current_statistics().tasks_living > before:
            await trio.sleep(0.01)


async def test_stopping_closes_idle_connections_at_once_and_lets_busy_ones_finish(
    server: Server,
) -> None:
    idle = await server.connect()
    await idle.send_all(request("/idle"))
    await read_response(idle)
    busy = await server.connect()
    await busy.send_all(request("/slow/0.3"))
    await trio.sleep(0.1)
    started = trio.current_time()
    server.stop.set()
    assert await closed_within(idle, KEEP_ALIVE * 0.6)
    reply = await read_response(busy)
    assert b"HTTP/1.1 200 " in reply
    assert await closed_within(busy, 1)
    with trio.fail_after(2):
        await server.stopped.wait()
    assert trio.current_time() - started < 2


async def test_a_client_that_half_closes_after_its_request_gets_the_response(
    server: Server,
) -> None:
    # shutdown(SHUT_WR) after a whole request: the client waits for its answer.
    for path in ("/slow/0.2", "/a"):
        stream = await server.connect()
        await stream.send_all(request(path))
        await stream.send_eof()
        reply = await read_response(stream)
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b'"%s"}' % path.encode())
        assert await closed_within(stream, 1)


async def test_a_client_that_half_closes_mid_request_is_not_waited_for(server: Server) -> None:
    stream = await server.connect()
    await stream.send_all(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
    await stream.send_eof()
    with trio.fail_after(2):
        rest = b""
        while chunk := await stream.receive_some(65536):
            rest += chunk
    assert rest.startswith(b"HTTP/1.1 400 "), rest  # the body never came whole


async def test_a_client_gone_mid_request_is_told_to_the_app_without_receive(
    server: Server,
) -> None:
    # The server tells the app through the request's Departure: no task of
    # the app waits on ``receive`` for the disconnect (tidings.http.departure).
    WATCHED.update(waiting=trio.Event(), done=trio.Event())
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", server.port))
    stream = trio.SocketStream(sock)
    await stream.send_all(request("/watch"))
    with trio.fail_after(5):
        await WATCHED["waiting"].wait()
    assert not WATCHED["departure"].gone
    # Gone outright (a reset, not a half-close after the request).
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    with trio.fail_after(5):
        await WATCHED["done"].wait()
    assert WATCHED["cancelled"] and WATCHED["departure"].gone


async def test_a_block_watched_after_the_client_went_is_cancelled_at_once() -> None:
    departure = Departure()
    departure.depart()
    with trio.fail_after(1), trio.CancelScope() as block:
        departure.watch(block)
        await trio.sleep(5)
    assert block.cancelled_caught


async def stalled(server: Server) -> trio.SocketStream:
    """A client that asks for a large response and does not read it."""
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", server.port))
    stream = trio.SocketStream(sock)
    await stream.send_all(request("/big"))
    return stream


async def test_a_client_that_stops_reading_loses_its_connection(server: Server) -> None:
    stream = await stalled(server)
    await trio.sleep(WRITE + 1)  # the write has been stuck for longer than allowed
    received = 0
    with trio.fail_after(10):
        try:
            while chunk := await stream.receive_some(1024 * 1024):
                received += len(chunk)
        except trio.BrokenResourceError:
            pass  # reset: the server closed with data unread
    assert received < BIG  # the connection ended before the response did


async def test_a_client_that_stops_reading_does_not_hold_up_a_stop(server: Server) -> None:
    streams = [await stalled(server) for _ in range(3)]
    await trio.sleep(0.3)
    started = trio.current_time()
    server.stop.set()
    with trio.fail_after(WRITE + 3):
        await server.stopped.wait()
    assert trio.current_time() - started < WRITE + 3
    for stream in streams:
        await stream.aclose()


async def test_a_small_response_arrives_in_one_write(server: Server) -> None:
    # The client waits in its read before the response is written; a head
    # and a body written separately would wake it with the head alone.
    stream = await server.connect()
    for n in range(30):
        await stream.send_all(request(f"/slow/0.005?{n}"))
        with trio.fail_after(5):
            first = await stream.receive_some(65536)
        assert first.endswith(b'{"path": "/slow/0.005"}'), first


async def test_a_response_whose_application_ends_without_a_body_still_goes_out(
    nursery: trio.Nursery,
) -> None:
    async def headless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await app(scope, receive, send)
            return
        await receive()
        await send({"type": "http.response.start", "status": 204, "headers": []})

    stop = trio.Event()
    binds = await nursery.start(_serve, headless, stop.wait)
    stream = await trio.open_tcp_stream("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
    await stream.send_all(request("/"))
    with trio.fail_after(5):
        first = await stream.receive_some(65536)
    assert first.startswith(b"HTTP/1.1 204"), first
    stop.set()


async def _serve(
    asgi: Any, trigger: Callable[[], Awaitable[None]], task_status: trio.TaskStatus[list[str]],
) -> None:
    await serve_asgi(asgi, "127.0.0.1", 0, grace_seconds=2, keep_alive_seconds=KEEP_ALIVE,
                     shutdown_trigger=trigger, task_status=task_status)


async def test_an_error_escaping_one_connection_ends_that_connection_alone(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault where no one expects one (here h11, made to fail on a marked
    request): hypercorn let it out of the connection's task into the
    server's nursery, which stopped serving every connection. The connection
    closes, the fault is logged, and the server serves the next request."""
    import h11

    parse = h11.Connection.next_event

    def next_event(self: h11.Connection) -> Any:
        if b"X-Fault" in bytes(self.trailing_data[0]):
            raise RuntimeError("a fault in the HTTP parser")
        return parse(self)

    monkeypatch.setattr(h11.Connection, "next_event", next_event)
    idle = await server.connect()
    await idle.send_all(request("/before"))
    assert b'"/before"' in await read_response(idle)
    faulty = await server.connect()
    await faulty.send_all(b"GET /fault HTTP/1.1\r\nHost: t\r\nX-Fault: 1\r\n\r\n")
    assert await closed_within(faulty, 5)
    with trio.fail_after(5):  # logged once the connection is closed
        while not any("a connection failed" in r.getMessage() for r in caplog.records):
            await trio.sleep(0.01)
    for stream in (idle, await server.connect()):
        await stream.send_all(request("/after"))
        assert b'"/after"' in await read_response(stream)
    assert not server.stopped.is_set()


async def test_past_its_cap_a_connection_is_answered_503_and_closed(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Three connections at most: a fourth is told 503 and closed before
    anything is read; once one of the three closes, a new one is served."""
    stop = trio.Event()
    binds = await nursery.start(lambda task_status: serve_asgi(
        app, "127.0.0.1", 0, grace_seconds=1, keep_alive_seconds=30, write_seconds=WRITE,
        shutdown_trigger=stop.wait, max_connections=3, task_status=task_status))
    port = int(binds[0].rsplit(":", 1)[1])
    held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(3)]
    for stream in held:  # each one served, and so counted
        await stream.send_all(request("/held"))
        assert b'"/held"' in await read_response(stream)
    over = await trio.open_tcp_stream("127.0.0.1", port)
    answer = b""
    with trio.fail_after(5):
        while chunk := await over.receive_some(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head
    assert re.search(rb"x-request-id: [0-9a-f]{32}\r\n", head)  # as every answer
    assert b'"SERVICE_UNAVAILABLE"' in body and int(head.split(b"content-length: ")[1]) == len(body)
    assert any("client connections open" in r.getMessage() for r in caplog.records)
    await held.pop().aclose()
    with trio.fail_after(5):
        while True:  # the server notices the close
            fresh = await trio.open_tcp_stream("127.0.0.1", port)
            await fresh.send_all(request("/fresh"))
            first = await fresh.receive_some(65536)
            if not first.startswith(b"HTTP/1.1 503 "):
                break
            await fresh.aclose()
            await trio.sleep(0.05)
    assert first.startswith(b"HTTP/1.1 200 ")
    for stream in (*held, fresh, over):
        await stream.aclose()
    stop.set()
