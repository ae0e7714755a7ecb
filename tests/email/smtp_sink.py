"""A real SMTP server (aiosmtpd) on 127.0.0.1 for the SMTP provider's tests,
with scripted replies per recipient and an optional STARTTLS certificate."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Received:
    mail_from: str
    recipients: list[str]
    data: bytes
    session: int


@dataclass
class Sink:
    """The handler: records messages; ``rcpt_replies[address]`` answers RCPT for
    that address, ``data_reply`` answers every message instead of 250."""

    messages: list[Received] = field(default_factory=list)
    rcpt_replies: dict[str, str] = field(default_factory=dict)
    mail_reply: str | None = None
    data_reply: str | None = None
    tls_sessions: set[int] = field(default_factory=set)
    # Offer PIPELINING (aiosmtpd serves pipelined commands, but does not say so).
    pipelining: bool = True

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        session.host_name = hostname
        if not self.pipelining:
            return responses
        return [*responses[:-1], "250-PIPELINING", responses[-1]]

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.mail_reply:
            return self.mail_reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        reply = self.rcpt_replies.get(address)
        if reply:
            return reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.data_reply:
            return self.data_reply
        if session.ssl is not None:
            self.tls_sessions.add(id(session))
        self.messages.append(
            Received(envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content,
                     id(session))
        )
        return "250 2.0.0 queued"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    return cert_file, key_file


@contextmanager
def running_sink(
    sink: Sink, *, tls: tuple[Path, Path] | None = None, port: int | None = None, **smtp: Any
) -> Iterator[int]:
    """Serve ``sink`` on 127.0.0.1 until the block ends; yields the port.
    ``tls`` (certificate, key) offers STARTTLS."""
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        smtp["tls_context"] = context
    port = port or free_port()
    # A plain asyncio loop of its own: trio-asyncio's policy would hand out its loop.
    loop = asyncio.SelectorEventLoop()
    controller = Controller(sink, hostname="127.0.0.1", port=port, loop=loop, **smtp)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()
        loop.close()
