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
  in the subject (a mail header) each line break becomes a space and every
  other control character is removed (``one_line``), in the values and in
  the subject's own text alike;
- a version without a text part gets one derived from its html
  (``tidings.html_text``), with the values substituted raw;
- a render whose subject, html and text together would exceed
  ``MAX_RENDERED_BYTES`` raises ``RenderTooLarge`` (a ``RenderError``), found
  from the values' lengths before anything is substituted.

Every placeholder must name a declared variable: ``compile_template`` refuses
others (``TemplateError``), and versions are checked with it before they are
stored. Compiled templates are cached by content, so rendering one version for
many recipients compiles it once. Variables, their values and the errors are
defined in ``tidings.rendering_variables`` and exported here too.
"""

from __future__ import annotations

import html as html_lib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tidings.html_text import html_to_text
from tidings.rendering_variables import (
    CONTROL_CHARACTERS,
    KEY_PATTERN,
    MAX_KEY_LENGTH,
    MAX_RENDERED_BYTES,
    MAX_SUBJECT_CHARACTERS,
    MAX_VARIABLES,
    VARIABLE_TYPES,
    VISIBLE,
    RenderError,
    RenderTooLarge,
    TemplateError,
    Value,
    Variable,
    VariableType,
    WrongType,
    check_variables,
    format_value,
    is_of_type,
    json_type,
    one_line,
    rendered_size,
    subject_fault,
)

__all__ = [
    "CONTROL_CHARACTERS",
    "CompiledTemplate",
    "Content",
    "KEY_PATTERN",
    "MAX_KEY_LENGTH",
    "MAX_RENDERED_BYTES",
    "MAX_SUBJECT_CHARACTERS",
    "MAX_VARIABLES",
    "RenderError",
    "RenderTooLarge",
    "Rendered",
    "TemplateError",
    "VARIABLE_TYPES",
    "VISIBLE",
    "Value",
    "Variable",
    "VariableType",
    "WrongType",
    "check_variables",
    "compile_template",
    "format_value",
    "is_of_type",
    "json_type",
    "one_line",
    "rendered_size",
    "subject_fault",
    "placeholders",
    "render",
    "utf8_length",
]

# Anything in triple braces is a placeholder; its key must then be declared.
_PLACEHOLDER = re.compile(r"\{\{\{([^{}]*)\}\}\}")


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


# --- compiling ------------------------------------------------------------------


def placeholders(source: str) -> list[str]:
    """The keys of the placeholders in ``source``, in order (with repeats)."""
    return [match.group(1).strip() for match in _PLACEHOLDER.finditer(source)]


def utf8_length(text: str) -> int:
    """How many bytes ``text`` takes in UTF-8 (lone surrogates count as three)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class _Part:
    """One part of a version as a ``%``-format string with ``%(key)s`` slots,
    the UTF-8 size of its fixed text and how often each key fills a slot, so
    that the size of a render is known before it is made."""

    format: str
    fixed_bytes: int
    counts: dict[str, int]

    @classmethod
    def of(cls, pieces: list[str], keys: list[str]) -> _Part:
        """A part from its fixed ``pieces`` and the ``keys`` of the slots between them."""
        slots = [f"%({key})s" for key in keys]
        format_ = "".join(
            piece.replace("%", "%%") + slot
            for piece, slot in zip(pieces, [*slots, ""], strict=True)
        )
        counts: dict[str, int] = {}
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        return cls(format_, sum(utf8_length(piece) for piece in pieces), counts)

    def slot_bytes(self, values: Mapping[str, str]) -> int:
        """The UTF-8 size of what ``values`` put in the slots."""
        return sum(count * utf8_length(values[key]) for key, count in self.counts.items())

    def fill(self, values: Mapping[str, str]) -> str:
        return self.format % values


def _compile_part(field: str, source: str, declared: frozenset[str]) -> _Part:
    """``source`` as a part whose placeholders are slots; TemplateError naming
    ``field`` if one of them is not declared. The subject's fixed text is put
    on one line too (a version stored before its subject was checked for
    control characters may hold some): after the split, so that removing a
    character never makes a placeholder."""
    keys = placeholders(source)
    undeclared = [key for key in dict.fromkeys(keys) if key not in declared]
    if undeclared:
        shown = ", ".join("{{{" + key + "}}}" for key in undeclared)
        raise TemplateError(field, f"placeholders of undeclared variables: {shown}")
    pieces = _PLACEHOLDER.split(source)[::2]
    if field == "subject":
        pieces = [one_line(piece) for piece in pieces]
    return _Part.of(pieces, keys)


# Placeholders of the html stand in the derived text as characters of the
# supplementary private use area A, one per key, chosen among those that
# neither the html nor its decoded entities hold.
_SENTINELS = range(0xF0000, 0xFFFFE)
_PRIVATE_USE = re.compile("[\U000f0000-\U000ffffd]")


