"""The SMTP provider against a real SMTP server (aiosmtpd) on loopback:
DKIM signatures that dkimpy verifies, outcomes per recipient, connection
reuse and recovery, STARTTLS and AUTH."""

from __future__ import annotations

import email
import email.policy
import ssl
import uuid
from pathlib import Path
from typing import Any

import dkim
import pytest
import trio

from tests.email.smtp_sink import Sink, running_sink, self_signed
from tidings.config import SmtpUrl
from tidings.email.dkim import new_private_key, public_key_base64
from tidings.providers.email import DkimKey, OutgoingEmail
from tidings.providers.smtp import SmtpProvider

KEY = new_private_key()
DKIM_RECORD = f"v=DKIM1; k=rsa; p={public_key_base64(KEY)}".encode()


def outgoing(*recipients: str, **changes: Any) -> OutgoingEmail:
    fields: dict[str, Any] = {
        "message_id": uuid.uuid4(),
        "team_id": uuid.uuid4(),
        "sender": "Acme <news@acme.example>",
        "recipients": recipients,
        "to": recipients,
        "subject": "Your receipt",
        "html": "<h1>Thanks</h1><p>Your order <a href='https://acme.example/o/1'>#1</a>.</p>",
        "dkim": DkimKey("acme.example", "tidings1", KEY),
    }
    fields.update(changes)
    fields.setdefault("return_paths", {
        r: f"b-{n}@bounces.acme.example" for n, r in enumerate(fields["recipients"], 1)
    })
    return OutgoingEmail(**fields)


def dns(name: bytes, timeout: int = 5) -> bytes:
    assert name == b"tidings1._domainkey.acme.example."
    return DKIM_RECORD


def url(port: int, starttls: str = "off", **more: Any) -> SmtpUrl:
    return SmtpUrl(host="127.0.0.1", port=port, implicit_tls=False, starttls=starttls,  # type: ignore[arg-type]
                   **more)


async def test_signed_message_with_text_part_and_return_path(sink: Sink, port: int) -> None:
    provider = SmtpProvider(url(port), "mx.tidings.example")
    email_ = outgoing("ada@example.org", cc=("cy@example.org",),
                      recipients=("ada@example.org", "cy@example.org", "hidden@example.org"))
    result = await provider.send(email_)
    await provider.aclose()
    assert result.provider == "smtp" and not result.deferred
    assert result.provider_message_id == f"<{email_.message_id}@acme.example>"
    assert [(o.recipient, o.type, o.code) for o in result.outcomes] == [
        ("ada@example.org", "sent", "250"), ("cy@example.org", "sent", "250"),
        ("hidden@example.org", "sent", "250"),
    ]
    # One transaction per recipient, from its own return path, on one
    # connection, with the same signed message.
    assert [(m.mail_from, m.recipients) for m in sink.messages] == [
        ("b-1@bounces.acme.example", ["ada@example.org"]),
        ("b-2@bounces.acme.example", ["cy@example.org"]),
        ("b-3@bounces.acme.example", ["hidden@example.org"]),
    ]
    assert len({m.data for m in sink.messages}) == 1
    assert len({m.session for m in sink.messages}) == 1 and provider.connections_opened == 1
    received = sink.messages[0]
    assert dkim.verify(received.data, dnsfunc=dns)
    # Altered in transit, it no longer verifies.
    assert not dkim.verify(received.data.replace(b"Your receipt", b"Your receipT"), dnsfunc=dns)
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert message["Message-ID"] == f"<{email_.message_id}@acme.example>"
    assert message["From"] == "Acme <news@acme.example>"
    assert message["Cc"] == "cy@example.org" and message["Bcc"] is None
    assert b"hidden@example.org" not in received.data
    assert "d=acme.example" in message["DKIM-Signature"].replace(" ", "")
    text = message.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert "Thanks" in text and "#1 (https://acme.example/o/1)" in text
    assert "<h1>Thanks</h1>" in message.get_body(("html",)).get_content()  # type: ignore[union-attr]


