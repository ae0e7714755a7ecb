"""The broadcast state table: every move it allows, and 409 for the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import httpx
import trio

from tests.broadcasts.conftest import Audience, draft
from tests.broadcasts.helpers import hold, wait_status
from tests.conftest import assert_error
from tests.email.helpers import ok
from tidings.service import Service
from tidings.storage import broadcasts


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def make(client: httpx.AsyncClient, audience: Audience) -> str:
    return str(ok(await client.post("/broadcasts", json=draft(audience)), 201)["id"])


async def test_send_now_queues_and_fanout_makes_it_sent(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid = await make(client, audience)
    sent = ok(await client.post(f"/broadcasts/{bid}/send"))
    assert sent["status"] == "queued" and sent["queued_at"] and sent["revision"] == 2
    assert await wait_status(service, bid, "sent") == "sent"
    done = ok(await client.get(f"/broadcasts/{bid}"))
    assert done["sent_at"] >= done["queued_at"] and done["revision"] > 2
    # Every later move is refused.
    for move in ("send", "cancel"):
        assert_error(await client.post(f"/broadcasts/{bid}/{move}"), 409, "CONFLICT")
    assert_error(await client.patch(f"/broadcasts/{bid}", json={"name": "x"}), 409, "CONFLICT")
    assert_error(await client.delete(f"/broadcasts/{bid}"), 409, "CONFLICT")


async def test_schedule_then_cancel_returns_to_draft(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    bid = await make(client, audience)
    at = later(3600)
    scheduled = ok(await client.post(f"/broadcasts/{bid}/send", json={"scheduled_at": at}))
    assert scheduled["status"] == "scheduled" and scheduled["queued_at"] is None
    assert datetime.fromisoformat(scheduled["scheduled_at"]) == datetime.fromisoformat(at)
    assert_error(await client.post(f"/broadcasts/{bid}/send"), 409, "CONFLICT")
    assert_error(await client.patch(f"/broadcasts/{bid}", json={"name": "x"}), 409, "CONFLICT")
    assert_error(await client.delete(f"/broadcasts/{bid}"), 409, "CONFLICT")
    # The cancel takes no body: one it would not read is refused, not dropped.
    for body in (b'{"x": 1}', b"{x", b"[]"):
        refused = await client.post(f"/broadcasts/{bid}/cancel", content=body)
        assert "takes no body" in assert_error(refused, 400, "BAD_REQUEST")
    back = ok(await client.post(f"/broadcasts/{bid}/cancel", content=b" {} "))
    assert back["status"] == "draft" and back["scheduled_at"] is None
    assert back["revision"] == 3
    assert ok(await client.patch(f"/broadcasts/{bid}", json={"name": "again"}))["revision"] == 4


async def test_past_schedule_is_422_and_draft_cancel_is_409(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    bid = await make(client, audience)
    past = await client.post(f"/broadcasts/{bid}/send", json={"scheduled_at": later(-60)})
    assert "future" in assert_error(past, 422, "UNPROCESSABLE_ENTITY")
    naive = await client.post(
        f"/broadcasts/{bid}/send", json={"scheduled_at": "2099-01-01T00:00:00"}
    )
    assert_error(naive, 400, "BAD_REQUEST")
    # The last microsecond a date can hold would be stored as PostgreSQL's infinity.
    for last in ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999999+00:00"):
        infinite = await client.post(f"/broadcasts/{bid}/send", json={"scheduled_at": last})
        assert "scheduled_at: is out of range" in assert_error(infinite, 400, "BAD_REQUEST")
    assert_error(await client.post(f"/broadcasts/{bid}/cancel"), 409, "CONFLICT")
    assert ok(await client.get(f"/broadcasts/{bid}"))["revision"] == 1


async def test_cancel_of_queued_is_canceled_and_final(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid = await make(client, audience)
    await hold(service, bid)  # another process's fanout that has not begun
    assert ok(await client.post(f"/broadcasts/{bid}/send"))["status"] == "queued"
    canceled = ok(await client.post(f"/broadcasts/{bid}/cancel"))
    assert canceled["status"] == "canceled" and canceled["canceled_at"]
    assert canceled["revision"] == 3 and canceled["queued_count"] == 0
    for move in ("send", "cancel"):
        assert_error(await client.post(f"/broadcasts/{bid}/{move}"), 409, "CONFLICT")
    assert_error(await client.delete(f"/broadcasts/{bid}"), 409, "CONFLICT")


async def test_delete_draft(client: httpx.AsyncClient, audience: Audience) -> None:
    bid = await make(client, audience)
    response = await client.delete(f"/broadcasts/{bid}")
    assert response.status_code == 204 and response.content == b""
    assert_error(await client.get(f"/broadcasts/{bid}"), 404, "NOT_FOUND")


async def test_scheduled_broadcast_starts_on_time(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid = await make(client, audience)
    at = datetime.now(UTC) + timedelta(seconds=2)
    ok(await client.post(f"/broadcasts/{bid}/send", json={"scheduled_at": at.isoformat()}))
    await wait_status(service, bid, "sent", within=10)
    done = ok(await client.get(f"/broadcasts/{bid}"))
    queued_at = datetime.fromisoformat(done["queued_at"])
    assert at <= queued_at < at + timedelta(seconds=2.5), (at, queued_at)
    assert done["queued_count"] == 3  # no topic: finn is eligible too


async def test_a_schedule_canceled_then_sent_now_or_sooner_goes_out_then(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    # The broadcast's actor is waiting for the first time when the plan changes.
    now_id, sooner_id = await make(client, audience), await make(client, audience)
    for bid in (now_id, sooner_id):
        ok(await client.post(f"/broadcasts/{bid}/send", json={"scheduled_at": later(25)}))
    await trio.sleep(1)
    for bid in (now_id, sooner_id):
        assert ok(await client.post(f"/broadcasts/{bid}/cancel"))["status"] == "draft"
    ok(await client.post(f"/broadcasts/{now_id}/send"))
    at = datetime.now(UTC) + timedelta(seconds=2)
    ok(await client.post(f"/broadcasts/{sooner_id}/send", json={"scheduled_at": at.isoformat()}))
    await wait_status(service, now_id, "sent", within=5)
    await wait_status(service, sooner_id, "sent", within=8)
    sooner = ok(await client.get(f"/broadcasts/{sooner_id}"))
    queued_at = datetime.fromisoformat(sooner["queued_at"])
    assert at <= queued_at < at + timedelta(seconds=2.5), (at, queued_at)


async def test_concurrent_patches_without_revision_each_apply(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    bid = await make(client, audience)
    changes = {"subject": "S", "preview_text": "P", "from_name": "F", "text": "T"}
    # 10 at once: more than 5 (the retries a PATCH once had), fewer than the
    # 14 that this test config lets wait for storage before shedding (503).
    names = [f"name {n}" for n in range(6)]
    statuses: list[int] = []

    async def patch(name: str, value: str) -> None:
        response = await client.patch(f"/broadcasts/{bid}", json={name: value})
        statuses.append(response.status_code)

    async with trio.open_nursery() as nursery:
        for name, value in [*changes.items(), *(("name", each) for each in names)]:
            nursery.start_soon(patch, name, value)
    assert statuses == [200] * (len(changes) + len(names))
    shown = ok(await client.get(f"/broadcasts/{bid}"))
    assert {name: shown[name] for name in changes} == changes  # no change lost
    assert shown["name"] in names
    assert shown["revision"] == 1 + len(changes) + len(names)
    # With a revision, a stale one is still refused.
    stale = await client.patch(f"/broadcasts/{bid}", json={"name": "x", "revision": 1})
    assert "revision 1 is stale" in assert_error(stale, 409, "CONFLICT")


class SendsInBetween:
    """A connection on which a send of the broadcast, on another connection,
    commits just after the first statement: a cancel racing a send."""

    def __init__(self, conn: Any, other: Any, bid: UUID, team_id: UUID) -> None:
        self._conn, self._other, self._bid, self._team_id = conn, other, bid, team_id
        self.raced = False

    async def fetchrow(self, query: str, *args: object) -> Any:
        row = await self._conn.fetchrow(query, *args)
        if not self.raced:
            self.raced = True
            scheduled = datetime.now(UTC) + timedelta(hours=1)
            await broadcasts.send(self._other, self._team_id, self._bid, scheduled)
        return row

    async def fetchval(self, query: str, *args: object) -> Any:
        return await self._conn.fetchval(query, *args)

    async def execute(self, query: str, *args: object) -> Any:
        return await self._conn.execute(query, *args)

    def transaction(self) -> Any:
        return self._conn.transaction()


async def test_a_cancel_that_met_a_draft_a_send_then_scheduled_cancels_it(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    """The cancel's statement found a draft; a send committed before the cancel
    looked again: the cancel applies to the scheduled broadcast rather than
    being refused with a state that allows it."""
    bid = await make(client, audience)
    team_id = UUID(ok(await client.get(f"/broadcasts/{bid}"))["team_id"])
    async with service.db.acquire() as conn, service.db.acquire() as other:
        racing = SendsInBetween(conn, other, UUID(bid), team_id)
        canceled = await broadcasts.cancel(cast(Any, racing), team_id, UUID(bid))
    assert racing.raced and canceled is not None
    assert (canceled.status, canceled.revision) == ("draft", 3)
    # A move the state does not allow is still refused, naming the state.
    refused = await client.post(f"/broadcasts/{bid}/cancel")
    assert "the broadcast is draft" in assert_error(refused, 409, "CONFLICT")
