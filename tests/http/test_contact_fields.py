"""The field checks shared by POST/PATCH /contacts and the import."""

from __future__ import annotations

import itertools

import email_validator
import pytest

from tidings.http.contact_fields import (
    FieldError,
    check_properties,
    normalize_email,
    normalize_phone,
    property_from_text,
)

LOCALS = [
    "ada", "Ada.Lovelace", "a+tag", "x_y-z", "o'neil", "postmaster", "Info", "a..b", ".a",
    "a.", "", "é", "a b", '"quoted"', "a" * 64, "a" * 65, "{weird}|~", "a@b",
]
DOMAINS = [
    "example.com", "EXAMPLE.com", "sub.Example.org", "localhost", "example", "exa_mple.com",
    "-example.com", "example-.com", "ex..ample.com", "xn--bcher-kva.example", "bücher.example",
    "example.test", "example.invalid", "123.com", "example.c0m", "[127.0.0.1]", "a" * 64 + ".com",
    "example.com.", "",
]


def reference(address: str) -> str | None:
    """What email-validator itself makes of the address (None: refused)."""
    try:
        return str(email_validator.validate_email(address, check_deliverability=False).normalized)
    except email_validator.EmailNotValidError:
        return None


def ours(address: str) -> str | None:
    try:
        return normalize_email(address)
    except ValueError:
        return None


def test_email_normalization_agrees_with_email_validator() -> None:
    # The fast path for plain addresses must accept and normalise exactly as
    # email-validator does, including the cases it hands over to it.
    for local, domain in itertools.product(LOCALS, DOMAINS):
        address = f"{local}@{domain}"
        assert ours(address) == reference(address), address
    long_address = "a" * 60 + "@" + ".".join(["b" * 60] * 4) + ".com"
    assert ours(long_address) == reference(long_address) is None


def test_email_is_stripped_and_its_domain_lowercased() -> None:
    assert normalize_email("  Ada@Example.COM ") == "Ada@example.com"
    with pytest.raises(ValueError, match="not a valid email address"):
        normalize_email("ada.example.com")


@pytest.mark.parametrize(
    "phone, e164, country",
    [
        ("+44 20 7946 0958", "+442079460958", "GB"),
        ("+1 (415) 555-0100", "+14155550100", "US"),
        ("+33 1 23 45 67 89", "+33123456789", "FR"),
        ("+800 1234 5678", "+80012345678", None),  # non-geographic: no country
    ],
)
def test_phone_to_e164_and_region(phone: str, e164: str, country: str | None) -> None:
    assert normalize_phone(phone) == (e164, country)


@pytest.mark.parametrize("phone", ["020 7946 0958", "+1 555", "call me", "+999 123456"])
def test_bad_phone_names_the_field(phone: str) -> None:
    with pytest.raises(FieldError, match="^mobile: "):
        normalize_phone(phone, field="mobile")


def test_property_values_are_checked_against_their_type() -> None:
    known = {"plan": "string", "seats": "number", "vip": "boolean", "renews": "date"}
    values = {"plan": "pro", "seats": 3.5, "vip": False, "renews": "2027-02-28", "old": None}
    with pytest.raises(FieldError, match="^properties.old: no contact property"):
        check_properties(values, known)  # type: ignore[arg-type]
    del values["old"]
    values["plan"] = None
    to_set, removed = check_properties(values, known)  # type: ignore[arg-type]
    assert to_set == {"seats": 3.5, "vip": False, "renews": "2027-02-28"}
    assert removed == ["plan"]
    wrong = [
        ("seats", "3"), ("seats", True), ("seats", float("nan")), ("vip", 1), ("vip", "true"),
        ("plan", 5), ("renews", "2027-02-30"), ("renews", "28/02/2027"), ("renews", 20270228),
    ]
    for key, value in wrong:
        with pytest.raises(FieldError, match=f"^properties.{key}: must be"):
            check_properties({key: value}, known)  # type: ignore[arg-type]


def test_csv_cells_become_typed_property_values() -> None:
    assert property_from_text("number", "42", "p") == 42
    assert property_from_text("number", "-1.5", "p") == -1.5
    assert property_from_text("boolean", "Yes", "p") is True
    assert property_from_text("boolean", "0", "p") is False
    assert property_from_text("date", "2026-01-31", "p") == "2026-01-31"
    assert property_from_text("string", "007", "p") == "007"
    for kind, text in [("number", "ten"), ("number", "inf"), ("boolean", "maybe"),
                       ("date", "2026-13-01")]:
        with pytest.raises(FieldError, match="^p: must be"):
            property_from_text(kind, text, "p")  # type: ignore[arg-type]
