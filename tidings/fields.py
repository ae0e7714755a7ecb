"""The error every field check raises, and the checks no field escapes.

Plain Python: the HTTP layer turns a ``FieldError`` into its envelope (400 or
422 as the route decides), an import into a rejected row, a worker into a
failed message.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

NUL_REASON = "must not contain NUL characters (\\u0000)"


class FieldError(ValueError):
    """A value refused. ``str()`` is ``"<field>: <reason>"``."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def has_nul(value: object) -> bool:
    """Whether a NUL character is anywhere in ``value``: a string, or the keys
    and values of JSON objects and arrays, however deep. PostgreSQL text
    cannot hold one."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
    return False


def refuse_nul(value: T) -> T:
    """``value``, or ValueError when it holds a NUL character (a validator)."""
    if has_nul(value):
        raise ValueError(NUL_REASON)
    return value
