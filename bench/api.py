"""``python -m bench api``: throughput and latency of ``POST /contacts``.

Starts a fresh service with the rate limit off, creates a token, then runs two
phases of equal length from this process: plain requests, and requests that each
carry a fresh ``Idempotency-Key``. Every request creates a contact with a unique
email. Each phase is preceded by a short unmeasured warm-up. Reports accepted
requests per second, p50/p99 latency, the cost of idempotency keys, the
service's peak RSS and how it shut down on SIGTERM.
"""

from __future__ import annotations

import argparse
import itertools
import secrets

import trio

from bench.harness import log, running_service
from bench.loadgen import PhaseResult, run_load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--connections", type=int, default=16, help="concurrent connections")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each phase")


class ContactRequests:
    """Pre-encoded ``POST /contacts`` requests, each with a unique email.

    Ids have a fixed width so the Content-Length never changes and a request is
    just a join of constant bytes around the id.
    """

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


async def _measure(
    host: str, port: int, token: str, args: argparse.Namespace
) -> dict[str, PhaseResult]:
    run_tag = secrets.token_hex(4)  # keeps emails unique even against a reused database
    results: dict[str, PhaseResult] = {}
    for phase, idempotent in (("plain", False), ("idempotent", True)):
        requests = ContactRequests(host, port, token, f"{run_tag}{phase[0]}", idempotent)
        if args.warmup > 0:
            warm = await run_load(
                host, port, requests, connections=args.connections, seconds=args.warmup
            )
            log(f"{phase} warm-up: {_describe(warm)}")
        log(f"{phase}: measuring for {args.seconds:g}s on {args.connections} connections")
        result = await run_load(
            host, port, requests, connections=args.connections, seconds=args.seconds
        )
        log(f"{phase}: {_describe(result)}")
        for kind, sample in result.error_samples.items():
            log(f"{phase}: first {kind}: {sample}")
        results[phase] = result
    return results


def _describe(result: PhaseResult) -> str:
    return f"{result.accepted} accepted, {result.errors} errors, {result.requests_per_s:.0f}/s"


def _number(value: float) -> float | int:
    return int(value) if value == int(value) else value


def run(args: argparse.Namespace) -> dict[str, object]:
    with running_service({"TIDINGS_RATE_LIMIT_PER_SECOND": "0"}) as service:
        token = service.create_token("bench")
        log("token created")
        results = trio.run(_measure, service.host, service.port, token, args)
        peak_rss_mb = service.peak_rss_mb()
        log("stopping service")
        shutdown = service.stop()
        log(f"service exited with {shutdown.exit_code} after {shutdown.seconds:.2f}s")

    plain, idempotent = results["plain"], results["idempotent"]
    cost = None
    if plain.requests_per_s > 0:
        cost = round((1 - idempotent.requests_per_s / plain.requests_per_s) * 100, 1)
    return {
        "bench": "api",
        "seconds": _number(args.seconds),
        "connections": args.connections,
        "plain": plain.summary(),
        "idempotent": idempotent.summary(),
        "idempotency_cost_pct": cost,
        "service_peak_rss_mb": peak_rss_mb,
        "shutdown_exit_code": shutdown.exit_code,
        "shutdown_seconds": shutdown.seconds,
    }
