"""HTTP conventions (CONTRACT §2): envelopes for every failure, limits, validation,
and the routes without a token (health, metrics, OpenAPI)."""

from __future__ import annotations

import gzip
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.conftest import Credential, MakeToken, assert_error
from tidings.config import Config
from tidings.http.app import all_routes
from tidings.http.routing import MUTATING
from tidings.service import Service

# --- helpers and fixtures -----------------------------------------------------


@pytest.fixture
def config_changes() -> dict[str, Any]:
    """Settings a test changes; tests override it with ``parametrize``."""
    return {}


@pytest.fixture
def config(config: Config, config_changes: dict[str, Any]) -> Config:
    return config.with_(**config_changes)




def padded_contact(size: int, email: str = "pad@example.com") -> bytes:
    """A valid contact body of exactly ``size`` bytes (JSON padded with spaces)."""
    bare = json.dumps({"email": email}).encode()
    body = bare[:-1] + b" " * (size - len(bare)) + b"}"
    assert len(body) == size
    return body


JSON_HEADERS = {"Content-Type": "application/json"}


# --- unknown routes and wrong methods --------------------------------------------


async def test_unknown_route_is_a_404_envelope(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.get("/no-such-thing"), 404, "NOT_FOUND")
    assert "/no-such-thing" in message
    # Without credentials too, and for other methods.
    async with httpx.AsyncClient(base_url=str(client.base_url)) as anonymous:
        assert_error(await anonymous.get("/no/such/thing"), 404, "NOT_FOUND")
    assert_error(await client.post("/no-such-thing", json={}), 404, "NOT_FOUND")


async def test_wrong_method_is_a_405_bad_request(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.put("/contacts", json={}), 405, "BAD_REQUEST")
    assert "PUT" in message
    assert_error(await client.delete("/healthz"), 405, "BAD_REQUEST")
    # A literal path beside a parameter (/emails/batch, /emails/{email_id}) is
    # its own resource: another method on it is 405, not a bad id.
    for method, path, allowed in [("GET", "/emails/batch", "POST"),
                                  ("PATCH", "/emails/batch", "POST"),
                                  ("GET", "/sms/preview", "POST"),
                                  ("DELETE", "/contacts/import", "POST")]:
        response = await client.request(method, path)
        assert "is not allowed" in assert_error(response, 405, "BAD_REQUEST"), path
        assert response.headers["allow"] == f"OPTIONS, {allowed}"
    async with httpx.AsyncClient(base_url=client.base_url) as plain:  # not in OpenAPI
        options = await plain.options("/emails/batch")
    assert set(options.headers["allow"].split(", ")) == {"POST", "OPTIONS"}
    assert "not a valid UUID" in assert_error(await client.get("/emails/batches"), 400,
                                              "BAD_REQUEST")


async def test_a_query_parameter_a_route_does_not_take_is_400(
    client: httpx.AsyncClient,
) -> None:
    """As on the list routes: nothing meant for something else is dropped."""
    refused = await client.post("/contacts?bogus=1", json={"email": "q@example.com"})
    assert "bogus: is not a known query parameter" in assert_error(refused, 400, "BAD_REQUEST")
    assert ok_data(await client.get("/contacts"))["data"] == []
    created = await client.post("/contacts", json={"email": "q@example.com"})
    assert created.status_code == 201, created.text
    contact_id = created.json()["data"]["id"]
    assert_error(await client.get(f"/contacts/{contact_id}?cache=123"), 400, "BAD_REQUEST")
    assert (await client.get(f"/contacts/{contact_id}")).status_code == 200
    listed = await client.get("/contacts?bogus=1")  # a list route, as before
    assert "bogus" in assert_error(listed, 400, "BAD_REQUEST")


