"""Requests that hypercorn refuses before the application still get the envelope."""

from __future__ import annotations

import json

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


async def test_a_malformed_header_line_is_400_with_the_envelope(base_url: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: a\r\nthis line has no colon\r\n\r\n"
    assert_envelope(*await exchange(base_url, request), expected=400)


async def test_a_malformed_request_line_is_400_with_the_envelope(base_url: str) -> None:
    for request in (b"GARBAGE\r\n\r\n", b"GET /a b c HTTP/1.1\r\n\r\n", b"\x00\x01\x02\r\n\r\n"):
        assert_envelope(*await exchange(base_url, request), expected=400)


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
