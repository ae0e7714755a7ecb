"""Routes without a token: the probes, metrics and the OpenAPI description.

``/healthz`` is liveness: it answers from the event loop alone, so it says
the process is alive and serving, nothing about storage (a liveness probe
that failed on a database outage would restart every healthy process).
``/readyz`` is readiness: storage answers and every migration is applied.
It checks on a connection of its own, never one of the request pool, so a
saturated pool cannot make it fail; checks are shared by concurrent probes
and reused for a second. The load shedder never counts nor refuses either.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import trio
import triopg
from quart import Response, current_app

from tidings.http.envelope import ApiError
from tidings.http.openapi import DOCUMENT_CONFIG, ROUTES_CONFIG, openapi_document
from tidings.http.routing import Routes
from tidings.storage.db import Database
from tidings.storage.migrate import missing_migrations

if TYPE_CHECKING:
    from tidings.service import Service

routes = Routes("System")

READY_TIMEOUT_SECONDS = 2.0
READY_REUSE_SECONDS = 1.0


class Readiness:
    """Whether storage is reachable and migrated, checked on a connection of its own."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = trio.Lock()
        self._checked_at = -math.inf
        self._problem: str | None = None

    async def problem(self) -> str | None:
        """None when ready, else why not. One check at a time; a result is
        reused for READY_REUSE_SECONDS, so probes cannot pile up connections."""
        async with self._lock:
            if trio.current_time() - self._checked_at >= READY_REUSE_SECONDS:
                self._problem = await self._check()
                self._checked_at = trio.current_time()
            return self._problem

    async def _check(self) -> str | None:
        try:
            with trio.fail_after(READY_TIMEOUT_SECONDS):
                async with triopg.connect(self._url) as conn:
                    missing = await missing_migrations(conn)
        except trio.TooSlowError:
            return f"storage did not answer within {READY_TIMEOUT_SECONDS:g} s"
        except Exception:
            return "storage is unreachable"
        if missing:
            return f"migrations not applied: {', '.join(missing)}"
        return None


_readiness: weakref.WeakKeyDictionary[Database, Readiness] = weakref.WeakKeyDictionary()


def readiness(db: Database) -> Readiness:
    found = _readiness.get(db)
    if found is None:
        found = _readiness[db] = Readiness(db.url)
    return found


@routes.route(
    "GET", "/healthz", public=True,
    summary="Liveness: the process and its event loop answer (storage is not checked)",
)
async def healthz(service: Service) -> dict[str, Any]:
    return {"status": "ok"}


@routes.route(
    "GET", "/readyz", public=True,
    summary="Readiness: storage is reachable and every migration is applied; 503 otherwise",
)
async def readyz(service: Service) -> dict[str, Any]:
    problem = await readiness(service.db).problem()
    if problem is not None:
        raise ApiError(503, "SERVICE_UNAVAILABLE", f"not ready: {problem}")
    return {"status": "ready"}


@routes.route("GET", "/metrics", summary="Prometheus metrics (text format)", public=True)
async def metrics(service: Service) -> Response:
    return Response(
        service.metrics.render(), status=200, content_type="text/plain; version=0.0.4"
    )


@routes.route("GET", "/openapi.json", summary="This OpenAPI description", public=True)
async def openapi(service: Service) -> Response:
    # The routes come from the app: this module is one of the groups they describe.
    config = current_app.config
    document = config.get(DOCUMENT_CONFIG)
    if document is None:
        document = config[DOCUMENT_CONFIG] = openapi_document(config[ROUTES_CONFIG])
    return Response(document, status=200, content_type="application/json")
