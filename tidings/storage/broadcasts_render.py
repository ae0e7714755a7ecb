"""How a broadcast's content becomes each recipient's email: the render plan.

A broadcast's subject, html and text use the placeholders of templates
(``{{{key}}}``, ``tidings.rendering``). Each one names, per recipient, the
first of these that has a value:

1. ``unsubscribe_url``: the recipient's signed unsubscribe link;
2. the contact's ``email``, ``first_name``, ``last_name``, or a contact
   property of that key;
3. the broadcast's ``variable_bindings`` of that key;
4. the contact property's ``fallback_value``.

A placeholder with no value for a recipient means that recipient's email
cannot be made: it counts in ``failed_count`` (bind the key to ``""`` to
render it empty). Values go into the html escaped, into the subject on one
line and into the text as they are, as ``tidings.rendering`` does.

Fanout renders a whole batch inside PostgreSQL: a part is its fixed pieces
and the keys between them, which the batch statement joins per recipient
(``tidings.storage.broadcasts_fanout``). This module is pure.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tidings.rendering import format_value, placeholders

# The placeholder syntax of tidings.rendering.
_PLACEHOLDER = re.compile(r"\{\{\{([^{}]*)\}\}\}")

UNSUBSCRIBE_URL = "unsubscribe_url"
CONTACT_FIELDS = ("email", "first_name", "last_name")
BUILT_IN = frozenset((UNSUBSCRIBE_URL, *CONTACT_FIELDS))


@dataclass(frozen=True)
class Part:
    """A source as fixed pieces with a key between each two (``len(keys) + 1`` pieces)."""

    pieces: list[str]
    keys: list[str]

    @classmethod
    def of(cls, source: str) -> Part:
        split = _PLACEHOLDER.split(source)
        keys = [key.strip() for key in split[1::2]]
        assert keys == placeholders(source)
        return cls(split[::2], keys)

    def prefixed(self, text: str) -> Part:
        return Part([text + self.pieces[0], *self.pieces[1:]], self.keys)


def preheader(preview_text: str) -> str:
    """The hidden block at the top of the html that inboxes show as the preview."""
    return (
        '<div style="display:none;max-height:0;overflow:hidden;mso-hide:all">'
        f"{html_lib.escape(preview_text)}</div>"
    )


def keys_of(subject: str, html: str, text: str | None) -> list[str]:
    """Every placeholder key of a broadcast's content, once each, in order."""
    keys = placeholders(subject) + placeholders(html) + placeholders(text or "")
    return list(dict.fromkeys(keys))


def unknown_keys(
    keys: Iterable[str], bindings: Mapping[str, Any], properties: Iterable[str]
) -> list[str]:
    """The keys that nothing could ever give a value: not built in, not bound,
    not a contact property of the team."""
    known = BUILT_IN | set(bindings) | set(properties)
    return [key for key in keys if key not in known]


def binding_text(bindings: Mapping[str, Any]) -> dict[str, str]:
    """The bindings as the text a placeholder shows."""
    return {key: format_value(value) for key, value in bindings.items()}


@dataclass(frozen=True)
class Plan:
    """What the batch statement needs to render every recipient of a broadcast."""

    subject: Part
    html: Part
    text: Part | None
    # Values before the contact's own: property fallbacks, then bindings, as text.
    defaults: dict[str, str]

    @classmethod
    def of(
        cls,
        subject: str,
        html: str,
        text: str | None,
        preview_text: str | None,
        bindings: Mapping[str, Any],
        property_fallbacks: Mapping[str, Any],
    ) -> Plan:
        html_part = Part.of(html)
        if preview_text:
            html_part = html_part.prefixed(preheader(preview_text))
        defaults = {
            key: format_value(value) for key, value in property_fallbacks.items()
            if value is not None and not isinstance(value, (dict, list))
        }
        defaults.update(binding_text(bindings))
        return cls(
            Part.of(subject), html_part, None if text is None else Part.of(text), defaults
        )

    def args(self) -> list[Any]:
        """The plan's parameters of the batch statement, in order."""
        text = self.text or Part([], [])
        return [
            self.subject.pieces, self.subject.keys, self.html.pieces, self.html.keys,
            text.pieces if self.text else None, text.keys, json.dumps(self.defaults),
        ]
