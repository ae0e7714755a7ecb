"""What an email looks like on the wire: line lengths of quoted-printable
bodies and RFC 2047 encoded words, the Date zone, and the text part derived
from html keeping joiners and dropping what a browser never shows."""

from __future__ import annotations

import email
import email.policy
import logging
import random
import re
import uuid
from email.header import decode_header, make_header

import pytest

from tests.email.conftest import smtp_config
from tidings.email.mime import build_message
from tidings.html_text import html_to_text
from tidings.providers.smtp import open_provider

ENCODED_WORD = re.compile(rb"=\?[^?]+\?[qQbB]\?[^?]*\?=")


def message(**fields: object) -> bytes:
    base: dict[str, object] = {"sender": "hi@acme.example", "to": ("ada@example.com",),
                               "subject": "Hi", "text": "Hello"}
    return build_message(email_id=uuid.uuid4(), domain="acme.example", **{**base, **fields})


def lines_of(raw: bytes) -> list[bytes]:
    assert b"\n" not in raw.replace(b"\r\n", b"")  # CRLF only
    return raw.split(b"\r\n")


def test_quoted_printable_lines_stay_within_76_when_a_dot_begins_one() -> None:
    texts = ["x" * 75 + "." + "y" * 80, "." + "z" * 200, "a" * 74 + "..b"]
    generator = random.Random(7)
    texts += ["".join(generator.choice("ab. =\t.é😀\n") for _ in range(300)) for _ in range(300)]
    for text in texts:
        raw = message(text=text)
        body = raw.split(b"\r\n\r\n", 1)[1]
        assert all(len(line) <= 76 and not line.startswith(b".") for line in lines_of(body)), text
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert parsed.get_content().replace("\r\n", "\n").rstrip("\n") == text.rstrip("\n")


@pytest.mark.parametrize("fields", [
    {"subject": "Votre commande n° 12345 a été expédiée — merci d'avoir choisi notre boutique"},
    {"subject": "日本語の件名テスト" * 8},
    {"sender": "Émile Zola de la Très Longue Famille des Écrivains <news@acme.example>"},
    {"to": ("a@example.com", "Ünïcödé Pèrsön With A Very Long Name To Wrap <b@example.com>")},
    {"headers": (("X-Very-Long-Header-Name-For-Testing-Purposes", "v" * 990),)},
])
def test_encoded_words_and_their_lines_keep_rfc_2047_lengths(fields: dict[str, object]) -> None:
    raw = message(**fields)
    head = raw.split(b"\r\n\r\n", 1)[0]
    for line in lines_of(head):
        words = ENCODED_WORD.findall(line)
        assert all(len(word) <= 75 for word in words), line
        assert not words or len(line) <= 76, line
    parsed = email.message_from_bytes(raw, policy=email.policy.compat32)
    if "subject" in fields:
        assert str(make_header(decode_header(parsed["Subject"]))) == fields["subject"]


def test_the_date_has_a_numeric_zone() -> None:
    date = email.message_from_bytes(message())["Date"]
    assert re.fullmatch(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} \+0000", date), date


def test_the_text_part_keeps_joiners_inside_words_and_emoji() -> None:
    family = "👨\u200d👩\u200d👧\u200d👦"
    persian = "می\u200cخواهم"
    assert html_to_text(f"<p>Family {family} — {persian}</p>") == f"Family {family} — {persian}"
    # Next to spaces or other invisible characters they are a preheader's padding.
    assert html_to_text("<p>Hi&zwnj;&nbsp;&zwnj;&#847;&zwnj; there&zwnj;</p>") == "Hi  there"


@pytest.mark.parametrize("html", [
    '<script src="x"/>var a = "<b>hidden</b>";</script>rest of mail',
    "<iframe>hidden</iframe>rest of mail",
    "<noembed>hidden</noembed>rest of mail",
    "<noframes>hidden</noframes>rest of mail",
    "<style/>.hidden{}</style>rest of mail",
])
def test_the_text_part_leaves_out_what_a_browser_never_shows(html: str) -> None:
    assert html_to_text(html) == "rest of mail"


async def test_an_http_public_url_is_warned_about_when_mail_really_leaves(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = smtp_config(database_url, 9)
    with caplog.at_level(logging.WARNING, logger="tidings.emails"):
        async with open_provider(config.with_(public_url="https://mail.acme.example")):
            pass
        async with open_provider(config.with_(public_url="http://mail.acme.example")):
            pass
    warned = [r.getMessage() for r in caplog.records if "TIDINGS_PUBLIC_URL" in r.getMessage()]
    assert len(warned) == 1 and "http://mail.acme.example" in warned[0], warned
