"""The body of POST /emails (and of each item of POST /emails/batch), checked.

The rules the spec leaves open are in docs/email.md: addresses, headers that
are refused, tags, scheduling limits, and how a template fills the email.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Self
from uuid import UUID

from pydantic import Field, field_validator, model_validator

from tidings.addresses import (
    BARE_ADDRESS,
    check_sendable,
    display,
    normalize_address,
    parse_mailbox,
)
from tidings.fields import FieldError
from tidings.http.models import Moment, RequestBody
from tidings.rendering_variables import CONTROL_CHARACTERS, VISIBLE
from tidings.storage.templates import TemplateRef

MAX_RECIPIENTS = 50
MAX_HEADERS = 50
MAX_TAGS = 50
MAX_SCHEDULE_AHEAD = timedelta(days=30)
MAX_ADDRESS_FIELD = 998

# Headers Tidings writes itself, or that would change who the email is from,
# to whom it goes, how it is signed or how its body is read.
REFUSED_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "reply-to", "subject", "sender", "date", "message-id",
    "return-path", "dkim-signature", "domainkey-signature", "authentication-results",
    "received", "received-spf", "delivered-to", "mime-version", "content-type",
    "content-transfer-encoding", "content-disposition", "content-id",
})
# ``ARC-*``: every ARC header (RFC 8617) is a forwarder's, whatever its name.
REFUSED_PREFIXES = ("arc-", "resent-", "content-", "x-tidings-")
# RFC 5322 field name: printable ASCII without the colon.
_HEADER_NAME = re.compile(r"[!-9;-~]{1,76}")
# A header's text is printable characters, spaces and tabs (RFC 5322 §2.2).
_CONTROL = CONTROL_CHARACTERS
_TAG_TEXT = r"^[A-Za-z0-9_-]+$"


Addresses = str | Annotated[list[str], Field(min_length=1, max_length=MAX_RECIPIENTS)]
# cc, bcc and reply_to: an empty list is none, as null is (GET shows ``[]`` for none).
MoreAddresses = str | Annotated[list[str], Field(max_length=MAX_RECIPIENTS)]


class Tag(RequestBody):
    name: str = Field(min_length=1, max_length=256, pattern=_TAG_TEXT)
    value: str = Field(min_length=1, max_length=256, pattern=_TAG_TEXT)


class TemplateUse(RequestBody):
    """A published template: by ``id`` (its id or alias) or ``alias``."""

    id: str | None = Field(None, min_length=1, max_length=100, description="Template id or alias")
    alias: str | None = Field(None, min_length=1, max_length=100)
    variables: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def one_ref(self) -> Self:
        if (self.id is None) == (self.alias is None):
            raise ValueError("template: give its id or its alias (one of them)")
        return self


class SendEmail(RequestBody):
    from_: str | None = Field(
        None, alias="from", max_length=MAX_ADDRESS_FIELD,
        description="'Name <address>' or an address, on a verified domain of the team; "
        "may come from the template",
    )
    to: Addresses = Field(description="An address or a list of 1 to 50")
    cc: MoreAddresses | None = None
    bcc: MoreAddresses | None = None
    reply_to: MoreAddresses | None = None
    subject: str | None = Field(None, min_length=1, max_length=MAX_ADDRESS_FIELD)
    html: str | None = Field(None, min_length=1)
    text: str | None = Field(None, min_length=1)
    # null is none, as for cc, bcc and reply_to.
    headers: dict[str, str] | None = Field(None, max_length=MAX_HEADERS)
    tags: list[Tag] | None = Field(None, max_length=MAX_TAGS)
    scheduled_at: Moment | None = Field(
        None, description="RFC 3339 with a time zone; in the future, at most 30 days ahead"
    )
    template: TemplateUse | None = None

    @field_validator("cc", "bcc", "reply_to", mode="after")
    @classmethod
    def empty_is_none(cls, value: str | list[str] | None) -> str | list[str] | None:
        """``[]`` is none, as null is, so a template's reply-to still applies."""
        return None if value == [] else value

    @model_validator(mode="after")
    def content(self) -> Self:
        if self.template is not None:
            given = [n for n in ("subject", "html", "text") if getattr(self, n) is not None]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: not accepted with a template, which gives the content"
                )
        else:
            if self.subject is None:
                raise ValueError("subject: is required (or a template)")
            if self.html is None and self.text is None:
                raise ValueError("html, text: give at least one of them (or a template)")
        if self.subject is not None and ("\r" in self.subject or "\n" in self.subject):
            raise ValueError("subject: must not contain line breaks")
        if self.subject is not None and _CONTROL.search(self.subject):
            raise ValueError("subject: control characters are not allowed")
        if self.subject is not None and not VISIBLE.search(self.subject):
            # As for a rendered subject (``subject_fault``): an email without
            # one reads as spam, and its spaces would leave it with none.
            raise ValueError("subject: holds no visible character (only spaces)")
        if self.scheduled_at is not None and self.scheduled_at.tzinfo is None:
            raise ValueError("scheduled_at: must carry a time zone (e.g. Z)")
        return self


