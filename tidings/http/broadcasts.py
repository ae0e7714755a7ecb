"""Broadcasts over HTTP: drafts, send and cancel (docs/broadcasts.md).

Handlers check what a broadcast refers to (its sender's domain, segment,
topic and placeholders) and make the moves through
``tidings.storage.broadcasts``, whose conditional statements decide races;
the fanout itself runs on the runtime (``tidings.actors.broadcasts``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, Field, model_validator

from tidings.addresses import MAX_ADDRESS_LENGTH, parse_address
from tidings.fields import FieldError
from tidings.http.envelope import bad_request, conflict, not_found, unprocessable
from tidings.http.models import (
    NOT_EMPTY,
    UNCHANGED,
    ListQuery,
    Moment,
    RequestBody,
    Resource,
    never_null,
)
from tidings.http.paging import page
from tidings.http.routing import Answer, Call, Routes
from tidings.rendering import placeholders
from tidings.rendering_variables import CONTROL_CHARACTERS
from tidings.storage import broadcasts as store
from tidings.storage import contact_properties as properties
from tidings.storage.broadcasts import Content, StaleRevision, WrongState
from tidings.storage.broadcasts_render import keys_of, unknown_keys
from tidings.storage.domains import sending_domain

routes = Routes("Broadcasts")

Status = Literal["draft", "scheduled", "queued", "sent", "failed", "canceled"]
Binding = str | int | float | bool

BINDINGS = (
    "Values of placeholders for every recipient, by key (string, number or boolean); "
    "a contact's own field or property of the same key wins"
)
EDITABLE = (
    "name", "segment_id", "topic_id", "from_email", "from_name", "reply_to_email", "subject",
    "preview_text", "html", "text", "variable_bindings",
)
REQUIRED = ("name", "segment_id", "from_email", "subject", "html")


def _one_line(body: RequestBody) -> None:
    """The fields that become message headers hold no control character,
    line breaks among them (NEL, U+2028 and U+2029 too, as POST /emails)."""
    name: str | None = getattr(body, "from_name", None)
    if name is not None and ("\t" in name or CONTROL_CHARACTERS.search(name)):
        raise ValueError("from_name: control characters (line breaks among them) are not allowed")
    subject: str | None = getattr(body, "subject", None)
    if subject is not None and CONTROL_CHARACTERS.search(subject):
        # As POST /emails and templates: line breaks among them.
        raise ValueError("subject: control characters are not allowed")


class CreateBroadcast(RequestBody):
    name: str = Field(min_length=1, max_length=200)
    segment_id: UUID = Field(description="The audience: a segment of the team")
    topic_id: UUID | None = Field(None, description="Contacts opted out of it are skipped")
    from_email: str = Field(max_length=MAX_ADDRESS_LENGTH, description="On a verified domain")
    from_name: str | None = Field(None, max_length=200)
    reply_to_email: str | None = Field(None, max_length=MAX_ADDRESS_LENGTH)
    subject: str = Field(min_length=1, max_length=998)
    preview_text: str | None = Field(None, max_length=500)
    html: str = Field(min_length=1)
    text: str | None = None
    variable_bindings: dict[str, Binding] = Field(default_factory=dict, description=BINDINGS)

    @model_validator(mode="after")
    def headers_safe(self) -> Self:
        _one_line(self)
        return self


class UpdateBroadcast(RequestBody):
    model_config = NOT_EMPTY

    name: Annotated[str, Field(min_length=1, max_length=200)] | None = UNCHANGED
    segment_id: UUID | None = UNCHANGED
    topic_id: UUID | None = Field(None, description="null removes it")
    from_email: Annotated[str, Field(max_length=MAX_ADDRESS_LENGTH)] | None = (
        UNCHANGED
    )
    from_name: str | None = Field(None, max_length=200, description="null removes it")
    reply_to_email: str | None = Field(None, max_length=MAX_ADDRESS_LENGTH)
    subject: Annotated[str, Field(min_length=1, max_length=998)] | None = (
        UNCHANGED
    )
    preview_text: str | None = Field(None, max_length=500)
    html: Annotated[str, Field(min_length=1)] | None = UNCHANGED
    text: str | None = None
    variable_bindings: dict[str, Binding] | None = Field(
        None, description=BINDINGS, json_schema_extra=never_null
    )
    revision: int | None = Field(
        None, ge=1, description="The revision the change is based on; another one is 409"
    )

    @model_validator(mode="after")
    def meaningful(self) -> Self:
        if not self.model_fields_set - {"revision"}:
            raise ValueError("give at least one field to change")
        for name in (*REQUIRED, "variable_bindings"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name}: must not be null")
        _one_line(self)
        return self


class SendBroadcast(RequestBody):
    scheduled_at: Moment | None = Field(
        None, description="RFC 3339 with a time zone, in the future; absent: send now"
    )

    @model_validator(mode="after")
    def aware(self) -> Self:
        if self.scheduled_at is not None and self.scheduled_at.tzinfo is None:
            raise ValueError("scheduled_at: must carry a time zone (e.g. Z)")
        return self


class BroadcastQuery(ListQuery):
    status: Status | None = None


class BroadcastOut(Resource):
    object: Literal["broadcast"] = "broadcast"
    id: UUID
    team_id: UUID
    name: str
    status: Status
    segment_id: UUID
    topic_id: UUID | None
    from_email: str
    from_name: str | None
    reply_to_email: str | None
    subject: str
    preview_text: str | None
    html: str
    text: str | None
    variable_bindings: dict[str, Any]
    scheduled_at: datetime | None
    queued_at: datetime | None
    sent_at: datetime | None
    canceled_at: datetime | None
    failure_reason: str | None = Field(description="Why it failed; null unless failed")
    audience_count: int
    eligible_count: int
    suppressed_count: int
    queued_count: int
    failed_count: int
    revision: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime


class BroadcastList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BroadcastOut]
    has_more: bool


def _address(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_address(value, field)
    except FieldError as error:  # no address at all: malformed, not impossible
        raise bad_request(str(error)) from None


async def _checked(call: Call, content: Content) -> Content:
    """The content with its addresses normalised (400 for one that is no
    address), once its references hold:
    404 for a segment or topic the team does not have, 422 for a sender off
    the team's verified domains or a placeholder nothing could fill."""
    from_email = _address(content.from_email, "from_email")
    assert from_email is not None
    reply_to = _address(content.reply_to_email, "reply_to_email")
    domain = from_email.rpartition("@")[2]
    if await sending_domain(call.conn, call.team_id, domain) is None:
        raise unprocessable(f"from_email: {domain} is not a verified sending domain of the team")
    if not await store.segment_exists(call.conn, call.team_id, content.segment_id):
        raise not_found(f"segment_id: segment {content.segment_id}")
    if content.topic_id is not None and not await store.topic_exists(
        call.conn, call.team_id, content.topic_id
    ):
        raise not_found(f"topic_id: topic {content.topic_id}")
    keys = keys_of(content.subject, content.html, content.text)
    if keys:
        defined = await properties.property_types(call.conn, call.team_id)
        unknown = unknown_keys(keys, content.variable_bindings, defined)
        if unknown:
            shown = ", ".join("{{{" + key + "}}}" for key in unknown)
            fields = [name for name, value in (("subject", content.subject),
                                               ("html", content.html), ("text", content.text))
                      if set(placeholders(value or "")) & set(unknown)]
            raise unprocessable(
                f"{', '.join(fields)}: placeholders that are neither contact fields, contact "
                f"properties, unsubscribe_url nor keys of variable_bindings: {shown}"
            )
    return Content(**{**content.__dict__, "from_email": from_email, "reply_to_email": reply_to})


