"""The MIME message of an outgoing email, as the bytes SMTP carries.

Built by hand rather than with ``email.message``: the standard library's
generator costs about a millisecond a message, as much as the DKIM
signature. Bodies are UTF-8 in quoted-printable, headers with non-ASCII
text are RFC 2047 encoded, address domains in their ASCII (xn--) form; the
message is 7-bit with CRLF line ends. A text part is derived from the html
when only html is given.

An address whose local part is not ASCII (acceptance refuses them; a
contact's address may be one) has no 7-bit form: it is written in UTF-8
(RFC 6532), and the SMTP client sends such a message only with SMTPUTF8,
failing it with a clear reason otherwise. Building a message never raises
for an address.
"""

from __future__ import annotations

import binascii
import re
import time
from datetime import UTC, datetime
from email.header import Header
from email.utils import format_datetime
from functools import lru_cache
from uuid import UUID

from tidings.addresses import display, shown_parts, wire_address
from tidings.html_text import html_to_text
from tidings.ids import token_hex

CRLF = b"\r\n"
# Headers Tidings writes itself; a caller's header of the same name is dropped.
OWN_HEADERS = frozenset({
    "from", "to", "cc", "bcc", "reply-to", "subject", "date", "message-id", "mime-version",
    "content-type", "content-transfer-encoding", "dkim-signature", "return-path",
})
_NAME = re.compile(r"^[!-9;-~]+$")


def message_id(email_id: UUID, domain: str) -> str:
    """``<id@domain>``: the Message-ID of the email, on its sending domain."""
    return f"<{email_id}@{domain}>"


# The longest word a header line keeps as it is: folding happens only at
# spaces, and a line holds at most 998 octets with the header's name.
LONGEST_WORD = 900


# Control characters a header's text cannot carry (RFC 5322 §2.2); the API
# refuses them, and text a template rendered loses them.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x9f]")
# What would end a header line, or look like it to a reader: one space instead.
_LINE_BREAKS = re.compile(r"(?:\r\n|[\n\r\v\f\x1c-\x1f\u2028\u2029])+")


def _encoded_words(text: str, field: str | None) -> str:
    """``text`` as RFC 2047 encoded words, folded between them: each word at
    most 75 octets and each line at most 76 (RFC 2047 §2), the first line
    counting the ``field``'s name and colon (None: a line that begins with
    the fold's space)."""
    return Header(text, "utf-8", header_name=field).encode(
        maxlinelen=76 if field else 75
    ).replace("\n", "\r\n")


def _header_text(value: str, field: str) -> str:
    """A header's text, one logical line: ASCII as it is, other text (or a
    word too long to fold, or text a mail client would take for an encoded
    word, ``=?``) as RFC 2047 encoded words, so that a client shows the text
    as the API does rather than decoding what it holds."""
    # On one line, and otherwise as given: tabs, runs of spaces, no-break
    # and ideographic spaces stay (a subject is shown as the API shows it).
    value = _LINE_BREAKS.sub(" ", _CONTROL.sub("", value)).strip()
    if (
        value.isascii() and "=?" not in value
        and all(len(word) <= LONGEST_WORD for word in value.split(" "))
    ):
        return value
    return _encoded_words(value, field)


def _mailbox(name: str, address: str, field: str | None) -> str:
    wire = wire_address(address)
    if not name:
        return wire
    if not name.isascii() or "=?" in name or any(
        len(word) > LONGEST_WORD for word in name.split()
    ):
        # Outside ASCII, a word too long to fold, or text a mail client would
        # take for an encoded word: RFC 2047 encoded words of at most 75
        # octets (folded between them), whose text keeps every space.
        words = _encoded_words(name, field)
        # The address on the words' last line when that stays within 76.
        start = 0 if "\n" in words else (len(field) + 2 if field else 1)
        last = start + len(words) - (words.rfind("\n") + 1)
        return words + ("\r\n " if last + 3 + len(wire) > 76 else " ") + f"<{wire}>"
    # Quoted when it holds a special character, or spaces that only quotes
    # keep (at either end, several in a row): as the API shows the name.
    return display(name, wire)


def _addresses(values: tuple[str, ...] | list[str], field: str) -> str:
    """The mailboxes of a ``field`` (From, To...), one on each line."""
    return ",\r\n ".join(
        _mailbox(name, address, field if n == 0 else None)
        for n, (name, address) in enumerate(shown_parts(values))
    )


