"""``python -m bench accept``: accepted POST /emails and POST /sms per second beside POST /contacts.

Starts ``tidings serve`` on a fresh embedded database (sandbox providers, rate
limit off), creates a team with a verified sending domain and an approved
sender ID, and then runs ``--rounds`` rounds of the same phases, one after
the other, so that each route is measured beside its reference several times
in one run on one machine:

- ``contacts``: ``POST /contacts``, a unique email each (the reference);
- ``emails`` / ``sms``: a send each, handed to the sandbox provider meanwhile;
- ``emails_scheduled`` / ``sms_scheduled``: sends for the next day, which
  measure acceptance alone, with no sending sharing the CPU;
- with ``--idempotent``, each of them again with a fresh ``Idempotency-Key``.

Load comes from wrk (one thread, ``--connections`` keep-alive connections).
Each phase has an unmeasured warm-up and reports accepted requests/s, p50,
p99 and the service's CPU time per accepted request (which other load on the
machine changes far less than the rate). ``--py-spy DIR`` also records a raw
py-spy profile of the service during each measured phase of the first round.
Prints one JSON line: every phase of every round, the medians per phase,
the ratios to ``contacts`` (of the medians, and each round's with their
median) and the load average before and after. Every other round runs its
phases in reverse order.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from bench.api import SETTLE_SECONDS, cpu_seconds
from bench.harness import HarnessError, Service, log, postgres_cpu, running_service
from bench.loadgen import CONTACT_BODY, run_wrk, wrk_available

DOMAIN = "bench.example"
SENDER = "Bench"

# Each body is a template: ID becomes a unique id, NUM four digits (a valid
# US number the sandbox delivers to).
BODIES = {
    "contacts": ("/contacts", CONTACT_BODY),
    "emails": ("/emails", '{"from": "Bench <news@' + DOMAIN + '>", "to": "ID@sink.example", '
               '"subject": "Your receipt", '
               '"html": "<h1>Thanks</h1><p>Your order is on its way.</p>"LATER}'),
    "sms": ("/sms", '{"to": "+1415555NUM", "from": "' + SENDER + '", '
            '"body": "Your code is ID"LATER}'),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up before each phase")
    parser.add_argument("--rounds", type=int, default=2, help="times each phase runs")
    parser.add_argument("--idempotent", action="store_true",
                        help="each phase again with a fresh Idempotency-Key per request")
    parser.add_argument("--phases", default="contacts,emails,emails_scheduled,sms,sms_scheduled",
                        help="comma-separated phases of a round")
    parser.add_argument("--py-spy", dest="py_spy", default=None,
                        help="record raw py-spy profiles of the first round into this directory")


def _template(phase: str) -> tuple[str, str]:
    kind = phase.removesuffix("_scheduled")
    if kind not in BODIES:
        raise HarnessError(f"unknown phase {phase!r}")
    path, body = BODIES[kind]
    later = ""
    if phase.endswith("_scheduled"):
        moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
        later = f', "scheduled_at": "{moment}"'
    return path, body.replace("LATER", later)


def wrk(service: Service, token: str, phase: str, idempotent: bool, seconds: float,
        connections: int) -> dict[str, Any]:
    path, body = _template(phase)
    host, port = service.base_url.removeprefix("http://").rsplit(":", 1)
    return run_wrk(
        host, int(port), token, idempotent=idempotent, run=secrets.token_hex(3),
        connections=connections, seconds=seconds, path=path, body=body,
    )


def prepare(service: Service, token: str) -> None:
    """A verified sending domain (the sandbox verifies at once) and an approved sender ID."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=service.base_url, headers=headers, timeout=30) as client:
        domain = client.post("/domains", json={"name": DOMAIN})
        if domain.status_code != 201:
            raise HarnessError(f"POST /domains answered {domain.status_code}: {domain.text}")
        verified = client.post(f"/domains/{domain.json()['data']['id']}/verify")
        if verified.json()["data"]["status"] != "verified":
            raise HarnessError(f"the domain was not verified: {verified.text}")
        sender = client.post("/sender-ids", json={"value": SENDER, "type": "alphanumeric"})
        if sender.status_code != 201:
            raise HarnessError(f"POST /sender-ids answered {sender.status_code}: {sender.text}")


