"""Races in the audience group: imports against imports, and writers of
contact properties against the deletion of a property's definition.

None of them may end in a deadlock (a 500), and none may leave a contact
holding a key whose definition a DELETE answered 204 for. The deterministic
tests hold a row lock in a transaction of their own to force the
interleaving; the others run the requests together, several times.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import trio
import triopg

from tests.conftest import Credential, assert_error
from tests.http.audience import create, define, ok
from tidings.service import Service

ROWS = 2500

LOCK_WAITERS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


async def wait_for_lock_waiters(watcher: Any, count: int) -> None:
    """Until ``count`` sessions of this database wait for a lock."""
    with trio.fail_after(10):
        while await watcher.fetchval(LOCK_WAITERS) < count:
            await trio.sleep(0.01)


@asynccontextmanager
async def sessions(database_url: str) -> AsyncIterator[tuple[Any, Any]]:
    """A session to hold locks in and one to watch the others with."""
    async with triopg.connect(database_url) as holder, triopg.connect(database_url) as watcher:
        yield holder, watcher


async def import_rows(client: httpx.AsyncClient, rows: list[dict[str, Any]]) -> dict[str, Any]:
    report: dict[str, Any] = ok(await client.post("/contacts/import", json=rows))
    return report


async def holding_key(service: Service, key: str) -> list[str]:
    """The emails of the contacts that hold a value for ``key``."""
    async with service.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT email FROM contacts WHERE properties ? $1 ORDER BY email", key
        )
    return [row["email"] for row in rows]


async def together(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``calls`` at once; their results, in the order given."""
    results: list[Any] = [None] * len(calls)

    async def run(n: int) -> None:
        results[n] = await calls[n]()

    async with trio.open_nursery() as nursery:
        for n in range(len(calls)):
            nursery.start_soon(run, n)
    return results


def emails(prefix: str) -> list[str]:
    return [f"{prefix}.{n:05}@example.com" for n in range(ROWS)]


async def released_together(
    database_url: str, lock: str, args: tuple[Any, ...], *calls: Callable[[], Awaitable[Any]]
) -> list[Any]:
    """Run ``calls`` at once while a transaction of the test holds ``lock``
    (a statement), until two sessions wait for a lock; then let them go on.

    A lock on a row in the middle of the requests' rows makes each of them
    lock its half before it waits there: requests that lock in opposite
    orders then each wait for the other once it is released (a deadlock),
    where of requests that lock in one order only one waits for the other."""
    async with sessions(database_url) as (holder, watcher):
        await holder.execute("BEGIN")
        await holder.execute(lock, *args)

        async def release() -> None:
            await wait_for_lock_waiters(watcher, 2)
            await holder.execute("ROLLBACK")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release)
            return await together(*calls)


# --- deadlocks ---------------------------------------------------------------------


def both_imported(reports: list[dict[str, Any]], created: int) -> None:
    for report in reports:
        # A row the other import created meanwhile is taken up again and
        # updated: none is left over.
        assert report["rejected_count"] == 0, report["rejected"][:3]
        assert report["created"] + report["updated"] == ROWS
    assert sum(report["created"] for report in reports) == created


