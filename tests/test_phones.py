"""Phone numbers: E.164, the ISO country, and a refusal that names the field."""

from __future__ import annotations

import pytest

from tidings.fields import FieldError
from tidings.phones import Phone, parse_phone


@pytest.mark.parametrize(
    "text, e164, country",
    [
        ("+44 20 7946 0958", "+442079460958", "GB"),
        ("+1 (415) 555-0100", "+14155550100", "US"),
        ("+33 1 23 45 67 89", "+33123456789", "FR"),
        ("+800 1234 5678", "+80012345678", None),  # non-geographic: no country
    ],
)
def test_a_number_becomes_e164_and_its_country(text: str, e164: str, country: str | None) -> None:
    assert parse_phone(text) == Phone(e164, country)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("020 7946 0958", "not a phone number in international format"),
        ("call me", "not a phone number in international format"),
        ("+1 555", "not a valid phone number"),
        ("+999 123456", "not a phone number in international format"),
        # Keypad letters and extensions would reach another number than the one written.
        ("+1415555ABCD", "holds letters"),
        ("+1 800 FLOWERS", "holds letters"),
        ("+14155551234;ext=5", "has an extension"),
        ("+1 415 555 1234 x5", "has an extension"),
    ],
)
def test_a_refusal_names_the_field_and_why(text: str, reason: str) -> None:
    with pytest.raises(FieldError) as refused:
        parse_phone(text, "mobile")
    assert refused.value.field == "mobile" and reason in refused.value.reason
    assert str(refused.value).startswith("mobile: ")


def test_a_possible_number_is_enough_when_validity_is_not_asked() -> None:
    # 555 numbers are fictional: possible, but not assigned.
    with pytest.raises(FieldError, match="not a valid phone number"):
        parse_phone("+1 555 555 0001", "to")
    assert parse_phone("+1 555 555 0001", "to", valid=False) == Phone("+15555550001", None)
    with pytest.raises(FieldError, match="not a possible phone number"):
        parse_phone("+1 555", "to", valid=False)