def ok_data(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()["data"]


async def test_trailing_slash_does_not_redirect(client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz/")
    assert health.status_code == 200, health.text
    assert "location" not in health.headers
    created = await client.post("/contacts/", json={"email": "slash@example.com"})
    assert created.status_code == 201, created.text
    fetched = await client.get(f"/contacts/{created.json()['data']['id']}/")
    assert fetched.status_code == 200, fetched.text


# --- 500 ---------------------------------------------------------------------------


async def test_unexpected_failure_is_a_500_without_a_trace(
    client: httpx.AsyncClient, service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    async with service.db.acquire() as conn:
        await conn.execute("DROP TABLE contacts CASCADE")
    with caplog.at_level(logging.ERROR, logger="tidings.http"):
        response = await client.post("/contacts", json={"email": "boom@example.com"})
    assert_error(response, 500, "INTERNAL_ERROR")
    for leak in ("Traceback", "asyncpg", "contacts", "relation", 'File "'):
        assert leak not in response.text, response.text
    logged = [r for r in caplog.records if r.name == "tidings.http" and r.exc_info]
    assert logged, caplog.records
    assert "Traceback" in caplog.text
    assert "contacts" in caplog.text  # the cause is in the log, not in the answer


# --- 413 ---------------------------------------------------------------------------

SMALL_BODY = pytest.mark.parametrize(
    "config_changes", [{"max_body_bytes": 2048}], ids=["max_body_bytes=2048"]
)


@SMALL_BODY
async def test_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/contacts", content=padded_contact(2049), headers=JSON_HEADERS)
    message = assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert "2048" in message
    much_larger = await client.post(
        "/contacts", content=padded_contact(100_000), headers=JSON_HEADERS
    )
    assert_error(much_larger, 413, "PAYLOAD_TOO_LARGE")


@SMALL_BODY
async def test_chunked_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    body = padded_contact(4096)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    # No Content-Length: the limit must hold while the body streams in.
    response = await client.post("/contacts", content=chunks(), headers=JSON_HEADERS)
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


@SMALL_BODY
async def test_body_within_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    for size in (2047, 2048):
        body = padded_contact(size, email=f"pad{size}@example.com")
        response = await client.post("/contacts", content=body, headers=JSON_HEADERS)
        assert response.status_code == 201, response.text


# --- 429 ---------------------------------------------------------------------------

RATE_LIMITED = pytest.mark.parametrize(
    "config_changes",
    [{"rate_limit_per_second": 1, "rate_limit_burst": 3}],
    ids=["rate=1/s,burst=3"],
)


@RATE_LIMITED
async def test_rate_limit_per_token(client: httpx.AsyncClient, make_token: MakeToken) -> None:
    missing = f"/contacts/{uuid.uuid4()}"
    for _ in range(3):
        assert (await client.get(missing)).status_code == 404
    limited = await client.get(missing)
    assert_error(limited, 429, "TOO_MANY_REQUESTS")
    retry_after = limited.headers.get("Retry-After")
    assert retry_after is not None and retry_after.isdigit(), limited.headers
    assert int(retry_after) >= 1

    other = await make_token(team="acme")
    response = await client.get(missing, headers=other.headers)
    assert response.status_code == 404, response.text
    # The first token is still limited.
    assert_error(await client.get(missing), 429, "TOO_MANY_REQUESTS")


# --- validation --------------------------------------------------------------------


async def test_unparseable_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/contacts", content=b'{"email": ', headers=JSON_HEADERS)
    message = assert_error(response, 400, "BAD_REQUEST")
    # What is wrong, and where.
    assert message == (
        "request body is not valid JSON: EOF while parsing a value at line 1 column 10"
    )
    deep = b'{"email": "a@example.com", "properties": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    response = await client.post("/contacts", content=deep, headers=JSON_HEADERS)
    message = assert_error(response, 400, "BAD_REQUEST")
    assert re.fullmatch(
        r"request body is not valid JSON: nested too deeply at line 1 column \d+", message
    ), message


async def test_a_route_that_takes_no_body_refuses_any_but_an_empty_object(
    client: httpx.AsyncClient,
) -> None:
    """Read as any body is: nested beyond the parser, or with a byte order
    mark, it is no empty object (400 naming the body, never a 500)."""
    cancel = f"/emails/{uuid.uuid4()}/cancel"
    for body in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 2000 + b"1" + b"}" * 2000,
                 b"\xef\xbb\xbf{}", b"\xff{}"):
        response = await client.post(cancel, content=body, headers=JSON_HEADERS)
        assert "takes no body" in assert_error(response, 400, "BAD_REQUEST"), body[:10]
    for body in (b"", b" { } ", b"{}"):
        response = await client.post(cancel, content=body, headers=JSON_HEADERS)
        assert_error(response, 404, "NOT_FOUND")


async def test_a_body_in_a_content_coding_is_415_naming_it(
    client: httpx.AsyncClient, service: Service
) -> None:
    plain = b'{"email": "coded@example.com"}'
    for coding, body in (("gzip", gzip.compress(plain)), ("identity, br", plain),
                         ("DEFLATE", plain)):
        response = await client.post(
            "/contacts", content=body, headers={**JSON_HEADERS, "Content-Encoding": coding}
        )
        message = assert_error(response, 415, "BAD_REQUEST")
        assert f"Content-Encoding: {coding.split()[-1].lower()} is not supported" in message
        assert response.headers["accept-encoding"] == "identity"
    # The public routes too: a provider's report is never stored as it came.
    response = await client.post("/providers/twilio/inbound", content=b"x=1",
                                 headers={"Content-Encoding": "gzip"})
    assert response.status_code == 415
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM contacts") == 0
    # No coding, or identity, is a body as it is.
    response = await client.post(
        "/contacts", content=plain, headers={**JSON_HEADERS, "Content-Encoding": "identity"}
    )
    assert response.status_code == 201, response.text


async def test_a_key_given_twice_in_one_object_is_400_naming_it(
    client: httpx.AsyncClient,
) -> None:
    # Parsers differ on which value a repeated key keeps: none is chosen here.
    bodies = [
        (b'{"email": "a@example.com", "email": "b@example.com"}', "email"),
        # Named by its path, as any other field of a nested object is.
        (b'{"email": "a@example.com", "properties": {"plan": "x", "plan": "y"}}',
         "properties.plan"),
    ]
    for body, key in bodies:
        response = await client.post("/contacts", content=body, headers=JSON_HEADERS)
        message = assert_error(response, 400, "BAD_REQUEST")
        assert f"body: {key}: is given more than once" in message, message
    assert (await client.get("/contacts")).json()["data"]["data"] == []
    batch = (b'[{"from": "a@x.example", "subject": "Hi", "text": "hi", "to": "b@example.com",'
             b' "to": "c@example.com"}]')
    response = await client.post("/emails/batch", content=batch, headers=JSON_HEADERS)
    assert "0.to: is given more than once" in assert_error(response, 400, "BAD_REQUEST")


async def test_a_query_parameter_given_twice_is_400_saying_so(client: httpx.AsyncClient) -> None:
    """No parameter takes several values; one repeated is refused as such,
    not as a value of the wrong type."""
    for path, query in (("/contacts", "limit=1&limit=1"), ("/contacts", "search=a&search=b"),
                        ("/sms", "status=sent&status=queued"), ("/events", "offset=0&offset=1")):
        response = await client.get(f"{path}?{query}")
        message = assert_error(response, 400, "BAD_REQUEST")
        name = query.split("=")[0]
        assert message == f"invalid query: {name}: is given more than once", message


async def test_missing_body_is_400(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/contacts"), 400, "BAD_REQUEST")
    response = await client.post("/contacts", content=b"  ", headers=JSON_HEADERS)
    assert_error(response, 400, "BAD_REQUEST")


async def test_body_that_is_not_an_object_is_400(client: httpx.AsyncClient) -> None:
    for body in (b"[]", b"null", b'"ada@example.com"', b"5"):
        response = await client.post("/contacts", content=body, headers=JSON_HEADERS)
        assert_error(response, 400, "BAD_REQUEST")


async def test_wrong_type_is_400_naming_the_field(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.post("/contacts", json={"email": 5}), 400, "BAD_REQUEST")
    assert "email" in message
    message = assert_error(
        await client.post("/contacts", json={"email": "a@example.com", "unsubscribed": "yes"}),
        400,
        "BAD_REQUEST",
    )
    assert "unsubscribed" in message


async def test_unknown_field_is_400_naming_it(client: httpx.AsyncClient) -> None:
    response = await client.post("/contacts", json={"email": "a@example.com", "nickname": "A"})
    message = assert_error(response, 400, "BAD_REQUEST")
    assert "nickname" in message


async def test_bad_uuid_in_the_path_is_400(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.get("/contacts/not-a-uuid"), 400, "BAD_REQUEST")
    assert "contact_id" in message


async def test_an_id_in_the_path_is_written_one_way(client: httpx.AsyncClient) -> None:
    """The hyphenated form, in either case, names a resource; the other
    spellings Python's UUID() reads do not, so one resource has one path."""
    contact = (await client.post("/contacts", json={"email": "one@example.com"})).json()["data"]
    cid = UUID(contact["id"])
    for path in (f"/contacts/{cid}", f"/contacts/{str(cid).upper()}"):
        assert (await client.get(path)).status_code == 200, path
    for spelling in (cid.hex, f"{{{cid}}}", f"urn:uuid:{cid}"):
        for path in (f"/contacts/{spelling}", f"/contacts/{spelling}/segments",
                     f"/emails/{spelling}", f"/templates/{spelling}"):
            response = await client.get(path)
            assert response.status_code in (400, 404), (path, response.text)
            assert response.status_code == 400 or path.startswith("/templates/"), path


async def test_the_token_is_checked_before_the_path(http: httpx.AsyncClient) -> None:
    assert_error(await http.get("/contacts/not-a-uuid"), 401, "UNAUTHORIZED")


@pytest.mark.parametrize(
    "body, field",
    [
        ({"email": "z@example.com", "first_name": "a\u0000b"}, "first_name"),
        ({"email": "z@example.com", "properties": {"a": "\u0000"}}, "properties"),
        ({"email": "z@example.com", "properties": {"k\u0000": 1}}, "properties"),
    ],
)
async def test_nul_characters_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    response = await client.post("/contacts", json=body)
    message = assert_error(response, 400, "BAD_REQUEST")
    assert field in message and "NUL" in message


@pytest.mark.parametrize("limit", ["1.0", "1e2", "two", "", "0", "-1"])
async def test_limit_must_be_a_whole_number_from_1(
    http: httpx.AsyncClient, make_token: MakeToken, limit: str
) -> None:
    manager = await make_token(step_up=True)
    response = await http.get(f"/tokens?limit={limit}", headers=manager.headers)
    message = assert_error(response, 400, "BAD_REQUEST")
    assert "limit" in message


@pytest.mark.parametrize(
    "path", ["/contacts", "/segments", "/templates", "/webhook-endpoints", "/events"]
)
@pytest.mark.parametrize("offset", ["-1", "1000000001", "99999999999999999999", "1.5"])
async def test_offset_out_of_range_is_400(
    client: httpx.AsyncClient, path: str, offset: str
) -> None:
    message = assert_error(await client.get(f"{path}?offset={offset}"), 400, "BAD_REQUEST")
    assert "offset" in message


async def test_the_largest_offset_is_an_empty_page(client: httpx.AsyncClient) -> None:
    response = await client.get("/contacts?offset=1000000000")
    assert response.status_code == 200, response.text
    assert response.json()["data"] == {"object": "list", "data": [], "has_more": False}


async def test_contact_without_email_or_phone_is_400(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/contacts", json={"first_name": "Ada"}), 400, "BAD_REQUEST")
    assert_error(await client.post("/contacts", json={}), 400, "BAD_REQUEST")


async def test_unparseable_phone_is_400_naming_phone(client: httpx.AsyncClient) -> None:
    for phone in ("call me maybe", "+1 555"):
        response = await client.post("/contacts", json={"phone": phone})
        message = assert_error(response, 400, "BAD_REQUEST")
        assert "phone" in message


async def test_duplicate_email_is_409_within_a_team_only(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    first = await client.post("/contacts", json={"email": "dup@example.com"})
    assert first.status_code == 201, first.text
    again = await client.post("/contacts", json={"email": "dup@example.com"})
    message = assert_error(again, 409, "CONFLICT")
    assert "email" in message

    globex = await make_token(team="globex")
    elsewhere = await http.post(
        "/contacts", json={"email": "dup@example.com"}, headers=globex.headers
    )
    assert elsewhere.status_code == 201, elsewhere.text


async def test_another_teams_contact_is_404(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    created = await client.post("/contacts", json={"email": "mine@example.com"})
    assert created.status_code == 201, created.text
    contact_id = created.json()["data"]["id"]
    globex: Credential = await make_token(team="globex")
    response = await http.get(f"/contacts/{contact_id}", headers=globex.headers)
    assert_error(response, 404, "NOT_FOUND")
    assert "mine@example.com" not in response.text
    assert (await client.get(f"/contacts/{contact_id}")).status_code == 200


# --- health, metrics, OpenAPI ------------------------------------------------------


async def test_healthz_needs_no_token(http: httpx.AsyncClient) -> None:
    response = await http.get("/healthz")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["success"] is True
    assert "data" in body


async def test_metrics_needs_no_token(client: httpx.AsyncClient, http: httpx.AsyncClient) -> None:
    created = await client.post("/contacts", json={"email": "metered@example.com"})
    assert created.status_code == 201
    response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    counted = re.search(
        r'^tidings_http_requests_total\{[^}]*route="/contacts"[^}]*\} (\S+)$', text, re.M
    )
    assert counted, text
    assert float(counted.group(1)) >= 1
    assert re.search(
        r'^tidings_http_requests_total\{[^}]*method="POST"[^}]*route="/contacts"'
        r'[^}]*status="201"',
        text,
        re.M,
    ), text
    assert re.search(r"^tidings_actors_running(\{[^}]*\})? \S+$", text, re.M), text


async def test_openapi_describes_every_route(http: httpx.AsyncClient) -> None:
    response = await http.get("/openapi.json")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    document = response.json()
    assert document["openapi"] == "3.1.0"
    paths = document["paths"]

    declared: dict[str, set[str]] = {}
    for route in all_routes():
        declared.setdefault(route.path, set()).add(route.method.lower())
        operation = paths.get(route.path, {}).get(route.method.lower())
        assert operation is not None, f"{route.method} {route.path} is not described"
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        if route.method in MUTATING and not route.public:
            assert "Idempotency-Key" in headers, f"{route.method} {route.path}"
        for name in route.path_params:
            assert any(p["name"] == name and p["in"] == "path" for p in operation["parameters"]), (
                f"{route.method} {route.path}: path parameter {name}"
            )
    assert {path: set(methods) for path, methods in paths.items()} == declared

    create = paths["/contacts"]["post"]
    ref = create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.startswith("#/components/schemas/")
    component = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "email" in component["properties"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in create["parameters"])


async def test_a_204_has_no_body_type_or_length(
    client: httpx.AsyncClient, base_url: str
) -> None:
    """RFC 9110 §8.6: no Content-Length on a 204, and no body to give a type to;
    through the front door (contacts), Quart (webhook endpoints, OPTIONS) and a
    replay."""
    contact = (await client.post("/contacts", json={"email": "gone@example.com"})).json()
    endpoint = (await client.post("/webhook-endpoints", json={
        "url": "https://hooks.example.com/t", "events": ["message.sent"]})).json()
    deletes = [
        (f"/contacts/{contact['data']['id']}", {"Idempotency-Key": "delete-gone"}),
        (f"/contacts/{contact['data']['id']}", {"Idempotency-Key": "delete-gone"}),  # replay
        (f"/webhook-endpoints/{endpoint['data']['id']}", {}),
    ]
    answers = [await client.delete(path, headers=headers) for path, headers in deletes]
    # Quart's own answer to OPTIONS, made a 204 by Tidings.
    async with httpx.AsyncClient(base_url=base_url) as plain:  # OPTIONS is not in OpenAPI
        answers += [await plain.options(path) for path in ("/contacts", "/healthz")]
    for response in answers:
        assert response.status_code == 204 and response.content == b"", response.text
        assert "content-type" not in response.headers, (response.url, response.headers)
        assert "content-length" not in response.headers, (response.url, response.headers)
