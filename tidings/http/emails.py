"""Emails over HTTP: send (one or a batch), list, get, reschedule, cancel, events.

The routes are storage units (``tidings/http/pipeline.py``): a request's
whole storage work (token, idempotency, the template, the sending domain and
suppression check, the insert of the emails with their first events and the
team's quota) runs on the asyncio side in one crossing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, RootModel

from tidings.http.emails_input import (
    MAX_ADDRESS_FIELD,
    InputError,
    SendEmail,
    address_list,
    check_headers,
    check_schedule,
    mailbox,
    recipient_lookup,
    shown,
    template_ref,
)
from tidings.http.envelope import ApiError, bad_request, conflict, not_found, unprocessable
from tidings.http.models import CreatedRangeQuery, Moment, RequestBody
from tidings.http.paging import MAX_LIMIT, QueryInt
from tidings.http.routing import Call, Routes
from tidings.rendering import RenderError, render, subject_fault
from tidings.storage import emails_accept as store
from tidings.storage import emails_manage as manage
from tidings.storage import templates as template_store

routes = Routes("Email", storage_units=True)

MAX_BATCH = 100
Status = Literal[
    "scheduled", "queued", "sent", "delivered", "delivery_delayed", "bounced",
    "complained", "failed", "suppressed", "canceled",
]


class Accepted(BaseModel):
    object: Literal["email"] = "email"
    id: UUID


class AcceptedList(BaseModel):
    """The list shape of CONTRACT §2; a batch is answered whole, so nothing
    more is ever left to fetch."""

    object: Literal["list"] = "list"
    data: list[Accepted]
    has_more: Literal[False] = False


class BatchBody(RootModel[list[SendEmail]]):
    root: list[SendEmail] = Field(min_length=1, max_length=MAX_BATCH)


class TagOut(BaseModel):
    name: str
    value: str


class EmailOut(BaseModel):
    object: Literal["email"] = "email"
    id: UUID
    from_: str = Field(serialization_alias="from")
    to: list[str]
    cc: list[str]
    bcc: list[str]
    reply_to: list[str]
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    tags: list[TagOut]
    status: Status
    scheduled_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, email: manage.Email) -> EmailOut:
        return cls(
            id=email.id, from_=email.from_address, to=email.to_addresses, cc=email.cc,
            bcc=email.bcc, reply_to=email.reply_to, subject=email.subject, html=email.html,
            text=email.text, headers=email.headers,
            tags=[TagOut(**tag) for tag in email.tags], status=email.status,  # type: ignore[arg-type]
            scheduled_at=email.scheduled_at, created_at=email.created_at,
            updated_at=email.updated_at,
        )

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class EmailList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmailOut]
    has_more: bool


class EmailQuery(CreatedRangeQuery):
    status: Status | None = None
    to: str | None = Field(
        None, min_length=1, max_length=320, description="A recipient in `to`; case-insensitive"
    )


class EventQuery(BaseModel):
    """Paging of an email's events: the spec's own rule (default 100; above
    100 falls back to 100)."""

    model_config = ConfigDict(extra="forbid")

    limit: QueryInt = Field(MAX_LIMIT, ge=1, description="1 to 100, default 100")
    offset: QueryInt = Field(0, ge=0, le=1_000_000_000)


class EmailEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: UUID
    type: str
    recipient: str | None
    occurred_at: datetime
    provider: str | None
    code: str | None
    message: str | None


class EmailEventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmailEventOut]


class Reschedule(RequestBody):
    scheduled_at: Moment = Field(description="RFC 3339; in the future, at most 30 days ahead")


def _prefixed(index: int | None, message: str) -> str:
    return message if index is None else f"{index}.{message}"


async def prepare(
    call: Call, body: SendEmail, now: datetime, index: int | None = None
) -> store.NewEmail:
    """The email ``body`` asks for: addresses parsed, template rendered (400/404/422)."""
    try:
        return await _prepare(call, body, now)
    except InputError as error:
        raise ApiError(
            error.status,
            "BAD_REQUEST" if error.status == 400 else "UNPROCESSABLE_ENTITY",
            _prefixed(index, error.message),
        ) from None
    except ApiError as error:
        error.message = _prefixed(index, error.message)
        raise


def _of_template(error: InputError) -> InputError:
    """A refusal of an address the template's version gave (a version stored
    before a rule that now refuses it): 422, as the body itself is fine."""
    return InputError(422, f"template.{error.message}")


async def _prepare(call: Call, body: SendEmail, now: datetime) -> store.NewEmail:
    from_ = body.from_
    reply_to: str | list[str] | None = body.reply_to
    template_id = version_id = None
    html: str | None
    text: str | None
    if body.template is not None:
        ref = template_ref(body.template)
        template = await template_store.get_template(call.conn, call.team_id, ref)
        if template is None:
            raise not_found("template")
        if template.published_version_id is None:
            raise InputError(422, "template: has no published version to send")
        versions = await template_store.get_versions(
            call.conn, call.team_id, [template.published_version_id]
        )
        version = versions.get(template.published_version_id)
        if version is None:  # deleted, with its versions, since it was read
            raise not_found("template")
        try:
            rendered = render(version, body.template.variables)
        except RenderError as error:
            raise InputError(422, f"template.{error}") from None
        subject, html, text = rendered.subject, rendered.html, rendered.text
        # As a subject given directly must fit a line and hold one character:
        # an email without one reads as spam, and its variables were likely wrong.
        if (fault := subject_fault(subject)) is not None:
            raise InputError(422, f"template: {fault}")
        if from_ is None and version.from_email is not None:
            from_ = shown(version.from_email, version.from_name)
        if reply_to is None and version.reply_to_email is not None:
            reply_to = version.reply_to_email
        template_id, version_id = template.id, version.id
    else:
        assert body.subject is not None
        subject, html, text = body.subject, body.html, body.text
    if from_ is None:
        status = 400 if body.template is None else 422
        raise InputError(status, "from: is required (the template has no sender)")
    try:
        from_email, from_name = mailbox("from", from_)
    except InputError as error:
        raise error if body.from_ is not None else _of_template(error) from None
    to = address_list("to", body.to)
    cc = address_list("cc", body.cc)
    bcc = address_list("bcc", body.bcc)
    try:
        replies = address_list("reply_to", reply_to)
    except InputError as error:
        raise error if body.reply_to is not None else _of_template(error) from None
    send_to: dict[str, str] = {}
    for address, _name in to + cc + bcc:
        send_to.setdefault(address.lower(), address)
    from_shown = shown(from_email, from_name)
    if len(from_shown) > MAX_ADDRESS_FIELD:
        raise InputError(400, f"from: at most {MAX_ADDRESS_FIELD} characters")
    return store.NewEmail(
        from_address=from_shown,
        from_email=from_email,
        to=[shown(a, n) for a, n in to],
        to_lookup=[a for a, _ in to],  # lowercased by PostgreSQL as it is stored
        cc=[shown(a, n) for a, n in cc],
        bcc=[shown(a, n) for a, n in bcc],
        reply_to=[shown(a, n) for a, n in replies],
        send_to=list(send_to.values()),
        subject=subject,
        html=html,
        text=text,
        headers=check_headers(body.headers or {}),
        tags=[{"name": tag.name, "value": tag.value} for tag in body.tags or ()],
        scheduled_at=check_schedule(body.scheduled_at, now),
        domain=from_email.rpartition("@")[2].lower(),
        provider=call.service.config.email_provider,
        template_id=template_id,
        template_version_id=version_id,
    )


async def accept(call: Call, emails: list[store.NewEmail], batch: bool) -> None:
    try:
        if batch:
            await store.accept(call.conn, call.team_id, emails, call.service.config.quotas)
        else:
            await call.service.emails.accepting.store(call.conn, call.team_id, emails)
    except store.UnverifiedDomain as error:
        where = f"{error.index}.from" if batch else "from"
        raise unprocessable(
            f"{where}: {error.domain!r} is not a verified sending domain of the team "
            "(POST /domains, then POST /domains/{id}/verify)"
        ) from None


@routes.route(
    "POST", "/emails", summary="Send an email (now or at scheduled_at)",
    permission="email:send", body=SendEmail, response=Accepted, status=202, counted=True,
)
async def send_email(call: Call, body: SendEmail) -> Accepted:
    email = await prepare(call, body, datetime.now(UTC))
    await accept(call, [email], batch=False)
    return Accepted(id=email.id)


@routes.route(
    "POST", "/emails/batch", summary="Send up to 100 emails at once: all or none",
    permission="email:send", body=BatchBody, response=AcceptedList, status=202, counted=True,
)
async def send_batch(call: Call, body: BatchBody) -> AcceptedList:
    now = datetime.now(UTC)
    emails = [await prepare(call, item, now, index) for index, item in enumerate(body.root)]
    await accept(call, emails, batch=True)
    return AcceptedList(data=[Accepted(id=email.id) for email in emails])


@routes.route(
    "GET", "/emails", summary="List emails, newest first", permission="email:read",
    query=EmailQuery, response=EmailList,
)
async def list_emails(call: Call, query: EmailQuery) -> dict[str, Any]:
    if query.start_date is not None and query.start_date.tzinfo is None:
        raise bad_request("invalid query: start_date: must carry a time zone (e.g. Z)")
    if query.end_date is not None and query.end_date.tzinfo is None:
        raise bad_request("invalid query: end_date: must carry a time zone (e.g. Z)")
    if query.end_precedes_start:
        raise bad_request("invalid query: end_date: must not precede start_date")
    to = None if query.to is None else recipient_lookup(query.to)
    where = manage.EmailFilter(status=query.status, to=to, start=query.starts_from,
                               end=query.end_date)
    found = await manage.list_emails(call.conn, call.team_id, where, query.limit + 1, query.offset)
    return {
        "object": "list",
        "data": [EmailOut.of(email).dump() for email in found[: query.limit]],
        "has_more": len(found) > query.limit,
    }


@routes.route(
    "GET", "/emails/{email_id}", summary="Retrieve an email", permission="email:read",
    response=EmailOut,
)
async def get_email(call: Call, email_id: UUID) -> dict[str, Any]:
    email = await manage.get_email(call.conn, call.team_id, email_id)
    if email is None:
        raise not_found("email")
    return EmailOut.of(email).dump()


@routes.route(
    "PATCH", "/emails/{email_id}", summary="Reschedule a scheduled email",
    permission="email:send", body=Reschedule, response=EmailOut,
)
async def reschedule_email(call: Call, email_id: UUID, body: Reschedule) -> dict[str, Any]:
    if body.scheduled_at.tzinfo is None:
        raise bad_request("invalid body: scheduled_at: must carry a time zone (e.g. Z)")
    try:
        when = check_schedule(body.scheduled_at, datetime.now(UTC))
    except InputError as error:
        raise unprocessable(error.message) from None
    assert when is not None
    try:
        email = await manage.reschedule(call.conn, call.team_id, email_id, when)
    except manage.NotScheduled as state:
        raise conflict(
            f"the email is {state.status}: only a scheduled email can be rescheduled"
        ) from None
    if email is None:
        raise not_found("email")
    return EmailOut.of(email).dump()


@routes.route(
    "POST", "/emails/{email_id}/cancel", summary="Cancel a scheduled email",
    permission="email:send", response=EmailOut, body_required=False,
)
async def cancel_email(call: Call, email_id: UUID) -> dict[str, Any]:
    try:
        async with call.conn.transaction():
            email = await manage.cancel(call.conn, call.team_id, email_id)
    except manage.NotScheduled as state:
        raise conflict(
            f"the email is {state.status}: only a scheduled email can be canceled"
        ) from None
    if email is None:
        raise not_found("email")
    return EmailOut.of(email).dump()


@routes.route(
    "GET", "/emails/{message_id}/events", summary="The email's events, newest first",
    permission="email:read", query=EventQuery, response=EmailEventList,
)
async def list_email_events(call: Call, message_id: UUID, query: EventQuery) -> dict[str, Any]:
    limit = min(query.limit, MAX_LIMIT)
    found = await manage.list_email_events(
        call.conn, call.team_id, message_id, limit, query.offset
    )
    if found is None:
        raise not_found("email")
    return {"object": "list", "data": [EmailEventOut.model_validate(e) for e in found]}