async def _find(call: Call, broadcast_id: UUID) -> store.Broadcast:
    found = await store.get(call.conn, call.team_id, broadcast_id)
    if found is None:
        raise not_found("broadcast")
    return found


def _refused(error: WrongState, move: str) -> Exception:
    return conflict(f"the broadcast is {error.status}: {move}")


@routes.route(
    "POST", "/broadcasts", summary="Create a draft broadcast", permission="broadcasts:write",
    body=CreateBroadcast, response=BroadcastOut, status=201,
)
async def create_broadcast(call: Call, body: CreateBroadcast) -> BroadcastOut:
    content = await _checked(call, Content(**body.model_dump()))
    return BroadcastOut.of(await store.create(call.conn, call.team_id, content))


@routes.route(
    "GET", "/broadcasts", summary="List broadcasts, newest first",
    permission="broadcasts:read", query=BroadcastQuery, response=BroadcastList,
)
async def list_broadcasts(call: Call, query: BroadcastQuery) -> dict[str, Any]:
    found = await store.list_page(
        call.conn, call.team_id, query.status, query.limit + 1, query.offset
    )
    return page([BroadcastOut.of(b) for b in found], query.limit)


@routes.route(
    "GET", "/broadcasts/{broadcast_id}", summary="Retrieve a broadcast",
    permission="broadcasts:read", response=BroadcastOut,
)
async def get_broadcast(call: Call, broadcast_id: UUID) -> BroadcastOut:
    return BroadcastOut.of(await _find(call, broadcast_id))


