"""SMS over HTTP: send, retrieve, reschedule, cancel, sync, preview.

The routes are storage units (``tidings/http/pipeline.py``): a request's
whole storage work (token, idempotency, the handler's queries) runs on the
asyncio side in one crossing. Acceptance is one statement in the common
case: the sender ID and consent check, the message with its ``queued``
event, and the team's quota (``tidings.storage.sms``). ``POST
/sms/{id}/sync`` asks the provider and stays on the trio side.
The list (``GET /sms``) is in ``tidings.http.sms_list``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field, field_validator

from tidings.fields import FieldError
from tidings.http.emails_input import InputError, check_schedule
from tidings.http.envelope import ApiError, bad_request, conflict, not_found, unprocessable
from tidings.http.models import Moment, RequestBody
from tidings.http.routing import Call, Finish, Routes
from tidings.http.sms_models import SmsOut
from tidings.phones import parse_phone
from tidings.providers.sms import ProviderUnavailable
from tidings.sms_encoding import Encoding, encode
from tidings.storage import sms as store
from tidings.storage.connection import Connection
from tidings.storage.sms_list import SEPARATOR

routes = Routes("SMS", storage_units=True)

MAX_BODY = 1600  # characters: Twilio's limit for one message, 10 or more segments
MAX_METADATA_KEYS = 50
# Retry-After of a sync the provider could not answer, when it gave no hint.
SYNC_RETRY_SECONDS = 5


class SendSms(RequestBody):
    to: str = Field(min_length=1, max_length=32, description="A phone number, +country code")
    from_: str = Field(
        alias="from", min_length=1, max_length=32,
        description="An approved sender ID of the team (its value)",
    )
    body: str = Field(min_length=1, max_length=MAX_BODY)
    scheduled_at: Moment | None = Field(
        None, description="RFC 3339; in the future, at most 30 days ahead"
    )
    metadata: dict[str, Any] | None = Field(
        None, max_length=MAX_METADATA_KEYS,
        description="Free-form; returned as an equal object, as PostgreSQL's jsonb keeps it: "
        "keys in jsonb's order, numbers in plain notation (1E2 as 100, -0.0 as 0)",
    )

    @field_validator("body")
    @classmethod
    def _searchable(cls, value: str) -> str:
        # The search column keeps the fields apart with it (storage.sms_list):
        # a body holding one could never be found by what it holds.
        if SEPARATOR in value:
            raise ValueError("U+001F (the unit separator) is not allowed in a text message")
        return value


class Preview(BaseModel):
    encoding: Encoding
    segments: int
    characters: int
    units: int = Field(description="GSM-7 septets or UTF-16 code units")
    non_gsm_characters: list[str]


class Reschedule(RequestBody):
    scheduled_at: Moment = Field(description="RFC 3339; in the future, at most 30 days ahead")


def sender_spellings(value: str) -> list[str]:
    """How ``from`` may be stored as a sender ID: as given, and a number in E.164."""
    value = value.strip()
    spellings = [value]
    digits = value[1:] if value.startswith("+") else value
    if digits.isdigit() and len(digits) > 8:
        try:
            spellings.append(parse_phone(f"+{digits}", "from", valid=False).e164)
        except FieldError:
            pass
    return spellings


def when(value: datetime | None, field: str) -> datetime | None:
    """A future time, at most 30 days ahead, with a zone (400 without, 422 out of range)."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise bad_request(f"invalid body: {field}: must carry a time zone (e.g. Z)")
    try:
        return check_schedule(value, datetime.now(UTC))
    except InputError as error:
        raise unprocessable(error.message) from None


def new_sms(call: Call, body: SendSms) -> store.NewSms:
    try:
        phone = parse_phone(body.to.strip(), "to")
    except FieldError as error:
        raise bad_request(str(error)) from None
    encoded = encode(body.body)
    return store.NewSms(
        to=phone.e164,
        country=phone.country,
        sender_candidates=sender_spellings(body.from_),
        body=body.body,
        encoding=encoded.encoding,
        segments=encoded.segments,
        provider=call.service.sms.provider.name,
        metadata=body.metadata,
        scheduled_at=when(body.scheduled_at, "scheduled_at"),
    )


