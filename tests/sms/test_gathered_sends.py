"""Text messages of one team sent while another is being stored are stored
together, by one statement (``tidings.storage.sms_group``), each checked
and answered as if alone.

A lock on the messages table holds the first send (the leader) in
PostgreSQL while the others arrive and wait in line; rows written by one
statement share its transaction id (``xmin``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import httpx
import pytest

from tests.conftest import Credential, assert_error
from tests.lines import held_in_line, poster
from tests.sms.helpers import SENDER, event_types, later, ok
from tidings.config import Config
from tidings.service import Service
from tidings.storage import quotas
from tidings.storage.quotas import LimitChange

FOLLOWERS = 5


@pytest.fixture
def config(database_url: str) -> Config:
    # A connection for the test's lock, the leader and every follower.
    return Config(database_url=database_url, db_pool_size=FOLLOWERS + 4,
                  rate_limit_per_second=0, shutdown_grace_seconds=2)


def number(n: int) -> str:
    return f"+1415555{n:04d}"


def message(n: int, **fields: Any) -> dict[str, Any]:
    # Scheduled for tomorrow: nothing sends them, so no later update moves xmin.
    body = {"from": SENDER, "to": number(100 + n), "body": f"Code {n}",
            "scheduled_at": later(days=1)}
    body.update(fields)
    return body


async def statements(service: Service, team_id: UUID) -> list[list[str]]:
    """The team's message bodies, grouped by the transaction that stored them."""
    async with service.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT xmin::text AS xid, body FROM sms_messages WHERE team_id = $1", team_id
        )
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row["xid"], []).append(row["body"])
    return sorted((sorted(bodies) for bodies in groups.values()),
                  key=lambda bodies: (len(bodies), bodies))


async def test_messages_that_wait_in_line_are_stored_by_one_statement(
    sms_client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "Shop", "type": "alphanumeric"}), 201)
    answers: dict[int, httpx.Response] = {}
    post = poster(sms_client, "/sms", message, answers)
    metadata = {"order": "A-17"}
    await held_in_line(service, "sms_messages", post(0), [
        *(post(n) for n in range(1, FOLLOWERS)),
        # Another sender ID, and metadata: each kept as its own.
        post(FOLLOWERS, **{"from": "Shop", "metadata": metadata}),
    ])

    assert await statements(service, acme.team_id) == [
        ["Code 0"], sorted(f"Code {n}" for n in range(1, FOLLOWERS + 1)),
    ]
    for n, answer in answers.items():
        sent = ok(answer, 202)
        last = n == FOLLOWERS
        assert (sent["to"], sent["body"]) == (number(100 + n), f"Code {n}")
        assert sent["from"] == ("Shop" if last else SENDER)
        assert sent["metadata"] == (metadata if last else None)
        shown = ok(await sms_client.get(f"/sms/{sent['id']}"))
        assert shown == sent
        assert await event_types(sms_client, sent["id"]) == ["message.queued"]
    # The webhook events name each message's own sender and recipient.
    listed = ok(await sms_client.get("/events", params={"limit": 100}))["data"]
    named = {e["message_id"]: (e["data"]["from"], e["data"]["to"]) for e in listed}
    for n, answer in answers.items():
        sender = "Shop" if n == FOLLOWERS else SENDER
        assert named[answer.json()["data"]["id"]] == (sender, number(100 + n))


async def test_a_message_the_group_cannot_store_is_refused_alone(
    sms_client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    ok(await sms_client.post("/suppressions", json={"address": number(102)}), 201)
    answers: dict[int, httpx.Response] = {}
    post = poster(sms_client, "/sms", message, answers)
    await held_in_line(service, "sms_messages", post(0), [
        post(1), post(2), post(3, **{"from": "Other"}), post(4),
    ])

    assert "is opted out" in assert_error(answers[2], 422, "UNPROCESSABLE_ENTITY")
    assert "not a sender ID of the team" in assert_error(
        answers[3], 422, "UNPROCESSABLE_ENTITY"
    )
    for n in (0, 1, 4):
        ok(answers[n], 202)
    stored = sorted(body for group in await statements(service, acme.team_id) for body in group)
    assert stored == ["Code 0", "Code 1", "Code 4"]


async def test_a_quota_with_room_for_part_of_a_group_takes_that_part(
    sms_client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    async with service.db.acquire() as conn:
        await quotas.set_limits(conn, acme.team_id, [LimitChange("sms", "day", 3)])
    answers: dict[int, httpx.Response] = {}
    post = poster(sms_client, "/sms", message, answers)
    # The leader takes one; four in line would make five: each then alone.
    await held_in_line(service, "sms_messages", post(0), [post(n) for n in range(1, 5)])

    statuses = sorted(answer.status_code for answer in answers.values())
    assert statuses == [202, 202, 202, 402, 402], [a.text for a in answers.values()]
    stored = [body for group in await statements(service, acme.team_id) for body in group]
    assert len(stored) == 3