def measure(service: Service, token: str, phase: str, idempotent: bool,
            args: argparse.Namespace, profile: Path | None) -> dict[str, Any]:
    if args.warmup > 0:
        wrk(service, token, phase, idempotent, args.warmup, args.connections)
        time.sleep(SETTLE_SECONDS)  # as in bench api: the warm-up's last requests finish
    pid = service.process.pid
    spy = None
    if profile is not None:
        spy = subprocess.Popen(
            ["py-spy", "record", "--format", "raw", "--nonblocking", "-r", "200",
             "-d", str(max(1, round(args.seconds))), "-o", str(profile), "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    cpu, pg = cpu_seconds(pid), postgres_cpu(service)
    result = wrk(service, token, phase, idempotent, args.seconds, args.connections)
    used = cpu_seconds(pid) - cpu
    pg_after = postgres_cpu(service)
    pg_used = sum(pg_after[p] - pg.get(p, 0.0) for p in pg_after)
    if spy is not None:
        spy.wait(30)
    accepted = result["accepted"]
    result["server_cpu_ms_per_request"] = round(used * 1000 / accepted, 3) if accepted else None
    result["postgres_cpu_ms_per_request"] = (
        round(pg_used * 1000 / accepted, 3) if accepted and pg_after else None
    )
    return result


def run(args: argparse.Namespace) -> dict[str, object]:
    if not wrk_available():
        raise HarnessError("this benchmark needs wrk (apt-get install wrk)")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    names = [(p, False) for p in phases] + ([(p, True) for p in phases] if args.idempotent else [])
    spy_dir = Path(args.py_spy) if args.py_spy else None
    if spy_dir is not None:
        spy_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with running_service({"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}) as service:
        token = service.create_token("bench")
        prepare(service, token)
        for number in range(args.rounds):
            figures: dict[str, Any] = {}
            # Every other round runs the phases in reverse order, so that
            # none is always measured first (or just after the warm-up).
            for phase, idempotent in names if number % 2 == 0 else names[::-1]:
                name = f"{phase}{'_idempotent' if idempotent else ''}"
                profile = None
                if spy_dir is not None and number == 0:
                    profile = spy_dir / f"{name}.txt"
                figures[name] = result = measure(service, token, phase, idempotent, args, profile)
                log(f"round {number + 1} {name}: {result['requests_per_s']}/s, "
                    f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
                    f"{result['errors']} errors, {result['server_cpu_ms_per_request']} ms CPU, "
                    f"PostgreSQL {result['postgres_cpu_ms_per_request']} ms")
            rounds.append(figures)
        service.stop()
    medians: dict[str, dict[str, float]] = {}
    for name in rounds[0]:
        medians[name] = {
            key: round(statistics.median(r[name][key] for r in rounds), 3)
            for key in ("requests_per_s", "server_cpu_ms_per_request",
                        "postgres_cpu_ms_per_request", "p99_ms")
            if all(r[name][key] is not None for r in rounds)
        }
    reference = medians.get("contacts", {}).get("requests_per_s")
    ratios = {
        name: round(m["requests_per_s"] / reference, 2)
        for name, m in medians.items() if reference and name != "contacts"
    }
    # Each round's own ratios, measured minutes apart at most: the machine's
    # drift between rounds cancels out of them.
    per_round = {
        name: [round(r[name]["requests_per_s"] / r["contacts"]["requests_per_s"], 2)
               for r in rounds]
        for name in rounds[0] if name != "contacts" and "contacts" in rounds[0]
    }
    return {
        "bench": "accept",
        "seconds": args.seconds,
        "connections": args.connections,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "medians": medians,
        "vs_contacts": ratios,
        "vs_contacts_each_round": per_round,
        "vs_contacts_median_of_rounds": {
            name: round(statistics.median(values), 2) for name, values in per_round.items()
        },
        "rounds": rounds,
    }
