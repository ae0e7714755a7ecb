"""Command line entry point: ``python -m bench <benchmark> [options]``.

A benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> dict``;
register it in ``BENCHMARKS``. The dict it returns is printed as one JSON line on
stdout; everything else (progress, service logs on failure) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Protocol

from bench import accept, api, broadcast, email, importing, overload, render, sms, smtp, webhooks
from bench.harness import HarnessError, log


class Benchmark(Protocol):
    """What ``python -m bench`` needs from a benchmark module."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> dict[str, object]: ...


BENCHMARKS: dict[str, Benchmark] = {
    "accept": accept,
    "api": api,
    "broadcast": broadcast,
    "email": email,
    "import": importing,
    "overload": overload,
    "render": render,
    "sms": sms,
    "smtp": smtp,
    "webhooks": webhooks,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, benchmark in BENCHMARKS.items():
        summary = (getattr(benchmark, "__doc__", None) or name).strip().splitlines()[0]
        sub = commands.add_parser(name, help=summary, description=summary)
        benchmark.add_arguments(sub)
    return parser


def _is_interrupt(exc: BaseException) -> bool:
    """A Ctrl-C, possibly wrapped in exception groups by trio's nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[1] is None
    return isinstance(exc, KeyboardInterrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = BENCHMARKS[args.benchmark].run(args)
    except HarnessError as exc:
        log(f"failed: {exc}")
        return 1
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        log("interrupted")
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
