"""Requests that ask for another protocol, or name no path, or a host the
application's framework cannot encode: each gets one answer in the
envelope (or the route's own), and the server goes on serving."""

from __future__ import annotations

import base64
import json

import httpx
import pytest

from tests.http.test_protocol_errors import assert_envelope, exchange

# A valid HTTP2-Settings value (RFC 9113 §3.2.1 in RFC 7540's upgrade): no settings.
NO_SETTINGS = base64.urlsafe_b64encode(b"").decode()
# INITIAL_WINDOW_SIZE (4) of 2^31, which HTTP/2 refuses.
TOO_LARGE_WINDOW = base64.urlsafe_b64encode(bytes.fromhex("000480000000")).decode()


async def still_serving(http: httpx.AsyncClient) -> None:
    response = await http.get("/healthz")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("settings", ["a", "!!!notbase64", TOO_LARGE_WINDOW, NO_SETTINGS])
async def test_an_h2c_upgrade_is_ignored_and_answered_in_http_1_1(
    base_url: str, http: httpx.AsyncClient, settings: str
) -> None:
    """RFC 9110 §7.8 lets a server ignore ``Upgrade``; RFC 9113 §3.1 retired
    the h2c upgrade. Tidings speaks HTTP/1.1 only: the request is answered
    as one, whatever its ``HTTP2-Settings`` say."""
    status, headers, body = await exchange(base_url, (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n"
        b"Connection: Upgrade, HTTP2-Settings, close\r\n"
        b"HTTP2-Settings: " + settings.encode() + b"\r\n\r\n"))
    assert status == 200, body
    assert "upgrade" not in headers
    assert json.loads(body)["success"] is True
    await still_serving(http)


async def test_the_http_2_preface_is_no_method_tidings_implements(
    base_url: str, http: httpx.AsyncClient
) -> None:
    """HTTP/2 with prior knowledge (RFC 9113 §3.3) starts with ``PRI * HTTP/2.0``:
    501 in the envelope, and the connection closes."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
    status, headers, body = await exchange(base_url, preface)
    assert "method" in assert_envelope(status, headers, body, 501)
    await still_serving(http)


async def test_a_websocket_upgrade_is_answered_as_plain_http(
    base_url: str, http: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    upgrade = (b"Upgrade: websocket\r\nConnection: Upgrade, close\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
    status, headers, body = await exchange(
        base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n")
    assert status == 200, body
    assert json.loads(body)["success"] is True
    token = client.headers["authorization"].encode()
    status, headers, body = await exchange(base_url, (
        b"GET /contacts HTTP/1.1\r\nHost: x\r\nAuthorization: " + token + b"\r\n"
        + upgrade + b"\r\n"))
    assert status == 200, body
    assert json.loads(body)["data"]["object"] == "list"
    await still_serving(http)


@pytest.mark.parametrize("target", [b"?x=1", b"?", b"healthz", b"http:healthz"])
@pytest.mark.parametrize("method", [b"GET", b"POST", b"OPTIONS"])
async def test_a_target_that_is_no_path_is_400(
    base_url: str, http: httpx.AsyncClient, method: bytes, target: bytes
) -> None:
    """RFC 9112 §3.2: a request target is a path from ``/`` (or a whole URI,
    or ``*`` for OPTIONS)."""
    status, headers, body = await exchange(
        base_url, method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert "request line" in assert_envelope(status, headers, body, 400)
    await still_serving(http)


async def test_a_whole_uri_as_the_target_is_served(base_url: str) -> None:
    status, _, body = await exchange(
        base_url, b"GET http://x/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200, body


@pytest.mark.parametrize("host", [b".", b"x..y", b"a" * 64 + b".example", b"-x-"])
async def test_a_host_the_framework_cannot_encode_is_no_500(
    base_url: str, http: httpx.AsyncClient, host: bytes
) -> None:
    for path in (b"/healthz", b"/openapi.json", b"/no-such-route"):
        status, headers, body = await exchange(
            base_url, b"GET " + path + b" HTTP/1.1\r\nHost: " + host
            + b"\r\nConnection: close\r\n\r\n")
        assert status < 500, (path, host, status, body)
        document = json.loads(body)
        assert "success" in document or "openapi" in document
    await still_serving(http)


async def test_a_connection_that_asked_to_upgrade_goes_on_in_http_1_1(base_url: str) -> None:
    """The switch refused (the answer is no 101), the connection carries the
    next request as any other."""
    for upgrade in (b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    b"HTTP2-Settings: " + NO_SETTINGS.encode() + b"\r\n",
                    b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n"):
        status, _, body = await exchange(base_url, (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + upgrade + b"\r\n"
            b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
        assert status == 200, body
        assert body.count(b"HTTP/1.1 200 ") == 1, body  # the second answer, after the first
        assert b"101" not in body.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("target", [b"http://[::1/livez", b"http://[zz]/livez", b"HTTP://[/x"])
async def test_a_whole_uri_that_is_no_uri_is_400(
    base_url: str, http: httpx.AsyncClient, target: bytes
) -> None:
    status, headers, body = await exchange(
        base_url, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "request line" in assert_envelope(status, headers, body, 400)
    await still_serving(http)


async def test_an_error_answer_to_a_head_is_its_head(base_url: str) -> None:
    """The status line and headers, without the body a GET would get."""
    for request, expected in (
        (b"HEAD ? HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"HEAD * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"HEAD /livez HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 17000 + b"\r\n\r\n", 431),
    ):
        status, headers, body = await exchange(base_url, request)
        assert status == expected and body == b"", (status, body)
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close" and int(headers["content-length"]) > 0
