"""Email addresses: bare, with a display name, in lists, and the RFC 5321 limits."""

from __future__ import annotations

import itertools

import email_validator
import pytest

from tidings.addresses import (
    Mailbox,
    normalize_address,
    parse_address,
    parse_address_list,
    parse_mailbox,
    parse_mailbox_list,
)
from tidings.fields import FieldError

LOCALS = [
    "ada", "Ada.Lovelace", "a+tag", "x_y-z", "o'neil", "postmaster", "Info", "a..b", ".a",
    "a.", "", "é", "a b", '"quoted"', "a" * 64, "a" * 65, "é" * 32, "é" * 33, "{weird}|~", "a@b",
]
DOMAINS = [
    "example.com", "EXAMPLE.com", "sub.Example.org", "localhost", "example", "exa_mple.com",
    "-example.com", "example-.com", "ex..ample.com", "xn--bcher-kva.example", "bücher.example",
    "example.test", "example.invalid", "123.com", "example.c0m", "[127.0.0.1]", "a" * 64 + ".com",
    "example.com.", "",
]


def reference(address: str) -> str | None:
    """What email-validator makes of the address, with the RFC 5321 limits
    (None: refused)."""
    try:
        checked = email_validator.validate_email(address, check_deliverability=False)
    except email_validator.EmailNotValidError:
        return None
    if len(checked.local_part.encode()) > 64 or len(checked.normalized.encode()) > 254:
        return None
    return str(checked.normalized)


def ours(address: str) -> str | None:
    try:
        return normalize_address(address)
    except FieldError:
        return None


def test_normalization_agrees_with_email_validator_within_the_limits() -> None:
    # The fast path for plain addresses must accept and normalise exactly as
    # email-validator does, including the cases it hands over to it.
    for local, domain in itertools.product(LOCALS, DOMAINS):
        address = f"{local}@{domain}"
        assert ours(address) == reference(address), address
    long_address = "a" * 60 + "@" + ".".join(["b" * 60] * 4) + ".com"
    assert ours(long_address) == reference(long_address) is None


def test_the_part_before_the_at_is_at_most_64_octets() -> None:
    assert normalize_address("a" * 64 + "@example.com") == "a" * 64 + "@example.com"
    # email-validator alone takes 65; RFC 5321 §4.5.3.1.1 does not.
    email_validator.validate_email("a" * 65 + "@example.com", check_deliverability=False)
    with pytest.raises(FieldError, match="^to: the part before the @ is 65 octets long"):
        normalize_address("a" * 65 + "@example.com", "to")
    # Octets, not characters: é is two of them in UTF-8.
    assert normalize_address("é" * 32 + "@example.com") == "é" * 32 + "@example.com"
    with pytest.raises(FieldError, match="66 octets"):
        normalize_address("é" * 33 + "@example.com")


def test_the_whole_address_is_at_most_254_octets() -> None:
    domain = ".".join(["d" * 60] * 3) + "." + "d" * 5 + ".com"  # 192 octets
    at_limit = "a" * (254 - 1 - len(domain)) + "@" + domain
    assert len(at_limit) == 254
    assert normalize_address(at_limit) == at_limit
    with pytest.raises(FieldError, match="255 octets|too long"):
        normalize_address("a" + at_limit)


def test_an_address_is_stripped_and_its_domain_lowercased() -> None:
    assert normalize_address("  Ada@Example.COM ") == "Ada@example.com"
    assert normalize_address("Postmaster@Example.com") == "postmaster@example.com"
    with pytest.raises(FieldError) as refused:
        normalize_address("ada.example.com", "email")
    assert refused.value.field == "email" and "@" in refused.value.reason


def test_a_bare_address_refuses_a_display_name_naming_the_field() -> None:
    assert parse_address("Help@Acme.Example", "reply_to") == "Help@acme.example"
    refused = ("Acme <help@acme.example>", "help@acme.example (Acme)", "a@x.example, b@x.example")
    for value in refused:
        with pytest.raises(FieldError, match="^reply_to: must be one email address, without"):
            parse_address(value, "reply_to")


def test_a_mailbox_has_an_optional_display_name() -> None:
    assert parse_mailbox("hi@Acme.Example") == Mailbox(None, "hi@acme.example")
    quoted = parse_mailbox('"Acme, Inc." <hi@acme.example>')
    assert quoted == Mailbox("Acme, Inc.", "hi@acme.example")
    assert parse_mailbox("Ünïcode Näme <hi@acme.example>").name == "Ünïcode Näme"
    assert Mailbox("Acme, Inc.", "hi@acme.example").formatted == '"Acme, Inc." <hi@acme.example>'
    assert Mailbox(None, "hi@acme.example").formatted == "hi@acme.example"


@pytest.mark.parametrize("name", [" Ann ", "Ann  Lee", " ", "Ann Lee", "Ünï Näme"])
def test_a_display_name_comes_back_as_it_was_given(name: str) -> None:
    shown = Mailbox(name, "hi@acme.example").formatted
    assert parse_mailbox(shown) == Mailbox(name, "hi@acme.example"), shown


@pytest.mark.parametrize(
    "value, reason",
    [
        ("Acme <hi@acme.example> (x)", "comments in parentheses"),
        ("Acme\r\nBcc: x@evil.example <hi@acme.example>", "control characters"),
        ("a@acme.example, b@acme.example", "optionally with a display name"),
        ("Team: a@acme.example;", "optionally with a display name"),
        ("Acme@[ ", "optionally with a display name"),
        ("Acme <" + "a" * 65 + "@acme.example>", "65 octets"),
    ],
)
def test_a_mailbox_refusal_names_the_field_and_why(value: str, reason: str) -> None:
    with pytest.raises(FieldError) as refused:
        parse_mailbox(value, "from")
    assert refused.value.field == "from" and reason in refused.value.reason


def test_an_address_list_is_a_string_or_a_list_within_its_limit() -> None:
    assert parse_address_list("A@X.example", "to", 50) == ["A@x.example"]
    assert parse_address_list(["a@x.example", "B@Y.example"], "cc", 2) == [
        "a@x.example", "B@y.example",
    ]
    assert parse_mailbox_list(["Ada <a@x.example>"], "to", 50) == [Mailbox("Ada", "a@x.example")]
    refusals: list[tuple[object, str]] = [
        ([], "^to: must name at least one address"),
        (["a@x.example"] * 3, "^to: at most 2 addresses, not 3"),
        (["a@x.example", "nope"], "^to.1: must be one email address"),
        (["a@x.example", 7], "^to.1: must be a string"),
        (42, "^to: must be an email address or a list of them"),
    ]
    for value, message in refusals:
        with pytest.raises(FieldError, match=message):
            parse_address_list(value, "to", 2)  # type: ignore[arg-type]
