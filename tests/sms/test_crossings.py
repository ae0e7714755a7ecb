"""POST /sms crosses from trio to asyncio once per request."""

from __future__ import annotations

import httpx

from tests.http.test_crossings import counting_crossings
from tests.sms.helpers import NUMBER, SENDER, later
from tidings.service import Service


def requests(runs: list[str]) -> list[str]:
    return [unit for unit in runs if unit == "run_unit"]


async def test_sending_is_one_crossing_with_and_without_a_key(
    sms_client: httpx.AsyncClient, service: Service
) -> None:
    # Scheduled: no send worker wakes up meanwhile (actors' polls cross on their
    # own time; a storage unit cannot call Database.run, and the trio-side
    # proxies are refused).
    body = {"to": NUMBER, "from": SENDER, "body": "Your code is 123456",
            "scheduled_at": later(days=1)}
    with counting_crossings(service) as runs:
        assert (await sms_client.post("/sms", json=body)).status_code == 202
        assert requests(runs) == ["run_unit"]
        runs.clear()
        scheduled = {**body, "body": "Your code is 654321"}
        first = await sms_client.post("/sms", json=scheduled, headers={"Idempotency-Key": "s1"})
        assert first.status_code == 202
        assert requests(runs) == ["run_unit"]
        runs.clear()
        sms_id = first.json()["data"]["id"]
        assert (await sms_client.post(f"/sms/{sms_id}/cancel")).status_code == 200
        assert requests(runs) == ["run_unit"]
        runs.clear()
        refused = await sms_client.post("/sms", json={**body, "from": "Nobody"})
        assert refused.status_code == 422
        assert requests(runs) == ["run_unit"]
