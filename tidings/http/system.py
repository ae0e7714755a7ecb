"""Routes without a token: health, metrics and the OpenAPI description."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import trio
from pydantic import BaseModel
from quart import Response

from tidings.http.envelope import ApiError
from tidings.http.models import RawContent
from tidings.http.routing import Routes

if TYPE_CHECKING:
    from tidings.service import Service

routes = Routes("System")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


@routes.route(
    "GET", "/healthz", summary="Liveness of the process and its storage", public=True,
    response=Health,
)
async def healthz(service: Service) -> dict[str, Any]:
    try:
        with trio.fail_after(2):
            async with service.db.acquire() as conn:
                await conn.fetchval("SELECT 1")
    except Exception:
        raise ApiError(503, "SERVICE_UNAVAILABLE", "storage is unreachable") from None
    return {"status": "ok"}


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
    from tidings.http.openapi import openapi_document

    return Response(openapi_document(), status=200, content_type="application/json")