def _fold(line: str) -> bytes:
    """A header (ASCII but for an address that needs SMTPUTF8), each of its
    lines (it may be folded already) folded at spaces to stay under 998 octets."""
    data = line.encode("utf-8")
    lines = data.split(CRLF)
    if all(len(one) <= 998 for one in lines):
        return data
    return CRLF.join(folded for one in lines for folded in _fold_line(one))


def _fold_line(line: bytes) -> list[bytes]:
    if len(line) <= 998:
        return [line]
    words = line.split(b" ")
    out, current = [], words[0]
    for word in words[1:]:
        if current.strip() and len(current) + 1 + len(word) > LONGEST_WORD:
            out.append(current)
            current = b" " + word
        else:
            current += b" " + word
    out.append(current)
    return out


def _qp(text: str) -> bytes:
    normal = text.replace("\r\n", "\n").replace("\r", "\n")
    encoded = binascii.b2a_qp(normal.encode("utf-8"), istext=True)
    lines = encoded.split(b"\n")
    # A dot at the start of a line is fine for SMTP (the client stuffs it),
    # but some gateways strip it: it is encoded. binascii also passes 76 by
    # one when it encodes a space that ends a line.
    if encoded.startswith(b".") or b"\n." in encoded or max(map(len, lines)) > 76:
        lines = [piece for line in lines for piece in _dotless(line)]
    return CRLF.join(lines)


def _dotless(line: bytes) -> list[bytes]:
    """A quoted-printable line with a leading dot as ``=2E``, cut with soft
    line breaks (never inside an ``=XX``) to lines of at most 76 octets
    (RFC 2045 §6.7)."""
    pieces = []
    while True:
        if line.startswith(b"."):
            line = b"=2E" + line[1:]
        if len(line) <= 76:
            pieces.append(line)
            return pieces
        cut = 75
        if line[cut - 1:cut] == b"=":
            cut -= 1
        elif line[cut - 2:cut - 1] == b"=":
            cut -= 2
        pieces.append(line[:cut] + b"=")
        line = line[cut:]


def _part(subtype: str, text: str) -> bytes:
    return CRLF.join([
        f"Content-Type: text/{subtype}; charset=utf-8".encode(),
        b"Content-Transfer-Encoding: quoted-printable",
        b"",
        _qp(text),
    ])


@lru_cache(maxsize=4)
def _date(second: int) -> bytes:
    """The Date header of the messages made in this second (they share it)."""
    return f"Date: {format_datetime(datetime.fromtimestamp(second, UTC))}".encode()  # +0000


def build_message(
    *,
    email_id: UUID,
    domain: str,
    sender: str,
    to: tuple[str, ...],
    subject: str,
    cc: tuple[str, ...] = (),
    reply_to: tuple[str, ...] = (),
    html: str | None = None,
    text: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The message: headers (never Bcc) and a text, html or multipart/alternative body."""
    lines: list[bytes] = [
        _fold(f"From: {_addresses([sender], 'From')}"),
        _fold(f"To: {_addresses(to, 'To')}") if to else b"To: undisclosed-recipients:;",
    ]
    if cc:
        lines.append(_fold(f"Cc: {_addresses(cc, 'Cc')}"))
    if reply_to:
        lines.append(_fold(f"Reply-To: {_addresses(reply_to, 'Reply-To')}"))
    lines += [
        _fold(f"Subject: {_header_text(subject, 'Subject')}"),
        _date(int(time.time())),
        f"Message-ID: {message_id(email_id, domain)}".encode(),
        b"MIME-Version: 1.0",
    ]
    for name, value in headers:
        if name.lower() in OWN_HEADERS or not _NAME.match(name):
            continue
        lines.append(_fold(f"{name}: {_header_text(value, name)}"))
    if text is None and html is not None:
        text = html_to_text(html)
    if html is None:
        lines.append(_part("plain", text or ""))
    else:
        boundary = f"=_tidings_{token_hex(12)}"
        lines += [
            f'Content-Type: multipart/alternative; boundary="{boundary}"'.encode(),
            b"",
            f"--{boundary}".encode(),
            _part("plain", text or ""),
            f"--{boundary}".encode(),
            _part("html", html),
            f"--{boundary}--".encode(),
        ]
    return CRLF.join(lines) + CRLF
