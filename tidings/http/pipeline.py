"""The request pipeline every route shares: token, rate limit, validation,
idempotency, the connection, and the handler.

A route declared as a storage unit (``Routes(..., storage_units=True)``)
runs all its storage work (the token lookup on a cache miss, the idempotency
claim, the handler's queries, the stored response) as one unit on the
storage loop, in ONE crossing from trio. The trio side reads the request
before and writes the response after. Other routes (their handlers use
actors, threads or trio itself) keep the connection proxy on the trio side.

Under an ``Idempotency-Key`` a storage unit records its response in its
own transaction (``tidings/http/keyed_units.py``). A route on the trio side
commits a claim on its own first, so that a concurrent request with the
same key sees "still processing" at once instead of waiting; its changes
and the stored response then commit in one transaction, and a failed
request releases its claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import trio
from quart import Response, g, request

from tidings.actors.idempotency import LOCK_LOST, Proceed, Refuse, Replay
from tidings.actors.mailbox import ActorError
from tidings.http.admission import admission, still_admitted
from tidings.http.envelope import ApiError, conflict, json_response
from tidings.http.idempotency_key import (
    IDEMPOTENCY_HEADER,
    fingerprint,
    idempotency_key,
    one_key_header,
)
from tidings.http.keyed_units import Rendered, refusal, refused_input, render, run_keyed
from tidings.http.parsing import arguments, parse_path, query_values, read_body
from tidings.http.ratelimit import NO_TOKEN, RateLimiter
from tidings.http.routing import MUTATING, NO_CONNECTION, Call, Finish, Route
from tidings.storage import idempotency as records
from tidings.storage.db import AsyncioConnection, Connection
from tidings.storage.errors import unavailable
from tidings.storage.tokens import Token

if TYPE_CHECKING:
    from tidings.service import Service

log = logging.getLogger("tidings.http")

# How long a request waits for an actor before answering 503.
ACTOR_TIMEOUT_SECONDS = 10.0


async def authorize(service: Service, route: Route, rate_limiter: RateLimiter) -> Token:
    """The caller's token, checked for this route; from the cache when it can be."""
    seen: list[UUID] = []
    try:
        return await admission(
            service, route, rate_limiter, request.headers.getlist("Authorization"), seen
        )
    finally:
        if seen:
            g.team_id = seen[0]


async def store_response(
    conn: Connection, call: Call, route: Route, key: str, claim: UUID, status: int, body: bytes
) -> None:
    """Keep the response for replays under ``key`` (sealed when it shows a
    secret), in the request's transaction; 409 if the claim was lost."""
    token_id = call.token.id
    kept = call.service.idempotency.stored_body(token_id, key, body, secret=route.secret_response)
    if not await records.complete(conn, token_id, key, claim, status, kept):
        raise conflict(LOCK_LOST)


# --- a storage unit: the whole request's storage work in one crossing --------


@dataclass(frozen=True)
class Incoming:
    """What the unit needs of a request, read on the trio side."""

    token: Token  # admitted (``admission``)
    path_values: dict[str, str]
    query: dict[str, Any]
    raw_body: bytes
    mimetype: str
    key_header: str | None
    fingerprint: bytes


async def run_unit(
    conn: AsyncioConnection,
    service: Service,
    route: Route,
    incoming: Incoming,
) -> tuple[Call, Rendered]:
    """Serve one request on ``conn``. Runs whole on the asyncio side: it awaits
    nothing but ``conn``. Cancellation rolls back its transaction."""
    key = idempotency_key(incoming.key_header) if route.method in MUTATING else None
    call = Call(service, incoming.token, conn)
    try:
        kwargs = arguments(
            route, incoming.path_values, incoming.query, incoming.raw_body, incoming.mimetype
        )
    except ApiError:
        answer = None if key is None else await refused_input(
            conn, call, key, incoming.fingerprint
        )
        if answer is None:
            raise
        return call, answer
    if key is None:
        return call, render(route, await route.handler(call, **kwargs))
    return call, await run_keyed(conn, call, route, kwargs, key, incoming.fingerprint)


# --- routes that stay on the trio side ---------------------------------------


