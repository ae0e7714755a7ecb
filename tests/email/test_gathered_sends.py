"""Sends of one team that arrive while another is being stored are stored
together, by one statement (``tidings.gathering``), each with its own answer.

A lock on the emails table holds the first send (the leader) in PostgreSQL
while the others arrive and wait in line; rows written by one statement
share its transaction id (``xmin``), which tells the groups apart.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest
import trio

from tests.conftest import Credential, assert_error
from tests.email.helpers import SENDER, events, later, ok
from tests.lines import held_in_line, locked, poster, waiting_on_lock
from tidings.config import Config
from tidings.gathering import Gathering
from tidings.service import Service
from tidings.storage import quotas
from tidings.storage.connection import AsyncioConnection
from tidings.storage.emails_accept import NewEmail, accept
from tidings.storage.quotas import LimitChange

FOLLOWERS = 6


@pytest.fixture
def config(database_url: str) -> Config:
    # A connection for the test's lock, the leader and every follower.
    return Config(database_url=database_url, db_pool_size=FOLLOWERS + 4,
                  rate_limit_per_second=0, shutdown_grace_seconds=2)


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


def email(number: int, **fields: Any) -> dict[str, Any]:
    # Scheduled for tomorrow: nothing sends them, so no later update moves xmin.
    body = {"from": SENDER, "to": f"reader{number}@example.com", "subject": f"Issue {number}",
            "html": f"<p>Issue {number}</p>", "scheduled_at": later(days=1)}
    body.update(fields)
    return body


async def statements(service: Service, team_id: UUID) -> dict[str, list[str]]:
    """The team's email subjects by the transaction that stored them."""
    async with service.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT xmin::text AS xid, subject FROM emails WHERE team_id = $1", team_id
        )
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row["xid"], []).append(row["subject"])
    return {xid: sorted(subjects) for xid, subjects in groups.items()}


