"""Template variables and their values, and the errors of compiling and rendering.

The vocabulary ``tidings.rendering`` works with: a declared ``Variable``, how a
value is checked against its type and written as text, and ``TemplateError``
and ``RenderError``. Plain Python, no rendering here.
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
    """A value as text: booleans as ``true``/``false``, whole floats without ``.0``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        return repr(value)
    return str(value)


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
