"""The checks a contact's fields go through, wherever they arrive from.

POST and PATCH /contacts and the bulk import share them, so a value is
accepted or refused the same way (and with the same message) in each.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import email_validator
import phonenumbers
from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from tidings.storage.contact_properties import PropertyType

ConsentStatus = Literal["unknown", "opted_in", "opted_out"]
CONSENT_STATUSES: tuple[str, ...] = ("unknown", "opted_in", "opted_out")

MAX_EMAIL_LENGTH = 320
MAX_PROPERTY_STRING = 2000

# The address forms email-validator accepts without further thought: an ASCII
# dot-atom before the @ and a host name after it. For these only the domain
# needs email-validator's full check, and a domain is checked once per
# process (an import of 50,000 rows usually names a few dozen domains).
_ATEXT = r"A-Za-z0-9_!#$%&'*+\-/=?^`{|}~"
_PLAIN_ADDRESS = re.compile(rf"([{_ATEXT}]+(?:\.[{_ATEXT}]+)*)@([A-Za-z0-9.\-]+)")
# Local parts that email-validator lowercases (RFC 2142); they take the full path.
_CASELESS_MAILBOXES = frozenset(email_validator.rfc_constants.CASE_INSENSITIVE_MAILBOX_NAMES)
_MAX_ADDRESS_OCTETS = 254


class FieldError(ValueError):
    """A value that cannot be stored; the message names the field and why."""


@functools.lru_cache(maxsize=4096)
def _normalized_domain(domain: str) -> str | None:
    try:
        checked = email_validator.validate_email("a@" + domain, check_deliverability=False)
    except email_validator.EmailNotValidError:
        return None
    return str(checked.domain)


def _invalid(reason: str) -> PydanticCustomError:
    # A ValueError that pydantic reports without its "Value error, " prefix.
    return PydanticCustomError(
        "value_error", "value is not a valid email address: {reason}", {"reason": reason}
    )


def normalize_email(value: str) -> str:
    """The address email-validator accepts, normalised as it does (the domain in
    lowercase); ValueError with its reason otherwise. No DNS lookup."""
    value = value.strip()
    if len(value) > MAX_EMAIL_LENGTH:
        raise _invalid(f"longer than {MAX_EMAIL_LENGTH} characters")
    plain = _PLAIN_ADDRESS.fullmatch(value)
    if plain is not None and len(value) <= _MAX_ADDRESS_OCTETS:
        local, domain = plain.groups()
        if local.lower() not in _CASELESS_MAILBOXES:
            normalized = _normalized_domain(domain)
            if normalized is not None:
                return f"{local}@{normalized}"
    try:
        checked = email_validator.validate_email(value, check_deliverability=False)
    except email_validator.EmailNotValidError as error:
        raise _invalid(str(error)) from None
    return str(checked.normalized)


Email = Annotated[
    str,
    AfterValidator(normalize_email),
    WithJsonSchema({"type": "string", "format": "email", "maxLength": MAX_EMAIL_LENGTH}),
]


def normalize_phone(phone: str, field: str = "phone") -> tuple[str, str | None]:
    """E.164 form and ISO 3166 alpha-2 region of an international phone number.

    Raises FieldError naming ``field`` when it is not a valid number written
    with its country code.
    """
    try:
        number = phonenumbers.parse(phone, None)
    except phonenumbers.NumberParseException:
        raise FieldError(
            f"{field}: {phone!r} is not a phone number in international format (+country code)"
        ) from None
    if not phonenumbers.is_valid_number(number):
        raise FieldError(f"{field}: {phone!r} is not a valid phone number")
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    region = phonenumbers.region_code_for_number(number)
    # Non-geographic numbers (+800, +882...) have the region "001": no country.
    return e164, region if region and region.isalpha() and region != "ZZ" else None


# --- contact properties --------------------------------------------------------------


def check_property_value(kind: PropertyType, value: Any, field: str) -> Any:
    """``value`` as stored for a property of type ``kind``; FieldError naming ``field``.

    string: a JSON string; number: a JSON number (not a boolean), finite;
    boolean: true or false; date: a ``YYYY-MM-DD`` string of a real date.
    """
    if kind == "string":
        if not isinstance(value, str):
            raise FieldError(f"{field}: must be a string")
        if len(value) > MAX_PROPERTY_STRING:
            raise FieldError(f"{field}: at most {MAX_PROPERTY_STRING} characters")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(f"{field}: must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise FieldError(f"{field}: must be a finite number")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise FieldError(f"{field}: must be true or false")
        return value
    if not isinstance(value, str) or not _is_date(value):
        raise FieldError(f"{field}: must be a date written YYYY-MM-DD")
    return value


_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def _is_date(value: str) -> bool:
    if not _DATE.fullmatch(value):
        return False
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def check_properties(
    values: Mapping[str, Any], definitions: Mapping[str, PropertyType]
) -> tuple[dict[str, Any], list[str]]:
    """Split ``values`` into the properties to set and the keys to remove (null).

    Every key must be defined for the team and every value of its type;
    FieldError names the first that is not.
    """
    to_set: dict[str, Any] = {}
    to_remove: list[str] = []
    for key, value in values.items():
        kind = definitions.get(key)
        field = f"properties.{key}"
        if kind is None:
            raise FieldError(f"{field}: no contact property with this key is defined")
        if value is None:
            to_remove.append(key)
        else:
            to_set[key] = check_property_value(kind, value, field)
    return to_set, to_remove


def property_from_text(kind: PropertyType, text: str, field: str) -> Any:
    """A CSV cell as a value of a property of type ``kind``; FieldError naming ``field``."""
    if kind == "string":
        return check_property_value(kind, text, field)
    if kind == "number":
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)  # type: ignore[assignment]
            except ValueError:
                raise FieldError(f"{field}: must be a number, not {text!r}") from None
        return check_property_value(kind, number, field)
    if kind == "boolean":
        return boolean_from_text(text, field)
    return check_property_value(kind, text, field)


_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def boolean_from_text(text: str, field: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise FieldError(f"{field}: must be true or false, not {text!r}")
