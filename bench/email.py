"""``python -m bench email``: email acceptance, drain to an SMTP sink, and latency.

Starts an SMTP sink (aiosmtpd, ``bench/email_sink.py``) in a process of its
own and ``tidings serve`` with ``TIDINGS_EMAIL_PROVIDER=smtp`` pointed at it,
on a fresh embedded database with the rate limit off; adds a sending domain
and marks it verified in the database (there is no DNS to check here), so
every message is DKIM-signed with the domain's 2048-bit key. Then, in order:

1. the sink's own ceiling: messages per second this process pushes into it
   over ``--sink-connections`` connections with the service's SMTP client;
2. accepted requests per second of ``POST /contacts`` and ``POST /emails``,
   each without and with a fresh ``Idempotency-Key`` (same load generator
   as ``bench api``); the emails are sent on to the sink meanwhile, and each
   email phase waits for its drain before the next phase starts; then
   ``POST /emails`` with a ``scheduled_at`` 20 days ahead: acceptance alone,
   with no sending sharing the CPU;
3. the drain: ``--drain`` emails accepted through ``POST /emails/batch``,
   timed from the first request to the last message received by the sink;
4. latency when not saturated: ``--latency-count`` emails at
   ``--latency-rate`` per second, each timed from the start of its request
   to its arrival at the sink (the sink records the arrival time).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import secrets
import shutil
import signal
import smtplib
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import trio

from bench.harness import HarnessError, Service, database_url, free_port, log, running_service
from bench.loadgen import PhaseResult, run_load

DOMAIN = "bench.example"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each accept phase")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each phase")
    parser.add_argument("--drain", type=int, default=5000, help="emails in the drain phase")
    parser.add_argument("--latency-count", type=int, default=200)
    parser.add_argument("--latency-rate", type=float, default=20.0, help="emails per second")
    parser.add_argument("--sink-seconds", type=float, default=5.0)
    parser.add_argument("--sink-connections", type=int, default=8)
    parser.add_argument("--smtp-connections", type=int, default=16,
                        help="TIDINGS_SMTP_CONNECTIONS of the service")
    parser.add_argument("--workers", type=int, default=1, help="tidings serve --workers")
    parser.add_argument("--phases", default="ceiling,accept,drain,latency",
                        help="which phases to run, comma-separated")
    parser.add_argument("--profile", metavar="FILE",
                        help="py-spy record (raw format) of the service during the drain")


class PostRequests:
    """Pre-encoded POST requests whose bodies differ only in a fixed-width id."""

    def __init__(
        self, host: str, port: int, token: str, path: str, body: tuple[bytes, bytes],
        tag: str, idempotent: bool,
    ) -> None:
        self._tag = tag.encode()
        self._counter = itertools.count()
        self._idempotent = idempotent
        self._start, self._end = body
        length = len(self._start) + len(self._make_id()) + len(self._end)
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n"
        ).encode()

    def _make_id(self) -> bytes:
        return self._tag + b"%010d" % next(self._counter)

    def __call__(self) -> bytes:
        unique = self._make_id()
        key = b"Idempotency-Key: bench-" + unique + b"\r\n" if self._idempotent else b""
        return b"".join((self._head, key, b"\r\n", self._start, unique, self._end))


CONTACT_BODY = (b'{"email": "', b'@bench.example", "first_name": "B"}')
EMAIL_BODY = (
    b'{"from": "Bench <news@' + DOMAIN.encode() + b'>", "to": "r',
    b'@sink.example", "subject": "Your receipt", '
    b'"html": "<h1>Thanks</h1><p>Your order is on its way.</p>"}',
)


class Sink:
    """The sink process and the arrivals it records."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.path = workdir / "arrivals.txt"
        self.path.touch()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.email_sink", str(self.port), str(self.path)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != b"ready":
            raise HarnessError("the SMTP sink did not start")

    def arrivals(self) -> list[tuple[float, str]]:
        found = []
        for line in self.path.read_text().splitlines():
            stamp, _, message_id = line.partition(" ")
            found.append((float(stamp), message_id))
        return found

    def count(self) -> int:
        return self.path.read_bytes().count(b"\n")

    async def wait_for(self, total: int, within: float) -> None:
        with trio.move_on_after(within):
            # Another process writes the file: there is nothing to wait on but time.
            while self.count() < total:  # noqa: ASYNC110
                await trio.sleep(0.05)
        if self.count() < total:
            raise HarnessError(f"the sink got {self.count()} of {total} messages in {within:.0f}s")

    def stop(self) -> None:
        """Stop the sink and remove the directory its arrivals were kept in."""
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.path.parent, ignore_errors=True)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by ``root`` and its descendants,
    split into the Python processes and PostgreSQL's."""
    tree = _children()
    ticks = os.sysconf("SC_CLK_TCK")
    totals = {"python": 0.0, "postgres": 0.0}
    stack = [root]
    while stack:
        pid = stack.pop()
        stack.extend(tree.get(pid, []))
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        used = (int(fields[11]) + int(fields[12])) / ticks
        totals["postgres" if "postgres" in name else "python"] += used
    return totals


