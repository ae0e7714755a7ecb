"""``python -m bench broadcast``: a broadcast to 100,000 contacts, fanout and drain.

Starts the SMTP sink of ``bench email`` and ``tidings serve`` with the smtp
provider pointed at it, on a fresh embedded database. Loads the audience
set-based straight into PostgreSQL (``--contacts`` eligible contacts and,
for every 25 of them, one more of each kind that is not: unsubscribed,
suppressed, opted out of the topic, without an email), all in one segment.
Then creates a broadcast with a topic, personalised subject and html and
the unsubscribe link, sends it through the API, and measures:

1. fanout: from the send request to ``queued_count`` = ``eligible_count``
   (the broadcast ``sent``), as the client sees it (``seconds_client``,
   polling every 20 ms) and as the server's ``queued_at``/``sent_at`` say
   (``seconds_server``), and the service process's CPU seconds meanwhile;
   the send worker drains meanwhile, as it would in production;
2. drain: emails received by the sink per second, from the send to the
   last arrival (``--drain 0`` skips it).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import trio

from bench.email import DOMAIN, Sink, verify_domain
from bench.harness import (
    HarnessError,
    Service,
    database_url,
    log,
    postgres_cpu,
    process_cpu_seconds,
    running_service,
)

LOAD = """
WITH made AS (
    INSERT INTO contacts (team_id, email, phone, first_name, unsubscribed)
    SELECT $1,
           CASE WHEN n > $2 AND (n - $2) % 4 = 0 THEN NULL ELSE 'c' || n || '@sink.example' END,
           CASE WHEN n > $2 AND (n - $2) % 4 = 0 THEN '+1415' || lpad(n::text, 7, '0') END,
           'Name' || n,
           n > $2 AND (n - $2) % 4 = 1
    FROM generate_series(1, $2::int + $3::int) n
    RETURNING id, email
)
INSERT INTO segment_contacts (segment_id, contact_id) SELECT $4, id FROM made
"""

SUPPRESS = """
INSERT INTO suppressions (team_id, address, kind, reason)
SELECT $1, 'c' || n || '@sink.example', 'email', 'manual'
FROM generate_series($2::int + 1, $2::int + $3::int) n WHERE (n - $2) % 4 = 2
"""

OPT_OUT = """
INSERT INTO topic_subscriptions (topic_id, contact_id, subscription)
SELECT $1, c.id, 'opt_out' FROM contacts c
JOIN generate_series($3::int + 1, $3::int + $4::int) n ON c.email = 'c' || n || '@sink.example'
WHERE c.team_id = $2 AND (n - $3) % 4 = 3
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contacts", type=int, default=100_000, help="eligible contacts")
    parser.add_argument("--drain", type=int, default=1, help="0: skip the drain")
    parser.add_argument("--batch-size", type=int, default=2000,
                        help="TIDINGS_BROADCAST_BATCH_SIZE of the service")
    parser.add_argument("--connections", type=int, default=2,
                        help="TIDINGS_BROADCAST_CONNECTIONS of the service")
    parser.add_argument("--provider", choices=("smtp", "sandbox"), default="smtp",
                        help="sandbox: the fanout alone, no SMTP sending beside it (no drain)")
    parser.add_argument("--smtp-connections", type=int, default=16,
                        help="TIDINGS_SMTP_CONNECTIONS of the service")


