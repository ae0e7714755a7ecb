"""GET /sms: the spec's behaviour 4, exactly.

Only the team's messages; ``data`` is an array; ``limit`` 1 to 100 (default
50, larger values capped at 100; 0, ``abc`` and ``2.5`` are 400);
``offset`` at least 0; ``status`` one of the 11 statuses (another value is
400); ``sender`` exact on ``from``; ``start_date`` and ``end_date``
inclusive, RFC 3339 with an offset (400 without one, and when the end
precedes the start); ``search`` case-insensitive and partial across
recipient, sender, body and provider message id. Newest first. An
unencoded ``+`` arrives as a space: in a date's offset, and in a
``sender`` that is a space and digits (a long code), it is read as ``+``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, RootModel

from tidings.http.envelope import bad_request
from tidings.http.models import CreatedRangeQuery, Moment
from tidings.http.routing import Call, Routes
from tidings.http.sms_models import SmsOut
from tidings.providers.sms import SmsStatus
from tidings.storage import sms_list as store

routes = Routes("SMS")

# "+14155550100" arrives as " 14155550100" in a query string whose "+" was
# not percent-encoded; no sender ID begins with a space (they are trimmed).
_SPACED_NUMBER = re.compile(r" [0-9]+")


def _plus(value: object) -> object:
    if isinstance(value, str) and _SPACED_NUMBER.fullmatch(value):
        return "+" + value[1:]
    return value


class SmsQuery(CreatedRangeQuery):
    status: SmsStatus | None = Field(None, description="Exact, on the normalized status")
    sender: Annotated[str | None, BeforeValidator(_plus)] = Field(
        None, min_length=1, max_length=32,
        description="Exact, on `from`; an unencoded `+` before a number's digits is read as `+`",
    )
    start_date: Moment | None = Field(
        None, description="Created at or after (RFC 3339 with an offset)"
    )
    end_date: Moment | None = Field(
        None, description="Created at or before (RFC 3339 with an offset)"
    )
    search: str | None = Field(
        None, min_length=1, max_length=200,
        description="Case-insensitive, partial: recipient, sender, body or provider message id",
    )


class SmsArray(RootModel[list[SmsOut]]):
    pass


@routes.route(
    "GET", "/sms", summary="List text messages, newest first", permission="sms:read",
    query=SmsQuery, response=SmsArray,
)
async def list_sms(call: Call, query: SmsQuery) -> list[dict[str, Any]]:
    for name in ("start_date", "end_date"):
        value = getattr(query, name)
        if value is not None and value.tzinfo is None:
            raise bad_request(f"invalid query: {name}: must carry an offset (Z or +hh:mm)")
    if query.end_precedes_start:
        raise bad_request("invalid query: end_date: must not precede start_date")
    where = store.SmsFilter(
        status=query.status, sender=query.sender, start=query.starts_from,
        end=query.end_date, search=query.search,
    )
    found = await store.list_sms(call.conn, call.team_id, where, query.limit, query.offset)
    return [SmsOut.of(sms).dump() for sms in found]