def _thread_cpu(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU per item of the service (its Python processes and PostgreSQL) and the sink."""

    def __init__(self, service: Service, sink: Sink) -> None:
        self._service = service.process.pid
        self._sink = sink.process.pid
        # The embedded PostgreSQL runs on its own, not as a child of the service.
        self._postgres = [
            int(path.read_text().split()[0])
            for path in service.data_dir.rglob("postmaster.pid")
        ]
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        return {
            "service_python": cpu_seconds(self._service)["python"],
            # The event loop's thread (its id is the process's): with one
            # worker, the part of the service that cannot use another core.
            "service_event_loop": _thread_cpu(self._service),
            "postgres": sum(cpu_seconds(pid)["postgres"] for pid in self._postgres),
            "sink": cpu_seconds(self._sink)["python"],
        }

    def per_item_ms(self, items: int) -> dict[str, float]:
        end = self._read()
        return {f"{name}_cpu_ms_per_email": round((end[name] - self._start[name]) * 1000 / items, 3)
                for name in end}


def verify_domain(service: Service, token: str) -> None:
    """Add the sending domain and mark it verified in the database."""
    response = httpx.post(
        f"{service.base_url}/domains", json={"name": DOMAIN},
        headers={"Authorization": f"Bearer {token}"},
    )
    if response.status_code != 201:
        raise HarnessError(f"POST /domains answered {response.status_code}: {response.text}")

    async def update() -> None:
        conn = await asyncpg.connect(database_url(service))
        try:
            await conn.execute(
                "UPDATE domains SET status = 'verified', verified_at = now(), "
                "last_checked_at = now() WHERE name = $1",
                DOMAIN,
            )
        finally:
            await conn.close()

    asyncio.run(update())


def sink_ceiling(port: int, seconds: float, connections: int) -> float:
    """Messages per second this process alone pushes into the sink (smtplib, a
    thread per connection, one message after another on each)."""
    message = (
        b"From: news@bench.example\r\nTo: r@sink.example\r\nSubject: ceiling\r\n"
        b"Message-ID: <ceiling@bench.example>\r\n\r\n" + (b"x" * 75 + b"\r\n") * 20
    )
    counts = [0] * connections
    deadline = time.monotonic() + seconds

    def pump(index: int) -> None:
        with smtplib.SMTP("127.0.0.1", port) as conn:
            while time.monotonic() < deadline:
                conn.sendmail("b@bench.example", ["r@sink.example"], message)
                counts[index] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=pump, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


async def accept_phases(
    service: Service, token: str, sink: Sink, args: argparse.Namespace
) -> dict[str, Any]:
    run_tag = secrets.token_hex(3)
    results: dict[str, Any] = {}
    expected = sink.count()
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 20 * 86400))
    scheduled = (EMAIL_BODY[0], EMAIL_BODY[1][:-1] + f', "scheduled_at": "{later}"}}'.encode())
    phases = (("/contacts", CONTACT_BODY, ""), ("/emails", EMAIL_BODY, ""),
              ("/emails", scheduled, "_scheduled"))
    for number, (path, body, suffix) in enumerate(phases):
        for idempotent in (False, True):
            name = f"{path.strip('/')}{suffix}{'_idempotent' if idempotent else ''}"
            tag = f"{run_tag}{number}{int(idempotent)}"
            requests = PostRequests(service.host, service.port, token, path, body, tag,
                                    idempotent)
            if args.warmup > 0:
                warm = await run_load(service.host, service.port, requests,
                                      connections=args.connections, seconds=args.warmup)
                if path == "/emails" and not suffix:
                    expected += warm.accepted
            result: PhaseResult = await run_load(
                service.host, service.port, requests,
                connections=args.connections, seconds=args.seconds,
            )
            log(f"{name}: {result.accepted} accepted, {result.errors} errors, "
                f"{result.requests_per_s:.0f}/s")
            for kind, sample in result.error_samples.items():
                log(f"{name}: first {kind}: {sample}")
            results[name] = result.summary()
            if path == "/emails" and not suffix:
                expected += result.accepted
                began = time.perf_counter()
                await sink.wait_for(expected, within=600)
                log(f"{name}: drained {time.perf_counter() - began:.1f}s after the phase")
    return results


def start_profiler(pid: int, path: str) -> subprocess.Popen[bytes]:
    """py-spy sampling the service (and its workers) while a thread holds the
    GIL, until SIGINT."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
         "--rate", "200", "--subprocesses", "--gil", "--nonblocking", "-o", path,
         "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


async def drain_phase(
    service: Service, token: str, sink: Sink, count: int, connections: int,
    profile: str | None = None,
) -> dict[str, Any]:
    before = sink.count()
    spy = None
    if profile:
        spy = start_profiler(service.process.pid, profile)
        await trio.sleep(1.0)
    meter = CpuMeter(service, sink)
    batches = [
        [{"from": f"Bench <news@{DOMAIN}>", "to": f"d{n}@sink.example",
          "subject": "Your receipt", "html": "<h1>Thanks</h1><p>On its way.</p>"}
         for n in range(start, min(start + 100, count))]
        for start in range(0, count, 100)
    ]
    queue = iter(batches)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers,
                                 timeout=60) as client:

        async def feed() -> None:
            for batch in queue:
                response = await client.post("/emails/batch", json=batch)
                if response.status_code != 202:
                    raise HarnessError(f"batch answered {response.status_code}: {response.text}")

        started = time.time()
        async with trio.open_nursery() as nursery:
            for _ in range(connections):
                nursery.start_soon(feed)
        accepted_in = time.time() - started
    await sink.wait_for(before + count, within=900)
    cpu = meter.per_item_ms(count)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    last = max(stamp for stamp, _ in sink.arrivals()[before:])
    seconds = last - started
    log(f"drain: {count} emails accepted in {accepted_in:.1f}s, received in {seconds:.1f}s; "
        f"{cpu}")
    return {
        "emails": count,
        "accepted_per_s": round(count / accepted_in, 1),
        "seconds_first_accept_to_last_received": round(seconds, 2),
        "drained_per_s": round(count / seconds, 1),
        **cpu,
    }


