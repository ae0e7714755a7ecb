"""Rendering a template version with variables: the one renderer every sending path uses.

A placeholder is a variable key in triple braces, ``{{{KEY}}}`` (spaces inside
the braces are allowed: ``{{{ KEY }}}``). ``render(version, variables)``
substitutes each placeholder in the subject, the html and the text part:

- with the supplied value, else the variable's fallback value;
- a declared variable with neither is *missing*; a supplied value of another
  type than the declared one is *wrong*; a supplied key that the version does
  not declare is *unknown*. Any of these raises one ``RenderError`` that lists
  every offending key;
- values go into the html HTML-escaped and into the text part as they are;
  in the subject (a mail header) line breaks become spaces;
- a version without a text part gets one derived from its html
  (``tidings.html_text``), with the values substituted raw.

Every placeholder must name a declared variable: ``compile_template`` refuses
others (``TemplateError``), and versions are checked with it before they are
stored. Compiled templates are cached by content, so rendering one version for
many recipients compiles it once.
"""

from __future__ import annotations

import html as html_lib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from tidings.html_text import html_to_text

VariableType = Literal["string", "number", "boolean"]
VARIABLE_TYPES: tuple[str, ...] = get_args(VariableType)
Value = str | int | float | bool

KEY_PATTERN = r"^[A-Za-z0-9_]+$"
MAX_KEY_LENGTH = 100
MAX_VARIABLES = 50

_KEY = re.compile(KEY_PATTERN)
# Anything in triple braces is a placeholder; its key must then be declared.
_PLACEHOLDER = re.compile(r"\{\{\{([^{}]*)\}\}\}")


@dataclass(frozen=True)
class Variable:
    """A declared variable. ``fallback_value`` None means: no fallback."""

    key: str
    type: VariableType
    fallback_value: Value | None = None


@dataclass(frozen=True)
class Rendered:
    subject: str
    html: str
    text: str


class Content(Protocol):
    """What the renderer reads from a template version."""

    @property
    def subject(self) -> str: ...

    @property
    def html(self) -> str: ...

    @property
    def text(self) -> str | None: ...

    @property
    def variables(self) -> Sequence[Variable]: ...


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
    ) -> None:
        self.missing = tuple(missing)
        self.wrong = tuple(wrong)
        self.unknown = tuple(unknown)
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


# --- values -------------------------------------------------------------------


def json_type(value: object) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, float) and not math.isfinite(value):
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
    return not isinstance(value, float) or math.isfinite(value)


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


# --- compiling ------------------------------------------------------------------


def placeholders(source: str) -> list[str]:
    """The keys of the placeholders in ``source``, in order (with repeats)."""
    return [match.group(1).strip() for match in _PLACEHOLDER.finditer(source)]


def _compile_part(field: str, source: str, declared: frozenset[str]) -> tuple[str, bool]:
    """``source`` as a ``%``-format string with ``%(key)s`` for each placeholder,
    and whether it has any placeholder."""
    keys = placeholders(source)
    undeclared = [key for key in dict.fromkeys(keys) if key not in declared]
    if undeclared:
        shown = ", ".join("{{{" + key + "}}}" for key in undeclared)
        raise TemplateError(field, f"placeholders of undeclared variables: {shown}")
    pieces = []
    last = 0
    for match in _PLACEHOLDER.finditer(source):
        pieces.append(source[last : match.start()].replace("%", "%%"))
        pieces.append(f"%({match.group(1).strip()})s")
        last = match.end()
    pieces.append(source[last:].replace("%", "%%"))
    return "".join(pieces), bool(keys)


class CompiledTemplate:
    """A version's parts as format strings, ready to render many times."""

    __slots__ = ("variables", "text_source", "_subject", "_html", "_text", "_types", "_fallbacks")

    def __init__(
        self, subject: str, html: str, text: str | None, variables: Sequence[Variable]
    ) -> None:
        check_variables(variables)
        declared = frozenset(v.key for v in variables)
        self.variables = tuple(variables)
        self._subject = _compile_part("subject", subject, declared)
        self._html = _compile_part("html", html, declared)
        self.text_source = html_to_text(html) if text is None else text
        self._text = _compile_part("html" if text is None else "text", self.text_source, declared)
        self._types = {v.key: v.type for v in variables}
        self._fallbacks = {
            v.key: format_value(v.fallback_value)
            for v in variables
            if v.fallback_value is not None
        }

    def resolve(self, supplied: Mapping[str, object]) -> dict[str, str]:
        """Each declared key's text: the supplied value, else the fallback; or RenderError."""
        values = dict(self._fallbacks)
        wrong: list[WrongType] = []
        unknown: list[str] = []
        types = self._types
        for key, value in supplied.items():
            kind = types.get(key)
            if kind is None:
                unknown.append(key)
            elif is_of_type(value, kind):
                values[key] = format_value(value)  # type: ignore[arg-type]
            else:
                wrong.append(WrongType(key, kind, json_type(value)))
        missing = [key for key in types if key not in values and key not in supplied]
        if missing or wrong or unknown:
            raise RenderError(missing=missing, wrong=wrong, unknown=sorted(unknown))
        return values

    def render(self, supplied: Mapping[str, object]) -> Rendered:
        values = self.resolve(supplied)
        fmt, used = self._subject
        subject = fmt % _one_line(values) if used else fmt % ()
        fmt, used = self._html
        html = fmt % {k: html_lib.escape(v) for k, v in values.items()} if used else fmt % ()
        fmt, used = self._text
        text = fmt % values if used else fmt % ()
        return Rendered(subject=subject, html=html, text=text)


def _one_line(values: dict[str, str]) -> dict[str, str]:
    return {
        key: value.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
        if "\n" in value or "\r" in value
        else value
        for key, value in values.items()
    }


CacheKey = tuple[str, str, str | None, tuple[Variable, ...]]


class _CompiledCache:
    """Compiled templates by content, least recently used out first, within a
    budget of characters: templates may be large, and a team may have many.
    Safe to use from worker threads too."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._entries: OrderedDict[CacheKey, tuple[CompiledTemplate, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> CompiledTemplate:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        subject, html, text, variables = key
        compiled = CompiledTemplate(subject, html, text, variables)
        # The key's strings, the format strings made of them, the text part.
        size = 2 * (len(subject) + len(html)) + 3 * len(compiled.text_source) + 1000
        if size > self.max_chars:
            return compiled
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (compiled, size)
                self.chars += size
            while self.chars > self.max_chars:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.chars -= evicted
        return compiled

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries


# At most 32 M characters of templates: under 150 MB even if all were 4-byte characters.
_cache = _CompiledCache(max_chars=32 * 1024 * 1024)


def compile_template(content: Content) -> CompiledTemplate:
    """The compiled form of a version (cached by content). Raises TemplateError."""
    return _cache.get((content.subject, content.html, content.text, tuple(content.variables)))

def render(content: Content, variables: Mapping[str, object]) -> Rendered:
    """Render a version with ``variables``. Raises RenderError listing every bad key."""
    return compile_template(content).render(variables)
