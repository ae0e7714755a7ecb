"""Every response the tests receive, checked against GET /openapi.json.

``check_response`` finds the operation by method and path template, and
fails when the status is not declared for it, when the media type differs,
or when the body does not match the declared schema. A request that matches
no operation (an unknown route, a wrong method) must still answer the error
envelope.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tidings.http.app import all_routes
from tidings.http.openapi import openapi_document

DOCUMENT_URI = "urn:tidings:openapi"


class NotInTheDocument(AssertionError):
    """A response the OpenAPI document does not describe."""


@dataclass(frozen=True)
class Operation:
    method: str
    template: str
    pattern: re.Pattern[str]
    responses: dict[str, Any]


def _pointer(*parts: str) -> str:
    return "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


@functools.cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(openapi_document(all_routes()))
    return loaded


@functools.cache
def operations() -> list[Operation]:
    found = []
    for template, methods in document()["paths"].items():
        regex = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        for method, operation in methods.items():
            found.append(
                Operation(method.upper(), template, re.compile(f"{regex}/?"),
                          operation["responses"])
            )
    return found


@functools.cache
def _registry() -> Registry[Any]:
    return Registry().with_resource(
        DOCUMENT_URI, Resource.from_contents(document(), default_specification=DRAFT202012)
    )


@functools.cache
def validator(pointer: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": f"{DOCUMENT_URI}#/{pointer}"}, registry=_registry())


def find_operation(method: str, path: str) -> Operation | None:
    matches = [
        op for op in operations() if op.method == method and op.pattern.fullmatch(path)
    ]
    # A literal segment beats a parameter: /contacts/import before /contacts/{contact_id}.
    matches.sort(key=lambda op: op.template.count("{"))
    return matches[0] if matches else None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise NotInTheDocument(f"body is not JSON: {response.text[:200]!r}") from None


def _errors(pointer: str, body: Any) -> list[str]:
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(body)'}: {error.message}"
        for error in validator(pointer).iter_errors(body)
    ][:5]


def check_response(method: str, path: str, response: httpx.Response) -> None:
    """Raise NotInTheDocument unless the document describes ``response``."""
    status = str(response.status_code)
    media_type = response.headers.get("content-type", "").split(";")[0].strip()
    where = f"{method} {path} -> {status}"
    operation = find_operation(method, path)
    if operation is None:
        if response.status_code < 400:
            raise NotInTheDocument(f"{where}: no operation in the document answers this")
        errors = _errors(_pointer("components", "schemas", "Error"), _body(response))
        if errors:
            raise NotInTheDocument(f"{where}: not the error envelope: {errors}")
        return
    declared = operation.responses.get(status)
    if declared is None:
        raise NotInTheDocument(
            f"{where}: status not declared for {operation.method} {operation.template} "
            f"(declared: {', '.join(operation.responses)}); body {response.text[:300]}"
        )
    content = declared.get("content")
    if not content:
        if response.content:
            raise NotInTheDocument(f"{where}: declared without a body, got {response.text[:200]}")
        return
    if media_type not in content:
        raise NotInTheDocument(f"{where}: media type {media_type!r}, declared {list(content)}")
    pointer = _pointer(
        "paths", operation.template, operation.method.lower(), "responses", status, "content",
        media_type, "schema",
    )
    body: Any = _body(response) if media_type == "application/json" else response.text
    errors = _errors(pointer, body)
    if errors:
        raise NotInTheDocument(f"{where}: body does not match the document: {errors}")


async def check_hook(response: httpx.Response) -> None:
    """An httpx response event hook: every response checked against the document."""
    await response.aread()
    check_response(response.request.method, response.request.url.path, response)
