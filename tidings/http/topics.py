"""Topics over HTTP, and each contact's subscription per topic.

A contact that has made no choice for a topic has the topic's
``default_subscription``; ``GET /contacts/{id}/topics`` shows the effective
value and whether it is that default.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, Field, model_validator

from tidings.http.contacts import CONTACT_REF, contact_ref, find_contact_id
from tidings.http.envelope import not_found
from tidings.http.models import NOT_EMPTY, RequestBody, Resource, never_null
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Routes
from tidings.storage import contacts as contact_store
from tidings.storage import topics as store
from tidings.storage.topics import Subscription

routes = Routes("Topics", storage_units=True)

DEFAULT_SUBSCRIPTION = (
    "The subscription of contacts that made no choice: opt_in (they receive the topic "
    "until they opt out) or opt_out (only those who opt in receive it)"
)


class CreateTopic(RequestBody):
    name: str = Field(min_length=1, max_length=100)
    description: str | None = Field(None, max_length=500)
    default_subscription: Subscription = Field(description=DEFAULT_SUBSCRIPTION)


class UpdateTopic(RequestBody):
    """Only the fields given change; ``null`` clears the description, while
    ``name`` and ``default_subscription`` may be changed, not cleared."""

    model_config = NOT_EMPTY

    name: str | None = Field(None, min_length=1, max_length=100, json_schema_extra=never_null)
    description: str | None = Field(None, max_length=500, description="null clears it")
    default_subscription: Subscription | None = Field(
        None, description=DEFAULT_SUBSCRIPTION, json_schema_extra=never_null
    )

    @model_validator(mode="after")
    def meaningful(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("give at least one field to change")
        for name in ("name", "default_subscription"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name}: must not be null")
        return self


class TopicOut(Resource):
    object: Literal["topic"] = "topic"
    id: UUID
    team_id: UUID
    name: str
    description: str | None
    default_subscription: Subscription
    created_at: datetime
    updated_at: datetime


class TopicList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TopicOut]
    has_more: bool


class ContactTopicOut(Resource):
    """A topic as one contact has it."""

    object: Literal["contact_topic"] = "contact_topic"
    id: UUID = Field(description="The topic's id")
    name: str
    description: str | None
    default_subscription: Subscription
    subscription: Subscription = Field(description="Effective: the contact's choice or the default")
    is_default: bool = Field(description="True when the contact made no choice for this topic")


class ContactTopicList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ContactTopicOut]
    has_more: bool


class TopicChoice(RequestBody):
    id: UUID = Field(description="A topic of the team")
    subscription: Subscription | None = Field(
        description="opt_in, opt_out, or null to remove the choice (back to the default)"
    )


class UpdateContactTopics(RequestBody):
    topics: list[TopicChoice] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def distinct(self) -> Self:
        seen: set[UUID] = set()
        for choice in self.topics:
            if choice.id in seen:
                raise ValueError(f"topics: topic {choice.id} is listed twice")
            seen.add(choice.id)
        return self


@routes.route(
    "POST", "/topics", summary="Create a topic", permission="contacts:write",
    body=CreateTopic, response=TopicOut, status=201,
)
async def create_topic(call: Call, body: CreateTopic) -> TopicOut:
    topic = await store.create_topic(
        call.conn, call.team_id, body.name, body.description, body.default_subscription
    )
    return TopicOut.of(topic)


@routes.route(
    "GET", "/topics", summary="List topics", permission="contacts:read",
    query=Paging, response=TopicList,
)
async def list_topics(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_topics(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([TopicOut.of(topic) for topic in found], query.limit)


@routes.route(
    "GET", "/topics/{topic_id}", summary="Retrieve a topic", permission="contacts:read",
    response=TopicOut,
)
async def get_topic(call: Call, topic_id: UUID) -> TopicOut:
    topic = await store.get_topic(call.conn, call.team_id, topic_id)
    if topic is None:
        raise not_found("topic")
    return TopicOut.of(topic)


@routes.route(
    "PATCH", "/topics/{topic_id}", summary="Update a topic", permission="contacts:write",
    body=UpdateTopic, response=TopicOut,
)
async def update_topic(call: Call, topic_id: UUID, body: UpdateTopic) -> TopicOut:
    topic = await store.update_topic(
        call.conn, call.team_id, topic_id,
        name=body.name,
        description_given="description" in body.model_fields_set,
        description=body.description,
        default=body.default_subscription,
    )
    if topic is None:
        raise not_found("topic")
    return TopicOut.of(topic)


@routes.route(
    "DELETE", "/topics/{topic_id}", summary="Delete a topic and every choice made for it",
    permission="contacts:write", status=204,
)
async def delete_topic(call: Call, topic_id: UUID) -> Answer:
    if not await store.delete_topic(call.conn, call.team_id, topic_id):
        raise not_found("topic")
    return Answer(204)


@routes.route(
    "GET", "/contacts/{contact_id}/topics",
    summary="A contact's (by id or email) subscription to each topic",
    permission="contacts:read", query=Paging, response=ContactTopicList, path_types=CONTACT_REF,
)
async def get_contact_topics(call: Call, contact_id: str, query: Paging) -> dict[str, Any]:
    found = await store.contact_topics(
        call.conn, call.team_id, await find_contact_id(call, contact_id),
        query.limit + 1, query.offset,
    )
    return page([ContactTopicOut.of(entry) for entry in found], query.limit)


@routes.route(
    "PATCH", "/contacts/{contact_id}/topics",
    summary="Set a contact's (by id or email) subscription to topics",
    permission="contacts:write", body=UpdateContactTopics, response=ContactTopicList,
    path_types=CONTACT_REF,
)
async def update_contact_topics(
    call: Call, contact_id: str, body: UpdateContactTopics
) -> dict[str, Any]:
    ref = contact_ref(contact_id)
    choices = {choice.id: choice.subscription for choice in body.topics}
    async with call.conn.transaction():
        # Locked, the contact and the topics cannot be deleted before the
        # choices are in.
        contact = await contact_store.lock_contact(call.conn, call.team_id, ref)
        if contact is None:
            raise not_found("contact")
        unknown = await store.lock_topics(call.conn, call.team_id, list(choices))
        if unknown:
            raise not_found(f"topic {unknown[0]}")
        await store.set_choices(call.conn, contact, choices)
        found = await store.contact_topics(
            call.conn, call.team_id, contact, len(choices), 0, only=list(choices)
        )
    return page([ContactTopicOut.of(entry) for entry in found], len(choices))
