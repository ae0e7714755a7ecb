"""``python -m bench overload``: latency, shedding and memory under many connections.

Starts a fresh service with the rate limit off, creates a token and a few
contacts, then for each connection count in ``--connections`` keeps one
request in flight on every connection for ``--seconds`` (``GET
/contacts?limit=10`` by default, ``POST /contacts`` with ``--write``) while
it samples the service's resident memory twice a second. Reports, per
phase: p50/p99 of the accepted (2xx) requests, the fraction of requests
shed with 503, any other non-2xx answers or transport errors, and the
service's RSS at the start, at its highest and at steady state (the median
of the second half of the phase). Everything runs over loopback and stops
by itself.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import secrets
import statistics
import time
from pathlib import Path

import httpx
import trio

from bench.harness import HarnessError, log, running_service
from bench.loadgen import PhaseResult, run_load

SAMPLE_SECONDS = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connections", default="250,1000",
        help="comma-separated connection counts, one phase each",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument(
        "--write", action="store_true", help="POST /contacts instead of GET /contacts"
    )
    parser.add_argument(
        "--honor-retry-after", action="store_true",
        help="clients wait the 1 s that Retry-After asks after a 503 (default: resend at once)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="an extra setting for the service (repeatable)",
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time used so far by ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """The resident set size of ``pid`` in MiB (0 when it has gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Requests:
    """Pre-encoded requests: a read of one page of contacts, or a contact creation."""

    def __init__(self, host: str, port: int, token: str, write: bool) -> None:
        self._write = write
        self._counter = itertools.count()
        self._tag = secrets.token_hex(4).encode()
        common = (
            f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        ).encode()
        if write:
            length = len(self._body(0))
            self._head = (
                b"POST /contacts HTTP/1.1\r\n" + common
                + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length
            )
        else:
            self._head = b"GET /contacts?limit=10 HTTP/1.1\r\n" + common + b"\r\n"

    def _body(self, number: int) -> bytes:
        return b'{"email": "o%s%010d@bench.example"}' % (self._tag, number)

    def __call__(self) -> bytes:
        if not self._write:
            return self._head
        return self._head + self._body(next(self._counter))


async def _sample_rss(pid: int, samples: list[tuple[float, float]], stop: trio.Event) -> None:
    started = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - started, rss_mb(pid)))
        with trio.move_on_after(SAMPLE_SECONDS):
            await stop.wait()


async def _phase(
    host: str, port: int, pid: int, requests: Requests, connections: int, seconds: float,
    pause_after_503: float = 0.0,
) -> dict[str, object]:
    samples: list[tuple[float, float]] = []
    stop = trio.Event()
    rss_before = rss_mb(pid)
    cpu_before = cpu_seconds(pid)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sample_rss, pid, samples, stop)
        result = await run_load(
            host, port, requests, connections=connections, seconds=seconds,
            request_timeout=30.0, pause_after_503=pause_after_503,
        )
        stop.set()
    summary = _summary(result, connections, rss_before, samples, seconds)
    summary["service_cpu_s"] = round(cpu_seconds(pid) - cpu_before, 1)
    summary["load_average"] = os.getloadavg()[0]
    return summary


def _summary(
    result: PhaseResult,
    connections: int,
    rss_before: float,
    samples: list[tuple[float, float]],
    seconds: float,
) -> dict[str, object]:
    shed = result.error_kinds.get("http_503", 0)
    answered = result.accepted + result.errors
    others = {kind: n for kind, n in result.error_kinds.items() if kind != "http_503"}
    late = [rss for at, rss in samples if at >= seconds / 2] or [rss for _, rss in samples]
    summary = result.summary()
    return {
        "connections": connections,
        "accepted": result.accepted,
        "accepted_per_s": summary["requests_per_s"],
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "shed": shed,
        "shed_fraction": round(shed / answered, 3) if answered else 0.0,
        "other_errors": others,
        "rss_before_mb": round(rss_before, 1),
        "rss_max_mb": round(max((rss for _, rss in samples), default=0.0), 1),
        "rss_steady_mb": round(statistics.median(late), 1) if late else 0.0,
        "samples": [e for e in result.error_samples.items() if e[0] != "http_503"][:3],
    }


def _seed(base_url: str, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=10) as client:
        for number in range(10):
            response = client.post("/contacts", json={"email": f"seed{number}@bench.example"})
            if response.status_code != 201:
                raise HarnessError(f"seeding contacts: {response.status_code} {response.text}")


def run(args: argparse.Namespace) -> dict[str, object]:
    counts = [int(part) for part in args.connections.split(",") if part.strip()]
    extra = {"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}
    for setting in args.env:
        name, _, value = setting.partition("=")
        extra[name] = value
    phases = []
    with running_service(extra) as service:
        token = service.create_token("bench")
        _seed(service.base_url, token)
        requests = Requests(service.host, service.port, token, args.write)
        for connections in counts:
            log(f"{connections} connections for {args.seconds:g}s")
            phase = trio.run(
                _phase, service.host, service.port, service.process.pid, requests,
                connections, args.seconds, 1.0 if args.honor_retry_after else 0.0,
            )
            log(json.dumps(phase))
            phases.append(phase)
        shutdown = service.stop()
    return {
        "bench": "overload",
        "request": "POST /contacts" if args.write else "GET /contacts?limit=10",
        "seconds": args.seconds,
        "clients_honor_retry_after": args.honor_retry_after,
        "settings": extra,
        "phases": phases,
        "shutdown_exit_code": shutdown.exit_code,
    }
