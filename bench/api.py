"""``python -m bench api``: throughput and latency of ``POST /contacts``, beside a bare app.

In one run, on the same machine and the same hypercorn settings:

- ``bare``: a quart-trio app whose ``POST /contacts`` parses the body and
  answers ``{}`` (``bench/bare.py``); ``bare_asgi`` the same as a plain ASGI
  function on the same hypercorn, without Quart: what the server alone costs;
- ``plain`` and ``idempotent``: Tidings (one worker, rate limit off), each
  request creating a contact with a unique email, the second with a fresh
  ``Idempotency-Key`` on every request;
- ``peer_plain`` and ``peer_idempotent``: the peer reference of issue 11,
  Starlette + uvicorn + asyncpg doing the same ``POST /contacts`` on the same
  database, its idempotency in one transaction (``bench/peer.py``; needs the
  ``dev`` extra);
- ``workers_plain`` and ``workers_idempotent``: the same with
  ``tidings serve --workers N`` (``--workers``, default 2).

Load comes from wrk when it is installed (one thread, ``--connections``
keep-alive connections), else from the raw-trio generator in
``bench/loadgen.py``. Each phase has an unmeasured warm-up. Every app runs
for the whole run; with ``--rounds N`` every phase runs N times, each round
in the opposite order of the one before. One JSON line on stdout: every
phase's accepted requests/s, p50 and p99 (medians over the rounds), the
ratios to the bare app and the cost of idempotency keys (the medians of each
round's own ratio, and with several rounds each round's), and the goals with
whether each is met.
"""

from __future__ import annotations

import argparse
import itertools
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import trio

from bench.harness import (
    HarnessError,
    Service,
    database_url,
    free_port,
    log,
    postgres_cpu,
    running_service,
)
from bench.loadgen import run_load, run_wrk, wrk_available


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each phase")
    parser.add_argument("--workers", type=int, default=2, help="workers of the last phases")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="times each phase runs, in alternating order; figures are the medians",
    )
    parser.add_argument(
        "--loadgen", choices=("auto", "wrk", "trio"), default="auto",
        help="load generator (auto: wrk when installed)",
    )


class ContactRequests:
    """Pre-encoded ``POST /contacts`` requests for the trio load generator."""

    def __init__(self, host: str, port: int, token: str, tag: str, idempotent: bool) -> None:
        self._tag = tag.encode()
        self._counter = itertools.count()
        self._idempotent = idempotent
        self._body_start = b'{"email": "'
        self._body_end = b'@bench.example", "first_name": "B"}'
        body_length = len(self._body_start) + len(self._make_id()) + len(self._body_end)
        self._head = (
            "POST /contacts HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {body_length}\r\n"
        ).encode()

    def _make_id(self) -> bytes:
        return self._tag + b"%010d" % next(self._counter)

    def __call__(self) -> bytes:
        unique = self._make_id()
        key = b"Idempotency-Key: bench-" + unique + b"\r\n" if self._idempotent else b""
        return b"".join((self._head, key, b"\r\n", self._body_start, unique, self._body_end))