def load_audience(service: Service, token: str, eligible: int) -> tuple[str, str]:
    """The segment and topic, with the audience loaded set-based."""
    headers = {"Authorization": f"Bearer {token}"}
    base = service.base_url
    segment = httpx.post(f"{base}/segments", json={"name": "bench"}, headers=headers).json()
    topic = httpx.post(f"{base}/topics", json={"name": "News", "default_subscription": "opt_in"},
                       headers=headers).json()
    segment_id, topic_id = segment["data"]["id"], topic["data"]["id"]
    ineligible = 4 * (eligible // 25)

    async def load() -> None:
        conn = await asyncpg.connect(database_url(service))
        try:
            team_id = await conn.fetchval(
                "SELECT team_id FROM segments WHERE id = $1", UUID(segment_id)
            )
            async with conn.transaction():
                await conn.execute(LOAD, team_id, eligible, ineligible,
                                   UUID(segment_id))
                await conn.execute(SUPPRESS, team_id, eligible, ineligible)
                await conn.execute(OPT_OUT, UUID(topic_id), team_id,
                                   eligible, ineligible)
            await conn.execute("ANALYZE")
        finally:
            await conn.close()

    started = time.monotonic()
    asyncio.run(load())
    log(f"loaded {eligible + ineligible} contacts in {time.monotonic() - started:.1f}s")
    return segment_id, topic_id


async def measure(
    service: Service, token: str, sink: Sink, segment_id: str, topic_id: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=service.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        created = (await client.post("/broadcasts", json={
            "name": "bench", "segment_id": segment_id, "topic_id": topic_id,
            "from_email": f"news@{DOMAIN}", "from_name": "Bench News",
            "subject": "Hello {{{first_name}}}",
            "html": ("<h1>Hello {{{first_name}}}</h1><p>" + "News of the week. " * 40
                     + "</p><p>{{{offer}}}</p>"
                     '<p><a href="{{{unsubscribe_url}}}">Unsubscribe</a></p>'),
            "variable_bindings": {"offer": "20% off until Sunday"},
        })).json()["data"]
        before = sink.count()
        service_cpu, pg_cpu = process_cpu_seconds(service.process.pid), postgres_cpu(service)
        started = last_report = time.monotonic()
        response = await client.post(f"/broadcasts/{created['id']}/send")
        if response.status_code != 200:
            raise HarnessError(f"send answered {response.status_code}: {response.text}")
        while True:
            got = (await client.get(f"/broadcasts/{created['id']}")).json()["data"]
            if got["status"] != "queued":
                break
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                log(f"fanout: {got['queued_count']} queued after {last_report - started:.1f}s")
            await trio.sleep(0.02)
        client_seconds = time.monotonic() - started
        service_cpu = process_cpu_seconds(service.process.pid) - service_cpu
        pg_after = postgres_cpu(service)
        pg_seconds = sum(pg_after[pid] - pg_cpu.get(pid, 0.0) for pid in pg_after)
        if got["status"] != "sent":
            raise HarnessError(f"the broadcast ended {got['status']}: {got['failure_reason']}")
        server_seconds = (datetime.fromisoformat(got["sent_at"])
                          - datetime.fromisoformat(got["queued_at"])).total_seconds()
        log(f"fanout: {got['queued_count']} queued in {client_seconds:.2f}s "
            f"(server: {server_seconds:.2f}s)")
        fanout = {
            "audience": got["audience_count"], "eligible": got["eligible_count"],
            "suppressed": got["suppressed_count"], "queued": got["queued_count"],
            "failed": got["failed_count"], "seconds_client": round(client_seconds, 3),
            "seconds_server": round(server_seconds, 3),
            "queued_per_s": round(got["queued_count"] / server_seconds),
            "service_cpu_s": round(service_cpu, 2), "postgres_cpu_s": round(pg_seconds, 2),
        }
        if not args.drain or args.provider == "sandbox":
            return {"fanout": fanout}
        total = got["queued_count"]
        await sink.wait_for(before + total, within=1800)
        send_wall = time.time() - (time.monotonic() - started)
        last = max(stamp for stamp, _ in sink.arrivals()[before:])
        seconds = last - send_wall
        log(f"drain: {total} emails in {seconds:.1f}s ({total / seconds:.0f}/s)")
        return {"fanout": fanout,
                "drain": {"emails": total, "seconds": round(seconds, 1),
                          "per_s": round(total / seconds)}}


def run(args: argparse.Namespace) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="tidings-bench-broadcast-"))
    sink = Sink(workdir)
    try:
        env = {
            "TIDINGS_RATE_LIMIT_PER_SECOND": "0",
            "TIDINGS_EMAIL_PROVIDER": args.provider,
            "TIDINGS_SMTP_URL": f"smtp://127.0.0.1:{sink.port}?starttls=off",
            "TIDINGS_SMTP_CONNECTIONS": str(args.smtp_connections),
            "TIDINGS_MAIL_HOST": "mx.bench.example",
            "TIDINGS_DOMAIN_RECHECK_SECONDS": "86400",
            "TIDINGS_BROADCAST_BATCH_SIZE": str(args.batch_size),
            "TIDINGS_BROADCAST_CONNECTIONS": str(args.connections),
        }
        with running_service(env) as service:
            token = service.create_token("bench")
            verify_domain(service, token)
            segment_id, topic_id = load_audience(service, token, args.contacts)
            results = trio.run(measure, service, token, sink, segment_id, topic_id, args)
            peak_rss_mb = service.peak_rss_mb()
            service.stop()
    finally:
        sink.stop()
    return {"bench": "broadcast", "provider": args.provider, "contacts": args.contacts,
            "batch_size": args.batch_size, "connections": args.connections,
            **results, "service_peak_rss_mb": peak_rss_mb}