async def test_imports_creating_the_same_emails_in_opposite_orders_both_succeed(
    client: httpx.AsyncClient, service: Service, database_url: str, acme: Credential
) -> None:
    """New rows are inserted in the order of the unique index, whatever the
    order of the rows: the test holds an uncommitted row in the middle."""
    new = emails("n")
    forward = [{"email": e, "first_name": "Forward"} for e in new]
    backward = [{"email": e, "last_name": "Backward"} for e in reversed(new)]
    reports = await released_together(
        database_url, "INSERT INTO contacts (team_id, email) VALUES ($1, $2)",
        (acme.team_id, new[ROWS // 2]),
        partial(import_rows, client, forward), partial(import_rows, client, backward),
    )
    both_imported(reports, ROWS)
    async with service.db.acquire() as conn:
        names = await conn.fetch("SELECT DISTINCT first_name, last_name FROM contacts")
        assert await conn.fetchval("SELECT count(*) FROM contacts") == ROWS
    assert [tuple(row) for row in names] == [("Forward", "Backward")]


async def test_imports_updating_the_same_contacts_in_opposite_orders_both_succeed(
    client: httpx.AsyncClient, database_url: str, acme: Credential
) -> None:
    """Contacts to update are locked in the order of their ids, whatever the
    order of the rows: the test holds the one in the middle."""
    known = emails("u")
    await import_rows(client, [{"email": e} for e in known])
    forward = [{"email": e, "first_name": "Forward"} for e in known]
    backward = [{"email": e, "last_name": "Backward"} for e in reversed(known)]
    reports = await released_together(
        database_url, "SELECT 1 FROM contacts WHERE lower(email) = $1 FOR UPDATE",
        (known[ROWS // 2],),
        partial(import_rows, client, forward), partial(import_rows, client, backward),
    )
    both_imported(reports, 0)


async def test_an_import_and_a_property_deletion_both_succeed(
    client: httpx.AsyncClient, service: Service, database_url: str
) -> None:
    """The deletion locks the contacts holding the key in the order of their
    ids, as the import does: the test holds the one in the middle."""
    plan = await define(client, key="plan", type="string")
    known = emails("p")
    await import_rows(client, [{"email": e, "properties": {"plan": "a"}} for e in known])
    rows = [{"email": e, "first_name": "Again"} for e in reversed(known)]
    report, deleted = await released_together(
        database_url, "SELECT 1 FROM contacts WHERE lower(email) = $1 FOR UPDATE",
        (known[ROWS // 2],),
        partial(import_rows, client, rows),
        partial(client.delete, f"/contact-properties/{plan['id']}"),
    )
    assert (report["updated"], report["rejected_count"]) == (ROWS, 0)
    ok(deleted, 204)
    assert await holding_key(service, "plan") == []


async def test_imports_and_property_deletions_at_once_never_deadlock(
    client: httpx.AsyncClient, service: Service
) -> None:
    """The same, and an import that writes the key being deleted, without
    forcing the interleaving, a few times."""
    for round_ in range(3):
        plan = await define(client, key=f"plan{round_}", type="string")
        key = plan["key"]
        known = emails(f"w{round_}")
        await import_rows(client, [{"email": e, "properties": {key: "a"}} for e in known])
        writing = [{"email": e, "properties": {key: "b"}} for e in reversed(known)]
        naming = [{"email": e, "first_name": "Again"} for e in reversed(known)]
        written, named, deleted = await together(
            partial(import_rows, client, writing),
            partial(import_rows, client, naming),
            partial(client.delete, f"/contact-properties/{plan['id']}"),
        )
        ok(deleted, 204)
        assert (named["updated"], named["rejected_count"]) == (ROWS, 0)
        # Before the deletion, or each row refused naming the key.
        assert written["updated"] in (0, ROWS), written["updated"]
        assert written["updated"] + written["rejected_count"] == ROWS
        for rejection in written["rejected"]:
            assert f"properties.{key}: " in rejection["reason"], rejection
        assert await holding_key(service, key) == []


# --- a value written while its definition is deleted ---------------------------------


async def test_writes_before_a_waiting_deletion_lose_their_value(
    client: httpx.AsyncClient, service: Service, database_url: str
) -> None:
    """A create, a PATCH and an import that write the key while its deletion
    waits (here for a lock the test holds) go in, and the deletion then
    removes their values."""
    plan = await define(client, key="plan", type="string")
    patched = await create(client, email="patched@example.com")
    statuses: list[int] = []

    async def delete() -> None:
        response = await client.delete(f"/contact-properties/{plan['id']}")
        statuses.append(response.status_code)

    async with sessions(database_url) as (holder, watcher), trio.open_nursery() as nursery:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM contact_properties WHERE id = $1 FOR KEY SHARE",
                plan["id"],
            )
            nursery.start_soon(delete)
            await wait_for_lock_waiters(watcher, 1)
            with trio.fail_after(10):
                await create(client, email="created@example.com", properties={"plan": "pro"})
                updated = await client.patch(
                    "/contacts/patched@example.com", json={"properties": {"plan": "pro"}}
                )
                assert ok(updated)["properties"] == {"plan": "pro"}
                report = await import_rows(
                    client, [{"email": "imported@example.com", "properties": {"plan": "pro"}}]
                )
                assert report["created"] == 1
            assert statuses == []
    assert statuses == [204]
    assert await holding_key(service, "plan") == []
    assert ok(await client.get(f"/contacts/{patched['id']}"))["properties"] == {}


async def test_writes_after_a_deletion_are_refused(
    client: httpx.AsyncClient, service: Service, database_url: str
) -> None:
    """A create, a PATCH and an import that come once the definition is
    deleted, while the deletion is still clearing the contacts (held here on
    a contact the test locks), wait for it and are then refused (422, or the
    row rejected), naming the key."""
    plan = await define(client, key="plan", type="string")
    held = await create(client, email="held@example.com", properties={"plan": "old"})
    patched = await create(client, email="patched@example.com")
    answers: dict[str, httpx.Response] = {}

    async def delete() -> None:
        answers["delete"] = await client.delete(f"/contact-properties/{plan['id']}")

    async def post() -> None:
        answers["post"] = await client.post(
            "/contacts", json={"email": "created@example.com", "properties": {"plan": "pro"}}
        )

    async def patch() -> None:
        answers["patch"] = await client.patch(
            f"/contacts/{patched['id']}", json={"properties": {"plan": "pro"}}
        )

    async def run_import() -> None:
        answers["import"] = await client.post("/contacts/import", json=[
            {"email": "imported@example.com", "properties": {"plan": "pro"}},
            {"email": "plain@example.com", "first_name": "Plain"},
        ])

    async with sessions(database_url) as (holder, watcher), trio.open_nursery() as nursery:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM contacts WHERE id = $1 FOR UPDATE", held["id"])
            nursery.start_soon(delete)
            await wait_for_lock_waiters(watcher, 1)
            for writer in (post, patch, run_import):
                nursery.start_soon(writer)
            # Each writer waits for the deletion, or (wrongly) finished at once.
            with trio.fail_after(10):
                while len(answers) < 3 and await watcher.fetchval(LOCK_WAITERS) < 4:
                    await trio.sleep(0.01)
    ok(answers["delete"], 204)
    assert "properties.plan" in assert_error(answers["post"], 422, "UNPROCESSABLE_ENTITY")
    assert "properties.plan" in assert_error(answers["patch"], 422, "UNPROCESSABLE_ENTITY")
    report = ok(answers["import"])
    assert (report["created"], report["rejected_count"]) == (1, 1)
    assert report["rejected"][0]["row"] == 1
    assert "properties.plan" in report["rejected"][0]["reason"]
    assert await holding_key(service, "plan") == []
    assert_error(await client.get("/contacts/created@example.com"), 404, "NOT_FOUND")
    assert_error(await client.get("/contacts/imported@example.com"), 404, "NOT_FOUND")
    # Nothing is stranded: the key can be defined again and set.
    await define(client, key="plan", type="number")
    assert ok(await client.patch(f"/contacts/{held['id']}", json={"properties": {"plan": 1}}))


async def test_creates_racing_a_deletion_never_keep_its_key(
    client: httpx.AsyncClient, service: Service
) -> None:
    for round_ in range(20):
        plan = await define(client, key="plan", type="string")
        body = {"email": f"c{round_}@example.com", "properties": {"plan": "pro"}}
        created, deleted = await together(
            partial(client.post, "/contacts", json=body),
            partial(client.delete, f"/contact-properties/{plan['id']}"),
        )
        ok(deleted, 204)
        if created.status_code != 201:
            assert "properties.plan: " in assert_error(created, 422, "UNPROCESSABLE_ENTITY")
        assert await holding_key(service, "plan") == []


DEADLOCKS = """
SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()
"""


async def deadlocks(watcher: Any) -> int:
    """The deadlocks PostgreSQL has broken in this database: its sessions
    report them within a second (PostgreSQL 15 and later)."""
    await watcher.execute("SELECT pg_stat_clear_snapshot()")
    count: int = await watcher.fetchval(DEADLOCKS)
    return count


async def test_an_import_meeting_a_row_inserted_meanwhile_never_deadlocks_another(
    client: httpx.AsyncClient, database_url: str, acme: Credential
) -> None:
    """Import A meets a row that another request inserted while A ran; import
    C, which saw that row, locks it to update it and then waits for a row A
    inserted. A must not then ask for C's row (a deadlock, which the retry
    hid): it starts again, its updates locked before its inserts."""
    late = "m.late@example.com"
    a_rows = [{"email": e} for e in [*emails("a"), late, "z.held@example.com", *emails("z")]]
    c_rows = [{"email": late, "first_name": "C"}, {"email": "a.00000@example.com"}]
    reports: dict[str, dict[str, Any]] = {}

    async def run(name: str, rows: list[dict[str, Any]]) -> None:
        reports[name] = await import_rows(client, rows)

    insert = "INSERT INTO contacts (team_id, email) VALUES ($1, $2)"
    async with sessions(database_url) as (holder, watcher), triopg.connect(database_url) as other:
        before = await deadlocks(watcher)
        async with trio.open_nursery() as nursery:
            await holder.execute("BEGIN")
            await holder.execute(insert, acme.team_id, late)
            await other.execute("BEGIN")
            await other.execute(insert, acme.team_id, "z.held@example.com")
            nursery.start_soon(run, "A", a_rows)
            await wait_for_lock_waiters(watcher, 1)  # A waits for the late row
            await holder.execute("COMMIT")  # inserted meanwhile: A leaves it
            await wait_for_lock_waiters(watcher, 1)  # A waits at z.held
            nursery.start_soon(run, "C", c_rows)  # sees the late row: locks it
            await wait_for_lock_waiters(watcher, 2)  # C waits for A's a.00000
            await other.execute("ROLLBACK")
        await trio.sleep(1.5)  # sessions report their deadlocks within a second
        assert await deadlocks(watcher) == before
    assert reports["C"]["rejected_count"] == 0 and reports["A"]["rejected_count"] == 0
    assert (reports["C"]["created"], reports["C"]["updated"]) == (1, 1)
    assert (reports["A"]["created"], reports["A"]["updated"]) == (len(a_rows) - 2, 2)


async def test_an_import_that_postgresql_ends_in_a_deadlock_runs_again(
    client: httpx.AsyncClient, database_url: str, acme: Credential
) -> None:
    """A cycle with a third writer: the test's session holds the later of two
    contacts the import updates, the import takes the first and waits for
    it, then the session asks for the first. PostgreSQL ends the import (it
    has waited longest); the import runs again once the session is done."""
    first, second = "dl.1@example.com", "dl.2@example.com"
    await import_rows(client, [{"email": first}, {"email": second}])
    rows = [{"email": first, "first_name": "A"}, {"email": second, "first_name": "B"}]
    async with sessions(database_url) as (holder, watcher):
        ids = sorted([await holder.fetchval(
            "SELECT id FROM contacts WHERE email = $1", email) for email in (first, second)])
        await holder.execute("SET deadlock_timeout = '5s'")  # the import's is 1 s
        async with trio.open_nursery() as nursery:
            reports: list[dict[str, Any]] = []

            async def run() -> None:
                reports.append(await import_rows(client, rows))

            async with holder.transaction():
                await holder.execute("SELECT 1 FROM contacts WHERE id = $1 FOR UPDATE", ids[1])
                nursery.start_soon(run)
                await wait_for_lock_waiters(watcher, 1)
                await holder.execute("SELECT 1 FROM contacts WHERE id = $1 FOR UPDATE", ids[0])
    assert reports[0]["updated"] == 2 and reports[0]["rejected_count"] == 0, reports


async def test_a_request_that_postgresql_ends_in_a_deadlock_is_503_not_500(
    client: httpx.AsyncClient, database_url: str, acme: Credential
) -> None:
    """The test's session holds the contact; the PATCH takes the property's
    definition and waits for it; the session then asks for the definition.
    PostgreSQL ends the PATCH: nothing of it was written, a retry may pass."""
    plan = await define(client, key="plan", type="string")
    contact = await create(client, email="dl.patch@example.com")
    async with sessions(database_url) as (holder, watcher):
        await holder.execute("SET deadlock_timeout = '5s'")  # the PATCH's is 1 s
        answers: list[httpx.Response] = []

        async def patch() -> None:
            answers.append(await client.patch(f"/contacts/{contact['id']}",
                                              json={"properties": {"plan": "pro"}}))

        async with trio.open_nursery() as nursery, holder.transaction():
            await holder.execute("SELECT 1 FROM contacts WHERE id = $1 FOR UPDATE",
                                 uuid.UUID(contact["id"]))
            nursery.start_soon(patch)
            await wait_for_lock_waiters(watcher, 1)
            await holder.execute("SELECT 1 FROM contact_properties WHERE id = $1 FOR UPDATE",
                                 uuid.UUID(plan["id"]))
    assert_error(answers[0], 503, "SERVICE_UNAVAILABLE")
    assert answers[0].headers["Retry-After"] == "1"
    assert ok(await client.get(f"/contacts/{contact['id']}"))["properties"] == {}
    retried = await client.patch(f"/contacts/{contact['id']}", json={"properties": {"plan": "pro"}})
    assert ok(retried)["properties"] == {"plan": "pro"}