Phase = Callable[[str, bool, float], dict[str, object]]
SETTLE_SECONDS = 0.5
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by ``pid`` and its children that still run (seconds)."""
    total = 0.0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def load(args: argparse.Namespace, host: str, port: int, token: str) -> Phase:
    """A function running one phase of ``seconds`` against ``host:port``."""
    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and wrk_available())

    def phase(tag: str, idempotent: bool, seconds: float) -> dict[str, object]:
        tag = f"{tag}{secrets.token_hex(3)}"
        if use_wrk:
            return run_wrk(host, port, token, idempotent=idempotent, run=tag,
                           connections=args.connections, seconds=seconds)
        requests = ContactRequests(host, port, token, tag, idempotent)
        result = trio.run(lambda: run_load(
            host, port, requests, connections=args.connections, seconds=seconds
        ))
        return result.summary()

    return phase


def measure(
    name: str, phase: Phase, idempotent: bool, args: argparse.Namespace, pid: int,
    database: Service | None = None,
) -> dict[str, object]:
    """One phase; also the server's CPU time per accepted request, which other
    load on the machine changes far less than the rate, and with ``database``
    that of its embedded PostgreSQL."""
    if args.warmup > 0:
        phase(f"w{name[:2]}", idempotent, args.warmup)
        # The warm-up's load generator leaves requests in flight when it
        # stops; let the server finish them, or the phase starts with its
        # connections shed for work nobody waits for.
        time.sleep(SETTLE_SECONDS)
    log(f"{name}: measuring for {args.seconds:g}s on {args.connections} connections")
    cpu = cpu_seconds(pid)
    pg = sum(postgres_cpu(database).values()) if database else 0.0
    result = phase(name[:2], idempotent, args.seconds)
    accepted = result["accepted"]
    assert isinstance(accepted, int)
    result["server_cpu_ms_per_request"] = (
        round((cpu_seconds(pid) - cpu) * 1000 / accepted, 3) if accepted else None
    )
    if database is not None and accepted:
        used = sum(postgres_cpu(database).values()) - pg
        result["postgres_cpu_ms_per_request"] = round(used * 1000 / accepted, 3)
    log(f"{name}: {result['requests_per_s']}/s, p50 {result['p50_ms']} ms, "
        f"p99 {result['p99_ms']} ms, {result['errors']} errors, "
        f"{result['server_cpu_ms_per_request']} ms CPU a request"
        + (f", PostgreSQL {result['postgres_cpu_ms_per_request']} ms"
           if "postgres_cpu_ms_per_request" in result else ""))
    return result


@contextmanager
def side_app(module: str, *extra: str, host: str = "127.0.0.1") -> Iterator[tuple[int, int]]:
    """A reference app (``python -m <module> --port N``) on a free port: its port and pid."""
    port = free_port(host)
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--host", host, "--port", str(port), *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://{host}:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise HarnessError(f"{module} did not start")
            time.sleep(0.1)
        yield port, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ratio(a: object, b: object) -> float | None:
    assert isinstance(a, float | int) and isinstance(b, float | int)
    return round(a / b, 2) if b else None


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


# The phases of a round, in the order of the first; each later round runs
# them in the opposite order of the one before, so that no phase always
# comes first (or last) while the machine drifts.
PHASES = ("bare", "bare_asgi", "plain", "idempotent", "peer_plain", "peer_idempotent",
          "workers_plain", "workers_idempotent")
# A phase: its load, whether each request has a key, the pid whose CPU is
# counted, and the service whose PostgreSQL's CPU is.
Target = tuple[Phase, bool, int, Service | None]


def ratios(
    rate: dict[str, float], results: dict[str, dict[str, object]]
) -> dict[str, float | None]:
    """The ratios of one round, and its worst p99 of one worker."""
    cost = _ratio(rate["idempotent"], rate["plain"])
    peer_cost = _ratio(rate["peer_idempotent"], rate["peer_plain"])
    return {
        "plain_vs_bare": _ratio(rate["plain"], rate["bare"]),
        "idempotent_vs_bare": _ratio(rate["idempotent"], rate["bare"]),
        "workers_plain_vs_bare": _ratio(rate["workers_plain"], rate["bare"]),
        "idempotency_cost_pct": None if cost is None else round((1 - cost) * 100, 1),
        "workers_plain_vs_peer": _ratio(rate["workers_plain"], rate["peer_plain"]),
        "workers_plain_vs_bare_asgi": _ratio(rate["workers_plain"], rate["bare_asgi"]),
        "plain_vs_peer": _ratio(rate["plain"], rate["peer_plain"]),
        "peer_idempotency_cost_pct": None if peer_cost is None else round((1 - peer_cost) * 100, 1),
        "worst_p99_ms": max(float(str(results[n]["p99_ms"])) for n in ("plain", "idempotent")),
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    loadgen = "wrk" if args.loadgen == "wrk" or (
        args.loadgen == "auto" and wrk_available()) else "trio"
    log(f"load generator: {loadgen}")
    off = {"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}
    rounds: list[dict[str, dict[str, object]]] = []
    # Every app runs for the whole run, idle but for its own phases.
    with ExitStack() as running:
        bare_port, bare_pid = running.enter_context(side_app("bench.bare"))
        asgi_port, asgi_pid = running.enter_context(side_app("bench.bare", "--asgi"))
        service = running.enter_context(running_service(off))
        token = service.create_token("bench")
        # The peer works on the same database, as the same team; it stops
        # before the service does.
        peer_app = ExitStack()
        peer_port, peer_pid = peer_app.enter_context(
            side_app("bench.peer", "--dsn", database_url(service)))
        running.enter_context(peer_app)
        workers = running.enter_context(
            running_service(off, serve_args=("--workers", str(args.workers))))
        plain = load(args, service.host, service.port, token)
        peer = load(args, "127.0.0.1", peer_port, token)
        several = load(args, workers.host, workers.port, workers.create_token("bench"))
        targets: dict[str, Target] = {
            "bare": (load(args, "127.0.0.1", bare_port, "none"), False, bare_pid, None),
            "bare_asgi": (load(args, "127.0.0.1", asgi_port, "none"), False, asgi_pid, None),
            "plain": (plain, False, service.process.pid, service),
            "idempotent": (plain, True, service.process.pid, service),
            "peer_plain": (peer, False, peer_pid, service),
            "peer_idempotent": (peer, True, peer_pid, service),
            "workers_plain": (several, False, workers.process.pid, workers),
            "workers_idempotent": (several, True, workers.process.pid, workers),
        }
        for number in range(args.rounds):
            order = PHASES if number % 2 == 0 else PHASES[::-1]
            if args.rounds > 1:
                log(f"round {number + 1} of {args.rounds}")
            rounds.append({
                name: measure(name, targets[name][0], targets[name][1], args,
                              targets[name][2], targets[name][3])
                for name in order
            })
        peak_rss_mb = service.peak_rss_mb()
        peer_app.close()
        shutdown = service.stop()
        workers_shutdown = workers.stop()

    each = [ratios({n: float(str(r[n]["requests_per_s"])) for n in PHASES}, r) for r in rounds]
    results = {
        name: {
            key: _median([float(str(r[name][key])) for r in rounds])
            for key in rounds[0][name]
            if all(isinstance(r[name].get(key), int | float) for r in rounds)
        } for name in PHASES
    }
    # Judged on the median of each round's own figure.
    judged = {
        key: (None if any(e[key] is None for e in each)
              else _median([float(str(e[key])) for e in each]))
        for key in each[0]
    }
    vs_bare, cost = judged["plain_vs_bare"], judged["idempotency_cost_pct"]
    workers_vs_peer = judged["workers_plain_vs_peer"]
    worst_p99 = judged["worst_p99_ms"]
    workers_rate = results["workers_plain"]["requests_per_s"]
    return {
        "bench": "api",
        "loadgen": loadgen,
        "seconds": args.seconds,
        "connections": args.connections,
        "workers": args.workers,
        "rounds": args.rounds,
        **results,
        **judged,
        "each_round": {key: [e[key] for e in each] for key in each[0]} if args.rounds > 1 else None,
        "goals": {
            "plain_vs_bare >= 0.6": vs_bare is not None and vs_bare >= 0.6,
            "idempotency_cost_pct < 15": cost is not None and cost < 15,
            "p99_ms < 50 (one worker)": worst_p99 is not None and worst_p99 < 50,
            "workers_plain >= 1381/s": workers_rate >= 1381,
            "workers_plain >= peer_plain (same run)": (
                workers_vs_peer is not None and workers_vs_peer >= 1.0),
        },
        "service_peak_rss_mb": peak_rss_mb,
        "shutdown_exit_code": shutdown.exit_code,
        "shutdown_seconds": shutdown.seconds,
        "workers_shutdown_exit_code": workers_shutdown.exit_code,
    }
