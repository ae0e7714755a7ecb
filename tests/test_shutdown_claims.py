"""A shutdown keeps its deadline while PostgreSQL holds a send worker's claim
(a lock another session holds on the messages): the claim is shielded from
the shutdown for a few seconds only (``CLAIM_SHIELD_SECONDS``), then cut
short with nothing leased."""

from __future__ import annotations

import signal
import sys
from datetime import UTC, datetime, timedelta

import httpx
import trio

from tests.test_cli_serve import authorization_line
from tests.test_e2e import free_port, service_env, wait_healthy
from tidings.actors.duework import CLAIM_SHIELD_SECONDS
from tidings.service import Service

GRACE = 1


async def waiting_on_lock(service: Service) -> None:
    with trio.fail_after(20):
        while True:
            async with service.db.acquire() as conn:
                if await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ):
                    return
            await trio.sleep(0.05)


async def test_a_claim_held_by_a_lock_does_not_hold_the_shutdown_past_its_deadline(
    service: Service, database_url: str, tmp_path: object
) -> None:
    env = service_env(tmp_path / "data")  # type: ignore[operator]
    env.update(DATABASE_URL=database_url, TIDINGS_SHUTDOWN_GRACE_SECONDS=str(GRACE),
               TIDINGS_RATE_LIMIT_PER_SECOND="0")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tidings", "serve", "--port", str(port)], env=env)
    try:
        await wait_healthy(base, process)
        name, _, value = (await authorization_line(env)).decode().partition(": ")
        async with httpx.AsyncClient(base_url=base, headers={name: value}) as client:
            sender = await client.post("/sender-ids", json={"value": "Acme",
                                                            "type": "alphanumeric"})
            assert sender.status_code == 201, sender.text
            soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
            sent = await client.post("/sms", json={"from": "Acme", "to": "+14155550123",
                                                   "body": "Hi", "scheduled_at": soon})
            assert sent.status_code == 202, sent.text
        async with service.db.acquire() as conn, conn.transaction():
            await conn.execute("LOCK TABLE sms_messages IN SHARE MODE")
            await waiting_on_lock(service)  # the send worker's claim, once due
            process.send_signal(signal.SIGTERM)
            signalled = trio.current_time()
            with trio.fail_after(GRACE + 5 + 3):
                assert await process.wait() == 0
            took = trio.current_time() - signalled
        assert took <= max(GRACE + 5, CLAIM_SHIELD_SECONDS) + 1, took
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
