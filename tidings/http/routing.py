"""Route declarations and the request pipeline every route shares.

One declaration (``@routes.route(...)``) gives the Quart rule, the token and
permission check, the rate limit, the validation of path, query and body,
idempotency, the database connection, and the OpenAPI operation. Handlers
only translate between HTTP and storage calls or actor messages.

Handlers get one connection for the whole request and open transactions
themselves where a change spans several statements. A request with an
``Idempotency-Key`` runs inside one transaction that also stores its
response, so it either commits with its replayable response or leaves no
trace and may run again (a handler's own transaction becomes a savepoint).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

import trio
from pydantic import BaseModel, ValidationError
from quart import Response, request
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from tidings.actors.idempotency import Proceed, Refuse, Replay
from tidings.actors.mailbox import ActorError
from tidings.http.envelope import (
    ApiError,
    bad_request,
    conflict,
    describe_validation,
    json_response,
    success_body,
)
from tidings.http.ratelimit import RateLimiter
from tidings.storage import idempotency as records
from tidings.storage import tokens as token_store
from tidings.storage.db import Connection
from tidings.storage.tokens import Token

if TYPE_CHECKING:
    from tidings.config import Config
    from tidings.service import Service

log = logging.getLogger("tidings.http")

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 256
# How long a request waits for an actor before answering 503.
ACTOR_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Call:
    """What a handler gets: the service, the caller's token and a connection.

    ``conn`` is in autocommit mode, except under an Idempotency-Key, where it
    is inside the request's transaction.
    """

    service: Service
    token: Token
    conn: Connection
    _after_commit: list[Callable[[], None]] = field(default_factory=list)

    @property
    def team_id(self) -> UUID:
        return self.token.team_id

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the request's changes are committed (not on failure)."""
        self._after_commit.append(callback)

    def committed(self) -> None:
        for callback in self._after_commit:
            callback()


@dataclass(frozen=True)
class Answer:
    """A handler result with a status other than the route's default."""

    status: int
    data: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RawBody:
    """The body of a route that parses its own (``raw_body=`` in its declaration)."""

    data: bytes
    content_type: str


Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    permission: str | None
    body: type[BaseModel] | None
    query: type[BaseModel] | None
    response: Any
    status: int
    step_up: bool
    public: bool
    path_types: dict[str, type]
    body_required: bool = True
    # The OpenAPI request body content of a route whose handler gets a RawBody.
    raw_body: dict[str, Any] | None = None
    # The route's own body size limit; None: TIDINGS_MAX_BODY_BYTES.
    body_limit: Callable[[Config], int] | None = None
    # The response shows a secret: stored only sealed for idempotent replays.
    secret_response: bool = False

    def max_body_bytes(self, config: Config) -> int:
        return config.max_body_bytes if self.body_limit is None else self.body_limit(config)

    @property
    def rule(self) -> str:
        """The Quart rule: ``/contacts/{contact_id}`` becomes ``/contacts/<contact_id>``."""
        return self.path.replace("{", "<").replace("}", ">")

    @property
    def path_params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


class Routes:
    """The routes of one resource group."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.items: list[Route] = []

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        permission: str | None = None,
        body: type[BaseModel] | None = None,
        query: type[BaseModel] | None = None,
        response: Any = None,
        status: int = 200,
        step_up: bool = False,
        public: bool = False,
        path_types: dict[str, type] | None = None,
        body_required: bool = True,
        raw_body: dict[str, Any] | None = None,
        body_limit: Callable[[Config], int] | None = None,
        secret_response: bool = False,
    ) -> Callable[[Handler], Handler]:
        """Declare a route. ``path_types`` maps path parameters that are not UUIDs
        to ``str`` (handed over as they are); ``body_required=False`` lets a
        request without a body stand for ``{}``."""
        def register(handler: Handler) -> Handler:
            self.items.append(
                Route(
                    method=method,
                    path=path,
                    handler=handler,
                    summary=summary,
                    tag=self.tag,
                    permission=permission,
                    body=body,
                    query=query,
                    response=response,
                    status=status,
                    step_up=step_up,
                    public=public,
                    path_types=path_types or {},
                    body_required=body_required,
                    raw_body=raw_body,
                    body_limit=body_limit,
                    secret_response=secret_response,
                )
            )
            return handler

        return register


# --- the pipeline -----------------------------------------------------------


def bearer_secret() -> str:
    headers = request.headers.getlist("Authorization")
    if len(headers) > 1:
        # Never pick one of several credentials: refuse them all.
        raise ApiError(
            401, "UNAUTHORIZED", "more than one Authorization header: send exactly one"
        )
    header = headers[0] if headers else ""
    if not header:
        raise ApiError(401, "UNAUTHORIZED", "missing Authorization header with a bearer token")
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise ApiError(401, "UNAUTHORIZED", "Authorization header must be 'Bearer <token>'")
    if any(char.isspace() or char == "," for char in secret):
        raise ApiError(
            401, "UNAUTHORIZED", "Authorization header must hold exactly one bearer token"
        )
    return secret


async def authorize(service: Service, route: Route) -> Token:
    """The caller's token, checked for this route; from the cache when it can be."""
    secret = bearer_secret()
    token = None
    if secret.startswith(token_store.TOKEN_PREFIX):
        secret_hash = token_store.hash_secret(secret)
        token = service.tokens.get(secret_hash)
        if token is None:
            version = service.tokens.version
            token = await service.db.run(token_store.find_by_hash, secret_hash)
            if token is not None:
                service.tokens.put(secret_hash, token, version)
    if token is None:
        raise ApiError(401, "UNAUTHORIZED", "invalid token")
    if token.revoked_at is not None:
        raise ApiError(401, "UNAUTHORIZED", "token has been revoked")
    if token.expired:
        raise ApiError(401, "UNAUTHORIZED", "token has expired")
    if route.permission is not None and route.permission not in token.permissions:
        raise ApiError(403, "FORBIDDEN", f"this token lacks the permission {route.permission!r}")
    if route.step_up and not token.step_up:
        raise ApiError(
            403,
            "STEP_UP_REQUIRED",
            "this operation needs a step-up token (tidings tokens create --step-up)",
        )
    return token