def _derived_text_part(html: str) -> _Part:
    """The text part derived from ``html``, with a slot where the html has a
    placeholder. Only placeholders of the html source are slots: braces that
    entities such as ``&#123;`` write are text, as a browser shows them."""
    keys = list(dict.fromkeys(placeholders(html)))
    if not keys:
        return _Part.of([html_to_text(html)], [])
    taken = set(_PRIVATE_USE.findall(html)) | set(_PRIVATE_USE.findall(html_lib.unescape(html)))
    free = (chr(code) for code in _SENTINELS if chr(code) not in taken)
    sentinel_of = {key: next(free) for key in keys}
    key_of = {sentinel: key for key, sentinel in sentinel_of.items()}
    marked = _PLACEHOLDER.sub(lambda match: sentinel_of[match.group(1).strip()], html)
    text = html_to_text(marked)
    split = re.split("([" + "".join(key_of) + "])", text)
    return _Part.of(split[::2], [key_of[sentinel] for sentinel in split[1::2]])


class CompiledTemplate:
    """A version's parts as format strings, ready to render many times."""

    __slots__ = ("variables", "_subject", "_html", "_text", "_fixed_bytes", "_types",
                 "_fallbacks")

    def __init__(
        self, subject: str, html: str, text: str | None, variables: Sequence[Variable]
    ) -> None:
        check_variables(variables)
        declared = frozenset(v.key for v in variables)
        self.variables = tuple(variables)
        self._subject = _compile_part("subject", subject, declared)
        self._html = _compile_part("html", html, declared)
        self._text = (
            _derived_text_part(html) if text is None else _compile_part("text", text, declared)
        )
        self._fixed_bytes = sum(
            part.fixed_bytes for part in (self._subject, self._html, self._text)
        )
        self._types = {v.key: v.type for v in variables}
        self._fallbacks = {
            v.key: format_value(v.fallback_value)
            for v in variables
            if v.fallback_value is not None
        }

    @property
    def chars(self) -> int:
        """Characters held by the compiled parts (for the cache's budget)."""
        return len(self._subject.format) + len(self._html.format) + len(self._text.format)

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
        """The version with ``supplied`` values. Raises RenderError, and
        RenderTooLarge before any substitution if the result would be too large."""
        values = self.resolve(supplied)
        subject_values = {key: one_line(values[key]) for key in self._subject.counts}
        html_values = {key: html_lib.escape(values[key]) for key in self._html.counts}
        size = (
            self._fixed_bytes
            + self._subject.slot_bytes(subject_values)
            + self._html.slot_bytes(html_values)
            + self._text.slot_bytes(values)
        )
        if size > MAX_RENDERED_BYTES:
            raise RenderTooLarge(size, MAX_RENDERED_BYTES)
        return Rendered(
            subject=self._subject.fill(subject_values),
            html=self._html.fill(html_values),
            text=self._text.fill(values),
        )


# A version's content as the cache knows it. Each variable is keyed with its
# fallback's type: ``True == 1`` in Python, but a boolean fallback is no
# fallback for a number (nor 1 for a boolean), and a version found in the
# cache is not checked again.
CacheKey = tuple[str, str, str | None, tuple[tuple[object, ...], ...]]


def _variable_key(variable: Variable) -> tuple[object, ...]:
    value = variable.fallback_value
    return (variable.key, variable.type, type(value), value)


def _key(content: Content) -> CacheKey:
    return (content.subject, content.html, content.text,
            tuple(map(_variable_key, content.variables)))


class _CompiledCache:
    """Compiled templates by content, least recently used out first, within a
    budget of characters: templates may be large, and a team may have many.
    Safe to use from worker threads too."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.chars = 0
        self._entries: OrderedDict[CacheKey, tuple[CompiledTemplate, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, content: Content) -> CompiledTemplate:
        key = _key(content)
        subject, html, text = content.subject, content.html, content.text
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found[0]
        compiled = CompiledTemplate(subject, html, text, tuple(content.variables))
        # The key's strings and the format strings made of them.
        size = len(subject) + len(html) + len(text or "") + compiled.chars + 1000
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

    def __contains__(self, content: Content) -> bool:
        return _key(content) in self._entries


# At most 32 M characters of templates: under 150 MB even if all were 4-byte characters.
_cache = _CompiledCache(max_chars=32 * 1024 * 1024)


def compile_template(content: Content) -> CompiledTemplate:
    """The compiled form of a version (cached by content). Raises TemplateError."""
    return _cache.get(content)

def render(content: Content, variables: Mapping[str, object]) -> Rendered:
    """Render a version with ``variables``. Raises RenderError listing every bad key."""
    return compile_template(content).render(variables)
