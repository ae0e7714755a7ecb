"""``python -m bench sms``: accepted ``POST /sms`` per second beside ``POST /contacts``,
and ``GET /sms`` with each filter over a team with 1,000,000 messages.

Starts ``tidings serve`` on a fresh embedded database (sandbox provider, rate
limit off), creates a team, its token and an approved sender ID, then:

1. accepted requests per second of ``POST /contacts`` and of ``POST /sms``,
   in the same run, same load generator and connections as ``bench api``
   (each phase after an unmeasured warm-up); the sandbox sends the messages
   meanwhile, as it would in production; then ``POST /sms`` scheduled for
   the next day, which measures acceptance without the sends beside it;
2. loads ``--messages`` messages into a second team with one set-based
   ``INSERT ... SELECT generate_series`` (the secondary indexes are dropped
   before and built after it, as a bulk build), then times ``GET /sms`` with
   each filter,
   ``--repeat`` requests each over HTTP, sequentially: p50 and p99.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import statistics
import time
import uuid
from typing import Any

import asyncpg
import httpx
import trio

from bench.api import ContactRequests
from bench.harness import HarnessError, Service, database_url, log, running_service
from bench.loadgen import PhaseResult, percentile, run_load

SENDER = "Bench"

# One statement for every message: realistic variety in recipients, senders,
# bodies (a quarter of them UCS-2), statuses and provider ids, two seconds apart.
LOAD = r"""
INSERT INTO sms_messages (id, team_id, to_number, country, from_sender, body, encoding,
                          segments, status, provider, message_id, created_at, updated_at,
                          submitted_at, delivered_at)
SELECT gen_random_uuid(), $1,
       '+1555' || lpad(((i::bigint * 7919) % 9000000 + 1000000)::text, 7, '0'), 'US',
       (ARRAY['Bench', 'Shop', '+15550001111', 'Alerts', '12345'])[i % 5 + 1],
       CASE i % 4
         WHEN 0 THEN 'Your Acme code is ' || ((i * 37) % 1000000)::text
                     || '. It expires in 10 minutes.'
         WHEN 1 THEN 'Hi! Your order #' || i::text || ' has shipped and arrives '
                     || (ARRAY['Monday', 'Tuesday', 'Friday'])[i % 3 + 1] || '.'
         WHEN 2 THEN 'Reminder: your appointment is on '
                     || to_char(now() + (i % 90) * interval '1 day', 'YYYY-MM-DD')
                     || ' at ' || (8 + i % 10)::text || ':00.'
         ELSE 'Grüße aus Berlin 😀 Ticket ' || (i % 50000)::text
       END,
       CASE i % 4 WHEN 3 THEN 'UCS-2' ELSE 'GSM-7' END, 1,
       CASE WHEN i % 100 < 85 THEN 'delivered' WHEN i % 100 < 90 THEN 'sent'
            WHEN i % 100 < 94 THEN 'undelivered' WHEN i % 100 < 97 THEN 'failed'
            WHEN i % 100 < 99 THEN 'submitted' ELSE 'queued' END,
       'sandbox', 'SM' || md5(i::text),
       now() - i * interval '2 seconds', now() - i * interval '2 seconds',
       now() - i * interval '2 seconds', now() - i * interval '2 seconds'
FROM generate_series(1, $2) AS i
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each accept phase")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each phase")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages of the team")
    parser.add_argument("--repeat", type=int, default=200, help="requests per filter")


class SmsRequests:
    """Pre-encoded ``POST /sms`` requests to varied numbers, fixed length."""

    def __init__(self, host: str, port: int, token: str, scheduled_at: str | None = None) -> None:
        self._counter = itertools.count()
        self._extra = b"" if scheduled_at is None else (
            b', "scheduled_at": "' + scheduled_at.encode() + b'"'
        )
        body_length = len(self._body(0))
        self._head = (
            "POST /sms HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {body_length}\r\n\r\n"
        ).encode()

    def _body(self, n: int) -> bytes:
        # +1 415 555 01xx..: valid US numbers the sandbox delivers to.
        return (b'{"to": "+1415555%04d", "from": "' + SENDER.encode()
                + b'", "body": "Your code is %06d"' + self._extra + b"}") % (
            100 + n % 9000, n % 1_000_000)

    def __call__(self) -> bytes:
        return self._head + self._body(next(self._counter))


def _describe(result: PhaseResult) -> str:
    return f"{result.accepted} accepted, {result.errors} errors, {result.requests_per_s:.0f}/s"