async def test_non_ascii_and_dots_survive_signing(sink: Sink, port: int) -> None:
    provider = SmtpProvider(url(port), "mx.tidings.example")
    await provider.send(outgoing(
        "ada@example.org", sender="Ëlise Café <news@acme.example>", subject="Reçu n° 1",
        html=None, text="Première ligne\n.\n..deux points\nfin", headers=(("X-Tag", "é"),),
    ))
    await provider.aclose()
    [received] = sink.messages
    assert dkim.verify(received.data, dnsfunc=dns)
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert message["Subject"] == "Reçu n° 1" and message["X-Tag"] == "é"
    content = message.get_content().replace("\r\n", "\n")
    assert content == "Première ligne\n.\n..deux points\nfin\n"


@pytest.mark.parametrize("pipelining", [True, False])
async def test_bounce_at_rcpt_and_temporary_failure(
    sink: Sink, port: int, pipelining: bool
) -> None:
    sink.pipelining = pipelining
    sink.rcpt_replies["gone@example.org"] = "550 5.1.1 no such user"
    sink.rcpt_replies["full@example.org"] = "452 4.2.2 mailbox full"
    provider = SmtpProvider(url(port), "mx.tidings.example")
    result = await provider.send(
        outgoing("ada@example.org", "gone@example.org", "full@example.org")
    )
    outcomes = {o.recipient: (o.type, o.code, o.message) for o in result.outcomes}
    assert outcomes == {
        "ada@example.org": ("sent", "250", "2.0.0 queued"),
        "gone@example.org": ("bounced", "550", "5.1.1 no such user"),
    }
    assert [(d.recipient, d.code, d.message) for d in result.deferred] == [
        ("full@example.org", "452", "4.2.2 mailbox full")
    ]
    assert sink.messages[0].recipients == ["ada@example.org"]

    # Every recipient refused: no message, and the connection goes on.
    result = await provider.send(outgoing("gone@example.org"))
    assert [(o.type, o.code) for o in result.outcomes] == [("bounced", "550")]
    assert len(sink.messages) == 1
    assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
    assert provider.connections_opened == 1
    await provider.aclose()


@pytest.mark.parametrize("pipelining", [True, False])
async def test_replies_at_data_and_mail(sink: Sink, port: int, pipelining: bool) -> None:
    sink.pipelining = pipelining
    provider = SmtpProvider(url(port), "mx.tidings.example")
    sink.data_reply = "554 5.7.1 message refused as spam"
    result = await provider.send(outgoing("ada@example.org", "bo@example.org"))
    assert [(o.type, o.code) for o in result.outcomes] == [("bounced", "554")] * 2
    sink.data_reply = "451 4.3.0 try again later"
    result = await provider.send(outgoing("ada@example.org"))
    assert not result.outcomes and [d.code for d in result.deferred] == ["451"]
    sink.data_reply = None
    sink.mail_reply = "553 5.7.1 sender not allowed"
    result = await provider.send(outgoing("ada@example.org"))
    assert [(o.type, o.code) for o in result.outcomes] == [("failed", "553")]
    sink.mail_reply = "421 4.7.0 closing"
    result = await provider.send(outgoing("ada@example.org"))
    assert [d.code for d in result.deferred] == ["421"]
    await provider.aclose()


