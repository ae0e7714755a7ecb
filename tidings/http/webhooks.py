"""Webhook endpoints and their deliveries over HTTP (CONTRACT §4)."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tidings.http.envelope import ApiError, conflict, not_found
from tidings.http.models import NOT_EMPTY, RequestBody, list_of, never_null
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Finish, Routes
from tidings.storage import events as event_store
from tidings.storage import webhooks as store
from tidings.storage.connection import Connection
from tidings.webhooks.catalogue import ALL_EVENTS, EVENT_TYPES, TEST_EVENT
from tidings.webhooks.safety import TooManyChecks, UnsafeTarget
from tidings.webhooks.urls import MAX_URL_LENGTH, check_url

routes = Routes("Webhooks")

SECRET_PREFIX = "whsec_"
# How long a rotated-out secret keeps signing.
ROTATION_OVERLAP_SECONDS = 24 * 3600
# When a team with too many URL checks in progress may try again.
CHECK_RETRY_AFTER_SECONDS = 1
# Every type of the catalogue, and "*". Repeats do not count: they are kept once.
MAX_EVENTS = len(EVENT_TYPES) + 1
EVENTS_DESCRIPTION = (
    f'Event types to receive, or ["*"] for every type: at most {MAX_EVENTS} distinct '
    "entries (repeats are kept once)"
)

DeliveryStatus = Literal["pending", "retrying", "succeeded", "failed"]


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def check_events(events: list[str]) -> list[str]:
    unknown = [name for name in events if name != ALL_EVENTS and name not in EVENT_TYPES]
    if unknown:
        raise ValueError(
            f"unknown event type {unknown[0]!r}; see GET /event-types, or use {ALL_EVENTS!r}"
        )
    distinct = list(dict.fromkeys(events))  # without repeats, in the order given
    if len(distinct) > MAX_EVENTS:
        raise ValueError(f"at most {MAX_EVENTS} distinct event types")
    return distinct


class CreateEndpoint(RequestBody):
    url: str = Field(min_length=1, max_length=MAX_URL_LENGTH)
    events: list[str] = Field(min_length=1, description=EVENTS_DESCRIPTION)
    description: str | None = Field(None, max_length=500)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url(value)

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[str]) -> list[str]:
        return check_events(value)


class UpdateEndpoint(RequestBody):
    """Only the fields given change; ``null`` clears the description, while
    ``url`` and ``events`` may be changed, not removed (refused by the route).
    ``{}`` changes nothing and is refused, as every PATCH of the API does."""

    model_config = NOT_EMPTY

    url: str | None = Field(
        None, min_length=1, max_length=MAX_URL_LENGTH, json_schema_extra=never_null
    )
    events: list[str] | None = Field(
        None, min_length=1, description=EVENTS_DESCRIPTION, json_schema_extra=never_null
    )
    description: str | None = Field(None, max_length=500)

    @model_validator(mode="after")
    def _something(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("give at least one field to change")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else check_events(value)


class EndpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: UUID
    url: str
    events: list[str]
    description: str | None
    status: Literal["enabled", "disabled"]
    consecutive_failures: int = Field(
        description="Deliveries that exhausted their retries since the last success or re-enable"
    )
    last_failure_at: datetime | None
    disabled_reason: Literal["manual", "failure_threshold"] | None
    disabled_at: datetime | None
    created_at: datetime
    updated_at: datetime


class EndpointWithSecret(EndpointOut):
    """An endpoint with its signing secret: only in create and rotate answers."""

    secret: str


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    number: int
    started_at: datetime
    duration_ms: int
    response_status: int | None
    response_body: str | None = Field(description="The first 2 KiB of the response body")
    error: str | None


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    object: Literal["webhook_delivery"] = "webhook_delivery"
    id: UUID
    endpoint_id: UUID
    event_id: UUID
    event_type: str
    status: DeliveryStatus
    attempt_count: int
    next_attempt_at: datetime | None
    response_status: int | None
    response_body: str | None = Field(description="The first 2 KiB of the last response body")
    error: str | None
    created_at: datetime
    updated_at: datetime


class DeliveryWithAttempts(DeliveryOut):
    attempts: list[AttemptOut]


class DeliveryQuery(Paging):
    status: DeliveryStatus | None = None


async def _vet_target(call: Call, url: str) -> None:
    try:
        await call.service.webhooks.guard.check_url(url, call.team_id)
    except TooManyChecks as busy:
        raise ApiError(
            429, "TOO_MANY_REQUESTS",
            f"url: {busy}; retry once they are done",
            {"Retry-After": str(CHECK_RETRY_AFTER_SECONDS)},
        ) from None
    except UnsafeTarget as refused:
        raise ApiError(
            422,
            "UNPROCESSABLE_ENTITY",
            f"url: {refused}; webhooks may not target loopback, private, link-local, "
            "multicast or unspecified addresses",
        ) from None


def _found(endpoint: store.Endpoint | None) -> store.Endpoint:
    """The endpoint a storage call found, or 404 (also for another team's)."""
    if endpoint is None:
        raise not_found("webhook endpoint")
    return endpoint


async def _endpoint(call: Call, endpoint_id: UUID) -> store.Endpoint:
    return _found(await store.get_endpoint(call.conn, call.team_id, endpoint_id))


@routes.route(
    "POST", "/webhook-endpoints", summary="Create a webhook endpoint",
    permission="webhooks:write", body=CreateEndpoint, response=EndpointWithSecret, status=201,
    secret_response=True, pooled=False,
)
async def create_endpoint(call: Call, body: CreateEndpoint) -> Finish:
    # No connection is held while the URL's name is resolved (``pooled=False``).
    await _vet_target(call, body.url)
    team_id = call.team_id

    async def create(conn: Connection) -> EndpointWithSecret:
        endpoint = await store.create_endpoint(
            conn, team_id, url=body.url, events=body.events, description=body.description,
            secret=new_secret(),
        )
        return EndpointWithSecret.model_validate(endpoint)

    return Finish(create)


@routes.route(
    "GET", "/webhook-endpoints", summary="List webhook endpoints", permission="webhooks:read",
    query=Paging, response=list_of(EndpointOut),
)
async def list_endpoints(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_endpoints(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([EndpointOut.model_validate(endpoint) for endpoint in found], query.limit)


@routes.route(
    "GET", "/webhook-endpoints/{endpoint_id}", summary="Retrieve a webhook endpoint",
    permission="webhooks:read", response=EndpointOut,
)
async def get_endpoint(call: Call, endpoint_id: UUID) -> EndpointOut:
    return EndpointOut.model_validate(await _endpoint(call, endpoint_id))


@routes.route(
    "PATCH", "/webhook-endpoints/{endpoint_id}", summary="Update a webhook endpoint",
    permission="webhooks:write", body=UpdateEndpoint, response=EndpointOut, pooled=False,
)
async def update_endpoint(call: Call, endpoint_id: UUID, body: UpdateEndpoint) -> Finish:
    given = body.model_fields_set
    for name in ("url", "events"):
        if name in given and getattr(body, name) is None:
            raise ApiError(400, "BAD_REQUEST", f"{name}: may be changed but not removed")
    if body.url is not None:
        await _vet_target(call, body.url)
    team_id = call.team_id

    async def update(conn: Connection) -> EndpointOut:
        endpoint = await store.update_endpoint(
            conn, team_id, endpoint_id, url=body.url, events=body.events,
            description=body.description, set_description="description" in given,
        )
        return EndpointOut.model_validate(_found(endpoint))

    return Finish(update)


@routes.route(
    "DELETE", "/webhook-endpoints/{endpoint_id}",
    summary="Delete a webhook endpoint with its deliveries and their attempts",
    permission="webhooks:write", status=204,
)
async def delete_endpoint(call: Call, endpoint_id: UUID) -> Answer:
    if not await store.delete_endpoint(call.conn, call.team_id, endpoint_id):
        raise not_found("webhook endpoint")
    return Answer(204)


@routes.route(
    "POST", "/webhook-endpoints/{endpoint_id}/disable", summary="Disable a webhook endpoint",
    permission="webhooks:write", response=EndpointOut,
)
async def disable_endpoint(call: Call, endpoint_id: UUID) -> EndpointOut:
    endpoint = await store.disable_endpoint(call.conn, call.team_id, endpoint_id)
    return EndpointOut.model_validate(_found(endpoint))


@routes.route(
    "POST", "/webhook-endpoints/{endpoint_id}/enable",
    summary="Re-enable a disabled webhook endpoint (its failure count starts over); "
    "an enabled one is left as it is",
    permission="webhooks:write", response=EndpointOut,
)
async def enable_endpoint(call: Call, endpoint_id: UUID) -> EndpointOut:
    endpoint = await store.enable_endpoint(call.conn, call.team_id, endpoint_id)
    return EndpointOut.model_validate(_found(endpoint))


@routes.route(
    "POST", "/webhook-endpoints/{endpoint_id}/rotate-secret",
    summary="Give a webhook endpoint a new secret; the old one keeps signing for 24 hours",
    permission="webhooks:write", response=EndpointWithSecret, secret_response=True,
)
async def rotate_secret(call: Call, endpoint_id: UUID) -> EndpointWithSecret:
    endpoint = await store.rotate_secret(
        call.conn, call.team_id, endpoint_id, new_secret(), ROTATION_OVERLAP_SECONDS
    )
    return EndpointWithSecret.model_validate(_found(endpoint))


@routes.route(
    "POST", "/webhook-endpoints/{endpoint_id}/test",
    summary="Send a webhook.test event to this endpoint alone",
    permission="webhooks:write", response=DeliveryOut, status=202,
)
async def test_endpoint(call: Call, endpoint_id: UUID) -> DeliveryOut:
    async with call.conn.transaction():
        endpoint = await _endpoint(call, endpoint_id)
        if endpoint.status != "enabled":
            raise conflict("the webhook endpoint is disabled; enable it to send a test event")
        event, _count = await event_store.record_event(
            call.conn,
            call.team_id,
            TEST_EVENT,
            data={"endpoint_id": str(endpoint.id), "description": EVENT_TYPES[TEST_EVENT]},
            only_endpoint=endpoint.id,
        )
        deliveries = await store.deliveries_of_event(call.conn, call.team_id, event.id)
    if not deliveries:  # disabled in the meantime
        raise conflict("the webhook endpoint is disabled; enable it to send a test event")
    return DeliveryOut.model_validate(deliveries[0])


@routes.route(
    "GET", "/webhook-endpoints/{endpoint_id}/deliveries",
    summary="List an endpoint's deliveries, newest first", permission="webhooks:read",
    query=DeliveryQuery, response=list_of(DeliveryOut),
)
async def list_deliveries(call: Call, endpoint_id: UUID, query: DeliveryQuery) -> dict[str, Any]:
    await _endpoint(call, endpoint_id)
    found = await store.list_deliveries(
        call.conn, call.team_id, endpoint_id, query.limit + 1, query.offset, query.status
    )
    return page([DeliveryOut.model_validate(delivery) for delivery in found], query.limit)


@routes.route(
    "GET", "/webhook-deliveries/{delivery_id}", summary="Retrieve a delivery with its attempts",
    permission="webhooks:read", response=DeliveryWithAttempts,
)
async def get_delivery(call: Call, delivery_id: UUID) -> DeliveryWithAttempts:
    delivery = await store.get_delivery(call.conn, call.team_id, delivery_id)
    if delivery is None:
        raise not_found("webhook delivery")
    return DeliveryWithAttempts.model_validate(delivery)


@routes.route(
    "POST", "/webhook-deliveries/{delivery_id}/retry",
    summary="Send a failed delivery once more", permission="webhooks:write",
    response=DeliveryOut,
)
async def retry_delivery(call: Call, delivery_id: UUID) -> DeliveryOut:
    try:
        delivery = await store.retry_delivery(call.conn, call.team_id, delivery_id)
    except store.NotFailed as refused:
        raise conflict(
            f"only a failed delivery can be retried; this one is {refused.status}"
        ) from None
    if delivery is None:
        raise not_found("webhook delivery")
    return DeliveryOut.model_validate(delivery)
