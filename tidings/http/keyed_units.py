"""A storage unit under an ``Idempotency-Key``.

The unit's whole work is one transaction, so its key needs no claim
committed ahead of it: the handler runs, and its response is recorded under
the key in the same transaction (``records.record``), which then commits.
That is one statement where a claim costs two and a commit of its own.

What a claim gave, this keeps:

- In this process, a second request with the key while the first runs
  (``RunningKeys``) is answered from the key's record when there is one;
  else a different request is told so, and the same one "still processing",
  or, past the processing lock, that the first expired (the first attempt
  then does not commit).
- Across processes, PostgreSQL's unique key decides: the later of two
  attempts waits for the first to commit, finds its record, rolls its own
  work back and answers with the first one's response. No key is executed
  twice.
- A retry of a completed request runs the handler in a transaction that is
  rolled back, and answers with the stored response. It does this also when
  the handler refuses (409 because the contact now exists, 404 because it
  was deleted): a refusal under a key is checked against its record before
  it is given.
"""

from __future__ import annotations

from typing import Any

from tidings.actors.idempotency import (
    DIFFERENT_REQUEST,
    LOCK_EXPIRED,
    LOCK_LOST,
    STILL_PROCESSING,
    Refuse,
    Replay,
    Running,
    answer_held,
)
from tidings.http.envelope import ApiError, conflict, success_body
from tidings.http.routing import Answer, Call, Route
from tidings.storage import idempotency as records
from tidings.storage.db import AsyncioConnection
from tidings.storage.errors import Duplicate
from tidings.storage.quotas import QuotaExceeded

Rendered = tuple[int, bytes, dict[str, str]]

# How many times a unit runs again when the record that held its key went
# away before it could read it (a released claim, a sweep).
ATTEMPTS = 3


# What a handler raises to refuse a request (each answered 4xx): under a key,
# checked against the key's record first.
REFUSALS = (ApiError, Duplicate, QuotaExceeded)


class _Held(Exception):
    """A live record holds the key: roll back and answer from it."""


def refusal(message: str) -> ApiError:
    """409 CONFLICT for a request whose key is held. One still processing
    says when to ask again (``Retry-After``), which the others do not need:
    an expired attempt may be retried at once, a different request never."""
    headers = {"Retry-After": "1"} if message == STILL_PROCESSING else None
    return ApiError(409, "CONFLICT", message, headers)


def render(route: Route, result: Any) -> Rendered:
    """A handler's result as the status, body and headers of its answer."""
    if isinstance(result, Answer):
        status, data, headers = result.status, result.data, result.headers
    else:
        status, data, headers = route.status, result, {}
    body = b"" if status == 204 else success_body(data)
    return status, body, headers


async def run_keyed(
    conn: AsyncioConnection,
    call: Call,
    route: Route,
    kwargs: dict[str, Any],
    key: str,
    fingerprint: bytes,
) -> Rendered:
    """Run the route's handler once under ``key``, or answer from the record
    that already holds it."""
    keys = call.service.idempotency
    scope = call.token.id
    running, ours = keys.running.enter(scope, key, fingerprint)
    if not ours:
        return await _beside(conn, call, key, fingerprint, running)
    try:
        for _ in range(ATTEMPTS):
            answer = await _attempt(conn, call, route, kwargs, key, fingerprint, running)
            if answer is not None:
                return answer
        raise refusal(STILL_PROCESSING)
    finally:
        keys.running.leave(scope, key, running)


async def _beside(
    conn: AsyncioConnection, call: Call, key: str, fingerprint: bytes, running: Running
) -> Rendered:
    """The answer to a request whose key an attempt in this process holds:
    from the key's record if there is one (that attempt may be a retry of a
    completed request); else a different request is told so, and the same
    one "still processing", or "expired" once the attempt outlived its lock."""
    keys = call.service.idempotency
    scope = call.token.id
    held = await records.look_up(conn, scope, key)
    if held is not None:
        return await _answer_from(conn, call, key, fingerprint, held)
    if running.fingerprint != fingerprint:
        raise refusal(DIFFERENT_REQUEST)  # never takes the key from that attempt
    if keys.running.expire(scope, key, running, call.service.config.idempotency_lock_seconds):
        raise refusal(LOCK_EXPIRED)
    raise refusal(STILL_PROCESSING)


async def refused_input(
    conn: AsyncioConnection, call: Call, key: str, fingerprint: bytes
) -> Rendered | None:
    """The answer to a request under ``key`` whose input was refused before
    its handler ran, when the key is already taken: the stored response if
    this very request completed, else 409 as for any other request with
    the key. None: the key is free, and the refusal stands."""
    held = await records.look_up(conn, call.token.id, key)
    if held is not None:
        return await _answer_from(conn, call, key, fingerprint, held)
    running = call.service.idempotency.running.get(call.token.id, key)
    if running is not None and running.fingerprint != fingerprint:
        raise refusal(DIFFERENT_REQUEST)
    return None


async def _answer_from(
    conn: AsyncioConnection,
    call: Call,
    key: str,
    fingerprint: bytes,
    held: records.Completed | records.Processing,
) -> Rendered:
    keys = call.service.idempotency
    scope = call.token.id
    decision = keys.opened(scope, key, await answer_held(conn, scope, key, fingerprint, held))
    if isinstance(decision, Replay):
        return decision.status, decision.body, {"Idempotent-Replayed": "true"}
    assert isinstance(decision, Refuse)  # a held key is replayed or refused
    raise refusal(decision.message)


async def _attempt(
    conn: AsyncioConnection,
    call: Call,
    route: Route,
    kwargs: dict[str, Any],
    key: str,
    fingerprint: bytes,
    running: Running,
) -> Rendered | None:
    """One run of the unit; None when it must run again."""
    keys = call.service.idempotency
    scope = call.token.id
    try:
        async with conn.transaction():
            rendered = render(route, await route.handler(call, **kwargs))
            status, body, _ = rendered  # a success: failures raise ApiError
            if running.lost:
                raise conflict(LOCK_LOST)
            kept = keys.stored_body(scope, key, body, secret=route.secret_response)
            if await records.record(
                conn, scope, key, fingerprint, status, kept,
                retention_seconds=call.service.config.idempotency_retention_seconds,
            ):
                return rendered
            raise _Held
    except _Held:
        call.rolled_back()
        held = await records.look_up(conn, scope, key)
        if held is None:
            return None
    except REFUSALS:
        call.rolled_back()
        held = await records.look_up(conn, scope, key)
        if held is None:
            raise  # the handler's own answer: no earlier request holds the key
    return await _answer_from(conn, call, key, fingerprint, held)
