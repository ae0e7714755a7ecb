"""DKIM signatures (dkimpy's relaxed canonicalisation, OpenSSL's RSA), checked
by dkimpy's verifier on message shapes that exercise them: folded and long headers, runs of
spaces and tabs, trailing blank lines, an empty body, oversigned headers."""

from __future__ import annotations

import email
import email.policy
import uuid
from email.header import decode_header, make_header
from email.utils import getaddresses
from typing import Any

import dkim
import pytest

from tidings.addresses import display
from tidings.email.dkim import new_private_key, public_key_base64
from tidings.email.mime import build_message
from tidings.email.signing import dkim_signature, sign

KEY = new_private_key()
RECORD = f"v=DKIM1; k=rsa; p={public_key_base64(KEY)}".encode()


def dns(name: bytes, timeout: int = 5) -> bytes:
    assert name == b"tidings1._domainkey.acme.example."
    return RECORD


SHAPES: dict[str, dict[str, Any]] = {
    "html only": {"sender": "Acme <news@acme.example>", "to": ("ada@example.org",),
                  "subject": "Your receipt", "html": "<h1>Thanks</h1><p>On its way.</p>"},
    "long, folded and non-ASCII headers": {
        "sender": "Zoë Ünïcode <news@acme.example>",
        "to": tuple(f"r{i}@example.org" for i in range(40)),
        "cc": ("cc@example.org",), "reply_to": ("Ré <r@acme.example>",),
        "subject": "Ça va?  tabs\tand   spaces " + "x" * 300,
        "text": ".a dot first\n\ntrailing spaces   \n\tand a tab\n\n\n",
        "headers": (("List-Unsubscribe", "<https://acme.example/u>"), ("X-Long", "y " * 600)),
    },
    "empty body": {"sender": "news@acme.example", "to": ("ada@example.org",),
                   "subject": "empty", "text": ""},
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_dkimpy_verifies_the_signature(shape: str) -> None:
    message = build_message(email_id=uuid.uuid4(), domain="acme.example", **SHAPES[shape])
    signed = sign(message, "acme.example", "tidings1", KEY)
    assert dkim.verify(signed, dnsfunc=dns)
    header = signed[:signed.index(b"\r\n", signed.index(b" b=") + 4) + 2]
    assert all(len(line) <= 78 for line in header.split(b"\r\n"))


@pytest.mark.parametrize("length", [12, 69, 70, 71, 100, 209])
def test_a_long_domain_or_selector_is_never_cut_by_a_fold(length: int) -> None:
    """Whitespace inside d= or s= makes another name (RFC 6376 §3.2): the
    header folds between tags, and the longest domain Tidings takes (209
    characters) stays whole on its line."""
    labels = ["a" * 63] * (length // 64) + ["b" * (length % 64 - 4 or 1)]
    domain = ".".join(labels) + ".com"
    assert len(domain) in (length, length - 3)  # 12 -> 'bbbbbbbb.com'
    selector = "tidings" + "s" * 50
    looked_up: list[bytes] = []

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        looked_up.append(name)
        return RECORD if name == f"{selector}._domainkey.{domain}.".encode() else b""

    message = build_message(email_id=uuid.uuid4(), domain=domain, sender=f"n@{domain}",
                            to=("ada@example.org",), subject="s", text="t")
    signed = sign(message, domain, selector, KEY)
    assert dkim.verify(signed, dnsfunc=lookup), looked_up
    header = signed[:signed.index(b"\r\n", signed.index(b" b=") + 4) + 2].decode()
    assert f" d={domain};" in header and f" s={selector};" in header
    assert all(len(line) <= 78 for line in header.split("\r\n") if domain not in line)


def test_a_changed_or_added_header_breaks_it() -> None:
    message = build_message(email_id=uuid.uuid4(), domain="acme.example", **SHAPES["html only"])
    header = dkim_signature(message, "acme.example", "tidings1", KEY)
    assert dkim.verify(header + message, dnsfunc=dns)
    changed = message.replace(b"Subject: Your receipt", b"Subject: Your  receipt!")
    assert not dkim.verify(header + changed, dnsfunc=dns)
    # Subject is oversigned: a second one added later does not pass.
    added = b"Subject: Pay now\r\n" + message
    assert not dkim.verify(header + added, dnsfunc=dns)
    # Nor does a Cc or Reply-To the message did not have: their absence is signed.
    for extra in (b"Reply-To: attacker@evil.example\r\n", b"Cc: victim@example.org\r\n",
                  b"To: other@example.org\r\n"):
        assert not dkim.verify(header + extra + message, dnsfunc=dns), extra
    # Relaxed: folding and spacing changes on the way do not matter.
    refolded = message.replace(b"Subject: Your receipt", b"Subject:  Your\r\n\treceipt ")
    assert dkim.verify(header + refolded, dnsfunc=dns)


@pytest.mark.parametrize(("word", "subject"), [
    (998, "Hi " + "x" * 998), (5000, "Hi " + "x" * 5000), (10, "Grüße aus Köln, " * 120),
])
def test_no_line_exceeds_998_octets_whatever_the_words(word: int, subject: str) -> None:
    """A header folds only at spaces: a word too long for one line is sent
    as RFC 2047 encoded words, which a reader joins back; a long non-ASCII
    subject, encoded and folded already, keeps its folds (and no empty line
    ends the headers early)."""
    message = build_message(
        email_id=uuid.uuid4(), domain="acme.example", sender="news@acme.example",
        to=("ada@example.org",), subject=subject, text="x",
        headers=(("X-Long-Word", "y" * word), ("X-Exact", "z" * (998 - len("X-Exact: ")))),
    )
    assert max(len(line) for line in message.split(b"\r\n")) <= 998
    parsed = email.message_from_bytes(message, policy=email.policy.default)
    assert parsed["Subject"] == " ".join(subject.split())
    assert parsed["X-Long-Word"] == "y" * word
    assert dkim.verify(sign(message, "acme.example", "tidings1", KEY), dnsfunc=dns)


def test_display_names_reach_the_message_as_the_api_shows_them() -> None:
    names = [
        "  Bob  Smith ", "Ann Lee", " Al", 'Acme, "Inc."', "Zoë  Ü ",
        "é" * 600, "x" * 1500, "\U0001f600" * 200,  # long: many encoded words
        "=?utf-8?b?UGF5UGFs?=",  # shown as typed, not decoded to another name
    ]
    raw = build_message(
        email_id=uuid.uuid4(), domain="acme.example", sender=display(names[-1], "b@acme.example"),
        to=tuple(display(name, f"r{n}@example.org") for n, name in enumerate(names)),
        subject="s", text="t",
    )
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    parsed = email.message_from_bytes(raw, policy=email.policy.compat32)

    def shown(name: str) -> str:  # as a mail client shows it: encoded words decoded
        return str(make_header(decode_header(name))) if "=?" in name else name

    assert [shown(name) for name, _ in getaddresses(parsed.get_all("To"))] == names
    assert shown(getaddresses([parsed["From"]])[0][0]) == names[-1]
    assert dkim.verify(sign(raw, "acme.example", "tidings1", KEY), dnsfunc=dns)


def test_a_subject_and_header_values_keep_their_spaces() -> None:
    """Runs of spaces, tabs, no-break and ideographic spaces reach the
    reader as the API shows them; only line breaks become one space."""
    subject = "Preis:\u00a0100\u00a0€ —  zwei  Leerzeichen\u3000日本\tTab"
    for given, shown in ((subject, subject), ("a  b\tc", "a  b\tc"),
                         ("one\r\ntwo\u2028three\x1fend", "one two three end")):
        message = build_message(
            email_id=uuid.uuid4(), domain="acme.example", sender="news@acme.example",
            to=("ada@example.org",), subject=given, text="x", headers=(("X-Note", given),),
        )
        parsed = email.message_from_bytes(message, policy=email.policy.default)
        assert (parsed["Subject"], parsed["X-Note"]) == (shown, shown)
        assert dkim.verify(sign(message, "acme.example", "tidings1", KEY), dnsfunc=dns)


def test_control_characters_never_reach_a_header() -> None:
    """The API refuses them; text a template rendered into a subject loses them."""
    message = build_message(
        email_id=uuid.uuid4(), domain="acme.example", sender="news@acme.example",
        to=("ada@example.org",), subject="a\x1b[2Jb\x7fc\x08d\x00e", text="x",
        headers=(("X-Ctl", "1\x0b2\x1b3"),),
    )
    assert b"Subject: a[2Jbcde\r\n" in message
    assert b"X-Ctl: 1 23\r\n" in message
