"""Requests that hypercorn refuses before the application still get the envelope."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx
import pytest
import trio


async def exchange(base_url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes; read the answer until the server closes the connection."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    received = bytearray()
    with trio.fail_after(5):
        try:
            await stream.send_all(request)
        except trio.BrokenResourceError:
            pass  # the server may answer and close before taking everything
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
            received += data
    await stream.aclose()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def assert_envelope(status: int, headers: dict[str, str], body: bytes, expected: int) -> str:
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    assert re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])  # as every response
    document = json.loads(body)
    assert document["success"] is False
    assert document["error"]["code"] == "BAD_REQUEST"
    message: str = document["error"]["message"]
    assert message
    return message


async def test_a_100_kb_header_is_431_with_the_envelope(base_url: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 100_000 + b"\r\n\r\n"
    message = assert_envelope(*await exchange(base_url, request), expected=431)
    assert "16384 bytes" in message


async def test_the_16_kib_limit_holds_for_a_head_that_arrives_at_once(base_url: str) -> None:
    """h11 only limits a head still incomplete in its buffer; a 17 KiB head sent
    in one write used to be served."""

    def request(size: int) -> bytes:
        start = b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\nX-Pad: "
        pad = size - len(start) - len(b"\r\n\r\n")
        return start + b"x" * pad + b"\r\n\r\n"

    assert len(request(16384)) == 16384
    status, _, _ = await exchange(base_url, request(16384))
    assert status == 200
    for size in (16385, 17_000, 40_000, 65_000):
        message = assert_envelope(*await exchange(base_url, request(size)), expected=431)
        assert "16384 bytes" in message
    # Many headers that add up past the limit count the same.
    many = b"GET /healthz HTTP/1.1\r\nHost: a\r\n" + b"".join(
        b"X-H%d: %s\r\n" % (n, b"y" * 1000) for n in range(20)) + b"\r\n"
    assert_envelope(*await exchange(base_url, many), expected=431)


async def test_a_malformed_header_line_is_400_with_the_envelope(base_url: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: a\r\nthis line has no colon\r\n\r\n"
    assert_envelope(*await exchange(base_url, request), expected=400)


async def test_a_malformed_request_line_is_400_with_the_envelope(
    base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidings.access")
    for request in (b"GARBAGE\r\n\r\n", b"GET /a b c HTTP/1.1\r\n\r\n", b"\x00\x01\x02\r\n\r\n"):
        status, headers, body = await exchange(base_url, request)
        assert_envelope(status, headers, body, expected=400)
        # Logged as every request is, under the id its answer carries.
        [line] = [r for r in caplog.records if r.name == "tidings.access"
                  and getattr(r, "request_id", None) == headers["x-request-id"]]
        assert (line.route, line.status) == ("(unread)", 400)  # type: ignore[attr-defined]


async def test_a_malformed_request_after_a_good_one_on_the_same_connection(
    base_url: str,
) -> None:
    good = b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
    status, headers, body = await exchange(base_url, good + b"NOT HTTP\r\n\r\n")
    # The first answer is the 200; the envelope of the 400 follows it.
    assert status == 200
    second = body[body.index(b"HTTP/1.1 400"):]
    head, _, envelope = second.partition(b"\r\n\r\n")
    assert json.loads(envelope)["error"]["code"] == "BAD_REQUEST"


async def test_a_client_gone_mid_body_after_its_answer_harms_nothing(base_url: str) -> None:
    """Answered early (401, 404) while its chunked body was still coming, a
    client that hangs up leaves h11 an incomplete message: no error answer
    is sent over the response under way, and the server serves on."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    heads = [
        b"POST /emails HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n",
        b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n",
        b"POST /emails HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    ]
    for _ in range(5):
        streams = []
        for head in heads * 4:
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(head)
            streams.append(stream)
        await trio.sleep(0.3)
        for stream in streams:
            await stream.aclose()
        await trio.sleep(0.2)
    status, _, _ = await exchange(
        base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert status == 200


async def test_bytes_after_a_request_that_closes_are_not_read(
    base_url: str, client: Any
) -> None:
    """RFC 9112 §9.6: the request with ``Connection: close`` (or of HTTP/1.0)
    is answered, then the connection closes; what followed it in the same
    write is neither read nor answered with a 400 in the response's place."""
    for request in (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.0\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nnot http at all\r\n\r\n",
    ):
        status, headers, body = await exchange(base_url, request)
        assert status == 200, body
        assert body.count(b"HTTP/1.") == 0, body  # one response, no second
        assert headers["connection"].lower() == "close"
    token = client.headers["authorization"]
    payload = json.dumps({"email": "close@example.com"}).encode()
    status, _, body = await exchange(base_url, (
        b"POST /contacts HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: " + token.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    ))
    assert status == 201, body
    assert json.loads(body)["data"]["email"] == "close@example.com"


async def test_a_method_is_case_sensitive(base_url: str) -> None:
    """RFC 9110 §9.1: "post" is no POST, though a router would take it for one
    (and a filter in front, checking for POST, would not): 501, as for a
    transfer coding Tidings does not implement."""
    body = b'{"email": "lower@example.com"}'
    status, headers, answer = await exchange(base_url, (
        b"post /contacts HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer svc_team_x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body))
    assert "case-sensitive" in assert_envelope(status, headers, answer, 501)
    status, headers, answer = await exchange(base_url, (
        b"POST /contacts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"))
    assert "transfer coding" in assert_envelope(status, headers, answer, 501)


async def test_a_method_tidings_has_no_route_for_is_501_and_one_it_has_elsewhere_405(
    base_url: str, client: httpx.AsyncClient
) -> None:
    for method in (b"PROPFIND", b"FOO", b"PRI"):
        status, headers, answer = await exchange(
            base_url, method + b" /contacts HTTP/1.1\r\nHost: x\r\n\r\n")
        assert "method" in assert_envelope(status, headers, answer, 501), method
    # PUT is a method of Tidings, only not of this path; TRACE, a method of
    # RFC 9110, of no path (CONTRACT §2: a wrong method is 405).
    assert (await client.put("/contacts", json={})).status_code == 405
    traced = await client.request("TRACE", "/contacts")
    assert traced.status_code == 405 and traced.json()["error"]["code"] == "BAD_REQUEST"
    assert "TRACE" not in traced.headers["allow"]