async def test_sends_that_wait_in_line_are_stored_by_one_statement(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    answers: dict[int, httpx.Response] = {}

    bodies = {number: email(number) for number in range(FOLLOWERS + 2)}

    def post(number: int, **headers: str) -> Any:
        async def run() -> None:
            answers[number] = await client.post("/emails", json=bodies[number], headers=headers)
        return run

    keyed = FOLLOWERS + 1  # with a key: in its own transaction, never in a group
    await held_in_line(service, "emails", post(0), [
        *(post(n) for n in range(1, FOLLOWERS + 1)), post(keyed, **{"Idempotency-Key": "k-1"}),
    ])

    ids = {n: ok(answer, 202)["id"] for n, answer in answers.items()}
    assert len(set(ids.values())) == FOLLOWERS + 2
    by_size = sorted((await statements(service, acme.team_id)).values(),
                     key=lambda subjects: (len(subjects), subjects))
    assert by_size == [
        ["Issue 0"], [f"Issue {keyed}"], sorted(f"Issue {n}" for n in range(1, FOLLOWERS + 1)),
    ]
    # Each is whole: its own recipient and first event.
    for number, email_id in ids.items():
        shown = ok(await client.get(f"/emails/{email_id}"))
        assert shown["subject"] == f"Issue {number}"
        assert shown["to"] == [f"reader{number}@example.com"]
        assert [event["type"] for event in await events(client, email_id)] == ["scheduled"]
    # The keyed send replays its own answer.
    replay = await client.post("/emails", json=bodies[keyed], headers={"Idempotency-Key": "k-1"})
    assert ok(replay, 202)["id"] == ids[keyed]


async def test_a_member_the_group_cannot_store_fails_alone(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    answers: dict[int, httpx.Response] = {}

    post = poster(client, "/emails", email, answers)

    await held_in_line(service, "emails", post(0), [
        post(1), post(2, **{"from": "Else <hi@elsewhere.example>"}), post(3),
    ])

    message = assert_error(answers[2], 422, "UNPROCESSABLE_ENTITY")
    assert message.startswith("from: 'elsewhere.example' is not a verified sending domain")
    for number in (0, 1, 3):
        ok(answers[number], 202)
    stored = sorted(s for subjects in (await statements(service, acme.team_id)).values()
                    for s in subjects)
    assert stored == ["Issue 0", "Issue 1", "Issue 3"]


async def test_a_quota_with_room_for_part_of_a_group_takes_that_part(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    async with service.db.acquire() as conn:
        await quotas.set_limits(conn, acme.team_id, [LimitChange("email", "day", 3)])
    answers: dict[int, httpx.Response] = {}

    post = poster(client, "/emails", email, answers)

    # The leader takes one; four in line would make five: each then alone.
    await held_in_line(service, "emails", post(0), [post(n) for n in range(1, 5)])

    statuses = sorted(answer.status_code for answer in answers.values())
    assert statuses == [202, 202, 202, 402, 402], [a.text for a in answers.values()]
    for answer in answers.values():
        if answer.status_code == 402:
            assert_error(answer, 402, "PAYMENT_REQUIRED")
    stored = [s for subjects in (await statements(service, acme.team_id)).values()
              for s in subjects]
    assert len(stored) == 3


def new_email(number: int) -> NewEmail:
    address = f"reader{number}@example.com"
    return NewEmail(
        from_address=SENDER, from_email="hi@acme.example", to=[address], to_lookup=[address],
        cc=[], bcc=[], reply_to=[], send_to=[address], subject=f"Issue {number}",
        html="<p>Hi</p>", text=None, headers={}, tags=[],
        scheduled_at=datetime.now(UTC) + timedelta(days=1), domain="acme.example",
        provider="sandbox",
    )


@dataclass
class Units:
    """Sends handed straight to the gathering on the storage loop, as the
    route hands them: ``unit(n)`` runs one, cancellable by ``scopes[n]``;
    ``stored``, ``failed`` and ``ended`` say how each finished."""

    unit: Callable[[int], Callable[[], Awaitable[None]]]
    scopes: dict[int, trio.CancelScope]
    stored: dict[int, list[NewEmail]]
    ended: dict[int, float]
    failed: dict[int, BaseException]


def units(
    service: Service, team_id: UUID,
    gathering: Gathering[UUID, NewEmail, NewEmail] | None = None,
) -> Units:
    scopes: dict[int, trio.CancelScope] = {}
    stored: dict[int, list[NewEmail]] = {}
    ended: dict[int, float] = {}
    failed: dict[int, BaseException] = {}
    lines = gathering or service.emails.accepting

    async def store(conn: AsyncioConnection, number: int) -> list[NewEmail]:
        return await lines.store(conn, team_id, [new_email(number)])

    def unit(number: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            with trio.CancelScope() as scopes[number]:
                try:
                    stored[number] = await service.db.run(store, number)
                except Exception as error:
                    failed[number] = error
            ended[number] = trio.current_time()
        return run

    return Units(unit, scopes, stored, ended, failed)


async def test_requests_cancelled_in_line_or_while_leading_leave_the_others_whole(
    service: Service, acme: Credential, acme_domain: str
) -> None:
    sends = units(service, acme.team_id)
    unit, scopes, stored = sends.unit, sends.scopes, sends.stored

    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(unit(0))  # leads alone, held by the lock
        await waiting_on_lock(service, 1)
        for number in (1, 2, 3):
            nursery.start_soon(unit(number))
            await trio.sleep(0.1)  # in line in this order
        scopes[3].cancel()  # leaves the line
        await trio.sleep(0.1)
        scopes[0].cancel()  # its statement is cancelled: 1 leads 1 and 2, held too
        await waiting_on_lock(service, 1)
        await trio.sleep(0.2)
        scopes[1].cancel()  # the group's statement goes on for 2's sake
        await trio.sleep(0.2)

    assert set(stored) == {2}
    assert [e.subject for e in stored[2]] == ["Issue 2"]
    groups = await statements(service, acme.team_id)
    assert sorted(groups.values()) == [["Issue 1", "Issue 2"]]


async def test_a_cancelled_leader_waits_its_grace_then_the_others_try_alone(
    service: Service, acme: Credential, acme_domain: str
) -> None:
    service.emails.accepting.grace = 0.3
    sends = units(service, acme.team_id)
    unit, scopes, stored, ended = sends.unit, sends.scopes, sends.stored, sends.ended

    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(unit(0))
        await waiting_on_lock(service, 1)
        for number in (1, 2):
            nursery.start_soon(unit(number))
            await trio.sleep(0.1)
        scopes[0].cancel()  # 1 leads 1 and 2, held by the lock
        await trio.sleep(0.2)
        await waiting_on_lock(service, 1)
        began = trio.current_time()
        scopes[1].cancel()  # 2 still waits: the statement goes on, for 0.3 s
        with trio.fail_after(5):
            while 1 not in ended:
                await trio.sleep(0.02)
        assert 0.25 <= ended[1] - began < 2
        # The statement was cut short, not finished (the lock is held):
        # 2 now waits on its own statement, which commits once it is free.
        await waiting_on_lock(service, 1)
        assert 2 not in ended

    assert set(stored) == {2}
    assert list((await statements(service, acme.team_id)).values()) == [["Issue 2"]]


async def test_a_group_whose_every_request_is_cancelled_is_cut_short_at_once(
    service: Service, acme: Credential, acme_domain: str
) -> None:
    # As a shutdown does: every request in flight is cancelled. Nobody waits
    # for the group's statement any more, so it is rolled back at once.
    sends = units(service, acme.team_id)
    unit, scopes, ended = sends.unit, sends.scopes, sends.ended

    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(unit(0))
        await waiting_on_lock(service, 1)
        for number in (1, 2, 3):
            nursery.start_soon(unit(number))
            await trio.sleep(0.1)
        scopes[0].cancel()  # 1 leads 1, 2 and 3, held by the lock
        await trio.sleep(0.2)
        await waiting_on_lock(service, 1)
        scopes[1].cancel()
        await trio.sleep(0.3)
        assert 1 not in ended  # 2 and 3 still wait: the statement goes on
        scopes[2].cancel()
        scopes[3].cancel()
        last = trio.current_time()
        with trio.fail_after(2):
            while len(ended) < 4:
                await trio.sleep(0.02)
        assert ended[1] - last < 1  # not the grace of 5 s
        # The lock is still held: nothing committed.

    assert await statements(service, acme.team_id) == {}


async def test_when_the_groups_connection_is_lost_the_others_try_alone(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    answers: dict[int, httpx.Response] = {}

    post = poster(client, "/emails", email, answers)

    async def end_the_waiting_backend(conn: Any) -> None:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )

    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(post(0))
        await waiting_on_lock(service, 1)
        for number in range(1, 5):
            nursery.start_soon(post(number))
        await trio.sleep(0.5)
        await end_the_waiting_backend(conn)  # 0's: the first in line leads the rest
        await trio.sleep(0.3)
        await waiting_on_lock(service, 1)
        await end_the_waiting_backend(conn)  # the group's: the other three try alone
        await waiting_on_lock(service, 3)

    # 0 and the first in line (its group's leader) lost their connections.
    assert_error(answers[0], 503, "SERVICE_UNAVAILABLE")
    lost = [n for n, answer in answers.items() if answer.status_code == 503]
    assert len(lost) == 2, {n: a.text for n, a in answers.items()}
    for number in set(range(1, 5)) - set(lost):
        ok(answers[number], 202)
    assert sorted((await statements(service, acme.team_id)).values()) == [
        [f"Issue {n}"] for n in sorted(set(range(1, 5)) - set(lost))
    ]


async def test_sends_whose_connections_ended_while_in_line_answer_503(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    answers: dict[int, httpx.Response] = {}

    post = poster(client, "/emails", email, answers)

    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(post(0))
        await waiting_on_lock(service, 1)
        for number in range(1, 4):
            nursery.start_soon(post(number))
        await trio.sleep(0.5)
        # The idle connections the sends in line hold (a restart of
        # PostgreSQL ends them all; here only the idle ones).
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE state = 'idle' AND datname = current_database()"
            " AND query NOT ILIKE '%LISTEN%'"
        )
        await trio.sleep(0.3)

    ok(answers[0], 202)
    for number in range(1, 4):
        assert_error(answers[number], 503, "SERVICE_UNAVAILABLE")
    assert list((await statements(service, acme.team_id)).values()) == [["Issue 0"]]
    # The pool mends: the next send is stored.
    ok(await client.post("/emails", json=email(9)), 202)


async def test_a_retry_alone_that_finds_its_email_stored_answers_as_the_group_did(
    service: Service, acme: Credential, acme_domain: str
) -> None:
    # The group's statement commits, but its answer is lost on the way back
    # (the connection reset): the others retry alone, and find their emails
    # stored already. They answer as the group's leader did, and nothing is
    # stored twice.
    async def answer_lost(
        conn: AsyncioConnection, team_id: UUID, emails: Sequence[NewEmail]
    ) -> list[NewEmail]:
        stored = await accept(conn, team_id, emails, service.config.quotas)
        if len(emails) > 1:
            raise ConnectionResetError("the answer was lost")
        return stored

    sends = units(service, acme.team_id, Gathering(answer_lost))
    async with locked(service, "emails") as (nursery, conn):
        nursery.start_soon(sends.unit(0))
        await waiting_on_lock(service, 1)
        for number in (1, 2, 3):
            nursery.start_soon(sends.unit(number))
        await trio.sleep(0.5)

    assert set(sends.stored) == {0}
    assert set(sends.failed) == {1, 2, 3}
    assert all(isinstance(error, ConnectionResetError) for error in sends.failed.values())
    assert sorted(map(sorted, (await statements(service, acme.team_id)).values())) == [
        ["Issue 0"], ["Issue 1", "Issue 2", "Issue 3"],
    ]
