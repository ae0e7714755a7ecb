"""Routes without a token: health, metrics and the OpenAPI description."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio
from quart import Response, current_app

from tidings.http.envelope import ApiError
from tidings.http.openapi import DOCUMENT_CONFIG, ROUTES_CONFIG, openapi_document
from tidings.http.routing import Routes

if TYPE_CHECKING:
    from tidings.service import Service

routes = Routes("System")


@routes.route("GET", "/healthz", summary="Liveness of the process and its storage", public=True)
async def healthz(service: Service) -> dict[str, Any]:
    try:
        with trio.fail_after(2):
            async with service.db.acquire() as conn:
                await conn.fetchval("SELECT 1")
    except Exception:
        raise ApiError(503, "SERVICE_UNAVAILABLE", "storage is unreachable") from None
    return {"status": "ok"}


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