async def test_envelope_is_pipelined_when_offered() -> None:
    """A server that answers nothing until MAIL, RCPT and DATA have all come:
    only a client that pipelines them gets through (RFC 2920)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    groups: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        buffer = b""

        async def until(marker: bytes) -> bytes:
            nonlocal buffer
            while marker not in buffer:
                buffer += await stream.receive_some(65536)
            head, _, buffer = buffer.partition(marker)
            return head + marker

        await stream.send_all(b"220 ready\r\n")
        await until(b"\r\n")
        await stream.send_all(b"250-fake\r\n250 PIPELINING\r\n")
        for _ in range(2):
            groups.append(await until(b"DATA\r\n"))
            await stream.send_all(b"250 ok\r\n250 ok\r\n354 go\r\n")
            await until(b"\r\n.\r\n")
            await stream.send_all(b"250 queued\r\n")
        await until(b"QUIT\r\n")
        await stream.send_all(b"221 bye\r\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        provider = SmtpProvider(url(port), "mx.tidings.example")
        with trio.fail_after(5):
            result = await provider.send(outgoing("ada@example.org", "bo@example.org"))
            await provider.aclose()
        nursery.cancel_scope.cancel()
    assert [o.type for o in result.outcomes] == ["sent", "sent"]
    assert groups == [
        b"MAIL FROM:<b-1@bounces.acme.example>\r\nRCPT TO:<ada@example.org>\r\nDATA\r\n",
        b"MAIL FROM:<b-2@bounces.acme.example>\r\nRCPT TO:<bo@example.org>\r\nDATA\r\n",
    ]


async def test_many_messages_over_one_connection(sink: Sink, port: int) -> None:
    provider = SmtpProvider(url(port), "mx.tidings.example", connections=2)
    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(provider.send, outgoing(f"r{i}@example.org"))
    await provider.aclose()
    assert len(sink.messages) == 40
    assert provider.connections_opened == 2
    assert len({m.session for m in sink.messages}) == 2


async def test_server_down_then_back(sink: Sink) -> None:
    with running_sink(sink) as port:
        provider = SmtpProvider(url(port), "mx.tidings.example")
        assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
    # The server went away: its pooled connection is dead and no new one opens.
    result = await provider.send(outgoing("ada@example.org"))
    assert not result.outcomes
    assert result.deferred[0].recipient == "ada@example.org"
    assert result.deferred[0].code is None and result.deferred[0].message
    with running_sink(sink) as new_port:
        provider.url = url(new_port)
        assert (await provider.send(outgoing("bo@example.org"))).outcomes[0].type == "sent"
    await provider.aclose()


async def test_stale_pooled_connection_is_replaced(sink: Sink) -> None:
    with running_sink(sink) as port:
        provider = SmtpProvider(url(port), "mx.tidings.example")
        await provider.send(outgoing("ada@example.org"))
    # The server restarts on the same port: the pooled connection is closed by
    # then; the provider notices before anything was sent and reconnects.
    with running_sink(sink, port=port):
        result = await provider.send(outgoing("bo@example.org"))
    assert [o.type for o in result.outcomes] == ["sent"]
    assert provider.connections_opened == 2
    assert [m.recipients for m in sink.messages] == [["ada@example.org"], ["bo@example.org"]]
    await provider.aclose()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path)


def trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


async def test_starttls_auto_and_require_use_tls(
    sink: Sink, certificate: tuple[Path, Path]
) -> None:
    with running_sink(sink, tls=certificate) as port:
        for mode in ("auto", "require"):
            provider = SmtpProvider(url(port, mode), "mx.tidings.example",
                                    tls_context=trusting(certificate[0]))
            assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
            await provider.aclose()
        provider = SmtpProvider(url(port, "off"), "mx.tidings.example")
        assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
        await provider.aclose()
    assert len(sink.messages) == 3 and len(sink.tls_sessions) == 2
    assert {m.session for m in sink.messages[:2]} == sink.tls_sessions


async def test_starttls_auto_without_tls_and_require_refused(sink: Sink, port: int) -> None:
    provider = SmtpProvider(url(port, "auto"), "mx.tidings.example")
    assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
    await provider.aclose()
    assert not sink.tls_sessions
    provider = SmtpProvider(url(port, "require"), "mx.tidings.example")
    result = await provider.send(outgoing("ada@example.org"))
    assert "STARTTLS" in result.deferred[0].message
    assert len(sink.messages) == 1


async def test_starttls_with_an_untrusted_certificate_is_refused(
    sink: Sink, certificate: tuple[Path, Path]
) -> None:
    with running_sink(sink, tls=certificate) as port:
        provider = SmtpProvider(url(port, "auto"), "mx.tidings.example")
        result = await provider.send(outgoing("ada@example.org"))
    assert "TLS" in result.deferred[0].message and not sink.messages


@pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS")
async def test_auth(sink: Sink) -> None:
    from aiosmtpd.smtp import AuthResult

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                     data: Any) -> Any:
        good = data.login == b"tidings" and data.password == b"s3cret:/@"
        return AuthResult(success=good, handled=False)

    with running_sink(sink, authenticator=authenticate, auth_require_tls=False,
                      auth_required=True) as port:
        provider = SmtpProvider(url(port, username="tidings", password="s3cret:/@"), "mx.t")
        assert (await provider.send(outgoing("ada@example.org"))).outcomes[0].type == "sent"
        await provider.aclose()
        provider = SmtpProvider(url(port, username="tidings", password="wrong"), "mx.t")
        result = await provider.send(outgoing("ada@example.org"))
        assert "authentication failed" in result.deferred[0].message
    assert len(sink.messages) == 1


async def test_a_message_that_cannot_be_signed_fails_alone(sink: Sink, port: int) -> None:
    provider = SmtpProvider(url(port), "mx.tidings.example")
    bad = outgoing("bad@example.org", dkim=DkimKey("acme.example", "tidings1", b"not a key"))
    results: dict[str, object] = {}

    async def send(email_: OutgoingEmail) -> None:
        try:
            results[email_.recipients[0]] = (await provider.send(email_)).outcomes[0].type
        except ValueError as error:
            results[email_.recipients[0]] = type(error).__name__

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(send, outgoing(f"r{i}@example.org"))
        nursery.start_soon(send, bad)
    await provider.aclose()
    assert results.pop("bad@example.org") == "ValueError"
    assert set(results.values()) == {"sent"} and len(sink.messages) == 10


async def test_a_connection_lost_in_one_recipients_transaction_defers_that_one_only() -> None:
    """The server answers bo@'s MAIL FROM and hangs up: bo@ is deferred
    (part of it may have taken effect, so it is not tried again at once),
    and cy@ goes on a fresh connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sessions: list[list[bytes]] = []

    async def serve(stream: trio.SocketStream) -> None:
        buffer = b""
        seen: list[bytes] = []
        sessions.append(seen)

        async def until(marker: bytes) -> bytes:
            nonlocal buffer
            while marker not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    raise trio.BrokenResourceError
                buffer += data
            head, _, buffer = buffer.partition(marker)
            return head + marker

        await stream.send_all(b"220 ready\r\n")
        await until(b"\r\n")
        await stream.send_all(b"250-fake\r\n250 PIPELINING\r\n")
        try:
            while True:
                mail = await until(b"\r\n")
                if mail == b"QUIT\r\n":
                    await stream.send_all(b"221 bye\r\n")
                    return
                seen.append(mail.removesuffix(b"\r\n"))
                envelope = await until(b"DATA\r\n")
                if b"bo@" in envelope:
                    await stream.send_all(b"250 ok\r\n")
                    await stream.aclose()
                    return
                await stream.send_all(b"250 ok\r\n250 ok\r\n354 go\r\n")
                await until(b"\r\n.\r\n")
                await stream.send_all(b"250 queued\r\n")
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        provider = SmtpProvider(url(port), "mx.tidings.example")
        with trio.fail_after(5):
            result = await provider.send(
                outgoing("ada@example.org", "bo@example.org", "cy@example.org")
            )
            await provider.aclose()
        nursery.cancel_scope.cancel()
    assert [(o.recipient, o.type) for o in result.outcomes] == [
        ("ada@example.org", "sent"), ("cy@example.org", "sent")
    ]
    assert [d.recipient for d in result.deferred] == ["bo@example.org"]
    assert "connection lost" in result.deferred[0].message
    assert provider.connections_opened == 2
    assert sessions == [
        [b"MAIL FROM:<b-1@bounces.acme.example>", b"MAIL FROM:<b-2@bounces.acme.example>"],
        [b"MAIL FROM:<b-3@bounces.acme.example>"],
    ]


