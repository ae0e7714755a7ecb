"""Real `tidings serve` processes sending to an SMTP server: kill -9 during a
drain loses no email, and two processes never send one email at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import trio
import triopg

from tests.email.smtp_sink import Sink, running_sink
from tests.test_e2e import free_port, wait_healthy
from tidings.email.dkim import new_private_key, new_selector, public_key_base64
from tidings.email.records import records_for
from tidings.permissions import ALL_PERMISSIONS
from tidings.storage import domains as domain_store
from tidings.storage import tokens as token_store
from tidings.storage.emails_accept import NewEmail, accept_emails


class SlowSink(Sink):
    """Takes 20 ms a message, and notes any message received while another
    copy of it is being received (two processes sending one email at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: Counter[str] = Counter()
        self.overlaps: list[str] = []
        self.ids: Counter[str] = Counter()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        data: bytes = envelope.original_content
        found = next(line for line in data.split(b"\r\n") if line.lower().startswith(b"message-id"))
        message_id = found.split(b":", 1)[1].strip().decode()
        self.in_flight[message_id] += 1
        if self.in_flight[message_id] > 1:
            self.overlaps.append(message_id)
        try:
            await asyncio.sleep(0.02)
        finally:
            self.in_flight[message_id] -= 1
        self.ids[message_id] += 1
        return await super().handle_DATA(server, session, envelope)


@contextmanager
def sink_server(sink: Sink) -> Iterator[int]:
    with running_sink(sink) as port:
        yield port


@asynccontextmanager
async def serving(database_url: str, port: int, log: Path) -> AsyncIterator[trio.Process]:
    """``tidings serve`` sending to the sink; killed (not stopped) when the block ends."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "TIDINGS_EMAIL_PROVIDER": "smtp",
        "TIDINGS_SMTP_URL": f"smtp://127.0.0.1:{port}?starttls=off",
        "TIDINGS_SMTP_CONNECTIONS": "2",
        # Long enough that a process starved of CPU (a loaded CI machine) keeps
        # its leases between renewals; short enough for the kill test to wait out.
        "TIDINGS_EMAIL_LEASE_SECONDS": "10",
        "TIDINGS_EMAIL_POLL_SECONDS": "0.2",
        "TIDINGS_MAIL_HOST": "mx.tidings.example",
    }
    http_port = free_port()
    command = [sys.executable, "-m", "tidings", "serve", "--host", "127.0.0.1",
               "--port", str(http_port)]
    with log.open("ab") as stderr:
        process = await trio.lowlevel.open_process(
            command, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        await wait_healthy(f"http://127.0.0.1:{http_port}", process)
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def setup_team(conn: Any) -> UUID:
    team_id: UUID = await token_store.ensure_team(conn, "acme")
    await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
    key, selector = new_private_key(), new_selector()
    records = records_for("acme.example", selector, public_key_base64(key), "mx.tidings.example")
    domain = await domain_store.create_domain(conn, team_id, "acme.example", selector, key,
                                              records)
    await domain_store.record_checks(conn, [domain_store.Check(domain.id, records, "verified")])
    return team_id


async def queue_emails(conn: Any, team_id: UUID, count: int) -> set[str]:
    emails = [
        NewEmail(
            from_address="Acme <hi@acme.example>", from_email="hi@acme.example",
            to=[f"r{n}@example.com"], to_lookup=[f"r{n}@example.com"], cc=[], bcc=[],
            reply_to=[], send_to=[f"r{n}@example.com"], subject=f"#{n}", html=None,
            text="Hello", headers={}, tags=[], scheduled_at=None, domain="acme.example",
            provider="smtp",
        )
        for n in range(count)
    ]
    for start in range(0, count, 100):
        await accept_emails(conn, team_id, emails[start:start + 100])
    return {email.smtp_message_id for email in emails}


async def unsent(conn: Any) -> int:
    count: int = await conn.fetchval("SELECT count(*) FROM emails WHERE status <> 'sent'")
    return count


async def test_kill_9_during_a_drain_loses_nothing(
    database_url: str, asyncio_bridge: None, tmp_path: Path
) -> None:
    sink = SlowSink()
    log = tmp_path / "serve.log"
    with sink_server(sink) as port:
        async with triopg.connect(database_url) as conn:
            team_id = await setup_team(conn)
            expected = await queue_emails(conn, team_id, 300)
            async with serving(database_url, port, log) as process:
                with trio.fail_after(60):
                    while sum(sink.ids.values()) < 40:
                        await trio.sleep(0.02)
                process.send_signal(signal.SIGKILL)
                await process.wait()
            left = await unsent(conn)
            assert left > 0, "everything was sent before the kill: the test proved nothing"
            leased = await conn.fetchval(
                "SELECT count(*) FROM emails WHERE lease_owner IS NOT NULL"
            )
            async with serving(database_url, port, log):
                with trio.fail_after(90):
                    while await unsent(conn):
                        await trio.sleep(0.2)
            events = await conn.fetchval(
                "SELECT count(*) FROM email_events WHERE type = 'sent'"
            )
    assert set(sink.ids) == expected
    assert sink.overlaps == []
    # Only emails in flight at the kill may have gone out twice.
    twice = [mid for mid, n in sink.ids.items() if n > 1]
    assert len(twice) <= leased
    assert events == 300


async def test_two_processes_send_each_email_once(
    database_url: str, asyncio_bridge: None, tmp_path: Path
) -> None:
    sink = SlowSink()
    log = tmp_path / "serve.log"
    with sink_server(sink) as port:
        async with triopg.connect(database_url) as conn:
            team_id = await setup_team(conn)
            async with serving(database_url, port, log), serving(database_url, port, log):
                expected = await queue_emails(conn, team_id, 300)
                with trio.fail_after(90):
                    while await unsent(conn):
                        await trio.sleep(0.2)
    assert sink.ids == dict.fromkeys(expected, 1)
    assert sink.overlaps == []
