"""Reading and validating a request's path, query and body (400 naming the field)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any
from uuid import UUID

import trio
from pydantic import BaseModel, BeforeValidator, ValidationError
from quart import request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from tidings.fields import RepeatedKey, check_unique_keys
from tidings.http.envelope import bad_request, describe_validation
from tidings.http.routing import RawBody, Route


def query_values() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in request.args:
        found = request.args.getlist(name)
        values[name] = found[0] if len(found) == 1 else found
    return values


# An id in a path is written one way, as Tidings writes it (8-4-4-4-12 hex
# digits, either case): one resource has one path, so a request's fingerprint
# (idempotency) and an access log line name it one way. Python's UUID() also
# takes braces, a "urn:uuid:" prefix and no hyphens.
_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def _id_text(value: Any) -> Any:
    if isinstance(value, str) and not _UUID_TEXT.fullmatch(value):
        raise ValueError("must be a UUID written 8-4-4-4-12 hex digits with hyphens")
    return value


# An id in a query string, written as in a path, for the same reasons: the
# query string is part of a request's fingerprint too.
QueryId = Annotated[UUID, BeforeValidator(_id_text)]


def path_uuid(raw: str) -> UUID | None:
    """The id a path segment names, written as Tidings writes ids; None if it is not one."""
    return UUID(raw) if _UUID_TEXT.fullmatch(raw) else None


def parse_path(route: Route, values: dict[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, raw in values.items():
        kind = route.path_types.get(name, UUID)
        if kind is UUID:
            if (found := path_uuid(raw)) is None:
                raise bad_request(f"{name}: {raw!r} is not a valid UUID")
            parsed[name] = found
        else:
            parsed[name] = raw
    return parsed


def parse_query(model: type[BaseModel], values: dict[str, Any]) -> BaseModel:
    # No query parameter takes several values: one given twice is refused as
    # such, not as a value of the wrong type (``query_values`` lists them).
    for name, value in values.items():
        if isinstance(value, list):
            raise bad_request(f"invalid query: {name}: is given more than once")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise bad_request(describe_validation(error, "query")) from None


def parse_body(model: type[BaseModel], raw: bytes, required: bool = True) -> BaseModel:
    if not raw.strip() and not required:
        raw = b"{}"
    if not raw.strip():
        raise bad_request("request body is required: send a JSON object")
    try:
        parsed = model.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            raise bad_request(f"request body is not valid JSON{_where(first)}") from None
        raise bad_request(describe_validation(error, "body")) from None
    try:
        check_unique_keys(raw)
    except RepeatedKey as error:
        raise bad_request(f"invalid body: {error}") from None
    return parsed


def _where(error: Any) -> str:
    """What the JSON parser found, and where: ": trailing comma at line 1
    column 8"; a body nested deeper than it reads says so."""
    found = str((error.get("ctx") or {}).get("error", ""))
    if not found:
        return ""
    if found.startswith("recursion limit exceeded"):
        found = found.replace("recursion limit exceeded", "nested too deeply", 1)
    return f": {found}"


async def read_body(limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit``.

    The application's own limit is the largest of any route's; this one is
    the route's. A chunked body is counted as it arrives, not buffered whole.
    """
    request.max_content_length = limit  # the 413 answer names it
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()
    received = bytearray()
    timeout = float("inf") if request.body_timeout is None else request.body_timeout
    with trio.move_on_after(timeout) as waiting:
        async for chunk in request.body:
            received += chunk
            if len(received) > limit:
                raise RequestEntityTooLarge()
    if waiting.cancelled_caught:
        raise RequestTimeout()
    return bytes(received)


def arguments(
    route: Route, path_values: dict[str, str], query: dict[str, Any], raw_body: bytes,
    mimetype: str,
) -> dict[str, Any]:
    """The handler's keyword arguments, validated (400 naming what is wrong)."""
    kwargs = parse_path(route, path_values)
    if route.query is not None:
        kwargs["query"] = parse_query(route.query, query)
    elif query:
        # As a list route refuses a parameter it does not know: a parameter
        # meant for something else is never silently dropped.
        raise bad_request(
            f"{min(query)}: is not a known query parameter ({route.method} {route.path} takes none)"
        )
    if route.body is not None:
        kwargs["body"] = parse_body(route.body, raw_body, route.body_required)
    elif route.raw_body is not None:
        kwargs["raw_body"] = RawBody(raw_body, mimetype)
    elif raw_body.strip() and not _empty_object(raw_body):
        # As a field a body model does not know: what the client meant by it
        # is never silently dropped. None, or {}, as clients send with a POST.
        raise bad_request(f"body: {route.method} {route.path} takes no body (send none, or {{}})")
    return kwargs


def _empty_object(raw: bytes) -> bool:
    # Read as a body is (UTF-8 text, no BOM); a body nested deeper than the
    # parser goes is no empty object either.
    try:
        return bool(json.loads(raw.decode("utf-8")) == {})
    except (ValueError, RecursionError):
        return False
