"""HTTP conventions that hold under hostile input: 405 Allow, one credential only."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.conftest import Credential, assert_error


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/contacts", {"GET", "HEAD", "OPTIONS", "POST"}),
        ("DELETE", "/healthz", {"GET", "HEAD", "OPTIONS"}),
        ("POST", "/tokens/00000000-0000-0000-0000-000000000000", {"DELETE", "OPTIONS"}),
    ],
)
async def test_a_405_carries_allow_and_the_envelope(
    client: httpx.AsyncClient, method: str, path: str, allowed: set[str]
) -> None:
    response = await client.request(method, path)
    message = assert_error(response, 405, "BAD_REQUEST")
    assert method in message
    assert {part.strip() for part in response.headers["allow"].split(",")} == allowed


async def test_two_authorization_headers_are_401(
    http: httpx.AsyncClient, acme: Credential
) -> None:
    good = f"Bearer {acme.secret}"
    for pair in (
        [("Authorization", good), ("Authorization", "Bearer junk")],
        [("Authorization", "Bearer junk"), ("Authorization", good)],
        [("Authorization", good), ("Authorization", good)],
    ):
        response = await http.get("/contacts", headers=pair)
        message = assert_error(response, 401, "UNAUTHORIZED")
        assert "more than one" in message
    assert (await http.get("/contacts", headers=[("Authorization", good)])).status_code == 200


@pytest.mark.parametrize(
    "template",
    ["Bearer {good}, Bearer junk", "Bearer {good} junk", "Bearer {good},junk",
     "Bearer junk, Bearer {good}"],
)
async def test_a_header_with_two_credentials_is_401(
    http: httpx.AsyncClient, acme: Credential, template: str
) -> None:
    response = await http.get(
        "/contacts", headers={"Authorization": template.format(good=acme.secret)}
    )
    assert_error(response, 401, "UNAUTHORIZED")


@pytest.mark.parametrize(("authorization", "challenge"), [
    (None, 'Bearer realm="tidings"'),
    ("Basic YTpi", 'Bearer realm="tidings", error="invalid_request"'),
    ("Bearer svc_team_unknown", 'Bearer realm="tidings", error="invalid_token"'),
])
async def test_a_401_says_how_to_authenticate(
    http: httpx.AsyncClient, authorization: str | None, challenge: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = await http.post("/sms", headers=headers, json={})
    assert_error(response, 401, "UNAUTHORIZED")
    assert response.headers["WWW-Authenticate"] == challenge


async def test_made_up_methods_do_not_grow_the_metrics(http: httpx.AsyncClient) -> None:
    # Not implemented (501) before any route is looked at: counted, all in
    # one series, whatever the method's name.
    for number in range(20):
        response = await http.request(f"X{number}METHOD", "/contacts")
        assert_error(response, 501, "BAD_REQUEST")
    text = (await http.get("/metrics")).text
    assert "X0METHOD" not in text and "X19METHOD" not in text
    assert 'method="OTHER",route="(unread)",status="501"} 20.0' in text
    # A method of Tidings on a path without it is 405, counted under its name.
    assert_error(await http.request("PUT", "/contacts"), 405, "BAD_REQUEST")
    text = (await http.get("/metrics")).text
    assert 'method="PUT",route="unmatched",status="405"} 1.0' in text


async def test_requests_refused_before_any_route_are_counted(http: httpx.AsyncClient) -> None:
    """Every answered request is in the metrics, as in the access log: those
    refused for their framing or coding too."""
    host, port = http.base_url.host, http.base_url.port
    assert port is not None
    for request in (
        b"POST /contacts HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /contacts HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 2\r\n\r\nab",
        b"GARBAGE\r\n\r\n",
    ):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(request)
            with trio.fail_after(5):
                while await stream.receive_some():
                    pass
    text = (await http.get("/metrics")).text
    for series in ('method="POST",route="(ambiguous)",status="400"} 1.0',
                   'method="POST",route="(content coding)",status="415"} 1.0',
                   'method="OTHER",route="(unread)",status="400"} 1.0'):
        assert series in text, series


async def test_options_is_204_with_allow_and_no_body(http: httpx.AsyncClient) -> None:
    # HTTP's own method, not an operation of the API document: asked unchecked.
    async with httpx.AsyncClient(base_url=http.base_url) as plain:
        response = await plain.options("/contacts")
    assert response.status_code == 204
    assert {m.strip() for m in response.headers["allow"].split(",")} == {
        "GET", "HEAD", "OPTIONS", "POST"
    }
    assert response.content == b"" and "content-type" not in response.headers
