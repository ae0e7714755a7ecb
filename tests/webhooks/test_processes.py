"""Real `tidings serve` processes: kill -9 loses nothing; two processes share the work."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from uuid import UUID

import trio
import triopg

from tests.test_e2e import free_port, wait_healthy
from tests.webhooks.receiver import Answer, Received, Receiver
from tidings.permissions import ALL_PERMISSIONS
from tidings.storage import tokens as token_store
from tidings.storage import webhooks as webhook_store
from tidings.storage.events import record_event


@asynccontextmanager
async def serving(database_url: str, log: Path, **settings: str) -> AsyncIterator[trio.Process]:
    """``tidings serve`` on the test's database; killed (not stopped) when the block ends."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "WEBHOOK_ALLOW_PRIVATE_URLS": "true",
        "WEBHOOK_TIMEOUT_SECONDS": "1",
        "TIDINGS_WEBHOOK_POLL_SECONDS": "0.2",
        **settings,
    }
    command = [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("ab") as stderr:
        process = await trio.lowlevel.open_process(
            command, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def make_endpoints(conn: object, team_id: UUID, urls: list[str]) -> list[UUID]:
    made = []
    for url in urls:
        endpoint = await webhook_store.create_endpoint(
            conn, team_id, url=url, events=["*"], description=None, secret="whsec_test"
        )
        made.append(endpoint.id)
    return made


async def emit_many(conn: object, team_id: UUID, count: int) -> list[UUID]:
    ids = []
    for n in range(count):
        async with conn.transaction():  # type: ignore[attr-defined]
            event, _ = await record_event(
                conn, team_id, "message.delivered", channel="sms", recipient=f"+1415555{n:04d}"
            )
        ids.append(event.id)
    return ids


async def unfinished(conn: object) -> int:
    count: int = await conn.fetchval(  # type: ignore[attr-defined]
        "SELECT count(*) FROM webhook_deliveries WHERE status <> 'succeeded'"
    )
    return count


class Watch:
    """Records what reached the receivers, and whether one delivery ever ran twice at once."""

    def __init__(self, delay: tuple[float, float]) -> None:
        self.delay = delay
        self.in_flight: Counter[str] = Counter()
        self.overlaps: list[str] = []
        self.received: set[tuple[str, str]] = set()

    async def respond(self, request: Received) -> Answer:
        delivery = request.headers["x-service-delivery"]
        self.in_flight[delivery] += 1
        if self.in_flight[delivery] > 1:
            self.overlaps.append(delivery)
        try:
            await trio.sleep(random.uniform(*self.delay))
        finally:
            self.in_flight[delivery] -= 1
        self.received.add((request.path, request.event["id"]))
        return 200, b"ok", {}


async def test_kill_9_loses_nothing_and_resumes_by_itself(
    database_url: str, asyncio_bridge: None, nursery: trio.Nursery, tmp_path: Path
) -> None:
    watch = Watch(delay=(0.2, 0.4))
    receiver = Receiver(watch.respond)
    await nursery.start(receiver.serve)
    urls = [f"{receiver.url}/{n}" for n in range(3)]

    async with triopg.connect(database_url) as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
        endpoints = await make_endpoints(conn, team_id, urls)
        before = await emit_many(conn, team_id, 30)

        log = tmp_path / "serve.log"
        async with serving(database_url, log, TIDINGS_WEBHOOK_CONCURRENCY="2") as process:
            await receiver.wait_for(6, within=30)
            process.send_signal(signal.SIGKILL)
            await process.wait()
        left = await unfinished(conn)
        assert left > 0, "everything was delivered before the kill: the test proved nothing"
        in_flight = await conn.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE lease_owner IS NOT NULL"
        )
        # Events committed while no process runs are kept too.
        during = await emit_many(conn, team_id, 5)

        async with serving(database_url, log, TIDINGS_WEBHOOK_CONCURRENCY="2"):
            with trio.fail_after(60):
                while await unfinished(conn):
                    await trio.sleep(0.2)

        expected = {(f"/hook/{n}", str(event)) for n in range(3) for event in before + during}
        assert watch.received == expected
        assert watch.overlaps == []
        counts = await conn.fetch(
            "SELECT endpoint_id, count(*) FROM webhook_deliveries GROUP BY endpoint_id"
        )
        assert {row["endpoint_id"]: row["count"] for row in counts} == dict.fromkeys(
            endpoints, 35
        )
        # Attempts cut off by the kill were taken up again once their lease ran out.
        assert in_flight >= 1


async def test_a_retry_due_later_waits_for_its_time_after_a_restart(
    database_url: str, asyncio_bridge: None, nursery: trio.Nursery, tmp_path: Path
) -> None:
    first = trio.Event()

    async def fail_once(_request: Received) -> Answer:
        if not first.is_set():
            first.set()
            return 500, b"", {}
        return 200, b"", {}

    receiver = Receiver(fail_once)
    await nursery.start(receiver.serve)
    async with triopg.connect(database_url) as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await make_endpoints(conn, team_id, [receiver.url])
        await emit_many(conn, team_id, 1)
        log = tmp_path / "serve.log"
        settings = {"WEBHOOK_RETRY_SCHEDULE": "0,3"}
        async with serving(database_url, log, **settings) as process:
            await receiver.wait_for(1)
            with trio.fail_after(10):
                while await conn.fetchval("SELECT attempt_count FROM webhook_deliveries") < 1:
                    await trio.sleep(0.05)
            process.send_signal(signal.SIGKILL)
            await process.wait()
        due = await conn.fetchval("SELECT next_attempt_at FROM webhook_deliveries")
        async with serving(database_url, log, **settings):
            with trio.fail_after(20):
                while await unfinished(conn):
                    await trio.sleep(0.1)
        second = await conn.fetchval(
            "SELECT started_at FROM webhook_attempts WHERE number = 2"
        )
        assert second >= due
        assert len(receiver.requests) == 2


async def test_two_processes_deliver_everything_and_never_one_delivery_twice_at_once(
    database_url: str, asyncio_bridge: None, nursery: trio.Nursery, tmp_path: Path
) -> None:
    watch = Watch(delay=(0.0, 0.02))
    receiver = Receiver(watch.respond)
    await nursery.start(receiver.serve)
    urls = [f"{receiver.url}/{n}" for n in range(4)]
    log = tmp_path / "serve.log"
    async with triopg.connect(database_url) as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await make_endpoints(conn, team_id, urls)
        async with serving(database_url, log), serving(database_url, log):
            events = await emit_many(conn, team_id, 150)
            with trio.fail_after(60):
                while await unfinished(conn):
                    await trio.sleep(0.2)
        attempts = await conn.fetch(
            "SELECT delivery_id, count(*) AS n FROM webhook_attempts GROUP BY delivery_id"
        )
    expected = {(f"/hook/{n}", str(event)) for n in range(4) for event in events}
    assert watch.received == expected
    assert watch.overlaps == []
    assert len(attempts) == 600
    # Every delivery succeeded at its first attempt: none was attempted twice.
    assert {row["n"] for row in attempts} == {1}
    assert len(receiver.requests) == 600