class InputError(ValueError):
    """A field that cannot be used: ``status`` 400 (malformed) or 422 (impossible)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@functools.lru_cache(maxsize=4096)
def mailbox(field: str, value: str) -> tuple[str, str | None]:
    """The address and display name of one mailbox (``Name <address>`` or an
    address), normalized; InputError naming ``field`` otherwise (a local part
    outside ASCII among the reasons: Tidings sends without SMTPUTF8).

    Cached: a team sends from the same few addresses, and parsing one with a
    display name (the standard library's header parser, then email-validator)
    costs more CPU than the rest of accepting the email. Refusals are not
    cached (an exception is never stored)."""
    try:
        if BARE_ADDRESS.fullmatch(value):
            # Most recipients are bare addresses: no need for the header parser.
            return check_sendable(normalize_address(value, field), field), None
        found = parse_mailbox(value, field)
    except FieldError as error:
        raise InputError(400, str(error)) from None
    return found.address, found.name


def recipient_lookup(value: str) -> str:
    """The ``to`` filter's value as acceptance keeps a recipient to find it
    by: an address in any spelling ``mailbox`` takes without a display name
    (quoted, in angle brackets); as given otherwise (a mailbox with a name,
    or no address at all: it then matches nothing)."""
    try:
        address, name = mailbox("to", value.strip())
    except InputError:
        return value
    return value if name is not None else address


def shown(address: str, name: str | None) -> str:
    """As the API shows (and the email stores) a mailbox: ``addresses.display``."""
    return display(name, address)


def address_list(field: str, value: str | list[str] | None) -> list[tuple[str, str | None]]:
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    return [mailbox(f"{field}.{n}" if len(values) > 1 else field, item)
            for n, item in enumerate(values)]


def check_headers(headers: dict[str, str]) -> dict[str, str]:
    seen: set[str] = set()
    for name, value in headers.items():
        lowered = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            raise InputError(400, f"headers: {name!r} is not a valid header name")
        if lowered in REFUSED_HEADERS or lowered.startswith(REFUSED_PREFIXES):
            raise InputError(
                400, f"headers.{name}: Tidings sets this header itself; it cannot be given"
            )
        if lowered in seen:
            raise InputError(400, f"headers.{name}: given twice (names are case-insensitive)")
        seen.add(lowered)
        if "\r" in value or "\n" in value or len(value) > MAX_ADDRESS_FIELD:
            raise InputError(
                400, f"headers.{name}: one line of at most {MAX_ADDRESS_FIELD} characters"
            )
        if _CONTROL.search(value):
            raise InputError(400, f"headers.{name}: control characters are not allowed")
    return headers


def check_schedule(scheduled_at: datetime | None, now: datetime) -> datetime | None:
    if scheduled_at is None:
        return None
    if scheduled_at <= now:
        raise InputError(422, "scheduled_at: must be in the future")
    if scheduled_at > now + MAX_SCHEDULE_AHEAD:
        raise InputError(422, "scheduled_at: at most 30 days ahead")
    return scheduled_at.astimezone(UTC)


def template_ref(value: TemplateUse) -> TemplateRef:
    if value.alias is not None:
        return TemplateRef(alias=value.alias)
    assert value.id is not None
    try:
        return TemplateRef(id=UUID(value.id))
    except ValueError:
        return TemplateRef(alias=value.id)