@routes.route(
    "POST", "/sms", summary="Send a text message (now or at scheduled_at)",
    permission="sms:send", body=SendSms, response=SmsOut, status=202, counted=True,
)
async def send_sms(call: Call, body: SendSms) -> dict[str, Any]:
    sms = new_sms(call, body)
    try:
        [stored] = await call.service.sms.accepting.store(call.conn, call.team_id, [sms])
    except store.SenderNotApproved as refused:
        state = "is not a sender ID of the team" if refused.status is None else (
            f"is a {refused.status} sender ID, not an approved one"
        )
        raise unprocessable(f"from: {body.from_!r} {state} (POST /sender-ids)") from None
    except store.OptedOut:
        raise unprocessable(
            f"to: {sms.to} is opted out of the team's messages: a contact of the team with "
            "this number is opted out, or the number is suppressed (a STOP reply, or "
            "GET /suppressions); a STOP is lifted only by the number's START reply"
        ) from None
    return SmsOut.of(stored).dump()


@routes.route(
    "POST", "/sms/preview",
    summary="What a body costs: encoding, segments, and the characters that force UCS-2",
    permission="sms:send", body=SendSms, response=Preview,
)
async def preview_sms(call: Call, body: SendSms) -> Preview:
    new_sms(call, body)  # the same checks as a send, without storing anything
    found = encode(body.body)
    return Preview(
        encoding=found.encoding, segments=found.segments, characters=found.characters,
        units=found.units, non_gsm_characters=list(found.non_gsm_characters),
    )


@routes.route(
    "GET", "/sms/{sms_id}", summary="Retrieve a text message", permission="sms:read",
    response=SmsOut,
)
async def get_sms(call: Call, sms_id: UUID) -> dict[str, Any]:
    found = await store.get_sms(call.conn, call.team_id, sms_id)
    if found is None:
        raise not_found("SMS")
    return SmsOut.of(found).dump()


def _not_scheduled(state: store.NotScheduled, verb: str) -> ApiError:
    return conflict(
        f"the SMS is {state.status}: only a queued SMS with a future scheduled_at can be {verb}"
    )


@routes.route(
    "PATCH", "/sms/{sms_id}", summary="Reschedule a scheduled text message",
    permission="sms:send", body=Reschedule, response=SmsOut,
)
async def reschedule_sms(call: Call, sms_id: UUID, body: Reschedule) -> dict[str, Any]:
    moment = when(body.scheduled_at, "scheduled_at")
    assert moment is not None
    try:
        found = await store.reschedule(call.conn, call.team_id, sms_id, moment)
    except store.NotScheduled as state:
        raise _not_scheduled(state, "rescheduled") from None
    if found is None:
        raise not_found("SMS")
    return SmsOut.of(found).dump()


@routes.route(
    "POST", "/sms/{sms_id}/cancel", summary="Cancel a scheduled text message",
    permission="sms:send", response=SmsOut, body_required=False,
)
async def cancel_sms(call: Call, sms_id: UUID) -> dict[str, Any]:
    try:
        found = await store.cancel(call.conn, call.team_id, sms_id)
    except store.NotScheduled as state:
        raise _not_scheduled(state, "canceled") from None
    if found is None:
        raise not_found("SMS")
    return SmsOut.of(found).dump()


@routes.route(
    "POST", "/sms/{sms_id}/sync",
    summary="Ask the provider for the message's status now and apply it",
    permission="sms:send", response=SmsOut, body_required=False, storage_unit=False,
    pooled=False,
)
async def sync_sms(call: Call, sms_id: UUID) -> dict[str, Any] | Finish:
    # No connection is held while the provider is asked (``pooled=False``);
    # what it says moves the message only forward, whenever it is applied.
    found = await call.service.db.run(store.get_sms, call.team_id, sms_id)
    if found is None:
        raise not_found("SMS")
    provider = call.service.sms.provider
    if found.message_id is None or found.provider != provider.name:
        return SmsOut.of(found).dump()  # not handed over (or not to this provider)
    try:
        update = await provider.fetch(found.message_id)
    except Exception as failure:  # the provider's trouble is not ours: 503, retry later
        wait = failure.retry_after if isinstance(failure, ProviderUnavailable) else None
        seconds = SYNC_RETRY_SECONDS if wait is None else max(1, math.ceil(wait.total_seconds()))
        raise ApiError(
            503, "SERVICE_UNAVAILABLE", f"the SMS provider did not answer: {failure}",
            {"Retry-After": str(seconds)},
        ) from None
    if update is None:
        return SmsOut.of(found).dump()
    report = store.Report(found.id, update.status, provider.name, update.code, update.message)
    team_id = call.team_id

    async def apply(conn: Connection) -> dict[str, Any]:
        await store.record_reports(conn, [report])
        synced = await store.get_sms(conn, team_id, sms_id)
        if synced is None:
            raise not_found("SMS")  # deleted meanwhile
        return SmsOut.of(synced).dump()

    return Finish(apply)
