"""The OpenAPI 3.1 description, generated from the route declarations and the
same pydantic models that validate requests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from tidings import __version__
from tidings.http.models import RawContent
from tidings.http.routing import MUTATING, Route
from tidings.http.shedding import NEVER_UNAVAILABLE

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

ERROR_DESCRIPTIONS = {
    400: "Malformed request: the message names the field and the reason",
    401: "Missing, invalid, expired or revoked token",
    402: "A quota of the team is used up; the message names it and when it resets",
    403: "The token lacks the permission (FORBIDDEN) or is not a step-up token",
    404: "Not found (also for another team's resources)",
    405: "The path is another resource's (e.g. /emails/batch), which takes other methods: "
         "see Allow",
    408: "The request body did not arrive within 60 s of its headers",
    409: "Conflict: idempotency key reuse, uniqueness, or a state that does not allow it",
    413: "The request body is larger than the route's limit",
    415: "The request body has a Content-Encoding (gzip...): send it without one",
    422: "Well-formed but impossible",
    429: "Rate limit exceeded; see Retry-After",
    431: "The request's headers are larger than 16 KiB",
    501: "A method or transfer coding not implemented (methods are case-sensitive)",
    500: "Internal error; the details are in the server log",
    503: "Storage unreachable, the service busy or shedding load; retry shortly",
}


# The error statuses that may say when to try again, and when they do.
RETRY_AFTER = {
    402: "Seconds until the quota resets; absent when the request alone exceeds it",
    409: "Present (1) when the same Idempotency-Key is still being processed",
    429: "Seconds until the token's bucket holds a request again",
    503: "Seconds to wait before retrying",
}


class _ResponseSchema(GenerateJsonSchema):
    """Response fields are always present: a field with a default is required too,
    so generated clients do not make every field optional."""

    def field_is_required(self, field: Any, total: bool) -> bool:
        if self.mode == "serialization":
            return not field.get("serialization_exclude")
        return super().field_is_required(field, total)


def _envelope(data_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["success", "data"],
        "properties": {"success": {"const": True}, "data": data_schema},
    }


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds, at any depth (``list[SendEmail]``)."""
    if _is_model(annotation):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def _model_names_ids(model: type[BaseModel], seen: set[type[BaseModel]]) -> bool:
    if model in seen:
        return False
    seen.add(model)
    for name, field in model.model_fields.items():
        if name.endswith(("_id", "_ids")):
            return True
        nested = _models_in(field.annotation)
        if any("id" in kind.model_fields for kind in nested):
            return True
        if any(_model_names_ids(kind, seen) for kind in nested):
            return True
    return False


def _names_ids(route: Route) -> bool:
    """Whether the query or body names other resources (a missing one is 404):
    a field ``*_id``/``*_ids``, or an object with an ``id`` (``template: {id}``),
    at any depth (the items of ``POST /emails/batch``)."""
    seen: set[type[BaseModel]] = set()
    return any(model is not None and _model_names_ids(model, seen)
               for model in (route.query, route.body))


def error_statuses(route: Route, routes: Sequence[Route] = ()) -> list[int]:
    """Every error status the pipeline or the handler of ``route`` may answer
    (``routes``: all of them, which decide where a path is another's)."""
    statuses = {431, 500, 501} | (set() if route.path in NEVER_UNAVAILABLE else {503})
    if route.rule(routes) != route.rule():
        statuses.add(405)  # a parameter spelled as a sibling's literal name
    if route.body is not None or route.raw_body is not None:
        statuses.add(408)
    if route.method in MUTATING:
        statuses.add(415)  # a body in a content coding, whatever the route
    if route.path_params or route.query is not None or not route.public:
        statuses.add(400)
    if route.public and route.path_params:
        statuses.add(404)
    if route.public and route.method in MUTATING:
        # Provider callbacks: a refused signature or secret, an oversized body,
        # a report that is not one.
        statuses |= {400, 403, 413, 422}
    if not route.public:
        statuses |= {401, 403, 429}
        if route.path_params or route.raw_body is not None or _names_ids(route):
            statuses.add(404)
        if route.method in MUTATING:
            statuses |= {409, 413}
        if route.body is not None or route.raw_body is not None:
            statuses.add(422)
        if route.counted:
            statuses.add(402)  # what it accepts counts against the team's quotas
    return sorted(statuses)


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in schema.get("properties", {}).items()
    ]


def _operation(
    route: Route, refs: dict[tuple[str, str], dict[str, Any]], routes: Sequence[Route] = ()
) -> dict[str, Any]:
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
    elif isinstance(route.response, RawContent):
        responses[str(route.status)] = {
            "description": route.summary,
            "content": {
                media_type: {"schema": schema}
                for media_type, schema in (
                    (route.response.media_type, route.response.schema), *route.response.also
                )
            },
        }
    else:
        data = (
            refs[(route.response.__name__, "serialization")]
            if _is_model(route.response)
            else {}
        )
        responses[str(route.status)] = {
            "description": route.summary,
            "content": {"application/json": {"schema": _envelope(data)}},
        }
        for status, meaning in route.also_ok:
            responses[str(status)] = {
                "description": meaning,
                "content": {"application/json": {"schema": _envelope(data)}},
            }
    for status in error_statuses(route, routes):
        responses[str(status)] = {
            "description": ERROR_DESCRIPTIONS[status],
            "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
        }
        if status in RETRY_AFTER:
            responses[str(status)]["headers"] = {"Retry-After": {
                "description": RETRY_AFTER[status], "schema": {"type": "integer", "minimum": 0},
            }}
    operation: dict[str, Any] = {
        "operationId": route.handler.__name__,
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
        operation["security"] = [] if route.credential is None else [{route.credential: []}]
    if route.body is not None:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {
                "application/json": {"schema": refs[(route.body.__name__, "validation")]}
            },
        }
    elif route.raw_body is not None:
        operation["requestBody"] = {"required": True, "content": route.raw_body}
    return operation


def build(routes: list[Route]) -> dict[str, Any]:
    wanted: dict[tuple[str, str], tuple[type[BaseModel], JsonSchemaMode]] = {}
    for route in routes:
        if route.body is not None:
            wanted[(route.body.__name__, "validation")] = (route.body, "validation")
        if _is_model(route.response):
            wanted[(route.response.__name__, "serialization")] = (
                route.response, "serialization"
            )
    keys, definitions = models_json_schema(
        list(wanted.values()), ref_template=REF, schema_generator=_ResponseSchema
    )
    refs = {key: keys[pair] for key, pair in wanted.items()}
    schemas = dict(definitions.get("$defs", {}))
    schemas["Error"] = ERROR_ENVELOPE
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, refs, routes)
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
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                REPORTS_SECRET: {
                    "type": "http", "scheme": "bearer",
                    "description": "TIDINGS_REPORTS_SECRET, for the MTA that posts reports",
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


# The credential of the route that takes delivery reports (docs/email.md).
REPORTS_SECRET = "reportsSecret"

# Where the app keeps its routes (set by ``create_app``) and the document made of them.
ROUTES_CONFIG = "TIDINGS_ROUTES"
DOCUMENT_CONFIG = "TIDINGS_OPENAPI_DOCUMENT"


def openapi_document(routes: Sequence[Route]) -> bytes:
    return json.dumps(build(list(routes)), indent=1).encode()
