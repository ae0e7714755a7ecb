"""Segments and their members; adding a member again is safe (spec, behaviour 3)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import trio

from tests.conftest import assert_error
from tests.http.audience import create, make, ok

MEMBERSHIP_FIELDS = {"id", "team_id", "name", "created_at", "assigned_at"}


async def test_segment_lifecycle_with_member_counts(client: httpx.AsyncClient) -> None:
    vip = await make(client, "/segments", name="VIP")
    assert vip["object"] == "segment" and vip["contact_count"] == 0
    trial = await make(client, "/segments", name="Trial")
    contacts = [await create(client, email=f"c{n}@example.com") for n in range(3)]
    for contact in contacts:
        ok(await client.post(f"/contacts/{contact['id']}/segments/{vip['id']}"))
    ok(await client.post(f"/contacts/{contacts[0]['id']}/segments/{trial['id']}"))

    listed = ok(await client.get("/segments"))
    assert [(s["name"], s["contact_count"]) for s in listed["data"]] == [("Trial", 1), ("VIP", 3)]
    assert ok(await client.get("/segments", params={"limit": 1}))["has_more"] is True
    fetched = ok(await client.get(f"/segments/{vip['id']}"))
    assert fetched == {**vip, "contact_count": 3}

    ok(await client.delete(f"/segments/{vip['id']}"), 204)
    assert_error(await client.get(f"/segments/{vip['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/segments/{vip['id']}"), 404, "NOT_FOUND")
    # The contacts stay, in their other segments.
    assert ok(await client.get(f"/contacts/{contacts[1]['id']}"))["id"] == contacts[1]["id"]
    memberships = ok(await client.get(f"/contacts/{contacts[0]['id']}/segments"))
    assert [m["name"] for m in memberships["data"]] == ["Trial"]


async def test_segment_refusals(client: httpx.AsyncClient) -> None:
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "name"), ({"name": ""}, "name"), ({"name": "n" * 101}, "name"),
        ({"name": "S", "filter": "x"}, "filter"), ({"name": 5}, "name"),
    ]
    for body, field in refusals:
        message = assert_error(await client.post("/segments", json=body), 400, "BAD_REQUEST")
        assert field in message, body


async def test_adding_again_answers_the_same_membership(client: httpx.AsyncClient) -> None:
    segment = await make(client, "/segments", name="VIP")
    contact = await create(client, email="ada@example.com")
    path = f"/contacts/{contact['id']}/segments/{segment['id']}"

    first = await client.post(path)
    membership = ok(first)
    assert set(membership) == MEMBERSHIP_FIELDS
    assert (membership["id"], membership["team_id"], membership["name"]) == (
        segment["id"], segment["team_id"], "VIP"
    )
    assert membership["created_at"] == segment["created_at"]
    assert membership["assigned_at"] >= segment["created_at"]

    await trio.sleep(0.01)
    again = await client.post(path)
    assert again.status_code == first.status_code
    assert ok(again) == membership  # the same assigned_at, the same shape
    keyed = await client.post(path, headers={"Idempotency-Key": "add-ada"})
    assert ok(keyed) == membership
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 1

    # Many at once: one membership, one assigned_at.
    other = await create(client, email="grace@example.com")
    answers: list[dict[str, Any]] = []

    async def add() -> None:
        answers.append(ok(await client.post(f"/contacts/{other['id']}/segments/{segment['id']}")))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(add)
    assert len({answer["assigned_at"] for answer in answers}) == 1


async def test_remove_and_add_back(client: httpx.AsyncClient) -> None:
    segment = await make(client, "/segments", name="VIP")
    contact = await create(client, email="ada@example.com")
    path = f"/contacts/{contact['id']}/segments/{segment['id']}"
    first = ok(await client.post(path))

    ok(await client.delete(path), 204)
    message = assert_error(await client.delete(path), 404, "NOT_FOUND")
    assert "not in this segment" in message
    assert ok(await client.get(f"/contacts/{contact['id']}/segments"))["data"] == []
    back = ok(await client.post(path))
    assert back["assigned_at"] > first["assigned_at"]


async def test_missing_contact_or_segment_is_404(client: httpx.AsyncClient) -> None:
    segment = await make(client, "/segments", name="VIP")
    contact = await create(client, email="ada@example.com")
    nowhere = uuid.uuid4()
    for method in ("POST", "DELETE"):
        message = assert_error(
            await client.request(method, f"/contacts/{nowhere}/segments/{segment['id']}"),
            404, "NOT_FOUND",
        )
        assert "contact" in message
        message = assert_error(
            await client.request(method, f"/contacts/{contact['id']}/segments/{nowhere}"),
            404, "NOT_FOUND",
        )
        assert "segment" in message
    bad = await client.post(f"/contacts/{contact['id']}/segments/vip")
    assert "segment_id" in assert_error(bad, 400, "BAD_REQUEST")
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 0


async def test_a_contact_is_named_by_id_or_email(client: httpx.AsyncClient) -> None:
    segment = await make(client, "/segments", name="VIP")
    contact = await create(client, email="Ada@Example.com")
    added = ok(await client.post(f"/contacts/ada@EXAMPLE.com/segments/{segment['id']}"))
    assert added["id"] == segment["id"]
    # The same membership, whichever way the contact is named.
    assert ok(await client.post(f"/contacts/{contact['id']}/segments/{segment['id']}")) == added
    for ref in ("Ada@example.com", "ADA@example.com", contact["id"]):
        assert ok(await client.get(f"/contacts/{ref}/segments"))["data"] == [added]
    ok(await client.delete(f"/contacts/ADA@example.com/segments/{segment['id']}"), 204)
    assert ok(await client.get("/contacts/ada@example.com/segments"))["data"] == []
    assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 0

    for method, path in [
        ("GET", "/contacts/nobody@example.com/segments"),
        ("POST", f"/contacts/nobody@example.com/segments/{segment['id']}"),
        ("DELETE", f"/contacts/nobody@example.com/segments/{segment['id']}"),
    ]:
        assert "contact" in assert_error(await client.request(method, path), 404, "NOT_FOUND")
    for method, path in [
        ("GET", "/contacts/ada-lovelace/segments"),
        ("POST", f"/contacts/ada-lovelace/segments/{segment['id']}"),
        ("DELETE", f"/contacts/ada-lovelace/segments/{segment['id']}"),
    ]:
        message = assert_error(await client.request(method, path), 400, "BAD_REQUEST")
        assert "contact_id" in message, path


async def test_members_and_memberships_are_listed_latest_first(client: httpx.AsyncClient) -> None:
    vip = await make(client, "/segments", name="VIP")
    trial = await make(client, "/segments", name="Trial")
    ada = await create(client, email="ada@example.com")
    grace = await create(client, email="grace@example.com")
    alan = await create(client, email="alan@example.com")
    for contact in (grace, ada, alan):
        ok(await client.post(f"/contacts/{contact['id']}/segments/{vip['id']}"))
    ok(await client.post(f"/contacts/{ada['id']}/segments/{trial['id']}"))

    members = ok(await client.get(f"/segments/{vip['id']}/contacts", params={"limit": 2}))
    assert [c["email"] for c in members["data"]] == ["alan@example.com", "ada@example.com"]
    assert members["has_more"] is True
    assert members["data"][1] == ok(await client.get(f"/contacts/{ada['id']}"))
    rest = ok(await client.get(f"/segments/{vip['id']}/contacts", params={"offset": 2}))
    assert [c["email"] for c in rest["data"]] == ["grace@example.com"]
    assert ok(await client.get(f"/segments/{trial['id']}/contacts"))["data"][0]["id"] == ada["id"]

    memberships = ok(await client.get(f"/contacts/{ada['id']}/segments"))
    assert [m["name"] for m in memberships["data"]] == ["Trial", "VIP"]
    assert all(set(m) == MEMBERSHIP_FIELDS for m in memberships["data"])

    assert_error(await client.get(f"/segments/{uuid.uuid4()}/contacts"), 404, "NOT_FOUND")
    assert_error(await client.get(f"/contacts/{uuid.uuid4()}/segments"), 404, "NOT_FOUND")


async def test_adding_while_the_segment_or_contact_goes_is_404(
    client: httpx.AsyncClient,
) -> None:
    """Additions that race a deletion of the segment or of the contact answer
    200 (they came first) or 404 naming what is gone; never 500."""
    statuses: list[int] = []

    async def add(contact_id: str, segment_id: str, gone: str) -> None:
        response = await client.post(f"/contacts/{contact_id}/segments/{segment_id}")
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert gone in assert_error(response, 404, "NOT_FOUND")

    async def delete(path: str) -> None:
        ok(await client.delete(path), 204)

    for round_ in range(8):
        segment = await make(client, "/segments", name=f"Doomed {round_}")
        contacts = [await create(client, email=f"r{round_}.{n}@example.com") for n in range(4)]
        async with trio.open_nursery() as nursery:
            for contact in contacts:
                nursery.start_soon(add, contact["id"], segment["id"], "segment")
            nursery.start_soon(delete, f"/segments/{segment['id']}")

        contact = await create(client, email=f"doomed{round_}@example.com")
        segments = [await make(client, "/segments", name=f"S{n}") for n in range(4)]
        async with trio.open_nursery() as nursery:
            for segment in segments:
                nursery.start_soon(add, contact["id"], segment["id"], "contact")
            nursery.start_soon(delete, f"/contacts/{contact['id']}")
        for segment in segments:
            assert ok(await client.get(f"/segments/{segment['id']}"))["contact_count"] == 0
    assert set(statuses) <= {200, 404}
