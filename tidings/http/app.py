"""The Quart application: every group's routes, and errors as envelopes.

No response leaves without an envelope: unknown routes, wrong methods,
oversized bodies and unexpected exceptions included. A stack trace goes to
the log, never into a response.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from quart import Response, g, request
from quart.wrappers import BaseRequestWebsocket
from quart_trio import QuartTrio
from werkzeug.exceptions import BadHost, HTTPException
from werkzeug.routing import MapAdapter

from tidings.http import (
    broadcasts,
    contact_import,
    contact_properties,
    contacts,
    domains,
    email_reports,
    emails,
    envelope,
    events,
    openapi,
    providers_twilio,
    segments,
    sender_ids,
    sms,
    sms_list,
    suppressions,
    system,
    templates,
    tokens,
    topics,
    unsubscribe,
    webhooks,
)
from tidings.http.envelope import (
    ApiError,
    error_body,
    error_response,
    json_response,
    storage_failure,
)
from tidings.http.frontdoor import FrontDoor, http_error_answer
from tidings.http.pipeline import make_view
from tidings.http.ratelimit import RateLimiter
from tidings.http.routing import Route, Routes, Segment
from tidings.http.shedding import Shedder
from tidings.logging_setup import choose_request_id, log_access, request_id
from tidings.storage.errors import Duplicate
from tidings.storage.quotas import QuotaExceeded

if TYPE_CHECKING:
    from tidings.service import Service

log = logging.getLogger("tidings.http")

REQUEST_ID_HEADER = "X-Request-Id"

GROUPS: tuple[Routes, ...] = (
    system.routes,
    tokens.routes,
    contacts.routes,
    contact_import.routes,
    contact_properties.routes,
    topics.routes,
    segments.routes,
    suppressions.routes,
    templates.routes,
    emails.routes,
    webhooks.routes,
    events.routes,
    domains.routes,
    email_reports.routes,
    sender_ids.routes,
    sms.routes,
    sms_list.routes,
    providers_twilio.routes,
    broadcasts.routes,
    unsubscribe.routes,
)

def _route_template(rule: str | None) -> str:
    """The route as the docs write it (``/contacts/{contact_id}``); ``unmatched``
    when no route takes the request (404, 405)."""
    if rule is None:
        return "unmatched"
    return re.sub(r"<(?:[^:>]*:)?([^>]+)>", r"{\1}", rule)


def all_routes() -> list[Route]:
    return [route for group in GROUPS for route in group.items]


def http_error(error: HTTPException) -> Response:
    return json_response(*http_error_answer(
        error, request.method, request.path, request.max_content_length
    ))


class TidingsApp(QuartTrio):
    """Quart on trio, routing by method and path alone."""

    def create_url_adapter(self, request: BaseRequestWebsocket | None) -> MapAdapter | None:
        # Quart binds its routes to the request's host, which werkzeug
        # encodes with IDNA first: a Host such as "." or "x..y" (valid
        # reg-names, RFC 3986 §3.2.2) failed that, outside every error
        # handler, as a 500. No route of Tidings depends on the host.
        try:
            return super().create_url_adapter(request)
        except BadHost:
            assert request is not None  # without a request, nothing is bound to a host
            return self.url_map.bind(
                "localhost", request.root_path, None, request.scheme, request.method,
                request.path, request.query_string.decode(),
            )


def create_app(service: Service) -> QuartTrio:
    app = TidingsApp("tidings")
    # What any request may buffer; each route enforces its own limit within it.
    app.config["MAX_CONTENT_LENGTH"] = max(
        route.max_body_bytes(service.config) for route in all_routes()
    )
    app.url_map.strict_slashes = False
    app.config[openapi.ROUTES_CONFIG] = all_routes()
    rate_limiter = RateLimiter(
        service.config.rate_limit_per_second, service.config.rate_limit_burst,
        # Half the places in flight at most for one team's bodies still arriving.
        uploads_per_team=max(1, service.config.max_in_flight // 2),
    )

    app.url_map.converters["segment"] = Segment
    for route in all_routes():
        app.add_url_rule(
            route.rule(all_routes()),
            endpoint=f"{route.method} {route.path}",
            view_func=make_view(service, route, rate_limiter),
            methods=[route.method],
        )

    @app.before_request
    async def start_clock() -> None:
        g.started = time.perf_counter()
        g.request_id = choose_request_id(request.headers.get(REQUEST_ID_HEADER))
        request_id.set(g.request_id)

    @app.after_request
    async def count(response: Response) -> Response:
        if request.method == "OPTIONS" and response.status_code == 200 and "Allow" in (
            response.headers
        ):
            # Quart's automatic answer: the methods are in Allow, and there is
            # no body (so no text/html content type) to announce.
            response.status_code = 204
            response.headers.pop("Content-Type", None)
            response.set_data(b"")
            response.headers.pop("Content-Length", None)  # none on a 204: RFC 9110 §8.6
        route = _route_template(request.url_rule.rule if request.url_rule is not None else None)
        started = getattr(g, "started", None)
        elapsed = 0.0 if started is None else time.perf_counter() - started
        service.metrics.observe(request.method, route, response.status_code, elapsed)
        rid = getattr(g, "request_id", None) or choose_request_id(None)
        response.headers[REQUEST_ID_HEADER] = rid
        log_access(
            request.method, route, response.status_code, elapsed, getattr(g, "team_id", None),
            rid,
        )
        return response

    app.register_error_handler(Duplicate, envelope.duplicate_response)
    app.register_error_handler(QuotaExceeded, envelope.quota_response)

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def werkzeug_error(error: HTTPException) -> Response:
        return http_error(error)

    @app.errorhandler(Exception)
    async def unexpected(error: Exception) -> Response:
        if (failure := storage_failure(error)) is not None:
            log.warning("%s %s: %s (%s)", request.method, request.path, failure.message, error)
            return error_response(failure)
        log.error("unhandled error in %s %s", request.method, request.path, exc_info=error)
        return json_response(
            500, error_body("INTERNAL_ERROR", "internal error; the details are in the server log")
        )

    # Storage-unit routes are answered without Quart's per-request machinery.
    front_door = FrontDoor(
        app.asgi_app, service, rate_limiter, app.url_map, all_routes(),
        body_timeout=app.config["BODY_TIMEOUT"], response_timeout=app.config["RESPONSE_TIMEOUT"],
    )
    # Sheds load before any work is done for a request (the ASGI middleware
    # idiom: hypercorn calls app(), which calls app.asgi_app).
    app.asgi_app = Shedder(  # type: ignore[method-assign]
        front_door,  # type: ignore[arg-type]
        max_in_flight=service.config.max_in_flight,
        max_storage=service.config.db_pool_size + service.config.max_db_waiters,
        on_answer=lambda method, route, status: service.metrics.observe(
            method, route, status, 0.0
        ),
    )
    return app
