"""Who may make a request: the bearer token, read from its header, looked up
(from the cache when it can be), and checked for the route, before anything
else of the request is read; and checked again once a body has arrived.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from tidings.http.envelope import ApiError, unauthorized
from tidings.http.ratelimit import RateLimiter
from tidings.http.routing import Route
from tidings.storage import tokens as token_store
from tidings.storage.tokens import Token

if TYPE_CHECKING:
    from tidings.service import Service


def bearer_secret(headers: list[str]) -> str:
    """The secret of the one ``Authorization: Bearer`` header among ``headers``."""
    if len(headers) > 1:
        # Never pick one of several credentials: refuse them all.
        raise unauthorized(
            "more than one Authorization header: send exactly one", "invalid_request"
        )
    header = headers[0] if headers else ""
    if not header:
        raise unauthorized("missing Authorization header with a bearer token")
    scheme, _, secret = header.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        raise unauthorized("Authorization header must be 'Bearer <token>'", "invalid_request")
    if any(char.isspace() or char == "," for char in secret):
        raise unauthorized(
            "Authorization header must hold exactly one bearer token", "invalid_request"
        )
    return secret


def secret_hash_of(secret: str) -> bytes | None:
    """The hash to look the secret up by; None when it cannot be a Tidings token."""
    if not secret.startswith(token_store.TOKEN_PREFIX):
        return None
    return token_store.hash_secret(secret)


def live(token: Token | None) -> Token:
    """``token`` if it is one that is neither revoked nor expired; else 401."""
    if token is None:
        raise unauthorized("invalid token", "invalid_token")
    if token.revoked_at is not None:
        raise unauthorized("token has been revoked", "invalid_token")
    if token.expired:
        raise unauthorized("token has expired", "invalid_token")
    return token


def admit(
    route: Route, token: Token | None, rate_limiter: RateLimiter, seen: list[UUID] | None = None
) -> Token:
    """``token`` may call ``route`` now, or the 401/403/429 that says why not.
    An authentic token adds its team to ``seen`` (for the access log)."""
    token = live(token)
    if seen is not None:
        seen.append(token.team_id)
    if route.permission is not None and route.permission not in token.permissions:
        raise ApiError(403, "FORBIDDEN", f"this token lacks the permission {route.permission!r}")
    if route.step_up and not token.step_up:
        raise ApiError(
            403,
            "STEP_UP_REQUIRED",
            "this operation needs a step-up token (tidings tokens create --step-up)",
        )
    rate_limiter.check(token.id)
    return token


async def admission(
    service: Service, route: Route, rate_limiter: RateLimiter, authorization: list[str],
    seen: list[UUID],
) -> Token:
    """The caller's token admitted for ``route``, or the 401/403/429 that says
    why not, before anything else of the request is read (its body above all:
    a client without a valid token holds nothing while it sends one slowly).
    From the cache, else looked up: a crossing of its own, on a token's first
    request in this process only. ``seen`` as in ``admit``."""
    secret_hash = secret_hash_of(bearer_secret(authorization))
    token = None
    if secret_hash is not None:
        token = service.tokens.get(secret_hash)
        if token is None:
            async with service.tokens.lookups:
                version = service.tokens.version
                token = await service.db.run(token_store.find_by_hash, secret_hash)
            if token is not None:
                service.tokens.put(secret_hash, token, version)
    return admit(route, token, rate_limiter, seen)


async def still_admitted(
    service: Service, token: Token, authorization: list[str], version: int
) -> None:
    """``token``, admitted before the request's body, once the body is in.

    A body may take up to the body timeout to arrive: a token that expired
    or was revoked meanwhile is refused (401) as a request sent after would
    be. ``version`` is the token cache's when the token was admitted; while
    it has not moved, nothing was revoked since.
    """
    live(token)
    if service.tokens.version == version:
        return
    secret_hash = secret_hash_of(bearer_secret(authorization))
    assert secret_hash is not None  # it was admitted
    cached = service.tokens.get(secret_hash)
    if cached is not None and cached.id == token.id:
        return
    live(await service.db.run(token_store.find_by_hash, secret_hash))