class Lines:
    """What a relay of the tests reads: its client's lines, one at a time
    (without their CRLF); a client gone is BrokenResourceError."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def __call__(self) -> bytes:
        while b"\r\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(b"\r\n")
        return head


@pytest.mark.parametrize("pipelining", [True, False])
@pytest.mark.parametrize("at", ["MAIL", "RCPT"])
async def test_a_421_that_closes_the_channel_is_the_reply_recorded(
    pipelining: bool, at: str
) -> None:
    """RFC 5321 §3.8: the server answers 421 and closes. The recipient is
    deferred with that reply, not with "connection lost"."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def serve(stream: trio.SocketStream) -> None:
        line = Lines(stream)
        await stream.send_all(b"220 ready\r\n")
        await line()
        await stream.send_all(b"250-fake\r\n250 PIPELINING\r\n" if pipelining else b"250 fake\r\n")
        if at == "RCPT":
            await line()
            await stream.send_all(b"250 ok\r\n")
        await line()
        await stream.send_all(b"421 4.7.0 too many connections, closing\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        provider = SmtpProvider(url(port), "mx.tidings.example")
        with trio.fail_after(5):
            result = await provider.send(outgoing("ada@example.org"))
            await provider.aclose()
        nursery.cancel_scope.cancel()
    assert not result.outcomes
    assert [(d.code, d.message) for d in result.deferred] == [
        ("421", "4.7.0 too many connections, closing")
    ]


async def test_a_reply_of_endless_lines_ends_the_connection() -> None:
    """A relay cannot make Tidings hold an unbounded reply."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    sent = 0

    async def serve(stream: trio.SocketStream) -> None:
        nonlocal sent
        try:
            while True:
                await stream.send_all(b"220-" + b"x" * 90 + b"\r\n")
                sent += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, listeners)
        provider = SmtpProvider(url(port), "mx.tidings.example")
        with trio.fail_after(5):
            result = await provider.send(outgoing("ada@example.org"))
        nursery.cancel_scope.cancel()
    [deferral] = result.deferred
    assert "more than 200 lines" in (deferral.message or "")
    assert sent < 5000  # what the kernel's buffers took before the connection ended


async def _slow_relay(
    listeners: list[trio.SocketListener], stall: set[str], delay: float
) -> None:
    """A relay that never answers RCPT for the local parts in ``stall`` (a
    tarpit) and answers every other RCPT after ``delay`` seconds."""

    async def serve(stream: trio.SocketStream) -> None:
        line = Lines(stream)
        try:
            await stream.send_all(b"220 ready\r\n")
            await line()
            await stream.send_all(b"250 fake\r\n")
            while True:
                command = await line()
                if command.startswith(b"RCPT"):
                    if command.split(b"<")[1].split(b"@")[0].decode() in stall:
                        await trio.sleep_forever()
                    await trio.sleep(delay)
                if command == b"DATA":
                    await stream.send_all(b"354 go\r\n")
                    while await line() != b".":
                        pass
                    await stream.send_all(b"250 queued\r\n")
                elif command == b"QUIT":
                    await stream.send_all(b"221 bye\r\n")
                    return
                else:
                    await stream.send_all(b"250 ok\r\n")
        except trio.BrokenResourceError:
            pass

    await trio.serve_listeners(serve, listeners)


async def test_a_team_whose_recipients_stall_holds_at_most_half_the_connections() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    acme, beta = uuid.uuid4(), uuid.uuid4()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_slow_relay, listeners, {"tarpit"}, 0.0)
        provider = SmtpProvider(url(port), "mx.tidings.example", connections=2)
        for n in range(3):  # acme's three emails, each stuck at its RCPT
            nursery.start_soon(provider.send, outgoing(f"tarpit@d{n}.example", team_id=acme))
        await trio.sleep(0.5)
        with trio.fail_after(3):
            result = await provider.send(outgoing("ok@example.org", team_id=beta))
        assert [o.type for o in result.outcomes] == ["sent"]
        nursery.cancel_scope.cancel()


async def test_an_email_holds_its_connection_for_a_bounded_time_per_try() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_slow_relay, listeners, set(), 0.6)
        provider = SmtpProvider(url(port), "mx.tidings.example", email_seconds=1.0)
        with trio.fail_after(5):
            result = await provider.send(
                outgoing("a@example.org", "b@example.org", "c@example.org", "d@example.org"))
            await provider.aclose()
        nursery.cancel_scope.cancel()
    assert [o.recipient for o in result.outcomes] == ["a@example.org", "b@example.org"]
    assert [(d.recipient, d.code) for d in result.deferred] == [
        ("c@example.org", None), ("d@example.org", None)
    ]
    assert "took too long" in (result.deferred[0].message or "")