@routes.route(
    "PATCH", "/broadcasts/{broadcast_id}", summary="Change a draft broadcast",
    permission="broadcasts:write", body=UpdateBroadcast, response=BroadcastOut,
)
async def update_broadcast(call: Call, broadcast_id: UUID, body: UpdateBroadcast) -> BroadcastOut:
    # The draft is read and held until the write: PATCHes of one draft take
    # turns, each merging its fields into what the one before it wrote, so
    # that without ``revision`` none is lost and none is refused.
    async with call.conn.transaction():
        current = await store.get(call.conn, call.team_id, broadcast_id, lock=True)
        if current is None:
            raise not_found("broadcast")
        if current.status != "draft":
            raise conflict(f"the broadcast is {current.status}: only a draft can be changed")
        revision = current.revision if body.revision is None else body.revision
        if revision != current.revision:
            raise conflict(
                f"revision {revision} is stale: the broadcast is at revision {current.revision}"
            )
        merged = {name: getattr(current, name) for name in EDITABLE}
        merged.update({name: getattr(body, name)
                       for name in body.model_fields_set if name in merged})
        content = await _checked(call, Content(**merged))
        try:
            updated = await store.update_draft(
                call.conn, call.team_id, broadcast_id, revision, content)
        except WrongState as error:
            raise _refused(error, "only a draft can be changed") from None
        except StaleRevision as error:
            raise conflict(
                f"revision {error.given} is stale: the broadcast is at revision {error.current}"
            ) from None
    if updated is None:
        raise not_found("broadcast")
    return BroadcastOut.of(updated)


@routes.route(
    "DELETE", "/broadcasts/{broadcast_id}", summary="Delete a draft broadcast",
    permission="broadcasts:write", status=204,
)
async def delete_broadcast(call: Call, broadcast_id: UUID) -> Answer:
    try:
        deleted = await store.delete_draft(call.conn, call.team_id, broadcast_id)
    except WrongState as error:
        raise _refused(error, "only a draft can be deleted") from None
    if not deleted:
        raise not_found("broadcast")
    return Answer(204)


@routes.route(
    "POST", "/broadcasts/{broadcast}/send",
    summary="Send a draft broadcast now, or schedule it", permission="broadcasts:send",
    body=SendBroadcast, body_required=False, response=BroadcastOut,
)
async def send_broadcast(call: Call, broadcast: UUID, body: SendBroadcast) -> BroadcastOut:
    # The path parameter is ``broadcast`` here, as the spec names it.
    broadcast_id = broadcast
    current = await _find(call, broadcast_id)
    if current.status != "draft":
        raise conflict(f"the broadcast is {current.status}: only a draft can be sent")
    at = body.scheduled_at
    if at is not None:
        if at <= datetime.now(UTC):
            raise unprocessable("scheduled_at: must be in the future")
        at = at.astimezone(UTC)
    await _checked(call, Content(**{name: getattr(current, name) for name in EDITABLE}))
    try:
        sent = await store.send(call.conn, call.team_id, broadcast_id, at)
    except WrongState as error:
        raise _refused(error, "only a draft can be sent") from None
    if sent is None:
        raise not_found("broadcast")
    call.after_commit(lambda: call.service.broadcasts.wake(broadcast_id))
    return BroadcastOut.of(sent)


@routes.route(
    "POST", "/broadcasts/{broadcast}/cancel",
    summary="Cancel a broadcast: scheduled back to draft, queued to canceled",
    permission="broadcasts:send", response=BroadcastOut,
)
async def cancel_broadcast(call: Call, broadcast: UUID) -> BroadcastOut:
    try:
        canceled = await store.cancel(call.conn, call.team_id, broadcast)
    except WrongState as error:
        raise _refused(error, "only a scheduled or queued broadcast can be canceled") from None
    if canceled is None:
        raise not_found("broadcast")
    return BroadcastOut.of(canceled)


