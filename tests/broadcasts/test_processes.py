"""Real `tidings serve` processes: kill -9 mid-fanout neither skips nor repeats a
contact, and two processes on one database fan out every broadcast once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import trio
import triopg

from tests.email.test_processes import setup_team
from tests.test_e2e import free_port, wait_healthy
from tidings.storage import broadcasts as store

AUDIENCE = """
WITH made AS (
    INSERT INTO contacts (team_id, email, first_name)
    SELECT $1, 'p' || n || '@example.com', 'P' || n FROM generate_series(1, $3::int) n
    RETURNING id
)
INSERT INTO segment_contacts (segment_id, contact_id) SELECT $2, id FROM made
"""


@asynccontextmanager
async def serving(database_url: str, log: Path) -> AsyncIterator[trio.Process]:
    """``tidings serve`` with small fanout batches and short leases; killed at the end."""
    env = {
        **os.environ, "DATABASE_URL": database_url, "TIDINGS_EMAIL_PROVIDER": "sandbox",
        "TIDINGS_BROADCAST_BATCH_SIZE": "100", "TIDINGS_BROADCAST_LEASE_SECONDS": "2",
    }
    port = free_port()
    with log.open("ab") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1", "--port",
             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", process)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def broadcast_to(conn: Any, team_id: UUID, size: int) -> UUID:
    segment = await conn.fetchval(
        "INSERT INTO segments (team_id, name) VALUES ($1, 's') RETURNING id", team_id
    )
    await conn.execute(AUDIENCE.replace("'p' ||", f"'p{segment.hex[:6]}' ||"), team_id,
                       segment, size)
    created = await store.create(conn, team_id, store.Content(
        "b", segment, None, "news@acme.example", None, None, "Hi {{{first_name}}}", None,
        "<p>{{{first_name}}}</p>", None, {},
    ))
    return created.id


async def progress(conn: Any, broadcast_id: UUID) -> Any:
    return await conn.fetchrow(
        "SELECT status, eligible_count, queued_count, "
        "(SELECT count(*) FROM emails WHERE broadcast_id = $1) AS emails, "
        "(SELECT count(DISTINCT contact_id) FROM emails WHERE broadcast_id = $1) AS contacts "
        "FROM broadcasts WHERE id = $1", broadcast_id,
    )


async def wait_sent(conn: Any, broadcast_id: UUID, within: float) -> Any:
    with trio.fail_after(within):
        while (row := await progress(conn, broadcast_id))["status"] != "sent":
            await trio.sleep(0.1)
    return row


async def test_kill_9_mid_fanout_resumes_without_skips_or_repeats(
    database_url: str, asyncio_bridge: None, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    async with triopg.connect(database_url) as conn:
        team_id = await setup_team(conn)
        bid = await broadcast_to(conn, team_id, 20_000)
        async with serving(database_url, log) as process:
            await store.send(conn, team_id, bid, None)
            with trio.fail_after(60):
                while (await progress(conn, bid))["queued_count"] < 300:
                    await trio.sleep(0.01)
            process.send_signal(signal.SIGKILL)
            await process.wait()
        killed = await progress(conn, bid)
        assert killed["status"] == "queued" and killed["queued_count"] < 20_000, killed
        assert killed["emails"] == killed["queued_count"]
        async with serving(database_url, log):
            done = await wait_sent(conn, bid, within=120)
        recipients = await conn.fetchval(
            "SELECT count(*) FROM broadcast_chunks k, unnest(k.contact_ids) r(contact_id) "
            "JOIN emails e ON e.broadcast_id = $1 AND e.contact_id = r.contact_id "
            "WHERE k.broadcast_id = $1", bid,
        )
    assert done["eligible_count"] == done["queued_count"] == 20_000
    assert done["emails"] == done["contacts"] == recipients == 20_000


async def test_two_processes_fan_out_each_broadcast_once(
    database_url: str, asyncio_bridge: None, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    async with triopg.connect(database_url) as conn:
        team_id = await setup_team(conn)
        ids = [await broadcast_to(conn, team_id, 2000) for _ in range(3)]
        async with serving(database_url, log), serving(database_url, log):
            for bid in ids:
                await store.send(conn, team_id, bid, None)
            done = [await wait_sent(conn, bid, within=120) for bid in ids]
    for row in done:
        assert row["queued_count"] == row["emails"] == row["contacts"] == 2000
