"""Route declarations: what a route is and what its handler gets.

One declaration (``@routes.route(...)``) gives the Quart rule, the token and
permission check, the rate limit, the validation of path, query and body,
idempotency, the database connection, and the OpenAPI operation. Handlers
only translate between HTTP and storage calls or actor messages.

Handlers get one connection for the whole request and open transactions
themselves where a change spans several statements. A request with an
``Idempotency-Key`` runs inside one transaction that also stores its
response, so it either commits with its replayable response or leaves no
trace and may run again (a handler's own transaction becomes a savepoint).

A route of a group declared with ``storage_units=True`` promises that its
handler awaits nothing but its connection (no actors, threads, sleeps or
other trio calls). The pipeline (``tidings/http/pipeline.py``) then runs the
request's whole storage work on the asyncio side in one crossing.

A route declared ``pooled=False`` waits on something outside (a provider's
API, DNS) and holds no connection while it does: its handler gets
``NO_CONNECTION``, reads what it needs in units of its own
(``service.db.run``), each on a pooled connection only while it runs, and
returns its writes as a ``Finish``. The pipeline runs that on a pooled
connection, in one transaction with the stored response under an
Idempotency-Key (which it checks is still the request's), so the writes
and the response commit together as for any other route. A slow provider
then holds none of the connections that every other request needs.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel
from werkzeug.routing import BaseConverter, Map

from tidings.storage.db import Connection
from tidings.storage.tokens import Token

if TYPE_CHECKING:
    from tidings.config import Config
    from tidings.service import Service

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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

    def rolled_back(self) -> None:
        """Forget what was to follow a commit that did not happen."""
        self._after_commit.clear()


class _NoConnection:
    """``Call.conn`` of a route that holds no pooled connection."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            "this route holds no pooled connection (pooled=False): use service.db.run"
        )


NO_CONNECTION: Connection = _NoConnection()


@dataclass(frozen=True)
class Finish:
    """What a ``pooled=False`` handler returns when it writes: ``unit(conn)``
    makes the writes and gives the handler's result (or raises its error),
    run by the pipeline in the request's transaction."""

    unit: Callable[[Connection], Awaitable[Any]]


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
    # A public route that checks a credential of its own instead of a team's
    # token: the OpenAPI security scheme that describes it.
    credential: str | None = None
    # Other success statuses with the same body, and what each means.
    also_ok: tuple[tuple[int, str], ...] = ()
    # The response shows a secret: stored only sealed for idempotent replays.
    secret_response: bool = False
    # The handler awaits only its connection: it runs whole on the asyncio side.
    storage_unit: bool = False
    # False: the handler holds no connection while it waits outside (NO_CONNECTION).
    pooled: bool = True
    # What it accepts counts against the team's quotas (it may answer 402).
    counted: bool = False

    def max_body_bytes(self, config: Config) -> int:
        return config.max_body_bytes if self.body_limit is None else self.body_limit(config)

    def rule(self, routes: Iterable[Route] = ()) -> str:
        """The Quart rule: ``/contacts/{contact_id}`` becomes ``/contacts/<contact_id>``.

        A parameter where one of ``routes`` has a literal name (``/emails/batch``
        beside ``/emails/{email_id}``) never takes that name: a ``GET
        /emails/batch`` is then 405 with ``Allow: POST``, not a bad email id."""
        parts = self.path.split("/")
        rule: list[str] = []
        for index, part in enumerate(parts):
            if not part.startswith("{"):
                rule.append(part)
                continue
            reserved = sorted({
                other[index] for other in (route.path.split("/") for route in routes)
                if len(other) > index and other[:index] == parts[:index]
                and not other[index].startswith("{")
            })
            names = ",".join(repr(name) for name in reserved)
            rule.append(f"<segment({names}):{part[1:-1]}>" if reserved else f"<{part[1:-1]}>")
        return "/".join(rule)

    @property
    def path_params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


class Segment(BaseConverter):
    """A path segment other than the ``reserved`` names (``Route.rule``)."""

    def __init__(self, url_map: Map, *reserved: str) -> None:
        super().__init__(url_map)
        self.regex = "(?!(?:" + "|".join(re.escape(name) for name in reserved) + ")$)[^/]+"


class Routes:
    """The routes of one resource group."""

    def __init__(self, tag: str, *, storage_units: bool = False) -> None:
        self.tag = tag
        self.storage_units = storage_units
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
        credential: str | None = None,
        also_ok: tuple[tuple[int, str], ...] = (),
        secret_response: bool = False,
        storage_unit: bool | None = None,
        pooled: bool = True,
        counted: bool = False,
    ) -> Callable[[Handler], Handler]:
        """Declare a route. ``path_types`` maps path parameters that are not UUIDs
        to ``str`` (handed over as they are); ``body_required=False`` lets a
        request without a body stand for ``{}``; ``storage_unit`` overrides the
        group's ``storage_units`` for this route (a handler that calls a
        provider is not a storage unit); ``pooled=False``: see the module;
        ``counted``: what it accepts counts against the team's quotas."""
        unit = self.storage_units if storage_unit is None else storage_unit
        if unit and not pooled:
            raise ValueError(f"{method} {path}: a storage unit holds its connection")

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
                    credential=credential,
                    also_ok=also_ok,
                    secret_response=secret_response,
                    storage_unit=unit,
                    pooled=pooled,
                    counted=counted,
                )
            )
            return handler

        return register
