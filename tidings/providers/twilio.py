"""Twilio's Messages API as an SMS provider (``TIDINGS_SMS_PROVIDER=twilio``).

Written from Twilio's public API reference (REST API 2010-04-01):

* send: ``POST /2010-04-01/Accounts/{AccountSid}/Messages.json``, form
  fields ``To``, ``From``, ``Body``, ``StatusCallback``, HTTP basic auth
  with the account SID and auth token; 201 with the message resource
  (``sid``, ``status``, ``error_code``, ``error_message``). A 429 (too many
  requests) or a 5xx, or no answer, is a retry (honouring ``Retry-After``,
  up to a day); another 4xx is the message ``rejected`` with Twilio's
  ``code`` and ``message`` (21211 invalid number, 21610 unsubscribed
  recipient, ...). A 2xx whose resource cannot be read (no ``sid``) took
  the message all the same: it is ``unknown``, never sent again.
* sync: ``GET .../Messages/{Sid}.json``, the SID percent-encoded; an
  answer that is not a message resource is no answer (``TwilioUnavailable``).
* sender review: a long code is approved when the account owns it
  (``GET .../IncomingPhoneNumbers.json?PhoneNumber=``), a short code
  likewise (``GET .../SMS/ShortCodes.json?ShortCode=``); alphanumeric IDs
  at once (the carrier decides per country when sending).
* webhooks: ``X-Twilio-Signature`` is base64 HMAC-SHA1, keyed with the auth
  token, of the full URL followed by every POST parameter's name and value,
  sorted by name (:func:`signature`).

Twilio's statuses map onto Tidings' (:data:`STATUSES`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from tidings.config import Config
from tidings.providers.sms import (
    MAX_RETRY_AFTER,
    NOW,
    AnswerLost,
    OutgoingSms,
    ProviderUnavailable,
    Retry,
    SenderIdDecision,
    SenderIdType,
    SmsProvider,
    SmsResult,
    SmsStatus,
    SmsUpdate,
)

log = logging.getLogger("tidings.twilio")

NAME = "twilio"
API_VERSION = "2010-04-01"
TIMEOUT_SECONDS = 15.0
# Failures of a send before its request could reach Twilio whole: Twilio
# took nothing, and the message may be sent again. Any other failure comes
# after the request went out.
NOT_SENT = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError,
    httpx.WriteTimeout, httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.ProxyError,
)

# Twilio's message statuses -> Tidings'. Twilio has taken a message once it is
# accepted, scheduled, queued or sending; ``sent`` means a carrier took it.
STATUSES: dict[str, SmsStatus] = {
    "accepted": "submitted",
    "scheduled": "submitted",
    "queued": "submitted",
    "sending": "submitted",
    "sent": "sent",
    "delivered": "delivered",
    "read": "delivered",
    "undelivered": "undelivered",
    "failed": "failed",
    "canceled": "canceled",
}


# What Twilio's error dictionary says of the codes a message's delivery ends
# with; a status callback carries only the code.
ERRORS = {
    "30001": "Queue overflow",
    "30002": "Account suspended",
    "30003": "Unreachable destination handset",
    "30004": "Message blocked",
    "30005": "Unknown destination handset",
    "30006": "Landline or unreachable carrier",
    "30007": "Message filtered by the carrier",
    "30008": "Unknown error",
    "30009": "Missing segment",
    "30010": "Message price exceeds max price",
}


def error_message(code: str | None, given: str | None) -> str | None:
    """The message of a failure: Twilio's own words when it gave them, else
    its error dictionary's for ``code``, else the code itself."""
    if given:
        return given
    if not code:
        return None
    return ERRORS.get(code, f"Twilio error {code}")


def unreachable(error: httpx.HTTPError) -> str:
    """What a team is told when the API cannot be reached: the kind of failure,
    not the address it was at (the operator's log has the whole error)."""
    log.warning("Twilio unreachable: %r", error)
    return f"Twilio unreachable ({type(error).__name__})"