def parse_path(route: Route, values: dict[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, raw in values.items():
        kind = route.path_types.get(name, UUID)
        if kind is UUID:
            try:
                parsed[name] = UUID(raw)
            except ValueError:
                raise bad_request(f"{name}: {raw!r} is not a valid UUID") from None
        else:
            parsed[name] = raw
    return parsed


def parse_query(model: type[BaseModel]) -> BaseModel:
    values: dict[str, Any] = {}
    for name in request.args:
        found = request.args.getlist(name)
        values[name] = found[0] if len(found) == 1 else found
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
        return model.model_validate_json(raw)
    except ValidationError as error:
        if error.errors()[0]["type"] == "json_invalid":
            raise bad_request("request body is not valid JSON") from None
        raise bad_request(describe_validation(error, "body")) from None


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


def idempotency_key() -> str | None:
    raw = request.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        return None
    try:
        # Header values arrive as latin-1; clients send UTF-8 for non-ASCII keys.
        raw = raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    key = raw.strip()
    if not key:
        raise bad_request(f"{IDEMPOTENCY_HEADER}: must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise bad_request(
            f"{IDEMPOTENCY_HEADER}: at most {MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    return key


def fingerprint(raw_body: bytes) -> bytes:
    """Method, route path, query string and body: what makes two requests the same."""
    digest = hashlib.sha256()
    for part in (request.method.encode(), request.path.encode(), request.query_string):
        digest.update(part)
        digest.update(b"\n")
    digest.update(raw_body)
    return digest.digest()


def render(route: Route, result: Any) -> tuple[int, bytes, dict[str, str]]:
    if isinstance(result, Answer):
        status, data, headers = result.status, result.data, result.headers
    else:
        status, data, headers = route.status, result, {}
    body = b"" if status == 204 else success_body(data)
    return status, body, headers


async def run_idempotent(
    service: Service,
    route: Route,
    token: Token,
    kwargs: dict[str, Any],
    key: str,
    raw_body: bytes,
) -> Response:
    try:
        with trio.fail_after(ACTOR_TIMEOUT_SECONDS):
            decision = await service.idempotency.begin(token.id, key, fingerprint(raw_body))
    except (trio.TooSlowError, ActorError):
        raise ApiError(
            503, "SERVICE_UNAVAILABLE", "the idempotency service is busy; retry shortly"
        ) from None
    match decision:
        case Replay(status=status, body=body):
            return json_response(status, body, {"Idempotent-Replayed": "true"})
        case Refuse(message=message):
            raise conflict(message)
        case Proceed(claim=claim):
            pass
    stored = False
    try:
        async with service.db.transaction() as conn:
            call = Call(service, token, conn)
            result = await route.handler(call, **kwargs)
            status, body, headers = render(route, result)
            if 200 <= status < 300:
                stored_body = service.idempotency.stored_body(
                    token.id, key, body, secret=route.secret_response
                )
                if not await records.complete(conn, token.id, key, claim, status, stored_body):
                    raise conflict(
                        "the idempotency lock of this request expired before it completed; "
                        "retry the request"
                    )
                stored = True
        call.committed()
        return json_response(status, body, headers)
    finally:
        if not stored:
            # The request failed: forget the claim so that a retry runs again.
            with trio.move_on_after(5, shield=True):
                async with service.db.acquire() as conn:
                    await records.release(conn, token.id, key, claim)


def make_view(
    service: Service, route: Route, rate_limiter: RateLimiter
) -> Callable[..., Awaitable[Response]]:
    async def view(**path_values: str) -> Response:
        if route.public:
            result = await route.handler(service, **parse_path(route, path_values))
            return result if isinstance(result, Response) else json_response(
                *render(route, result)
            )
        token = await authorize(service, route)
        rate_limiter.check(token.id)
        kwargs = parse_path(route, path_values)
        if route.query is not None:
            kwargs["query"] = parse_query(route.query)
        raw_body = b""
        if route.method in MUTATING:
            raw_body = await read_body(route.max_body_bytes(service.config))
        if route.body is not None:
            kwargs["body"] = parse_body(route.body, raw_body, route.body_required)
        elif route.raw_body is not None:
            kwargs["raw_body"] = RawBody(raw_body, request.mimetype)
        key = idempotency_key() if route.method in MUTATING else None
        if key is not None:
            return await run_idempotent(service, route, token, kwargs, key, raw_body)
        async with service.db.acquire() as conn:
            call = Call(service, token, conn)
            result = await route.handler(call, **kwargs)
        call.committed()
        return json_response(*render(route, result))

    view.__name__ = f"{route.method.lower()}_{route.handler.__name__}"
    return view
