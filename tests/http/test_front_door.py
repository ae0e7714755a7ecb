"""The front door answers storage-unit routes as the Quart path does, and the
shedder and the connection wrapper keep kept-alive clients from waiting."""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import MutableMapping
from typing import Any
from uuid import UUID

import pytest
import trio
import trio.testing

from tests.conftest import Credential
from tidings.http.app import create_app
from tidings.http.connection import DRAIN_SECONDS, SoundConnections
from tidings.http.frontdoor import FrontDoor
from tidings.http.shedding import Shedder
from tidings.service import Service
from tidings.storage.tokens import hash_secret

Scope = MutableMapping[str, Any]


def http_scope(
    method: str, path: str, headers: list[tuple[str, str]], query: bytes = b""
) -> Scope:
    return {
        "type": "http", "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }


async def exchange(app: Any, scope: Scope, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Run one request through the ASGI ``app``; its status, headers and body."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def front_door_of(service: Service) -> FrontDoor:
    app = create_app(service)
    door = app.asgi_app.app  # type: ignore[attr-defined]
    assert isinstance(door, FrontDoor)
    return door


VARYING = frozenset({"id", "email", "created_at", "updated_at"})


def comparable(document: Any) -> Any:
    """A document without what differs between two creations (ids, times, emails)."""
    if isinstance(document, dict):
        return {k: "*" if k in VARYING else comparable(v) for k, v in document.items()}
    if isinstance(document, list):
        return [comparable(item) for item in document]
    return document


async def test_the_front_door_answers_as_the_quart_path(
    service: Service, acme: Credential
) -> None:
    door = front_door_of(service)
    quart = door._fallback
    auth = ("Authorization", f"Bearer {acme.secret}")
    json_type = ("Content-Type", "application/json")
    cases: list[tuple[str, str, list[tuple[str, str]], bytes, bytes]] = [
        ("POST", "/contacts", [], b"", b'{"email": "a@example.com"}'),
        ("POST", "/contacts", [("Authorization", "Bearer nope")], b"", b"{}"),
        ("POST", "/contacts", [auth, auth], b"", b"{}"),
        ("POST", "/contacts", [auth, json_type], b"", b'{"email": 1}'),
        ("POST", "/contacts", [auth, json_type], b"", b"not json"),
        ("POST", "/contacts", [auth, json_type], b"", b'{"email": "%s@example.com"}'),
        ("POST", "/contacts/", [auth, json_type], b"", b'{"email": "%s-2@example.com"}'),
        ("POST", "/contacts", [auth, json_type], b"", b'{"email": "taken@example.com"}'),
        ("POST", "/contacts", [auth, json_type, ("Content-Length", "99999999")], b"", b"{}"),
        ("POST", "/contacts", [auth, json_type, ("Idempotency-Key", "k-%s")], b"",
         b'{"email": "k%s@example.com"}'),
        ("POST", "/contacts", [auth, json_type, ("Idempotency-Key", "")], b"", b"{}"),
        ("GET", "/contacts", [auth], b"limit=1&email=taken%40example.com", b""),
        ("GET", "/contacts", [auth], b"limit=nope", b""),
        ("GET", "//contacts", [auth], b"limit=1&limit=2", b""),
        ("GET", "/contacts/taken@example.com", [auth], b"", b""),
        ("GET", "/contacts/nobody@example.com", [auth], b"", b""),
        ("GET", "/contacts/neither", [auth], b"", b""),
        ("DELETE", "/contacts/taken@example.com", [auth], b"", b""),
    ]
    for run in ("quart", "door"):
        app = quart if run == "quart" else door
        answers = []
        for method, path, headers, query, body in cases:
            if b"%s" in body:
                body = body.replace(b"%s", run.encode())
            headers = [(n, v.replace("%s", run)) for n, v in headers]
            if method == "POST" and b"taken@" in body:
                await exchange(app, http_scope(method, path, headers, query), body)
            status, answer_headers, answer = await exchange(
                app, http_scope(method, path, headers, query), body
            )
            assert answer_headers.pop("x-request-id")
            if status in (200, 201):  # ids and times differ in length
                answer_headers.pop("content-length")
            document = comparable(json.loads(answer)) if answer else None
            answers.append((method, path, status, answer_headers, document))
        if run == "quart":
            expected = answers
        else:
            for want, got in zip(expected, answers, strict=True):
                assert got == want, (got, want)


async def test_only_storage_unit_routes_bypass_quart(service: Service) -> None:
    door = front_door_of(service)
    passed: list[str] = []

    async def fallback(scope: Scope, receive: Any, send: Any) -> None:
        passed.append(f"{scope['method']} {scope['path']}")
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    door._fallback = fallback
    for method, path in [
        ("POST", "/contacts"), ("HEAD", "/contacts"), ("OPTIONS", "/contacts"),
        ("PUT", "/contacts"), ("GET", "/nowhere"), ("GET", "/healthz"), ("POST", "/emails"),
        ("POST", f"/sms/{UUID(int=0)}/sync"), ("GET", "/contacts//"),
    ]:
        await exchange(door, http_scope(method, path, []))
    assert passed == [
        "HEAD /contacts", "OPTIONS /contacts", "PUT /contacts", "GET /nowhere",
        "GET /healthz", f"POST /sms/{UUID(int=0)}/sync", "GET /contacts//",
    ]


async def test_a_request_stops_counting_once_its_answer_is_sent() -> None:
    # A kept-alive client sends its next request as soon as it has the answer,
    # possibly before the task of the previous one has ended.
    linger = trio.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await linger.wait()

    shedder = Shedder(app, max_in_flight=1, max_storage=1)  # type: ignore[arg-type]
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> dict[str, Any]:
        await trio.sleep_forever()
        raise AssertionError

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(shedder, http_scope("GET", "/contacts", []), receive, send)
            await trio.testing.wait_all_tasks_blocked()
        assert (shedder.in_flight, shedder.storage_in_flight) == (0, 0)
        linger.set()
    assert statuses == [200, 200, 200]
    assert shedder.shed_total == 0


async def test_probes_and_metrics_answer_when_the_process_is_at_capacity() -> None:
    held = trio.Event()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["path"] == "/contacts":
            await held.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    shedder = Shedder(app, max_in_flight=1, max_storage=1)  # type: ignore[arg-type]
    statuses: dict[str, int] = {}

    def sender(path: str) -> Any:
        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses[path] = message["status"]
        return send

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async with trio.open_nursery() as nursery:
        nursery.start_soon(shedder, http_scope("GET", "/contacts", []), receive,
                           sender("/contacts"))
        await trio.testing.wait_all_tasks_blocked()
        for path in ("/metrics", "/healthz", "/livez", "/readyz", "/openapi.json"):
            await shedder(http_scope("GET", path, []), receive, sender(path))
        held.set()
    assert statuses == {"/metrics": 200, "/healthz": 200, "/livez": 200, "/readyz": 200,
                        "/openapi.json": 503, "/contacts": 200}


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_an_answer_that_closes_the_connection_does_not_wait_for_the_body(
    clock: trio.testing.MockClock,
) -> None:
    async def refuse(scope: Scope, receive: Any, send: Any) -> None:
        await send({
            "type": "http.response.start", "status": 503,
            "headers": [(b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def never(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def receive() -> dict[str, Any]:
        await trio.sleep_forever()  # the body never comes
        raise AssertionError

    scope = http_scope("POST", "/contacts", [("Content-Length", "10")])
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for app, waits in ((refuse, 0.0), (never, DRAIN_SECONDS)):
        sent.clear()
        began = trio.current_time()
        await SoundConnections(app)(scope, receive, send)
        assert trio.current_time() - began == pytest.approx(waits)
        assert (b"connection", b"close") in sent[0]["headers"]


async def test_a_client_that_leaves_cancels_its_request(
    service: Service, acme: Credential, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidings.access")
    door = front_door_of(service)
    auth = ("Authorization", f"Bearer {acme.secret}")
    # The token known (its first request looks it up on its own; the cache
    # answers once the revocation listener is live): the unit below is the
    # request's storage work.
    with trio.fail_after(10):
        while not service.tokens.live:
            await trio.sleep(0.01)
    assert (await exchange(door, http_scope("GET", "/contacts", [auth])))[0] == 200
    assert service.tokens.get(hash_secret(acme.secret)) is not None
    cancelled = trio.Event()

    async def stuck(*args: Any) -> Any:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"email": "a@example.com"}', "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if len(messages) == 1:
            await trio.testing.wait_all_tasks_blocked()  # the unit is running
        if messages:
            return messages.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    service.db.run = stuck  # type: ignore[method-assign]
    try:
        scope = http_scope("POST", "/contacts", [auth])
        with trio.fail_after(5):
            await door(scope, receive, send)
    finally:
        del service.db.run
    assert cancelled.is_set()
    assert sent == []
    # Not answered, but logged: 499, as a request its client closed.
    assert [(r.route, r.status) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "tidings.access"][-1] == ("/contacts", 499)


async def test_a_request_whose_client_is_gone_is_cancelled_through_the_server(
    service: Service, base_url: str, acme: Credential, caplog: pytest.LogCaptureFixture
) -> None:
    # The real server tells the front door (tidings.http.departure): the
    # request, waiting in PostgreSQL on a row another transaction holds, is
    # cancelled when its client resets the connection, and writes nothing.
    caplog.set_level(logging.INFO, logger="tidings.access")
    email = "held@example.com"
    body = json.dumps({"email": email}).encode()
    async with service.db.transaction() as holder:
        await holder.execute(
            "INSERT INTO contacts (team_id, email) VALUES ($1, $2)", acme.team_id, email)
        host, port = base_url.removeprefix("http://").rsplit(":", 1)
        sock = trio.socket.socket()
        await sock.connect((host, int(port)))
        await sock.send(
            b"POST /contacts HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + acme.secret.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        with trio.fail_after(10):  # the request's insert waits for the holder
            while not await holder.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ):
                await trio.sleep(0.02)
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: gone outright

        def logged() -> list[int]:
            return [r.status for r in caplog.records  # type: ignore[attr-defined]
                    if r.name == "tidings.access" and r.route == "/contacts"]

        with trio.fail_after(10):
            while 499 not in logged():
                await trio.sleep(0.02)
        await holder.execute("DELETE FROM contacts WHERE team_id = $1", acme.team_id)
    # The holder committed its delete: had the request gone on, its insert
    # would now have been made.
    await trio.sleep(0.3)
    async with service.db.acquire() as conn:
        assert await conn.fetchval(
            "SELECT count(*) FROM contacts WHERE team_id = $1", acme.team_id) == 0
    assert logged() == [499]