async def _accept_phases(host: str, port: int, token: str,
                         args: argparse.Namespace) -> dict[str, PhaseResult]:
    results: dict[str, PhaseResult] = {}
    tomorrow = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
    makers = {
        "contacts": lambda: ContactRequests(host, port, token, secrets.token_hex(4), False),
        "sms": lambda: SmsRequests(host, port, token),
        # Accepted for tomorrow: acceptance alone, without the sends competing for the CPU.
        "sms_scheduled": lambda: SmsRequests(host, port, token, tomorrow),
    }
    for phase, make in makers.items():
        if args.warmup > 0:
            warm = await run_load(host, port, make(), connections=args.connections,
                                  seconds=args.warmup)
            log(f"{phase} warm-up: {_describe(warm)}")
        result = await run_load(host, port, make(), connections=args.connections,
                                seconds=args.seconds)
        log(f"{phase}: {_describe(result)}")
        for kind, sample in result.error_samples.items():
            log(f"{phase}: first {kind}: {sample}")
        results[phase] = result
    return results


# The indexes of sms_messages that a bulk load builds after the rows (all but
# the primary key, which other tables reference).
SECONDARY_INDEXES = """
SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS definition
FROM pg_index WHERE indrelid = 'sms_messages'::regclass AND NOT indisprimary
"""


async def _load(url: str, team_id: uuid.UUID, count: int) -> dict[str, float]:
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        indexes = await conn.fetch(SECONDARY_INDEXES)
        for index in indexes:
            await conn.execute(f"DROP INDEX {index['name']}")
        await conn.execute(LOAD, team_id, count)
        loaded = time.monotonic()
        log(f"loaded {count} messages in {loaded - started:.0f}s; building the indexes")
        await conn.execute("SET maintenance_work_mem = '1GB'")
        for index in indexes:
            await conn.execute(index["definition"])
        indexed = time.monotonic()
        await conn.execute("VACUUM ANALYZE sms_messages")
        log(f"indexes built in {indexed - loaded:.0f}s")
        return {"load_s": round(loaded - started, 1), "index_s": round(indexed - loaded, 1)}
    finally:
        await conn.close()


FILTERS: dict[str, dict[str, str]] = {
    "none": {},
    "status": {"status": "undelivered"},
    "status_absent": {"status": "expired"},
    "sender": {"sender": "Shop"},
    "dates": {"start_date": "-10d", "end_date": "-9d"},
    "offset_1000": {"offset": "1000"},
    "search_common": {"search": "SHIPPED"},
    "search_recipient": {"search": "5551234"},
    "search_provider_id": {"search": "sm" + "c4ca4238a0"},
    "search_rare": {"search": "order #777777 "},
    "search_medium": {"search": "ticket 42"},
    "search_absent": {"search": "zzqx"},
    "search_one_char_absent": {"search": "q"},
    "search_two_chars_absent": {"search": "zq"},
    "search_one_char_common": {"search": "\u00dc"},
    "combined": {"status": "delivered", "sender": "Shop", "search": "Friday"},
}


def _params(raw: dict[str, str]) -> dict[str, str]:
    now = time.time()
    params = {}
    for name, value in raw.items():
        if value.startswith("-") and value.endswith("d"):
            moment = now - float(value[1:-1]) * 86400
            value = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(moment))
        params[name] = value
    return params


def _time_filters(service: Service, token: str, repeat: int) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url=service.base_url,
                      headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        for name, raw in FILTERS.items():
            params = _params(raw)
            timings = []
            count = 0
            for _ in range(repeat):
                started = time.perf_counter()
                response = client.get("/sms", params=params)
                timings.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    raise HarnessError(f"GET /sms {params} answered {response.status_code}")
                count = len(response.json()["data"])
            timings.sort()
            figures[name] = {
                "params": params, "rows": count,
                "p50_ms": round(statistics.median(timings), 2),
                "p99_ms": round(percentile(timings, 99), 2),
            }
            log(f"GET /sms {name}: {figures[name]}")
    return figures


def _create(service: Service, token: str, path: str, body: dict[str, str]) -> None:
    response = httpx.post(f"{service.base_url}{path}", json=body,
                          headers={"Authorization": f"Bearer {token}"})
    if response.status_code != 201:
        raise HarnessError(f"POST {path} answered {response.status_code}: {response.text}")


def run(args: argparse.Namespace) -> dict[str, object]:
    with running_service({"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}) as service:
        token = service.create_token("bench")
        _create(service, token, "/sender-ids", {"value": SENDER, "type": "alphanumeric"})
        accepted = trio.run(_accept_phases, service.host, service.port, token, args)
        big = json.loads(service.cli("tokens", "create", "--team", "million", "--all"))
        url = database_url(service)
        loading = asyncio.run(_load(url, uuid.UUID(big["team_id"]), args.messages))
        filters = _time_filters(service, big["token"], args.repeat)
        service.stop()

    contacts, sms, scheduled = accepted["contacts"], accepted["sms"], accepted["sms_scheduled"]
    return {
        "bench": "sms",
        "connections": args.connections,
        "post_contacts": contacts.summary(),
        "post_sms": sms.summary(),
        "post_sms_scheduled": scheduled.summary(),
        "sms_vs_contacts": round(sms.requests_per_s / contacts.requests_per_s, 2)
        if contacts.requests_per_s else None,
        "messages": args.messages,
        **loading,
        "get_sms": filters,
    }