async def latency_phase(
    service: Service, token: str, sink: Sink, count: int, rate: float
) -> dict[str, Any]:
    sent: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=service.base_url, headers=headers,
                                 timeout=30) as client:
        for n in range(count):
            began = time.time()
            response = await client.post("/emails", json={
                "from": f"Bench <news@{DOMAIN}>", "to": f"l{n}@sink.example",
                "subject": "Your code", "text": f"Your code is {n:06d}",
            })
            if response.status_code != 202:
                raise HarnessError(f"POST /emails answered {response.status_code}: {response.text}")
            sent[f"<{response.json()['data']['id']}@{DOMAIN}>"] = began
            await trio.sleep(max(0.0, 1 / rate - (time.time() - began)))
    with trio.move_on_after(60):
        while True:
            arrived = {mid: stamp for stamp, mid in sink.arrivals() if mid in sent}
            if len(arrived) == len(sent):
                break
            await trio.sleep(0.1)
    latencies = sorted((arrived[mid] - sent[mid]) * 1000 for mid in arrived)
    if len(latencies) < len(sent):
        raise HarnessError(f"{len(sent) - len(latencies)} latency emails never arrived")

    def pick(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    return {"emails": count, "rate_per_s": rate, "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "max_ms": round(latencies[-1], 1)}


async def measure(
    service: Service, token: str, sink: Sink, args: argparse.Namespace
) -> dict[str, Any]:
    phases = set(args.phases.split(","))
    results: dict[str, Any] = {}
    if "ceiling" in phases:
        log(f"sink ceiling: {args.sink_seconds:g}s on {args.sink_connections} connections")
        ceiling = await trio.to_thread.run_sync(
            sink_ceiling, sink.port, args.sink_seconds, args.sink_connections
        )
        log(f"sink ceiling: {ceiling:.0f} messages/s")
        results["sink_ceiling_per_s"] = round(ceiling, 1)
    if "accept" in phases:
        results["accept"] = await accept_phases(service, token, sink, args)
    if "drain" in phases:
        results["drain"] = await drain_phase(service, token, sink, args.drain, 4, args.profile)
    if "latency" in phases:
        results["latency"] = await latency_phase(
            service, token, sink, args.latency_count, args.latency_rate
        )
    return results


def run(args: argparse.Namespace) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="tidings-bench-sink-"))
    sink = Sink(workdir)
    try:
        env = {
            "TIDINGS_RATE_LIMIT_PER_SECOND": "0",
            "TIDINGS_EMAIL_PROVIDER": "smtp",
            "TIDINGS_SMTP_URL": f"smtp://127.0.0.1:{sink.port}?starttls=off",
            "TIDINGS_SMTP_CONNECTIONS": str(args.smtp_connections),
            "TIDINGS_MAIL_HOST": "mx.bench.example",
            # There is no DNS for the bench domain: no re-check during the run.
            "TIDINGS_DOMAIN_RECHECK_SECONDS": "86400",
        }
        serve_args = ["--workers", str(args.workers)] if args.workers > 1 else []
        with running_service(env, serve_args=serve_args) as service:
            token = service.create_token("bench")
            verify_domain(service, token)
            log("token created, sending domain verified")
            results = trio.run(measure, service, token, sink, args)
            peak_rss_mb = service.peak_rss_mb()
            shutdown = service.stop()
    finally:
        sink.stop()
    return {
        "bench": "email",
        "seconds": args.seconds,
        "connections": args.connections,
        "workers": args.workers,
        **results,
        "service_peak_rss_mb": peak_rss_mb,
        "shutdown_exit_code": shutdown.exit_code,
    }
