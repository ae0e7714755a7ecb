"""Routes without a token: the probes, metrics and the OpenAPI description.

``/healthz`` answers 200 when the process and its storage are up (CONTRACT
§2). ``/readyz`` is readiness: storage answers and every migration is
applied. Both check on a connection of their own, never one of the request
pool, so a saturated pool cannot make them fail; checks are shared by
concurrent probes and reused for a second. ``/livez`` is liveness: it
answers from the event loop alone, nothing about storage (a liveness probe
that failed on a database outage would restart every healthy process). The
load shedder never counts nor refuses any of them.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import trio
import triopg
from pydantic import BaseModel
from quart import Response, current_app

from tidings.http.envelope import ApiError
from tidings.http.models import RawContent
from tidings.http.openapi import DOCUMENT_CONFIG, ROUTES_CONFIG, openapi_document
from tidings.http.routing import Routes
from tidings.storage.db import Database
from tidings.storage.migrate import missing_migrations

if TYPE_CHECKING:
    from tidings.service import Service

routes = Routes("System")

READY_TIMEOUT_SECONDS = 2.0
READY_REUSE_SECONDS = 1.0
# A probe's result is reused for a second: asking sooner tells nothing new.
RETRY = {"Retry-After": "1"}


class Readiness:
    """Whether storage is reachable and migrated, checked on a connection of its own."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = trio.Lock()
        self._checked_at = -math.inf
        self._storage: str | None = None
        self._missing: list[str] = []

    async def problem(self, *, migrations: bool = True) -> str | None:
        """None when ready, else why not: storage, then (with ``migrations``)
        a migration not applied. One check at a time; a result is reused for
        READY_REUSE_SECONDS, so probes cannot pile up connections."""
        async with self._lock:
            if trio.current_time() - self._checked_at >= READY_REUSE_SECONDS:
                await self._check()
                self._checked_at = trio.current_time()
        if self._storage is None and migrations and self._missing:
            return f"migrations not applied: {', '.join(self._missing)}"
        return self._storage

    async def _check(self) -> None:
        self._storage, self._missing = None, []
        try:
            with trio.fail_after(READY_TIMEOUT_SECONDS):
                async with triopg.connect(self._url) as conn:
                    self._missing = await missing_migrations(conn)
        except trio.TooSlowError:
            self._storage = f"storage did not answer within {READY_TIMEOUT_SECONDS:g} s"
        except asyncpg.TooManyConnectionsError as error:
            self._storage = f"storage refuses more connections ({error})"
        except Exception:
            self._storage = "storage is unreachable"


_readiness: weakref.WeakKeyDictionary[Database, Readiness] = weakref.WeakKeyDictionary()


def readiness(db: Database) -> Readiness:
    found = _readiness.get(db)
    if found is None:
        found = _readiness[db] = Readiness(db.url)
    return found


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Live(BaseModel):
    status: Literal["alive"] = "alive"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


@routes.route(
    "GET", "/healthz", public=True,
    summary="Health: the process and its storage are up; 503 otherwise",
    response=Health,
)
async def healthz(service: Service) -> dict[str, Any]:
    problem = await readiness(service.db).problem(migrations=False)
    if problem is not None:
        raise ApiError(503, "SERVICE_UNAVAILABLE", f"not healthy: {problem}", RETRY)
    return {"status": "ok"}


@routes.route(
    "GET", "/livez", public=True,
    summary="Liveness: the process and its event loop answer (storage is not checked)",
    response=Live,
)
async def livez(service: Service) -> dict[str, Any]:
    return {"status": "alive"}


@routes.route(
    "GET", "/readyz", public=True,
    summary="Readiness: storage is reachable and every migration is applied; 503 otherwise",
    response=Ready,
)
async def readyz(service: Service) -> dict[str, Any]:
    problem = await readiness(service.db).problem()
    if problem is not None:
        raise ApiError(503, "SERVICE_UNAVAILABLE", f"not ready: {problem}", RETRY)
    return {"status": "ready"}


@routes.route(
    "GET", "/metrics", summary="Prometheus metrics (text format)", public=True,
    response=RawContent("text/plain", {"type": "string"}),
)
async def metrics(service: Service) -> Response:
    return Response(
        service.metrics.render(), status=200, content_type="text/plain; version=0.0.4"
    )


@routes.route(
    "GET", "/openapi.json", summary="This OpenAPI description", public=True,
    response=RawContent("application/json", {"type": "object"}),
)
async def openapi(service: Service) -> Response:
    # The routes come from the app: this module is one of the groups they describe.
    config = current_app.config
    document = config.get(DOCUMENT_CONFIG)
    if document is None:
        document = config[DOCUMENT_CONFIG] = openapi_document(config[ROUTES_CONFIG])
    return Response(document, status=200, content_type="application/json")
