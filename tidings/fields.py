"""The error every field check raises, and the checks no field escapes.

Plain Python: the HTTP layer turns a ``FieldError`` into its envelope (400 or
422 as the route decides), an import into a rejected row, a worker into a
failed message.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

T = TypeVar("T")

NUL_REASON = "must not contain NUL characters (\\u0000)"
NOT_FINITE_REASON = (
    "must hold only finite numbers (NaN, Infinity and numbers beyond 1e308 are not JSON)"
)


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


def finite_number(value: int | float) -> bool:
    """Whether a parsed JSON number is one a double holds: not NaN, not an
    infinity, and no whole number beyond 1.8e308 (Python's parser keeps any
    number of digits; a JavaScript client would read ``Infinity``)."""
    if isinstance(value, float):
        return math.isfinite(value)
    try:
        float(value)  # rounds as a double would; beyond its range: OverflowError
    except OverflowError:
        return False
    return True


def has_non_finite(value: object) -> bool:
    """Whether a NaN, an infinity or a whole number beyond a double is anywhere
    in ``value``, however deep: JSON has none of them."""
    if isinstance(value, (int, float)):
        return not finite_number(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(has_non_finite(item) for item in value)
    return False


def refuse_nul(value: T) -> T:
    """``value``, or ValueError when it holds a NUL character (a validator)."""
    if has_nul(value):
        raise ValueError(NUL_REASON)
    return value


def refuse_unstorable(value: T) -> T:
    """``value``, or ValueError when it holds a NUL character or a number JSON
    cannot hold (a validator of request bodies)."""
    if has_nul(value):
        raise ValueError(NUL_REASON)
    if has_non_finite(value):
        raise ValueError(NOT_FINITE_REASON)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _whole(text: str) -> int:
    number = int(text)
    if not finite_number(number):
        raise ValueError(f"{text[:20]}… is beyond the range of a JSON number")
    return number


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is beyond the range of a JSON number")
    return number


class RepeatedKey(ValueError):
    """A JSON object that names one key twice; ``key`` is its path in the
    document (``metadata.a``, ``0.to``)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key}: is given more than once in one object")
        self.key = key


class _Repeated(dict[str, Any]):
    """An object read with a key named twice: which one."""

    key = ""


class _Objects:
    """An ``object_pairs_hook`` that marks the objects naming a key twice.

    RFC 8259 §4 leaves an object with a repeated name to each parser: some
    keep the first value, some the last. A request read one way by a proxy
    and another way here is refused rather than guessed at, naming where."""

    def __init__(self) -> None:
        self.repeated: _Repeated | None = None

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(pairs)
        if len(result) == len(pairs) or self.repeated is not None:
            return result
        marked = _Repeated(result)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                marked.key = key
                break
            seen.add(key)
        self.repeated = marked
        return marked

    def check(self, document: Any) -> None:
        if self.repeated is not None:
            raise RepeatedKey(".".join(_path_to(document, self.repeated) or [self.repeated.key]))


def _path_to(node: Any, target: _Repeated) -> list[str] | None:
    """The path of keys and indexes from ``node`` to ``target``'s repeated key."""
    if node is target:
        return [target.key]
    children = node.items() if isinstance(node, dict) else (
        enumerate(node) if isinstance(node, list) else ()
    )
    for name, child in children:
        if isinstance(child, dict | list) and (found := _path_to(child, target)) is not None:
            return [str(name), *found]
    return None


def check_unique_keys(data: str | bytes) -> None:
    """RepeatedKey for the first key that an object of ``data`` (valid JSON)
    names twice."""
    objects = _Objects()
    objects.check(json.loads(data, object_pairs_hook=objects))


def strict_json(data: str | bytes) -> Any:
    """``json.loads`` as RFC 8259 has JSON: ValueError for NaN, Infinity and
    numbers beyond a double (which Python's json would take), and RepeatedKey
    for an object that names one key twice."""
    objects = _Objects()
    document = json.loads(data, parse_constant=_no_constant, parse_float=_finite,
                          parse_int=_whole, object_pairs_hook=objects)
    objects.check(document)
    return document
