"""The success and error envelopes, the error every handler raises, and the
answer to a storage ``Duplicate``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ValidationError
from quart import Response

from tidings.storage.errors import Duplicate, contended, unavailable
from tidings.storage.quotas import QuotaExceeded

JSON = "application/json"


class ApiError(Exception):
    """An error answer: HTTP status, envelope code and a message for people."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BAD_REQUEST", message)


def unauthorized(message: str, error: str | None = None) -> ApiError:
    """401 with its challenge (RFC 9110 §11.6.1), and RFC 6750's error code
    when the request carried a credential: ``invalid_request`` for a header
    that is not one bearer token, ``invalid_token`` for a token that is not
    good (unknown, revoked, expired)."""
    challenge = 'Bearer realm="tidings"' + (f', error="{error}"' if error else "")
    return ApiError(401, "UNAUTHORIZED", message, {"WWW-Authenticate": challenge})


def not_found(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"{what} not found")


def conflict(message: str) -> ApiError:
    return ApiError(409, "CONFLICT", message)


def unprocessable(message: str) -> ApiError:
    return ApiError(422, "UNPROCESSABLE_ENTITY", message)


def storage_unavailable() -> ApiError:
    """503 for a request that failed because storage cannot be reached now."""
    return ApiError(503, "SERVICE_UNAVAILABLE", "storage is unavailable; retry shortly",
                    {"Retry-After": "1"})


def storage_contended() -> ApiError:
    """503 for a request whose transaction PostgreSQL ended to let a
    concurrent one go on (a deadlock): nothing of it was written."""
    return ApiError(503, "SERVICE_UNAVAILABLE",
                    "the request met a concurrent one in storage and was rolled back; retry it",
                    {"Retry-After": "1"})


def storage_failure(error: BaseException) -> ApiError | None:
    """The 503 for a storage error that a retry may cure (storage unreachable,
    or a transaction PostgreSQL ended for another's sake); None for others."""
    if unavailable(error):
        return storage_unavailable()
    if contended(error):
        return storage_contended()
    return None


def payment_required(exceeded: QuotaExceeded) -> ApiError:
    """402 for a team quota that a send would pass; ``Retry-After`` says when the
    quota resets, unless the send is larger than the quota itself."""
    headers = {} if exceeded.retry_after is None else {"Retry-After": str(exceeded.retry_after)}
    return ApiError(402, "PAYMENT_REQUIRED", exceeded.message, headers)


async def quota_response(exceeded: QuotaExceeded) -> Response:
    """The answer to a send that a team quota refused, whichever route made it.
    Registered with the app for every route."""
    return error_response(payment_required(exceeded))


async def duplicate_response(duplicate: Duplicate) -> Response:
    """The one answer to a unique value taken already, whichever route hit it:
    409 naming the field. Registered with the app for every route."""
    return error_response(conflict(f"{duplicate.field}: {duplicate.message}"))


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(document: Any) -> bytes:
    return json.dumps(document, default=_default, separators=(",", ":")).encode()


def success_body(data: Any) -> bytes:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return dumps({"success": True, "data": data})


def error_body(code: str, message: str) -> bytes:
    return dumps({"success": False, "error": {"code": code, "message": message}})


def no_content(headers: dict[str, str] | None = None) -> Response:
    """A 204: no body, and so neither a type nor a length (RFC 9110 §8.6
    forbids a Content-Length on a 204; Quart would add both)."""
    response = Response(b"", status=204, headers=headers)
    for name in ("Content-Type", "Content-Length"):
        response.headers.pop(name, None)
    return response


def json_response(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    if status == 204:
        return no_content(headers)
    return Response(body, status=status, content_type=JSON, headers=headers)


def error_response(error: ApiError) -> Response:
    return json_response(error.status, error_body(error.code, error.message), error.headers)


# The tags pydantic puts in a location for one side of a union (``str |
# list[str]``), besides the generic ``list[...]``, ``constrained-...`` and
# ``function-...`` ones: not fields.
_PLAIN_TAGS = frozenset({"str", "int", "float", "bool", "none", "bytes", "dict", "list"})


def _branch(part: object) -> bool:
    """Whether a location part names a branch of a type, not a field."""
    return isinstance(part, str) and (
        part in _PLAIN_TAGS or "[" in part or part.startswith(("constrained-", "function-"))
    )


def _located(detail: Any) -> tuple[str, bool]:
    """Where an error is (its fields, branches left out), and whether it only
    says the value is not of one branch's type (``to`` is a list, so its
    ``str`` side fails on the type alone)."""
    loc = detail["loc"]
    location = ".".join(str(part) for part in loc if not _branch(part))
    wrong_side = bool(loc) and _branch(loc[-1]) and str(detail["type"]).endswith("_type")
    return location, wrong_side


def describe_validation(error: ValidationError, where: str) -> str:
    """One line that names each offending field and why, e.g. ``email: ...``.
    A value that fits one side of a union is told what that side wants; one
    that fits none is told every side it could be."""
    details = [(detail, *_located(detail)) for detail in error.errors(include_url=False)]
    kept = {location for _, location, wrong_side in details if not wrong_side}
    merged: dict[str, list[str]] = {}
    for detail, location, wrong_side in details:
        if wrong_side and any(k == location or k.startswith(f"{location}.") for k in kept):
            continue  # another side of the union says what is wrong
        message = detail["msg"].removeprefix("Value error, ")
        if detail["type"] == "missing":
            message = "is required"
        elif detail["type"] == "extra_forbidden":
            message = "is not a known field"
        merged.setdefault(location, []).append(message)
    parts = []
    for location, messages in list(merged.items())[:5]:
        message = " or ".join(dict.fromkeys(messages))
        # A check of the whole body names its fields in its message.
        parts.append(f"{location}: {message}" if location else message)
    more = len(merged) - len(parts)
    if more > 0:
        parts.append(f"and {more} more")
    return f"invalid {where}: " + "; ".join(parts)
