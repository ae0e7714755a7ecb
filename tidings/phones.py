"""Phone numbers: parsed with phonenumbers, kept in E.164 with their ISO country.

Numbers must be written in international form (``+`` and the country code);
nothing is guessed from a default region. A refusal is a ``FieldError``
naming the field and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import phonenumbers

from tidings.fields import FieldError

INTERNATIONAL = "in international format (+country code)"


@dataclass(frozen=True)
class Phone:
    """A number in E.164 and its ISO 3166-1 alpha-2 country (None for
    non-geographic numbers such as +800, and numbers no country claims)."""

    e164: str
    country: str | None


def parse_phone(text: str, field: str = "phone", *, valid: bool = True) -> Phone:
    """``text`` as a ``Phone``; FieldError naming ``field`` otherwise.

    ``valid``: the number must be one phonenumbers knows to be assigned in
    its country's plan; without it, a number of a possible length is enough.
    """
    try:
        number = phonenumbers.parse(text, None)
    except phonenumbers.NumberParseException:
        raise FieldError(field, f"{text!r} is not a phone number {INTERNATIONAL}") from None
    # phonenumbers reads keypad letters as digits (1-800-FLOWERS) and keeps an
    # extension apart; a text message goes to the digits alone, so either one
    # would reach a number other than the one written.
    if number.extension:
        raise FieldError(field, f"{text!r} has an extension; a text message reaches no extension")
    if any(char.isalpha() for char in text):
        raise FieldError(field, f"{text!r} holds letters: write the number in digits")
    region = phonenumbers.region_code_for_number(number)
    # ``is_valid_number`` is this with the region looked up once more (a
    # third of a parse for the +1 numbers of 25 regions).
    if valid and (region is None or not phonenumbers.is_valid_number_for_region(number, region)):
        raise FieldError(field, f"{text!r} is not a valid phone number")
    if not valid and not phonenumbers.is_possible_number(number):
        raise FieldError(field, f"{text!r} is not a possible phone number")
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    # Non-geographic numbers (+800, +882...) have the region "001": no country.
    return Phone(e164, region if region and region.isalpha() and region != "ZZ" else None)
