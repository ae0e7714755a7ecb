"""What holds a place among the requests in flight: work, not the wait for
the rest of a body an answer did not need."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import trio

from tests.conftest import MakeToken
from tidings.config import Config


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(database_url=database_url, rate_limit_per_second=0, max_in_flight=4,
                  db_pool_size=2, shutdown_grace_seconds=2)


async def _head(stream: trio.SocketStream) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        received += chunk
    return received


async def test_answers_waiting_for_a_body_they_did_not_need_hold_no_place(
    base_url: str, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """As many clients as there are places announce a body, send none, and
    are answered 401 (their token is no token): while those answers wait for
    the bodies (up to 2 s, so that a body on its way keeps the connection),
    a team's request is served, not shed."""
    caplog.set_level(logging.INFO, logger="tidings.access")
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    streams = []
    for _ in range(4):
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            b"POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer svc_team_bogus\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        streams.append(stream)

    def decided() -> int:  # each answer is logged as it starts, before its wait
        return sum(1 for r in caplog.records
                   if r.name == "tidings.access" and getattr(r, "status", None) == 401)

    with trio.fail_after(10):
        while decided() < 4:
            await trio.sleep(0.01)
    with trio.fail_after(1.5):  # within the 2 s the answers above wait
        listed = await client.get("/contacts")
    assert listed.status_code == 200, listed.text
    for stream in streams:
        with trio.fail_after(5):
            assert (await _head(stream)).startswith(b"HTTP/1.1 401 ")
        await stream.aclose()


async def test_a_shed_request_is_answered_whole_when_more_follows_it(
    base_url: str, make_token: MakeToken
) -> None:
    """Every place is held by an upload that stalls (two teams, two each);
    a third team's request, with another request right behind it in the
    same write, is shed: its 503 (which closes the connection) is written
    whole before the close, however the bytes behind it were read."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    stalled = []
    for team in ("one", "two"):
        secret = (await make_token(team=team)).secret.encode()
        for _ in range(2):
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(
                b"POST /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret
                + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            stalled.append(stream)
    third = (await make_token(team="three")).secret.encode()
    request = b"GET /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + third + b"\r\n\r\n"
    with trio.fail_after(20):
        for follower in (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n") * 5:
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(request + follower)
            received = b""
            while chunk := await stream.receive_some(65536):
                received += chunk
            await stream.aclose()
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), (follower, received)
            assert b"retry-after: " in head.lower()
            assert json.loads(body)["error"]["code"] == "SERVICE_UNAVAILABLE"
    for stream in stalled:
        await stream.aclose()
