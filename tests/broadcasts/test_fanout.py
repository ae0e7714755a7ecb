"""Fanout: the counting rules, rendering, the snapshot, cancel mid-way, failures."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from datetime import datetime
from hashlib import md5
from typing import Any
from uuid import RFC_4122, UUID, uuid4

import asyncpg
import httpx
import trio

from tests.broadcasts.conftest import Audience, add_contact, draft
from tests.broadcasts.helpers import batch_args, emails_of, hold, sent_while_held, wait_status
from tests.email.helpers import ok
from tidings.service import Service
from tidings.storage import broadcasts_fanout as fanout
from tidings.storage.broadcasts_batch import (
    CLAIM_CHUNK,
    Batch,
    claim_chunk,
    queue_batch,
    queue_chunk,
)
from tidings.storage.db import AsyncioConnection


async def test_counting_rules_and_rendering(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    body = draft(audience, topic_id=audience.topic_id, text="Hi {{{first_name}}} & co",
                 preview_text="Spring <sale>")
    bid = ok(await client.post("/broadcasts", json=body), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    done = ok(await client.get(f"/broadcasts/{bid}"))
    # carl unsubscribed, dora suppressed, eve without email, finn opted out of the topic.
    assert (done["audience_count"], done["suppressed_count"], done["eligible_count"]) == (6, 4, 2)
    assert (done["queued_count"], done["failed_count"]) == (2, 0)
    emails = {e["to_addresses"][0]: e for e in await emails_of(service, bid)}
    assert set(emails) == {"ada@example.com", "bob@example.com"}
    # Ids made from the broadcast and the contact are still RFC 4122 UUIDs;
    # so is the id of each email's queued event, made from the email's.
    for email in emails.values():
        made = UUID(str(email["id"]))
        assert made == UUID(bytes=md5(f"{bid}{email['contact_id']}".encode()).digest(), version=3)
        assert (made.version, made.variant) == (3, RFC_4122)
        shown = ok(await client.get(f"/emails/{made}"))
        assert shown["id"] == str(made)
        events = ok(await client.get(f"/emails/{made}/events"))["data"]
        queued = [UUID(e["id"]) for e in events if e["type"] == "queued"]
        assert queued == [UUID(bytes=md5(f"{made}:queued".encode()).digest(), version=3)]
    ada = emails["ada@example.com"]
    assert ada["subject"] == "Hello Ada" and ada["text"] == "Hi Ada & co"
    assert "<p>Hi Ada, 20% off</p>" in ada["html"] and "Spring &lt;sale&gt;" in ada["html"]
    headers = json.loads(ada["headers"])
    link = headers["List-Unsubscribe"][1:-1]
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert link.startswith("http://127.0.0.1:8080/unsubscribe/") and f'href="{link}"' in ada["html"]
    events = ok(await client.get("/events", params={"type": "broadcast.sent"}))["data"]
    assert [e["data"]["broadcast_id"] for e in events] == [bid]


async def test_every_message_event_of_a_broadcast_email_names_the_broadcast(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid = ok(await client.post("/broadcasts", json=draft(audience)), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    with trio.fail_after(15):  # sent at once, delivered a moment later (the sandbox)
        while True:
            events = ok(await client.get("/events", params={"limit": 100}))["data"]
            types = {e["type"] for e in events if e["type"].startswith("message.")}
            if {"message.queued", "message.sent", "message.delivered"} <= types:
                break
            await trio.sleep(0.1)
    for event in events:
        if event["type"].startswith("message."):
            assert event["data"]["broadcast_id"] == bid, event
            # The same keys as every email's events, queued by the fanout or not.
            assert set(event["data"]) == {"email_id", "from", "to", "subject", "broadcast_id",
                                           "provider", "code", "message"}, event
            assert event["data"]["provider"] == "sandbox", event


async def test_missing_values_fail_only_their_email_and_escape_html(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    await add_contact(client, audience.segment_id, email="x@example.com", first_name="<b>X</b>")
    body = draft(audience, html="<p>{{{first_name}}} {{{last_name}}}</p>", subject="Hi",
                 variable_bindings={})
    bid = ok(await client.post("/broadcasts", json=body), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    done = ok(await client.get(f"/broadcasts/{bid}"))
    # Nobody has a last_name and nothing binds it: every eligible email fails.
    assert (done["eligible_count"], done["queued_count"], done["failed_count"]) == (4, 0, 4)
    ok(await client.patch(f"/contacts/{audience.contacts['ada']}", json={"last_name": "L"}))
    body["variable_bindings"] = {"last_name": ""}
    bid = ok(await client.post("/broadcasts", json=body), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    html = {e["to_addresses"][0]: e["html"] for e in await emails_of(service, bid)}
    assert html["ada@example.com"] == "<p>Ada L</p>"
    assert html["x@example.com"] == "<p>&lt;b&gt;X&lt;/b&gt; </p>"


async def test_snapshot_and_cancel_during_fanout(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner = await sent_while_held(client, service, draft(audience))
    snap = await service.db.run(fanout.snapshot, UUID(bid), owner, 1)
    assert snap.eligible == 3
    # A contact that joins the segment after the snapshot is not part of it.
    await add_contact(client, audience.segment_id, email="late@example.com", first_name="L")
    args = await batch_args(service, bid, owner)
    first = await service.db.run(queue_batch, args)
    assert (first.held, first.queued) == (True, 1)
    assert ok(await client.get(f"/broadcasts/{bid}"))["queued_count"] == 1
    canceled = ok(await client.post(f"/broadcasts/{bid}/cancel"))
    assert canceled["status"] == "canceled" and canceled["queued_count"] == 1
    after = await service.db.run(queue_batch, args)
    assert after.held is False and after.queued == 0
    assert len(await emails_of(service, bid)) == 1
    assert ok(await client.get(f"/broadcasts/{bid}"))["queued_count"] == 1


async def test_contacts_that_opt_out_after_the_snapshot_get_no_email(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    await add_contact(client, audience.segment_id, email="gus@example.com", first_name="Gus")
    body = draft(audience, topic_id=audience.topic_id)
    bid, owner = await sent_while_held(client, service, body)
    assert (await service.db.run(fanout.snapshot, UUID(bid), owner, 10)).eligible == 3
    # After the snapshot, before their emails are made: ada unsubscribes,
    # bob opts out of the topic; gus stays.
    ok(await client.patch(f"/contacts/{audience.contacts['ada']}", json={"unsubscribed": True}))
    ok(await client.patch(f"/contacts/{audience.contacts['bob']}/topics", json={
        "topics": [{"id": audience.topic_id, "subscription": "opt_out"}]}))
    done = await service.db.run(queue_batch, await batch_args(service, bid, owner))
    assert (done.handled, done.queued, done.failed, done.blocked) == (3, 1, 0, 2)
    assert [e["to_addresses"] for e in await emails_of(service, bid)] == [["gus@example.com"]]
    shown = ok(await client.get(f"/broadcasts/{bid}"))
    counts = ("audience_count", "suppressed_count", "eligible_count", "queued_count")
    assert [shown[name] for name in counts] == [7, 6, 1, 1]


async def queue_then_unsubscribe(conn: AsyncioConnection, batch: Batch, contact: UUID) -> None:
    async with conn.transaction():  # the send worker sees both at once
        await queue_batch(conn, batch)
        await conn.execute("UPDATE contacts SET unsubscribed = true WHERE id = $1", contact)


async def test_an_email_whose_contact_unsubscribes_before_it_is_sent_is_not_sent(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner = await sent_while_held(client, service, draft(audience))
    await service.db.run(fanout.snapshot, UUID(bid), owner, 10)
    args = await batch_args(service, bid, owner)
    await service.db.run(queue_then_unsubscribe, args, UUID(audience.contacts["ada"]))
    with trio.fail_after(10):
        while "queued" in (statuses := {
            e["to_addresses"][0]: e["status"] for e in await emails_of(service, bid)
        }).values():
            await trio.sleep(0.05)
    assert statuses["ada@example.com"] == "suppressed"
    assert statuses["bob@example.com"] not in ("suppressed", "failed"), statuses
    ada = next(e for e in await emails_of(service, bid) if e["to_addresses"] == ["ada@example.com"])
    events = ok(await client.get(f"/emails/{ada['id']}/events"))["data"]
    assert any(e["type"] == "suppressed" and "unsubscribed" in str(e) for e in events), events


async def test_resume_never_queues_twice(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner = await sent_while_held(client, service, draft(audience))
    await service.db.run(fanout.snapshot, UUID(bid), owner, 2)
    args = await batch_args(service, bid, owner)
    await service.db.run(queue_batch, args)
    # The process dies; its lease ends; this process takes over from the cursor.
    async with service.db.acquire() as conn:
        await conn.execute("UPDATE broadcasts SET leased_until = now() - interval '1 second'")
    await wait_status(service, bid, "sent")
    emails = await emails_of(service, bid)
    assert len(emails) == len({e["contact_id"] for e in emails}) == 3
    assert ok(await client.get(f"/broadcasts/{bid}"))["queued_count"] == 3


async def test_failures_mark_the_broadcast_failed_with_an_event(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner = await sent_while_held(client, service, draft(audience))
    async with service.db.acquire() as conn:
        await conn.execute("DELETE FROM segments WHERE id = $1", UUID(audience.segment_id))
        await conn.execute("UPDATE broadcasts SET lease_owner = NULL, leased_until = NULL")
    assert owner is not None
    await wait_status(service, bid, "failed")
    failed = ok(await client.get(f"/broadcasts/{bid}"))
    assert "segment" in failed["failure_reason"]
    events = ok(await client.get("/events", params={"type": "broadcast.failed"}))["data"]
    assert [e["data"]["broadcast_id"] for e in events] == [bid]


async def test_give_up_marks_failed(service: Service, client: httpx.AsyncClient,
                                    audience: Audience) -> None:
    bid = ok(await client.post("/broadcasts", json=draft(audience)), 201)["id"]
    await hold(service, bid)
    ok(await client.post(f"/broadcasts/{bid}/send"))
    supervisor = service.broadcasts.fanout
    assert supervisor is not None and supervisor.work.on_give_up is not None
    await supervisor.work.on_give_up(UUID(bid), RuntimeError("boom at db.internal:5432"))
    failed = ok(await client.get(f"/broadcasts/{bid}"))
    assert failed["status"] == "failed"
    # The team is told it failed, not the internal error.
    assert "internal error" in failed["failure_reason"]
    assert "boom" not in failed["failure_reason"] and "Runtime" not in failed["failure_reason"]
    assert await service.db.run(fanout.fail, uuid4(), "none") is None


async def in_chunks_of_one(
    client: httpx.AsyncClient, service: Service, audience: Audience
) -> tuple[str, UUID, Batch]:
    """A broadcast sent while held, its snapshot in chunks of one contact:
    its id, the holding owner, and what its batches are given."""
    bid, owner = await sent_while_held(client, service, draft(audience))
    await service.db.run(fanout.snapshot, UUID(bid), owner, 1)
    return bid, owner, await batch_args(service, bid, owner)


async def test_batches_side_by_side_take_distinct_chunks(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner, batch = await in_chunks_of_one(client, service, audience)
    async with service.db.acquire() as first, first.transaction():
        # A batch in flight on another connection holds chunk 0 ...
        claimed = await first.fetch(CLAIM_CHUNK, UUID(bid), owner, [], "acme.example")
        assert [row["chunk"] for row in claimed] == [0]
        # ... so this one takes chunk 1 at once, another contact.
        with trio.fail_after(5):
            other = await service.db.run(queue_batch, batch)
        assert other.queued == 1
    emails = await emails_of(service, bid)
    assert [e["contact_id"] for e in emails] != [claimed[0]["contact_id"]]


async def test_a_cancel_waits_for_the_batches_in_flight_and_answers_final_counts(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner, batch = await in_chunks_of_one(client, service, audience)
    answers: list[dict[str, Any]] = []

    async def cancel() -> None:
        answers.append(ok(await client.post(f"/broadcasts/{bid}/cancel")))

    async with trio.open_nursery() as nursery:
        async with service.db.acquire() as first, first.transaction():
            # A batch that has its chunk and makes its emails ...
            rows = await claim_chunk(first, batch)
            assert isinstance(rows, list)
            nursery.start_soon(cancel)
            await trio.sleep(0.5)
            # ... holds the cancel back until it has queued them.
            assert answers == []
            assert (await queue_chunk(first, batch, rows)).queued == 1
    canceled = answers[0]
    assert canceled["status"] == "canceled" and canceled["queued_count"] == 1
    # A batch after the cancel queues nothing; the counts stay as answered.
    after = await service.db.run(queue_batch, batch)
    assert after.held is False and len(await emails_of(service, bid)) == 1
    shown = ok(await client.get(f"/broadcasts/{bid}"))
    assert {k: shown[k] for k in ("queued_count", "revision", "updated_at")} == {
        k: canceled[k] for k in ("queued_count", "revision", "updated_at")}


async def test_updated_at_never_moves_back_when_batches_commit_out_of_order(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    bid, owner, batch = await in_chunks_of_one(client, service, audience)
    async with service.db.acquire() as first, first.transaction():
        await first.execute("SELECT 1")  # this batch's transaction begins first ...
        await trio.sleep(0.05)
        await service.db.run(queue_batch, batch)  # ... another commits before it
        between = ok(await client.get(f"/broadcasts/{bid}"))
        await queue_batch(first, batch)
    last = ok(await client.get(f"/broadcasts/{bid}"))
    assert last["revision"] > between["revision"]
    assert datetime.fromisoformat(last["updated_at"]) >= datetime.fromisoformat(
        between["updated_at"])


async def test_a_sending_domain_deleted_during_fanout_fails_the_broadcast(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    """Every chunk checks the domain, holding it while it queues: a delete
    waits for the chunk in flight, and the next chunk ends the fanout."""
    bid, owner = await sent_while_held(client, service, draft(audience))
    await service.db.run(fanout.snapshot, UUID(bid), owner, 1)  # a chunk per contact
    assert (await service.db.run(queue_batch, await batch_args(service, bid, owner))).queued == 1
    async with service.db.acquire() as deleting, deleting.transaction():
        await deleting.execute("SELECT 1 FROM domains WHERE name = 'acme.example' FOR UPDATE")
        # The fanout goes on in the service's own actor, and its next chunk
        # waits for the domain.
        async with service.db.acquire() as conn:
            await conn.execute("UPDATE broadcasts SET lease_owner = NULL, leased_until = NULL "
                               "WHERE id = $1", UUID(bid))
        service.broadcasts.wake(UUID(bid))
        with trio.fail_after(10):
            # Seen from outside the transaction (pg_stat_activity keeps still within one).
            while not await conn_count(
                service, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%FROM broadcast_chunks%'"
            ):
                await trio.sleep(0.02)
        await deleting.execute("DELETE FROM domains WHERE name = 'acme.example'")
    await wait_status(service, bid, "failed")
    failed = ok(await client.get(f"/broadcasts/{bid}"))
    assert "verified sending domain" in failed["failure_reason"]
    assert failed["queued_count"] == 1 and len(await emails_of(service, bid)) == 1
    assert ok(await client.get("/events", params={"type": "broadcast.failed"}))["data"]


async def conn_count(service: Service, query: str) -> int:
    async with service.db.acquire() as conn:
        found: int = await conn.fetchval(query)
    return found


class Recording:
    """The batch's renderer, noting how many emails each call made."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.groups: list[int] = []

    def render(self, rows: Any) -> Any:
        made = self.inner.render(rows)
        self.groups.append(len(made.htmls) + made.failed)
        return made

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_chunk_of_large_emails_is_made_a_group_at_a_time(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    """A chunk is never made whole when its emails are large: a few first,
    then as many as the batch's budget holds, each group queued before the
    next is made; the chunk is done and counted once, as one batch."""
    for n in range(12):
        await add_contact(client, audience.segment_id, email=f"big{n}@example.com",
                          first_name=f"Big{n}")
    body = draft(audience, html="<p>{{{first_name}}}</p>" + "x" * 200_000)
    bid, owner = await sent_while_held(client, service, body)
    eligible = (await service.db.run(fanout.snapshot, UUID(bid), owner, 100)).eligible
    recording = Recording((await batch_args(service, bid, owner)).renderer)
    batch = replace(await batch_args(service, bid, owner), renderer=recording, budget=1_000_000)
    done = await service.db.run(queue_batch, batch)
    assert done.queued == eligible > 8
    assert recording.groups[0] == 8 and max(recording.groups[1:]) <= 5, recording.groups
    assert sum(recording.groups) == eligible
    assert len(await emails_of(service, bid)) == eligible
    shown = ok(await client.get(f"/broadcasts/{bid}"))
    assert shown["queued_count"] == eligible
    assert (await service.db.run(queue_batch, batch)).handled == 0  # the chunk is done


async def test_a_chunk_whose_broadcast_is_taken_over_midway_writes_nothing(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    """Its lease taken by another process between two groups of a chunk: the
    groups already written are rolled back with the batch, and the chunk is
    left for the process that holds the broadcast now."""
    for n in range(12):
        await add_contact(client, audience.segment_id, email=f"big{n}@example.com",
                          first_name=f"Big{n}")
    body = draft(audience, html="<p>{{{first_name}}}</p>" + "x" * 200_000)
    bid, owner = await sent_while_held(client, service, body)
    await service.db.run(fanout.snapshot, UUID(bid), owner, 100)
    batch = await batch_args(service, bid, owner)

    class TakenOver(Recording):
        def render(self, rows: Any) -> Any:
            if self.groups:  # after the first group is written
                other = threading.Thread(target=take_over)  # another process, at once
                other.start()
                other.join()
            return super().render(rows)

    def take_over() -> None:
        async def update() -> None:
            conn = await asyncpg.connect(service.db.url)
            try:
                await conn.execute("UPDATE broadcasts SET lease_owner = $2 WHERE id = $1",
                                   UUID(bid), uuid4())
            finally:
                await conn.close()

        asyncio.new_event_loop().run_until_complete(update())

    racing = TakenOver(batch.renderer)
    done = await service.db.run(queue_batch, replace(batch, renderer=racing, budget=1_000_000))
    assert len(racing.groups) >= 2 and done.held is False and done.queued == 0
    assert await emails_of(service, bid) == []
    async with service.db.acquire() as conn:
        assert await conn.fetchval(
            "SELECT count(*) FROM broadcast_chunks WHERE broadcast_id = $1 AND NOT done",
            UUID(bid)) == 1
