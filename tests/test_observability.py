"""Request ids, the access log and the metrics an operator scrapes."""

from __future__ import annotations

import logging
import re

import httpx
import pytest

from tests.conftest import Credential


async def test_a_sane_request_id_is_kept_and_any_other_replaced(
    http: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    kept = await client.get("/contacts", headers={"X-Request-Id": "req-42.a:b"})
    assert kept.headers["X-Request-Id"] == "req-42.a:b"
    for bad in ("x" * 129, "has space", "semi;colon"):
        replaced = await client.get("/contacts", headers={"X-Request-Id": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["X-Request-Id"]), bad
    # Every answer carries one: errors and unknown routes too.
    for response in (
        await http.get("/contacts"),
        await http.get("/no/such/route"),
        await http.get("/healthz"),
    ):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-Id"])


async def test_the_access_log_names_route_status_team_and_request(
    client: httpx.AsyncClient, acme: Credential, caplog: pytest.LogCaptureFixture
) -> None:
    created = await client.post("/contacts", json={"email": "ada@example.com"})
    contact_id = created.json()["data"]["id"]
    with caplog.at_level(logging.INFO, logger="tidings.access"):
        await client.get(f"/contacts/{contact_id}", headers={"X-Request-Id": "trace-1"})
    [record] = [r for r in caplog.records if r.name == "tidings.access"]
    assert record.method == "GET"  # type: ignore[attr-defined]
    assert record.route == "/contacts/{contact_id}"  # type: ignore[attr-defined]
    assert record.status == 200  # type: ignore[attr-defined]
    assert record.team_id == str(acme.team_id)  # type: ignore[attr-defined]
    assert record.request_id == "trace-1"  # type: ignore[attr-defined]
    assert record.duration_ms >= 0  # type: ignore[attr-defined]
    assert "GET /contacts/{contact_id} 200" in record.getMessage()


async def test_the_access_log_names_the_team_of_a_request_that_fails(
    http: httpx.AsyncClient, client: httpx.AsyncClient, acme: Credential,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token authenticated: whatever goes wrong next (a bad query, a bad
    body, a duplicate, a missing permission), the line names its team."""
    await client.post("/contacts", json={"email": "ada@example.com"})
    with caplog.at_level(logging.INFO, logger="tidings.access"):
        answers = [
            await client.get("/contacts?limit=abc"),  # the front door, 400
            await client.post("/contacts", json={"email": "ada@example.com"}),  # 409
            await client.post("/contacts", content=b"{", headers={  # 400, bad JSON
                "Content-Type": "application/json"}),
            await client.post("/tokens", json={"permissions": ["contacts:read"]}),  # 403
            await client.post("/contacts/import", content=b"email\nnot-an-address\n",
                              headers={"Content-Type": "text/csv", "X-Request-Id": "csv"}),
        ]
        anonymous = await http.get("/contacts")  # 401: no team to name
    assert [a.status_code for a in answers][:4] == [400, 409, 400, 403]
    records = [r for r in caplog.records if r.name == "tidings.access"]
    assert len(records) == len(answers) + 1
    for record in records[:-1]:
        assert record.team_id == str(acme.team_id), record.getMessage()  # type: ignore[attr-defined]
    assert anonymous.status_code == 401
    assert records[-1].team_id is None  # type: ignore[attr-defined]


async def test_metrics_have_process_gc_and_status_labels(
    http: httpx.AsyncClient, client: httpx.AsyncClient
) -> None:
    await client.get("/contacts/00000000-0000-0000-0000-000000000000")
    text = (await http.get("/metrics")).text
    for name in (
        "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
        "python_gc_collections_total", "python_gc_objects_collected_total",
    ):
        assert re.search(rf"^{name}(\{{[^}}]*\}})? ", text, re.M), name
    assert re.search(
        r'^tidings_http_request_duration_seconds_count\{method="GET",'
        r'route="/contacts/\{contact_id\}",status="404"\} 1\.0$',
        text, re.M,
    ), text
