"""``python -m bench webhooks``: signed webhook deliveries per second, and latency.

Starts a fresh service and one receiver process listening on ``--endpoints``
ports (a lean server that answers at once), creates one endpoint per port
over the API, then records events straight into the service's database the
way every group does (``record_event`` in a transaction) and watches them
arrive. Two rounds:

* healthy: every receiver answers 200;
* degraded: a quarter of the receivers answer 500 or never answer (half
  each; the service's timeout is ``--timeout`` seconds), the rest answer 200.

Each round has a paced phase (``--rate`` deliveries per second in all, for
``--seconds``: events committed at ``rate / endpoints`` per second, each going
to every endpoint of the round) that gives the latency from an event's commit
to its arrival at a receiver (p50/p99), and a burst phase (``--burst`` events,
``--burst-batch`` per transaction, so that committing them does not set the
pace) that gives deliveries per second: 2xx answers
received per second from the first commit to the last arrival, and the
service process's CPU time per delivery over the burst. In the degraded round
both figures count the healthy receivers only: what a broken endpoint costs
everyone else.

``--service-path DIR`` runs the service from another checkout (A/B beside a
reference in one sitting); ``--profile FILE`` records a py-spy profile of the
service during the healthy burst.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
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
    parser.add_argument(
        "--rate", type=float, default=200.0,
        help="paced deliveries per second in all (events/s times endpoints)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the paced phase")
    parser.add_argument("--burst", type=int, default=500, help="events in the burst phase")
    parser.add_argument(
        "--burst-batch", type=int, default=50,
        help="burst events committed per transaction (1: each alone)",
    )
    parser.add_argument("--timeout", type=float, default=2.0, help="WEBHOOK_TIMEOUT_SECONDS")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="TIDINGS_WEBHOOK_CONCURRENCY"
    )
    parser.add_argument(
        "--rounds", default="healthy,degraded", help="which rounds to run (comma-separated)"
    )
    parser.add_argument(
        "--service-path", type=Path, default=None,
        help="run the service from this checkout (put first on its PYTHONPATH)",
    )
    parser.add_argument(
        "--profile", type=Path, default=None,
        help="write a py-spy raw profile of the service's healthy burst here",
    )


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class CpuWatch:
    """CPU seconds of the service, its PostgreSQL (all backends), the receiver, this process."""

    def __init__(self, service: int, postmaster: int, receiver: int) -> None:
        self.service = service
        self.postmaster = postmaster
        self.receiver = receiver

    def read(self) -> dict[str, float]:
        backends = [self.postmaster, *children_of(self.postmaster)]
        return {
            "service": cpu_seconds(self.service),
            "postgres": sum(cpu_seconds(pid) for pid in backends),
            "receiver": cpu_seconds(self.receiver),
            "bench": time.process_time(),
        }


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
        self.burst_cpu: dict[str, float] = {}
        self.burst_commit_seconds = 0.0


async def emit(
    conn: Any, team_id: UUID, round_: Round, phase: str, count: int, every: float,
    per_transaction: int = 1,
) -> None:
    started = time.monotonic()
    for first in range(0, count, per_transaction):
        if every:
            await trio.sleep(max(0.0, started + first * every - time.monotonic()))
        ids = []
        async with conn.transaction():
            for n in range(first, min(count, first + per_transaction)):
                event, _ = await record_event(
                    conn, team_id, round_.event_type, channel="email",
                    recipient=f"user{n}@bench.example", data={"phase": phase, "n": n},
                )
                ids.append(str(event.id))
        at = time.time()
        for event_id in ids:
            round_.committed[event_id] = (phase, at)


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


async def drive(
    url: str, team_id: UUID, rounds: list[Round], args: argparse.Namespace, watch: CpuWatch
) -> None:
    async with open_asyncio_bridge(), triopg.connect(url) as conn:
        for round_ in rounds:
            healthy_ids = [
                endpoint_id for endpoint_id, (_port, mode) in zip(
                    round_.endpoint_ids, round_.ports, strict=True
                ) if mode == "ok"
            ]
            events_per_s = args.rate / len(round_.ports)
            paced = int(events_per_s * args.seconds)
            log(
                f"{round_.name}: paced phase, {paced} events at {events_per_s:g}/s "
                f"({args.rate:g} deliveries/s)"
            )
            await emit(conn, team_id, round_, "paced", paced, 1 / events_per_s)
            await wait_delivered(conn, round_, healthy_ids, within=120)
            log(f"{round_.name}: burst phase, {args.burst} events")
            profiler = None
            if args.profile is not None and round_.name == "healthy":
                profiler = start_profiler(args.profile, watch.service)
            before = watch.read()
            started = time.monotonic()
            await emit(conn, team_id, round_, "burst", args.burst, 0, args.burst_batch)
            round_.burst_commit_seconds = time.monotonic() - started
            await wait_delivered(conn, round_, healthy_ids, within=600)
            after = watch.read()
            round_.burst_cpu = {name: after[name] - before[name] for name in after}
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(60)


def start_profiler(out: Path, pid: int) -> subprocess.Popen[bytes]:
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if spy is None:
        raise HarnessError("--profile needs py-spy (on PATH or in $PY_SPY)")
    profiler = subprocess.Popen(
        [spy, "record", "-r", "200", "--format", "raw", "-o", str(out), "--pid", str(pid)],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    return profiler


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
    # Every endpoint of the round gets an attempt of every burst event.
    attempted = len(burst_commits) * len(round_.ports)
    return {
        "deliveries_per_s": round(len(burst_arrivals) / span, 1),
        "burst_deliveries": len(burst_arrivals),
        "burst_seconds": round(span, 2),
        "burst_commit_seconds": round(round_.burst_commit_seconds, 2),
        "service_cpu_ms_per_attempt": round(
            round_.burst_cpu.get("service", 0.0) * 1000 / attempted, 3
        ),
        # Over the burst, in CPU seconds per second of the burst (1.0 = one core).
        "cores": {
            name: round(seconds / span, 2) for name, seconds in round_.burst_cpu.items()
        },
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
    wanted = set(args.rounds.split(","))
    rounds = [round_ for round_ in rounds if round_.name in wanted]
    if not rounds:
        raise HarnessError(f"--rounds: none of {args.rounds!r} is healthy or degraded")
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
    if args.service_path is not None:
        path = [str(args.service_path.resolve()), os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(part for part in path if part)
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
            watch = CpuWatch(service.process.pid, _postmaster_pid(service.data_dir), receiver.pid)
            trio.run(drive, url, team_id, rounds, args, watch)
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
        "paced_deliveries_per_s": args.rate,
        **{round_.name: summarize(round_, arrivals) for round_ in rounds},
        "peak_rss_mb": rss,
        "shutdown_exit_code": shutdown.exit_code,
    }


def _postmaster_pid(data_dir: Path) -> int:
    pid_file = data_dir.resolve() / "pg" / "postmaster.pid"
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        raise HarnessError("the service's embedded PostgreSQL is not running") from None


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
