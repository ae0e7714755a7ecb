"""Prometheus metrics of one service: HTTP traffic, the actor runtime, and the
process (CPU, memory, open file descriptors, garbage collection).

Under ``tidings serve --workers N`` a scrape reaches whichever worker the
kernel hands its connection to. The HTTP series are then kept in files the
workers share (prometheus_client's multiprocess mode: ``MULTIPROC_ENV``,
set by the parent for its workers), so that every scrape counts every
worker's requests, those of workers that have died included, and a
counter never goes back. The other series describe the process that
answered, named by ``tidings_process{pid}``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from tidings import MULTIPROC_ENV
from tidings.actors.runtime import Supervised

# Label values come from requests: a client may send any method name, and
# every new label value is a series kept for the process's lifetime.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _ProcessCollector(Collector):
    """``tidings_process{pid} 1``: which process answered the scrape. Not a
    Gauge, which in multiprocess mode would be written to the shared files."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        found = GaugeMetricFamily("tidings_process", "This process (its pid)", labels=["pid"])
        found.add_metric([str(os.getpid())], 1)
        yield found


class _SupervisorCollector(Collector):
    def __init__(self, supervisors: Callable[[], Sequence[Supervised]]) -> None:
        self._supervisors = supervisors

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        running = GaugeMetricFamily(
            "tidings_actors_running", "Actors running now", labels=["supervisor"]
        )
        queued = GaugeMetricFamily(
            "tidings_actor_mailbox_messages", "Messages waiting in mailboxes", labels=["supervisor"]
        )
        restarts = CounterMetricFamily(
            "tidings_actor_restarts", "Actors restarted after a crash", labels=["supervisor"]
        )
        given_up = CounterMetricFamily(
            "tidings_actor_give_ups",
            "Actors given up after crashing more often than their restart intensity allows",
            labels=["supervisor"],
        )
        for supervisor in self._supervisors():
            running.add_metric([supervisor.name], len(supervisor.running()))
            queued.add_metric([supervisor.name], supervisor.queued())
            restarts.add_metric([supervisor.name], supervisor.restarts)
            given_up.add_metric([supervisor.name], supervisor.given_up)
        yield running
        yield queued
        yield restarts
        yield given_up


class _WebhookCollector(Collector):
    def __init__(self, attempts: Callable[[], Mapping[str, int]]) -> None:
        self._attempts = attempts

    def collect(self) -> Iterator[CounterMetricFamily]:
        attempts = CounterMetricFamily(
            "tidings_webhook_attempts",
            "Webhook attempts made by this process, by what the delivery became",
            labels=["result"],
        )
        for result, count in sorted(self._attempts().items()):
            attempts.add_metric([result], count)
        yield attempts


class Metrics:
    def __init__(
        self,
        supervisors: Callable[[], Sequence[Supervised]],
        webhook_attempts: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self._series: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        shared = os.environ.get(MULTIPROC_ENV)
        # Shared: the HTTP series are collected from the files, not from here.
        http = None if shared else self.registry
        self._shared: CollectorRegistry | None = None
        if shared:
            self._shared = CollectorRegistry()
            MultiProcessCollector(self._shared, path=shared)  # type: ignore[no-untyped-call]
        self.requests = Counter(
            "tidings_http_requests",
            "HTTP requests answered",
            ["method", "route", "status"],
            registry=http,
        )
        self.latency = Histogram(
            "tidings_http_request_duration_seconds",
            "Time to answer an HTTP request",
            ["method", "route", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=http,
        )
        # Which process answered: with --workers N each scrape reaches one of them.
        self.registry.register(_ProcessCollector())
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_SupervisorCollector(supervisors))
        self.registry.register(_WebhookCollector(webhook_attempts))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "OTHER"
        key = (method, route, status)
        series = self._series.get(key)
        if series is None:
            # Looking a labelled child up costs more than counting: keep them.
            labels = (method, route, str(status))
            series = self._series[key] = (
                self.requests.labels(*labels), self.latency.labels(*labels)
            )
        series[0].inc()
        series[1].observe(seconds)

    def render(self) -> bytes:
        own = generate_latest(self.registry)
        return own if self._shared is None else generate_latest(self._shared) + own