class TwilioUnavailable(ProviderUnavailable):
    """Twilio did not answer a question (sync, review) usefully: try later."""


# What the answer to a send records when Twilio said 2xx (it took the
# message) but its resource cannot be read: the message may be delivered,
# so it is not refused, and not sent again.
UNREADABLE = "unreadable_answer"


def tidings_status(twilio_status: str | None) -> SmsStatus:
    return STATUSES.get((twilio_status or "").strip().lower(), "unknown")


def signature(auth_token: str, url: str, params: Iterable[tuple[str, str]]) -> str:
    """The ``X-Twilio-Signature`` of a request to ``url`` with these POST parameters."""
    payload = url + "".join(name + value for name, value in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def valid_signature(
    auth_token: str, url: str, params: Iterable[tuple[str, str]], given: str
) -> bool:
    # Bytes: a header with a character beyond ASCII is a signature that does
    # not match, not an error (compare_digest takes ASCII text only).
    return hmac.compare_digest(
        signature(auth_token, url, params).encode(), given.strip().encode("utf-8", "replace")
    )


# Delay-seconds (RFC 9110): ASCII digits only. ``str.isdigit`` also takes
# ``²`` and other digits ``int`` refuses.
_SECONDS = re.compile(r"[0-9]+")
# More digits than this are more than a day in any case; ``int`` refuses
# over 4300 of them.
_MAX_SECONDS_DIGITS = 9


def _http_date(raw: str | None) -> datetime | None:
    """An HTTP date, zoned (one without a zone, ``-0000``, is UTC); None if unreadable."""
    if not raw:
        return None
    try:
        moment = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def retry_after(response: httpx.Response) -> timedelta | None:
    """``Retry-After`` in seconds or as an HTTP date (counted from the
    answer's ``Date``, else from now), at most ``MAX_RETRY_AFTER``; None
    when absent or unreadable."""
    raw = response.headers.get("Retry-After", "").strip()
    if not raw:
        return None
    if _SECONDS.fullmatch(raw):
        if len(raw) > _MAX_SECONDS_DIGITS:
            return MAX_RETRY_AFTER
        return min(timedelta(seconds=int(raw)), MAX_RETRY_AFTER)
    moment = _http_date(raw)
    if moment is None:
        return None
    date = _http_date(response.headers.get("Date")) or datetime.now(UTC)
    return min(max(moment - date, timedelta(0)), MAX_RETRY_AFTER)


def _json(response: httpx.Response) -> dict[str, Any] | None:
    """The answer's JSON object; None when it is not one."""
    try:
        found = response.json()
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


# What PostgreSQL's text cannot hold (NUL) and UTF-8 cannot encode (a lone
# surrogate, which JSON's ``\ud800`` gives): in Twilio's words they would
# fail the transaction that records a whole batch of the team's sends.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _text(value: object) -> str | None:
    """A value of Twilio's answer as storable text (see ``_UNSTORABLE``)."""
    return None if value is None else _UNSTORABLE.sub("\ufffd", str(value))


def _sid(value: object) -> str | None:
    """A message SID: Twilio's are ``SM`` and 32 hex digits, and any string
    without spaces or control characters is taken; None for anything else."""
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        return None
    if any(not c.isprintable() or c.isspace() for c in value) or _UNSTORABLE.search(value):
        return None
    return value


class TwilioSms:
    """Sends through one account over one pooled HTTP client."""

    name = NAME
    approves_sender_ids_instantly = False
    texts_people = True

    def __init__(self, client: httpx.AsyncClient, api_url: str, account_sid: str) -> None:
        self._client = client
        self._account = f"{api_url}/{API_VERSION}/Accounts/{account_sid}"

    async def send(self, sms: OutgoingSms) -> SmsResult:
        form = {"To": sms.to, "From": sms.sender, "Body": sms.body}
        if sms.status_callback:
            form["StatusCallback"] = sms.status_callback
        try:
            response = await self._client.post(f"{self._account}/Messages.json", data=form)
        except NOT_SENT as error:
            return SmsResult(NAME, None, retry=Retry(None, unreachable(error)))
        except httpx.HTTPError as error:
            # After the request went out (no answer in time, the connection
            # closed, a broken answer): Twilio may have taken the message.
            raise AnswerLost(unreachable(error)) from None
        status = response.status_code
        body = _json(response) or {}
        if status == 429 or status >= 500:
            return SmsResult(NAME, None, retry=Retry(
                _text(body.get("code")) or str(status),
                _text(body.get("message")) or f"Twilio answered {status}",
                retry_after(response),
            ))
        if not 200 <= status < 300:
            update = SmsUpdate(
                "rejected", NOW, _text(body.get("code")) or str(status),
                _text(body.get("message")) or f"Twilio answered {status}",
            )
            return SmsResult(NAME, None, updates=(update,))
        sid = _sid(body.get("sid"))
        if sid is None:
            log.warning("Twilio answered %s to a send without a message SID: %.200r",
                        status, response.text)
            return SmsResult(NAME, None, updates=(SmsUpdate(
                "unknown", NOW, UNREADABLE,
                f"Twilio took the message (it answered {status}) but its answer could "
                "not be read (no message SID): the message may be delivered",
            ),))
        return SmsResult(NAME, sid, updates=(self._update(body),))

    def _update(self, message: dict[str, Any]) -> SmsUpdate:
        return SmsUpdate(
            tidings_status(_text(message.get("status"))), NOW,
            _text(message.get("error_code")),
            error_message(_text(message.get("error_code")), _text(message.get("error_message"))),
        )

    async def fetch(self, provider_message_id: str) -> SmsUpdate | None:
        # The SID is Twilio's text: one path segment whatever it holds.
        found = await self._get(f"/Messages/{quote(provider_message_id, safe='')}.json", {})
        if found is None:
            return None
        if not isinstance(found.get("status"), str):
            raise TwilioUnavailable("Twilio's answer could not be read (no message status)")
        return self._update(found)

    async def review_sender_id(self, value: str, type: SenderIdType) -> SenderIdDecision:
        if type == "alphanumeric":
            return "approved"
        if type == "long_code":
            path, query, key = "/IncomingPhoneNumbers.json", {"PhoneNumber": value}, (
                "incoming_phone_numbers"
            )
        else:
            path, query, key = "/SMS/ShortCodes.json", {"ShortCode": value}, "short_codes"
        try:
            found = await self._get(path, query)
        except TwilioUnavailable:
            return "pending"  # not decided: it cannot send until it is approved
        owned = [] if found is None else found.get(key)
        if not isinstance(owned, list):
            return "pending"  # an answer that says nothing decides nothing
        return "approved" if owned else "rejected"

    async def _get(self, path: str, query: dict[str, str]) -> dict[str, Any] | None:
        try:
            response = await self._client.get(self._account + path, params=query)
        except httpx.HTTPError as error:
            raise TwilioUnavailable(unreachable(error)) from None
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise TwilioUnavailable(
                f"Twilio answered {response.status_code}", retry_after(response)
            )
        found = _json(response)
        if found is None:
            # Not a resource (an HTML error page, an array): no answer.
            raise TwilioUnavailable(
                f"Twilio's answer could not be read (it answered {response.status_code})"
            )
        return found


@asynccontextmanager
async def open_provider(config: Config) -> AsyncIterator[SmsProvider]:
    assert config.twilio_account_sid and config.twilio_auth_token  # checked at start
    async with httpx.AsyncClient(
        auth=(config.twilio_account_sid, config.twilio_auth_token), timeout=TIMEOUT_SECONDS
    ) as client:
        yield TwilioSms(client, config.twilio_api_url, config.twilio_account_sid)
