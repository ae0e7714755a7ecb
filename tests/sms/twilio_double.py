"""A Twilio double for tests, written from Twilio's public REST API reference
(2010-04-01): a real HTTP server on 127.0.0.1 that speaks the Messages,
IncomingPhoneNumbers and SMS/ShortCodes resources with HTTP basic auth,
form-encoded requests and Twilio's JSON resources and error bodies."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import trio

from tests.webhooks.receiver import Answer, Received, Receiver
from tidings.config import Config

ACCOUNT_SID = "AC" + "0123456789abcdef" * 2
AUTH_TOKEN = "double-auth-token"


@dataclass
class TwilioDouble:
    """Messages it took (by sid), numbers and short codes the account owns,
    how many of the next sends to answer with 429 (``Retry-After: 1``),
    whether the account's numbers and short codes answer 503 (an outage),
    what to do with a new message's SID before answering its 201 (Twilio may
    call back before its answer has reached the sender), what to do
    before answering a fetch of a message (a slow API), and answers of its
    own for every send to a number (``answers``, by ``To``: but for a 429
    the message is taken all the same, as Twilio takes it before its answer
    can go wrong), for every fetch of a SID (``fetch_answers``) and for
    every look-up of a number or short code (``numbers_answer``)."""

    owned_numbers: set[str] = field(default_factory=set)
    owned_short_codes: set[str] = field(default_factory=set)
    throttle_next: int = 0
    numbers_unavailable: bool = False
    lookups: list[str] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    sends: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    receiver: Receiver | None = None
    before_created: Callable[[str], Awaitable[None]] | None = None
    before_fetched: Callable[[str], Awaitable[None]] | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    fetch_answers: dict[str, Answer] = field(default_factory=dict)
    numbers_answer: Answer | None = None

    @property
    def base(self) -> str:
        assert self.receiver is not None
        parts = urlsplit(self.receiver.url)
        return f"{parts.scheme}://{parts.netloc}"

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        self.receiver = Receiver(self.respond)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.receiver.serve)
            task_status.started(self.base)

    async def respond(self, request: Received) -> Answer:
        expected = base64.b64encode(f"{ACCOUNT_SID}:{AUTH_TOKEN}".encode()).decode()
        if request.headers.get("authorization") != f"Basic {expected}":
            return self._error(401, 20003, "Authenticate")
        parts = urlsplit(request.path)
        prefix = f"/2010-04-01/Accounts/{ACCOUNT_SID}"
        if not parts.path.startswith(prefix):
            return self._error(404, 20404, "The requested resource was not found")
        path = parts.path.removeprefix(prefix)
        query = dict(parse_qsl(parts.query))
        if path in ("/IncomingPhoneNumbers.json", "/SMS/ShortCodes.json"):
            self.lookups.append(query.get("PhoneNumber") or query.get("ShortCode", ""))
        if self.numbers_unavailable and path in ("/IncomingPhoneNumbers.json",
                                                 "/SMS/ShortCodes.json"):
            return self._error(503, 20503, "Service Unavailable")
        if self.numbers_answer is not None and path in ("/IncomingPhoneNumbers.json",
                                                        "/SMS/ShortCodes.json"):
            return self.numbers_answer
        if request.method == "POST" and path == "/Messages.json":
            form = dict(parse_qsl(request.body.decode()))
            answer = self._create(form)
            if (answer[0] == 201 and self.before_created is not None
                    and form.get("To") not in self.answers):
                await self.before_created(json.loads(answer[1])["sid"])
            return answer
        if request.method == "GET" and path.startswith("/Messages/"):
            sid = unquote(path.removeprefix("/Messages/").removesuffix(".json"))
            if self.before_fetched is not None:
                await self.before_fetched(sid)
            if sid in self.fetch_answers:
                return self.fetch_answers[sid]
            if sid not in self.messages:
                return self._error(404, 20404, f"The requested resource {parts.path} was not found")
            return self._json(200, self.messages[sid])
        if request.method == "GET" and path == "/IncomingPhoneNumbers.json":
            number = query.get("PhoneNumber", "")
            owned = [{"sid": "PN" + secrets.token_hex(16), "phone_number": number,
                      "capabilities": {"sms": True}}] if number in self.owned_numbers else []
            return self._json(200, {"incoming_phone_numbers": owned, "page": 0, "page_size": 50})
        if request.method == "GET" and path == "/SMS/ShortCodes.json":
            code = query.get("ShortCode", "")
            owned = [{"sid": "SC" + secrets.token_hex(16), "short_code": code}] if (
                code in self.owned_short_codes) else []
            return self._json(200, {"short_codes": owned, "page": 0, "page_size": 50})
        return self._error(404, 20404, "The requested resource was not found")

    def _create(self, form: dict[str, str]) -> Answer:
        self.sends.append((trio.current_time(), form))
        if self.throttle_next > 0:
            self.throttle_next -= 1
            status, body, _ = self._error(429, 20429, "Too Many Requests")
            return status, body, {"Content-Type": "application/json", "Retry-After": "1"}
        for name in ("To", "From", "Body"):
            if not form.get(name):
                return self._error(400, 21604 if name == "To" else 21603,
                                   f"A '{name}' parameter is required.")
        if form["To"].endswith("9999"):
            return self._error(400, 21610, "Attempt to send to unsubscribed recipient")
        answer = self.answers.get(form["To"])
        sid = "SM" + secrets.token_hex(16)
        message = {
            "sid": sid, "account_sid": ACCOUNT_SID, "to": form["To"], "from": form["From"],
            "body": form["Body"], "status": "queued", "num_segments": "1", "direction":
            "outbound-api", "error_code": None, "error_message": None,
            "api_version": "2010-04-01", "uri": f"/2010-04-01/Accounts/{ACCOUNT_SID}"
            f"/Messages/{sid}.json",
        }
        if answer is not None and answer[0] == 429:
            return answer  # throttled: not taken
        self.messages[sid] = message
        return answer or self._json(201, message)

    def _json(self, status: int, document: dict[str, Any]) -> Answer:
        return status, json.dumps(document).encode(), {"Content-Type": "application/json"}

    def _error(self, status: int, code: int, message: str) -> Answer:
        return self._json(status, {
            "code": code, "message": message, "status": status,
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
        })


def twilio_config(database_url: str, double: TwilioDouble, public_url: str,
                  **settings: Any) -> Config:
    """A service sending through ``double``, its callbacks signed for ``public_url``."""
    return Config(
        database_url=database_url, db_pool_size=settings.pop("db_pool_size", 6),
        rate_limit_per_second=0, shutdown_grace_seconds=2, sms_poll_seconds=0.2,
        sms_provider="twilio", twilio_account_sid=ACCOUNT_SID, twilio_auth_token=AUTH_TOKEN,
        twilio_api_url=double.base, public_url=public_url, **settings,
    )


async def started(nursery: trio.Nursery, **fields: Any) -> TwilioDouble:
    """A double with ``fields`` (owned numbers, ...), serving in ``nursery``."""
    twilio = TwilioDouble(**fields)
    await nursery.start(twilio.serve)
    return twilio
