"""Template variables and their values, and the errors of compiling and rendering.

The vocabulary ``tidings.rendering`` works with: a declared ``Variable``, how a
value is checked against its type and written as text (``format_value``), what
a subject cannot hold (``one_line``), and ``TemplateError`` and
``RenderError``. Plain Python, no rendering here. The broadcast renderer
(``tidings.storage.broadcasts_render``) writes values and subjects with the
same two functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from tidings.fields import finite_number

VariableType = Literal["string", "number", "boolean"]
VARIABLE_TYPES: tuple[str, ...] = get_args(VariableType)
Value = str | int | float | bool

KEY_PATTERN = r"^[A-Za-z0-9_]+$"
MAX_KEY_LENGTH = 100
MAX_VARIABLES = 50
# The most a render may produce: UTF-8 bytes of subject, html and text together.
# Mail providers take messages of 10 to 30 MB in all; 4 MiB of content is generous
# for an email and keeps one render's memory and time bounded.
MAX_RENDERED_BYTES = 4 * 1024 * 1024

_KEY = re.compile(KEY_PATTERN)


@dataclass(frozen=True)
class Variable:
    """A declared variable. ``fallback_value`` None means: no fallback."""

    key: str
    type: VariableType
    fallback_value: Value | None = None


class TemplateError(ValueError):
    """The content of a version is not a valid template; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class WrongType:
    key: str
    expected: VariableType
    got: str


class RenderError(ValueError):
    """Values that cannot render this version: every missing, wrong and unknown key."""

    def __init__(
        self,
        missing: Sequence[str] = (),
        wrong: Sequence[WrongType] = (),
        unknown: Sequence[str] = (),
        *,
        message: str | None = None,
    ) -> None:
        self.missing = tuple(missing)
        self.wrong = tuple(wrong)
        self.unknown = tuple(unknown)
        if message is not None:
            super().__init__(message)
            return
        parts = []
        if self.missing:
            parts.append(
                "missing values (no fallback) for " + ", ".join(self.missing)
            )
        for item in self.wrong:
            parts.append(f"{item.key} must be a {item.expected}, got {item.got}")
        if self.unknown:
            parts.append("not declared by the template: " + ", ".join(self.unknown))
        super().__init__("variables: " + "; ".join(parts))


class RenderTooLarge(RenderError):
    """The values are valid but would make a message over ``limit`` bytes (``size``)."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            message=f"variables: the rendered subject, html and text would be {size} bytes, "
            f"over the limit of {limit} bytes ({limit // (1024 * 1024)} MiB) in all"
        )


# --- values -------------------------------------------------------------------


def json_type(value: object) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (
        not finite_number(value)
    ):
        return "non-finite number"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def is_of_type(value: object, kind: VariableType) -> bool:
    """Whether ``value`` is a ``kind``: a bool is not a number, NaN and infinities are not."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return finite_number(value)


def format_value(value: Value) -> str:
    """A value as text: the one way every renderer (templates, broadcasts)
    writes one. Booleans are ``true``/``false``; numbers are plain decimal as
    JavaScript's ``Number#toString`` writes them (the shortest digits that
    read back as the same double: ``2.5``, ``0.1``, ``3.0`` is ``3``), except
    that a whole number never takes an exponent (``1e16`` is
    ``10000000000000000``, where JavaScript switches at 1e21); only a number
    below 1e-6 in size does, as in JavaScript (``1e-7``, ``1.5e-10``). An
    integer is written with all its digits."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))  # -0.0 too: "0", as in JavaScript
    text = repr(value)
    if "e" not in text:  # repr is plain decimal from 1e-4 to 1e16
        return text
    return _without_exponent(text)


def _without_exponent(text: str) -> str:
    """A finite double's ``repr`` in exponent form (``1.5e+16``, ``1e-07``) in
    plain digits, or with JavaScript's exponent (``1e-7``) below 1e-6."""
    sign, text = ("-", text[1:]) if text.startswith("-") else ("", text)
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    written = whole + fraction
    digits = written.lstrip("0")
    # The value is 0.<digits> x 10**point.
    point = len(whole) + int(exponent) - (len(written) - len(digits))
    digits = digits.rstrip("0")
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    if point > 0:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if point > -6:
        return f"{sign}0.{'0' * -point}{digits}"
    rest = "." + digits[1:] if len(digits) > 1 else ""
    return f"{sign}{digits[0]}{rest}e-{1 - point}"


# What a subject (a mail header) cannot hold (RFC 5322 §2.2): the C0 controls
# but the tab, DEL, the C1 controls (NEL among them) and the line and paragraph
# separators U+2028 and U+2029. The same characters POST /emails refuses in a
# subject or a header value.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# Those of them that end a line (as ``str.splitlines`` has it), CRLF as one.
_LINE_BREAK = re.compile(r"\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` as a subject may hold it: each line break (CR, LF, CRLF, VT,
    FF, the separators U+001C to U+001E, NEL, U+2028, U+2029) becomes a space,
    every other control character (``CONTROL_CHARACTERS``) is removed."""
    if not CONTROL_CHARACTERS.search(text):
        return text
    return CONTROL_CHARACTERS.sub("", _LINE_BREAK.sub(" ", text))


# A subject's longest line (RFC 5322 §2.1.1), and what makes one seen: a
# character that is not a space or a control character.
MAX_SUBJECT_CHARACTERS = 998
VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]")


def subject_fault(subject: str) -> str | None:
    """Why a rendered subject cannot be sent (None: it can): longer than a
    header line, or without a character a reader would see."""
    if len(subject) > MAX_SUBJECT_CHARACTERS:
        return (f"the rendered subject has {len(subject)} characters; "
                f"a subject has at most {MAX_SUBJECT_CHARACTERS}")
    if not VISIBLE.search(subject):
        return "the rendered subject is empty (its variables gave it no visible character)"
    return None


def rendered_size(*parts: str | None) -> int:
    """The UTF-8 bytes of a render's parts, counted only when they could be
    over ``MAX_RENDERED_BYTES`` (a character is at most 4 bytes)."""
    characters = sum(len(part) for part in parts if part)
    if characters * 4 <= MAX_RENDERED_BYTES:
        return characters
    return sum(len(part.encode("utf-8", "surrogatepass")) for part in parts if part)


def check_variables(variables: Sequence[Variable]) -> None:
    """Raise TemplateError for a bad key, a duplicate key or a fallback of another type."""
    if len(variables) > MAX_VARIABLES:
        raise TemplateError(
            "variables", f"at most {MAX_VARIABLES} variables, got {len(variables)}"
        )
    seen: set[str] = set()
    for index, variable in enumerate(variables):
        where = f"variables.{index}"
        if not _KEY.match(variable.key) or len(variable.key) > MAX_KEY_LENGTH:
            raise TemplateError(
                f"{where}.key",
                f"{variable.key!r} must be 1 to {MAX_KEY_LENGTH} letters, digits or _",
            )
        if variable.key in seen:
            raise TemplateError(f"{where}.key", f"duplicate key {variable.key!r}")
        seen.add(variable.key)
        if variable.type not in VARIABLE_TYPES:
            raise TemplateError(
                f"{where}.type", f"must be one of {', '.join(VARIABLE_TYPES)}"
            )
        fallback = variable.fallback_value
        if fallback is not None and not is_of_type(fallback, variable.type):
            raise TemplateError(
                f"{where}.fallback_value",
                f"must be a {variable.type} like the variable, got {json_type(fallback)}",
            )
