"""The OpenAPI 3.1 description, generated from the route declarations and the
same pydantic models that validate requests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tidings import __version__
from tidings.http.routing import MUTATING, Route

REF = "#/components/schemas/{model}"

ERROR_CODES = [
    "BAD_REQUEST", "UNAUTHORIZED", "FORBIDDEN", "STEP_UP_REQUIRED", "NOT_FOUND", "CONFLICT",
    "PAYMENT_REQUIRED", "PAYLOAD_TOO_LARGE", "UNPROCESSABLE_ENTITY", "TOO_MANY_REQUESTS",
    "INTERNAL_ERROR", "SERVICE_UNAVAILABLE",
]

ERROR_ENVELOPE = {
    "type": "object",
    "required": ["success", "error"],
    "properties": {
        "success": {"const": False},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": ERROR_CODES},
                "message": {"type": "string"},
            },
        },
    },
}

ERRORS_OF_EVERY_ROUTE = {
    "400": "Malformed request: the message names the field and the reason",
    "401": "Missing, invalid, expired or revoked token",
    "403": "The token lacks the permission (FORBIDDEN) or is not a step-up token",
    "429": "Rate limit exceeded; see Retry-After",
    "500": "Internal error",
}


def _envelope(data_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["success", "data"],
        "properties": {"success": {"const": True}, "data": data_schema},
    }


def _models(routes: list[Route]) -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for route in routes:
        for model in (route.body, route.response):
            if isinstance(model, type) and issubclass(model, BaseModel):
                found[model.__name__] = model
    return list(found.values())


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema.get("properties", {}).items()
    ]


def _operation(route: Route, refs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string"}
            if route.path_types.get(name, None) is str
            else {"type": "string", "format": "uuid"},
        }
        for name in route.path_params
    ]
    if route.query is not None:
        parameters += _query_parameters(route.query)
    if route.method in MUTATING and not route.public:
        parameters.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 256},
                "description": "Replays the stored response of an earlier identical request",
            }
        )
    responses: dict[str, Any] = {}
    if route.status == 204:
        responses["204"] = {"description": "Done; no body"}
    else:
        data = refs.get(route.response.__name__) if isinstance(route.response, type) else None
        responses[str(route.status)] = {
            "description": route.summary,
            "content": {"application/json": {"schema": _envelope(data or {})}},
        }
    if not route.public:
        for status, description in ERRORS_OF_EVERY_ROUTE.items():
            responses[status] = {
                "description": description,
                "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
            }
        if route.path_params:
            responses["404"] = {
                "description": "Not found (also for another team's resources)",
                "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
            }
        if route.method in MUTATING:
            responses["409"] = {
                "description": "Conflict: idempotency key reuse, uniqueness, or state",
                "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
            }
    operation: dict[str, Any] = {
        "operationId": f"{route.method.lower()}_{route.handler.__name__}",
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if route.permission:
        operation["description"] = f"Needs the permission `{route.permission}`" + (
            " and a step-up token." if route.step_up else "."
        )
    if route.public:
        operation["security"] = []
    if route.body is not None:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": refs[route.body.__name__]}},
        }
    elif route.raw_body is not None:
        operation["requestBody"] = {"required": True, "content": route.raw_body}
    return operation


def build(routes: list[Route]) -> dict[str, Any]:
    models = _models(routes)
    keys, definitions = models_json_schema(
        [(model, "validation") for model in models], ref_template=REF
    )
    refs = {model.__name__: keys[(model, "validation")] for model in models}
    schemas = dict(definitions.get("$defs", {}))
    schemas["Error"] = ERROR_ENVELOPE
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tidings",
            "version": "1.0.0",
            "description": f"Tidings {__version__}: email, SMS, audiences and webhooks.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


# Where the app keeps its routes (set by ``create_app``) and the document made of them.
ROUTES_CONFIG = "TIDINGS_ROUTES"
DOCUMENT_CONFIG = "TIDINGS_OPENAPI_DOCUMENT"


def openapi_document(routes: Sequence[Route]) -> bytes:
    return json.dumps(build(list(routes)), indent=1).encode()
