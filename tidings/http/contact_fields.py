"""The checks a contact's fields go through, wherever they arrive from.

POST and PATCH /contacts and the bulk import share them, so a value is
accepted or refused the same way (and with the same message) in each.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from tidings.addresses import MAX_ADDRESS_LENGTH, normalize_address
from tidings.fields import FieldError, finite_number
from tidings.storage.contact_properties import PropertyType

ConsentStatus = Literal["unknown", "opted_in", "opted_out"]
CONSENT_STATUSES: tuple[str, ...] = ("unknown", "opted_in", "opted_out")

MAX_PROPERTY_STRING = 2000


def normalize_email(value: str) -> str:
    """``tidings.addresses.normalize_address`` as a pydantic validator: its
    ValueError is reported without pydantic's "Value error, " prefix."""
    try:
        return normalize_address(value)
    except FieldError as error:
        raise PydanticCustomError(
            "value_error", "value is not a valid email address: {reason}",
            {"reason": error.reason},
        ) from None


Email = Annotated[
    str,
    AfterValidator(normalize_email),
    WithJsonSchema({"type": "string", "format": "email", "maxLength": MAX_ADDRESS_LENGTH}),
]


# --- contact properties --------------------------------------------------------------


def check_property_value(kind: PropertyType, value: Any, field: str) -> Any:
    """``value`` as stored for a property of type ``kind``; FieldError naming ``field``.

    string: a JSON string; number: a JSON number (not a boolean), finite;
    boolean: true or false; date: a ``YYYY-MM-DD`` string of a real date.
    """
    if kind == "string":
        if not isinstance(value, str):
            raise FieldError(field, "must be a string")
        if len(value) > MAX_PROPERTY_STRING:
            raise FieldError(field, f"at most {MAX_PROPERTY_STRING} characters")
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FieldError(field, "must be a number")
        if not finite_number(value):
            raise FieldError(field, "must be a finite number (at most 1.8e308)")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise FieldError(field, "must be true or false")
        return value
    if not isinstance(value, str) or not _is_date(value):
        raise FieldError(field, "must be a date written YYYY-MM-DD")
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
            raise FieldError(field, "no contact property with this key is defined")
        if value is None:
            to_remove.append(key)
        else:
            to_set[key] = check_property_value(kind, value, field)
    return to_set, to_remove


_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def property_from_text(kind: PropertyType, text: str, field: str) -> Any:
    """A CSV cell as a value of a property of type ``kind``; FieldError naming ``field``."""
    if kind == "string":
        return check_property_value(kind, text, field)
    if kind == "number":
        # ASCII decimal notation only: Python would also read "1_000", other
        # scripts' digits ("١٢"), "inf" and "nan".
        if not _DECIMAL.fullmatch(text.strip()):
            raise FieldError(field, f"must be a number, not {text!r}")
        return check_property_value(kind, _number(text.strip()), field)
    if kind == "boolean":
        return boolean_from_text(text, field)
    # A date, read with the spaces around it let go as a number's and a
    # boolean's are (" 2024-01-31 " in a cell written by hand).
    return check_property_value(kind, text.strip(), field)


def _number(text: str) -> int | float:
    """A decimal as ``_DECIMAL`` reads it. A whole number of more digits than
    a double's range holds is infinite (refused as any), not read: Python
    refuses to read one of over 4,300 digits at all."""
    if any(c in text for c in ".eE"):
        return float(text)
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("+-").lstrip("0") or "0"
    return float("inf") if len(digits) > 309 else int(sign + digits)


_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def boolean_from_text(text: str, field: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise FieldError(field, f"must be true or false, not {text!r}")
