"""Twilio's webhooks (CONTRACT §6): status callbacks and inbound replies.

No bearer token: each request must carry a valid ``X-Twilio-Signature``
(HMAC-SHA1 of ``TIDINGS_PUBLIC_URL`` + path + the sorted form parameters,
keyed with ``TWILIO_AUTH_TOKEN``), else 403.

* ``POST /providers/twilio/status``: ``MessageSid`` and ``MessageStatus``
  (with ``ErrorCode``) move the message, forward only. A callback that comes
  before the send worker has stored the message's SID is kept (``kept``:
  true) and applied once the SID is stored; one whose URL names a message
  without a SID (``?sms=``: its answer lost) gives it that SID.
* ``POST /providers/twilio/inbound``: a reply ``From`` a number ``To`` a
  sender ID. STOP and its kin opt the number out for every team whose
  approved sender ID it is, START and its kin opt it back in, HELP and
  INFO are answered (TwiML) with ``TIDINGS_SMS_HELP_TEXT``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl
from uuid import UUID
from xml.sax.saxutils import escape

from quart import Response, request

from tidings.fields import NUL_REASON, FieldError, has_nul
from tidings.http.envelope import ApiError, bad_request, json_response, success_body
from tidings.http.models import RawContent
from tidings.http.parsing import read_body
from tidings.http.routing import Routes
from tidings.http.sms import sender_spellings
from tidings.phones import parse_phone
from tidings.providers.twilio import NAME, error_message, tidings_status, valid_signature
from tidings.service import Service
from tidings.sms_keywords import Action, help_text, keyword_action
from tidings.storage import sender_ids, sms_consent, sms_status

routes = Routes("Providers")

TWIML = "text/xml; charset=utf-8"
FORM = {"application/x-www-form-urlencoded": {"schema": {"type": "object"}}}
# Twilio's forms are a few KiB (a message body is at most 1,600 characters);
# a larger one is no callback of Twilio's, refused before it is read whole.
MAX_FORM_BYTES = 64 * 1024
# What X-Twilio-Signature holds: an HMAC-SHA1 in base64, 28 characters.
_SIGNATURE = re.compile(r"\s*[A-Za-z0-9+/]{27}=\s*")
_FORBIDDEN = "X-Twilio-Signature is missing or does not match"
MAX_SID_LENGTH = 64
OPT_OUT_TYPES: dict[str, Action] = {"STOP": "opt_out", "START": "opt_in", "HELP": "help"}


async def signed_form(service: Service) -> dict[str, str]:
    """The request's form parameters, once its Twilio signature is checked
    (403). What costs nothing is checked first: a request without a token
    configured, or without a signature of the right shape, is refused before
    its body is read."""
    token = service.config.twilio_auth_token
    given = request.headers.get("X-Twilio-Signature", "")
    if token is None or not _SIGNATURE.fullmatch(given):
        raise ApiError(403, "FORBIDDEN", _FORBIDDEN)
    raw = await read_body(MAX_FORM_BYTES)
    params = parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True)
    url = service.config.public_url + request.path
    if request.query_string:
        url += "?" + request.query_string.decode("latin-1")
    if not valid_signature(token, url, params, given):
        raise ApiError(403, "FORBIDDEN", _FORBIDDEN)
    for name, value in params:
        if has_nul(name) or has_nul(value):
            raise bad_request(f"invalid form: {name.replace(chr(0), '')}: {NUL_REASON}")
    return dict(params)


def _named_message() -> UUID | None:
    """The message a status callback's URL names (``?sms=``, signed with it)."""
    try:
        return UUID(request.args.get("sms", ""))
    except ValueError:
        return None


def twiml(message: str | None = None) -> Response:
    inner = "" if message is None else f"<Message>{escape(message)}</Message>"
    body = f'<?xml version="1.0" encoding="UTF-8"?><Response>{inner}</Response>'
    return Response(body, status=200, content_type=TWIML)


@routes.route(
    "POST", "/providers/twilio/status", summary="Twilio status callback (X-Twilio-Signature)",
    public=True, raw_body=FORM, body_limit=lambda _config: MAX_FORM_BYTES,
)
async def twilio_status(service: Service) -> Response:
    form = await signed_form(service)
    sid = form.get("MessageSid") or form.get("SmsSid") or ""
    status = tidings_status(form.get("MessageStatus") or form.get("SmsStatus"))
    if not sid:
        return json_response(200, success_body({"recorded": 0, "kept": False}))
    code = form.get("ErrorCode") or None
    report = sms_status.ProviderReport(
        sid, status, NAME, code, error_message(code, form.get("ErrorMessage") or None)
    )
    changes, kept = await service.db.run(
        sms_status.record_provider_report, report, _named_message()
    )
    # Twilio does not send a callback again after a 2xx: a report about a
    # message whose id is not stored yet is kept, and applied once it is.
    return json_response(200, success_body({"recorded": len(changes), "kept": kept}))


@routes.route(
    "POST", "/providers/twilio/inbound", summary="Twilio inbound message (X-Twilio-Signature)",
    public=True, raw_body=FORM, body_limit=lambda _config: MAX_FORM_BYTES,
    response=RawContent("text/xml", {"type": "string"}),
)
async def twilio_inbound(service: Service) -> Response:
    form = await signed_form(service)
    # With Advanced Opt-Out Twilio names what a reply was (its own keywords,
    # in every language it knows of) in OptOutType; else the body is read.
    action = OPT_OUT_TYPES.get(form.get("OptOutType", "").strip().upper()) or keyword_action(
        form.get("Body", "")
    )
    try:
        phone = parse_phone(form.get("From", "").strip(), "From", valid=False).e164
    except FieldError:
        return twiml()  # not a phone number (a short code, a channel address): nothing to do
    if action is None:
        return twiml()
    # Twilio gives E.164; a number without its "+" is the same sender ID.
    teams = await service.db.run(sender_ids.teams_of_sender, sender_spellings(form.get("To", "")))
    # Twilio's id of the reply (34 characters): a request sent again, or
    # replayed, counts once. Anything longer is no id of Twilio's, and is
    # not kept.
    sid = (form.get("MessageSid") or form.get("SmsSid") or "").strip()
    reply = sid if 0 < len(sid) <= MAX_SID_LENGTH else None
    if action == "opt_out":
        await service.db.run(sms_consent.opt_out, teams, phone, None, reply=reply)
    elif action == "opt_in":
        await service.db.run(sms_consent.opt_in, teams, phone, reply=reply)
    else:
        names = await service.db.run(sms_consent.team_names, teams)
        team = sorted(names.values())[0] if names else "Tidings"
        return twiml(help_text(service.config.sms_help_text, team))
    return twiml()
