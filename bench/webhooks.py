"""``python -m bench webhooks``: signed webhook deliveries per second, and latency.

Starts a fresh service and one receiver process listening on ``--endpoints``
ports (a lean server that answers at once), creates one endpoint per port
over the API, then records events straight into the service's database the
way every group does (``record_event`` in a transaction) and watches them
arrive. Two rounds:

* healthy: every receiver answers 200;
* degraded: a quarter of the receivers answer 500 or never answer (half
  each; the service's timeout is ``--timeout`` seconds), the rest answer 200.

Each round has a paced phase (``--rate`` events per second for ``--seconds``)
that gives the latency from an event's commit to its arrival at a receiver
(p50/p99), and a burst phase (``--burst`` events as fast as they commit)
that gives deliveries per second: 2xx answers received per second from the
first commit to the last arrival. In the degraded round both figures count
the healthy receivers only: what a broken endpoint costs everyone else.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import trio
import triopg

from bench.harness import HarnessError, free_port, log, running_service
from tidings.storage.db import open_asyncio_bridge
from tidings.storage.events import record_event


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", type=int, default=16, help="receivers (one endpoint each)")
    parser.add_argument("--rate", type=float, default=5.0, help="paced events per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the paced phase")
    parser.add_argument("--burst", type=int, default=500, help="events in the burst phase")
    parser.add_argument("--timeout", type=float, default=2.0, help="WEBHOOK_TIMEOUT_SECONDS")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="TIDINGS_WEBHOOK_CONCURRENCY"
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Round:
    """One set of endpoints subscribed to one event type, and what reached them."""

    def __init__(self, name: str, event_type: str, ports: list[tuple[int, str]]) -> None:
        self.name = name
        self.event_type = event_type
        self.ports = ports
        self.healthy = {port for port, mode in ports if mode == "ok"}
        self.endpoint_ids: list[UUID] = []
        self.committed: dict[str, tuple[str, float]] = {}  # event id -> (phase, commit time)


async def emit(
    conn: Any, team_id: UUID, round_: Round, phase: str, count: int, every: float
) -> None:
    started = time.monotonic()
    for n in range(count):
        if every:
            await trio.sleep(max(0.0, started + n * every - time.monotonic()))
        async with conn.transaction():
            event, _ = await record_event(
                conn, team_id, round_.event_type, channel="email",
                recipient=f"user{n}@bench.example", data={"phase": phase, "n": n},
            )
        round_.committed[str(event.id)] = (phase, time.time())


async def wait_delivered(conn: Any, round_: Round, healthy_ids: list[UUID], within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        left = await conn.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ANY($1) "
            "AND status <> 'succeeded'",
            healthy_ids,
        )
        if left == 0:
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"{round_.name}: {left} deliveries still not succeeded")
        await trio.sleep(0.2)


async def drive(url: str, team_id: UUID, rounds: list[Round], args: argparse.Namespace) -> None:
    async with open_asyncio_bridge(), triopg.connect(url) as conn:
        for round_ in rounds:
            healthy_ids = [
                endpoint_id for endpoint_id, (_port, mode) in zip(
                    round_.endpoint_ids, round_.ports, strict=True
                ) if mode == "ok"
            ]
            paced = int(args.rate * args.seconds)
            log(f"{round_.name}: paced phase, {paced} events at {args.rate:g}/s")
            await emit(conn, team_id, round_, "paced", paced, 1 / args.rate)
            await wait_delivered(conn, round_, healthy_ids, within=120)
            log(f"{round_.name}: burst phase, {args.burst} events")
            await emit(conn, team_id, round_, "burst", args.burst, 0)
            await wait_delivered(conn, round_, healthy_ids, within=600)


def summarize(round_: Round, arrivals: list[tuple[int, str, float]]) -> dict[str, Any]:
    latencies: list[float] = []
    burst_arrivals: list[float] = []
    for port, event_id, at in arrivals:
        if port not in round_.healthy or event_id not in round_.committed:
            continue
        phase, committed = round_.committed[event_id]
        if phase == "paced":
            latencies.append((at - committed) * 1000)
        else:
            burst_arrivals.append(at)
    burst_commits = [t for phase, t in round_.committed.values() if phase == "burst"]
    expected = len(burst_commits) * len(round_.healthy)
    if len(burst_arrivals) < expected:
        raise HarnessError(f"{round_.name}: {len(burst_arrivals)} of {expected} burst arrivals")
    span = max(burst_arrivals) - min(burst_commits)
    return {
        "deliveries_per_s": round(len(burst_arrivals) / span, 1),
        "burst_deliveries": len(burst_arrivals),
        "burst_seconds": round(span, 2),
        "latency_p50_ms": round(statistics.median(latencies), 1),
        "latency_p99_ms": round(percentile(latencies, 0.99), 1),
        "latency_samples": len(latencies),
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    count = args.endpoints
    broken = max(1, count // 4)
    healthy_ports = [(free_port(), "ok") for _ in range(count)]
    degraded_ports = [
        (free_port(), "fail" if n < broken // 2 or broken == 1 else "hang" if n < broken else "ok")
        for n in range(count)
    ]
    rounds = [
        Round("healthy", "message.sent", healthy_ports),
        Round("degraded", "message.delivered", degraded_ports),
    ]
    env = {
        "WEBHOOK_ALLOW_PRIVATE_URLS": "true",
        "TIDINGS_RATE_LIMIT_PER_SECOND": "0",
        "WEBHOOK_TIMEOUT_SECONDS": str(args.timeout),
        # Failed deliveries retry after the measurement is over.
        "WEBHOOK_RETRY_SCHEDULE": "0,600",
        "TIDINGS_LOG_LEVEL": "WARNING",
    }
    if args.concurrency:
        env["TIDINGS_WEBHOOK_CONCURRENCY"] = str(args.concurrency)
    with running_service(env) as service:
        token = service.create_token()
        notes = service.workdir / "arrivals.txt"
        command = [sys.executable, "-m", "bench.receiver", "--out", str(notes)]
        for round_ in rounds:
            command += [f"--port={port}:{mode}" for port, mode in round_.ports]
        receiver = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            if receiver.stdout is None or receiver.stdout.readline().strip() != "ready":
                raise HarnessError("the receiver did not start")
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=service.base_url, headers=headers) as api:
                for round_ in rounds:
                    for port, _mode in round_.ports:
                        created = api.post("/webhook-endpoints", json={
                            "url": f"http://127.0.0.1:{port}/hook", "events": [round_.event_type],
                        })
                        if created.status_code != 201:
                            raise HarnessError(f"creating an endpoint: {created.text}")
                        round_.endpoint_ids.append(UUID(created.json()["data"]["id"]))
            # Connect to the service's embedded PostgreSQL without joining it:
            # a process that joins (start_embedded) keeps it running until that
            # process exits, which is why the service seemed to leave it running.
            url = _embedded_url(service.data_dir)
            team_id = _team_of(url, rounds[0].endpoint_ids[0])
            trio.run(drive, url, team_id, rounds, args)
            rss = service.peak_rss_mb()
        finally:
            receiver.terminate()
            receiver.wait(30)
        arrivals: list[tuple[int, str, float]] = []
        for line in notes.read_text().splitlines():
            port_text, event_id, at = line.split()
            arrivals.append((int(port_text), event_id, float(at)))
        shutdown = service.stop()
    return {
        "benchmark": "webhooks",
        "endpoints": count,
        "broken_endpoints_in_degraded": broken,
        "healthy": summarize(rounds[0], arrivals),
        "degraded": summarize(rounds[1], arrivals),
        "peak_rss_mb": rss,
        "shutdown_exit_code": shutdown.exit_code,
    }


def _embedded_url(data_dir: Path) -> str:
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(data_dir.resolve() / "pg")
    if info is None:
        raise HarnessError("the service's embedded PostgreSQL is not running")
    url: str = info.get_uri(database="tidings")
    return url


def _team_of(url: str, endpoint_id: UUID) -> UUID:
    async def read() -> UUID:
        async with open_asyncio_bridge(), triopg.connect(url) as conn:
            team: UUID = await conn.fetchval(
                "SELECT team_id FROM webhook_endpoints WHERE id = $1", endpoint_id
            )
            return team

    return trio.run(read)
