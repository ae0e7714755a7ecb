"""POST /emails (and the batch) cross from trio to asyncio once per request."""

from __future__ import annotations

import httpx

from tests.email.helpers import events, later, ok
from tests.http.test_crossings import counting_crossings, counting_statements
from tidings.service import Service


def requests(runs: list[str]) -> list[str]:
    return [unit for unit in runs if unit == "run_unit"]


async def test_sending_is_one_crossing_with_and_without_a_key(
    client: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    # Scheduled: no send worker wakes up meanwhile (actors' polls cross on their
    # own time; a storage unit cannot call Database.run, and the trio-side
    # proxies are refused).
    body = {"from": f"news@{acme_domain}", "to": "ada@example.com", "subject": "Hi", "text": "x",
            "scheduled_at": later(days=1)}
    with counting_crossings(service) as runs:
        assert (await client.post("/emails", json=body)).status_code == 202
        assert requests(runs) == ["run_unit"]
        runs.clear()
        scheduled = {**body, "to": "bob@example.com"}
        first = await client.post("/emails", json=scheduled, headers={"Idempotency-Key": "e1"})
        assert first.status_code == 202
        assert requests(runs) == ["run_unit"]
        runs.clear()
        replay = await client.post("/emails", json=scheduled, headers={"Idempotency-Key": "e1"})
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == first.content
        assert requests(runs) == ["run_unit"]
        runs.clear()
        assert (await client.post("/emails/batch", json=[body, body])).status_code == 202
        assert requests(runs) == ["run_unit"]
        runs.clear()
        refused = await client.post("/emails", json={**body, "from": "news@other.example"})
        assert refused.status_code == 422
        assert requests(runs) == ["run_unit"]


async def test_a_common_send_is_one_statement(
    client: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    # From a verified domain to addresses the team does not suppress: the
    # check, the email, its events and the quota's count in one round trip.
    body = {"from": f"news@{acme_domain}", "to": ["ada@example.com", "bob@example.com"],
            "subject": "Hi", "text": "x", "scheduled_at": later(days=1)}
    # The team's first send makes its quota counters, in a transaction.
    assert (await client.post("/emails", json=body)).status_code == 202
    with counting_statements(service) as sent:
        assert (await client.post("/emails", json=body)).status_code == 202
        assert len(sent) == 1
        sent.clear()
        assert (await client.post("/emails/batch", json=[body, body])).status_code == 202
        assert len(sent) == 1
        sent.clear()
        # A suppressed recipient: checked first, then stored with its event.
        suppressed = await client.post("/suppressions", json={"address": "bob@example.com"})
        assert suppressed.status_code == 201, suppressed.text
        sent.clear()
        accepted = await client.post("/emails", json=body)
        assert accepted.status_code == 202
        assert len(sent) == 3
    found = await events(client, ok(accepted, 202)["id"])
    assert [(e["type"], e["recipient"]) for e in found] == [
        ("scheduled", "ada@example.com, bob@example.com"), ("suppressed", "bob@example.com")
    ]