async def run_idempotent(
    service: Service, route: Route, token: Token, kwargs: dict[str, Any], key: str,
    raw_body: bytes,
) -> Response:
    try:
        with trio.fail_after(ACTOR_TIMEOUT_SECONDS):
            decision = await service.idempotency.begin(token.id, key, fingerprint(
                request.method, request.path, request.query_string, raw_body
            ))
    except (trio.TooSlowError, ActorError):
        raise ApiError(
            503, "SERVICE_UNAVAILABLE", "the idempotency service is busy; retry shortly"
        ) from None
    match decision:
        case Replay(status=status, body=body):
            return json_response(status, body, {"Idempotent-Replayed": "true"})
        case Refuse(message=message):
            raise refusal(message)
        case Proceed(claim=claim):
            pass
    stored = False
    try:
        result: Any = None
        if not route.pooled:
            # The wait outside holds no connection; the writes (a Finish) and
            # the stored response then commit together (a lost claim rolls
            # both back).
            call = Call(service, token, NO_CONNECTION)
            result = await route.handler(call, **kwargs)
        async with service.db.transaction() as conn:
            if route.pooled:
                call = Call(service, token, conn)
                result = await route.handler(call, **kwargs)
            elif isinstance(result, Finish):
                result = await result.unit(conn)
            status, body, headers = render(route, result)
            if 200 <= status < 300:
                await store_response(conn, call, route, key, claim, status, body)
                stored = True
        call.committed()
        return json_response(status, body, headers)
    finally:
        if not stored:
            # The request failed: forget the claim so that a retry runs again
            # (once storage answers, if it does not now).
            released = False
            with trio.move_on_after(5, shield=True):
                try:
                    async with service.db.acquire() as conn:
                        await records.release(conn, token.id, key, claim)
                    released = True
                except Exception as error:
                    if not unavailable(error):
                        log.exception("the claim of a failed request could not be released")
            if not released:
                service.idempotency.releases.later(token.id, key, claim)


async def _refused_input(
    conn: AsyncioConnection, service: Service, token: Token, key: str, request_fingerprint: bytes
) -> Rendered | None:
    return await refused_input(conn, Call(service, token, conn), key, request_fingerprint)


async def run_on_trio(
    service: Service, route: Route, rate_limiter: RateLimiter, path_values: dict[str, str]
) -> Response:
    version = service.tokens.version
    token = await authorize(service, route, rate_limiter)
    raw_body = b""
    if route.method in MUTATING:
        with rate_limiter.uploads.receiving(token.team_id):
            raw_body = await read_body(route.max_body_bytes(service.config))
        await still_admitted(service, token, request.headers.getlist("Authorization"), version)
    key = (
        idempotency_key(one_key_header(request.headers.getlist(IDEMPOTENCY_HEADER)))
        if route.method in MUTATING else None
    )
    try:
        kwargs = arguments(route, path_values, query_values(), raw_body, request.mimetype)
    except ApiError:
        if key is None:
            raise
        answer = await service.db.run(_refused_input, service, token, key, fingerprint(
            request.method, request.path, request.query_string, raw_body
        ))
        if answer is None:
            raise
        return json_response(*answer)
    if key is not None:
        return await run_idempotent(service, route, token, kwargs, key, raw_body)
    if not route.pooled:
        call = Call(service, token, NO_CONNECTION)
        result = await route.handler(call, **kwargs)
        if isinstance(result, Finish):
            async with service.db.transaction() as conn:  # its writes, all or none
                result = await result.unit(conn)
        call.committed()
        return json_response(*render(route, result))
    async with service.db.acquire() as conn:
        call = Call(service, token, conn)
        result = await route.handler(call, **kwargs)
    call.committed()
    return json_response(*render(route, result))


async def run_incoming(
    service: Service, route: Route, incoming: Incoming
) -> tuple[Call, Rendered]:
    """The request's storage work in one crossing; the caller runs
    ``call.committed()`` and answers."""
    return await service.db.run(run_unit, service, route, incoming)


async def run_as_unit(
    service: Service, route: Route, rate_limiter: RateLimiter, path_values: dict[str, str]
) -> Response:
    """A storage-unit route served through Quart (``tidings/http/frontdoor.py``
    serves them without it; HEAD requests and anything it passes on come here)."""
    seen: list[UUID] = []  # the admitted token's team, for the access log
    try:
        version = service.tokens.version
        authorization = request.headers.getlist("Authorization")
        token = await admission(service, route, rate_limiter, authorization, seen)
        raw_body = b""
        if route.method in MUTATING:
            with rate_limiter.uploads.receiving(token.team_id):
                raw_body = await read_body(route.max_body_bytes(service.config))
            await still_admitted(service, token, authorization, version)
        key_header = one_key_header(request.headers.getlist(IDEMPOTENCY_HEADER))
        incoming = Incoming(
            token=token,
            path_values=path_values,
            query=query_values(),
            raw_body=raw_body,
            mimetype=request.mimetype,
            key_header=key_header,
            fingerprint=b"" if key_header is None else fingerprint(
                request.method, request.path, request.query_string, raw_body
            ),
        )
        call, (status, body, headers) = await run_incoming(service, route, incoming)
    finally:
        if seen:
            g.team_id = seen[0]
    call.committed()
    return json_response(status, body, headers)


def make_view(
    service: Service, route: Route, rate_limiter: RateLimiter
) -> Callable[..., Awaitable[Response]]:
    run = run_as_unit if route.storage_unit else run_on_trio

    async def view(**path_values: str) -> Response:
        if route.public:
            with (rate_limiter.uploads.receiving(NO_TOKEN) if route.raw_body is not None
                  else nullcontext()):
                result = await route.handler(service, **parse_path(route, path_values))
            return result if isinstance(result, Response) else json_response(
                *render(route, result)
            )
        return await run(service, route, rate_limiter, path_values)

    view.__name__ = f"{route.method.lower()}_{route.handler.__name__}"
    return view
