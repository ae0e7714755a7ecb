"""A keyed request that failed because storage went down does not pin its
key: once storage answers again, the client's retry runs (docs/api.md)."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.db_proxy import DatabaseProxy
from tests.sms.helpers import ok, send, settled
from tests.sms.twilio_double import TwilioDouble, started, twilio_config
from tidings.config import Config

PUBLIC = "https://tidings.example"


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery, owned_numbers={"+14155550100"})


@pytest.fixture
def config(proxy: DatabaseProxy, double: TwilioDouble) -> Config:
    # The service reaches its database through the proxy, which the test cuts.
    return twilio_config(proxy.url, double, PUBLIC)


async def test_a_sync_that_failed_with_storage_down_frees_its_key_once_storage_is_back(
    client: httpx.AsyncClient, double: TwilioDouble, proxy: DatabaseProxy, nursery: trio.Nursery
) -> None:
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sms = await settled(client, (await send(client, **{"from": "+14155550100"}))["id"],
                        "submitted")
    asked, answer = trio.Event(), trio.Event()

    async def slow_fetch(_sid: str) -> None:
        asked.set()
        await answer.wait()

    double.before_fetched = slow_fetch
    sync, key = f"/sms/{sms['id']}/sync", {"Idempotency-Key": "sync-during-an-outage"}
    failed: list[httpx.Response] = []

    async def first_attempt() -> None:
        failed.append(await client.post(sync, headers=key))

    async with trio.open_nursery() as attempts:
        attempts.start_soon(first_attempt)
        await asked.wait()  # its key is claimed; Twilio is being asked
        beside = await client.post(sync, headers=key)
        assert beside.status_code == 409 and "still processing" in beside.text
        assert beside.headers["Retry-After"] == "1"
        proxy.cut()  # and storage goes down before it can record the answer
        answer.set()
    assert failed[0].status_code == 503
    double.before_fetched = None
    await nursery.start(proxy.serve)  # storage is back
    # Well within the key's 30 s lock (which would free it anyway), the
    # claim is released and a retry runs.
    with trio.fail_after(10):
        while (retry := await client.post(sync, headers=key)).status_code in (503, 409):
            assert retry.status_code == 503 or "still processing" in retry.text
            await trio.sleep(0.2)
    assert retry.status_code == 200, retry.text
    assert "Idempotent-Replayed" not in retry.headers
