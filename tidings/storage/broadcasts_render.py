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
render it empty); so does an email past a template render's limits (over
4 MiB, or a subject of more than 998 characters or with none to see).
Values are written as text by ``format_value`` and go into the html
escaped, into the subject through ``one_line`` (the subject's own text too)
and into the text as they are: the functions ``tidings.rendering`` uses for
templates, so both give the same subject and the same numbers.

``preview_text`` is literal text (escaped, never a placeholder) in a hidden
block put right after the html's ``<body>`` tag (``preheader_offset``).

A part is its fixed pieces and the keys between them; a ``Renderer`` joins
them with each recipient's values and signs its unsubscribe link, for a
whole batch at a time (``tidings.storage.broadcasts_fanout`` reads the
recipients and stores what it made). This module is pure.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from uuid import UUID

from tidings.rendering import (
    MAX_RENDERED_BYTES,
    format_value,
    one_line,
    placeholders,
    rendered_size,
    subject_fault,
)
from tidings.unsubscribe import TokenKey

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

    def on_one_line(self) -> Part:
        """The part with its fixed pieces as a subject holds them (``one_line``)."""
        return Part([one_line(piece) for piece in self.pieces], self.keys)

    def inserting(self, text: str, source: str, at: int) -> Part:
        """This part (of ``source``) with fixed ``text`` at offset ``at`` of
        the source, which must not be inside a placeholder."""
        before, after = Part.of(source[:at]), Part.of(source[at:])
        assert before.keys + after.keys == self.keys
        joined = before.pieces[-1] + text + after.pieces[0]
        return Part([*before.pieces[:-1], joined, *after.pieces[1:]], self.keys)


def preheader(preview_text: str) -> str:
    """The hidden block that inboxes show as the preview: ``preview_text``
    escaped, as literal text."""
    return (
        '<div style="display:none;max-height:0;overflow:hidden;mso-hide:all">'
        f"{html_lib.escape(preview_text)}</div>"
    )


class _BodyFinder(HTMLParser):
    """Where the body's start tag (else the head's end tag) ends, as a parser
    reads them (in the html with its placeholders blanked out): not a
    ``<body>`` inside a comment (an Outlook conditional), a title, a script
    or an attribute, and a ``<!--`` inside a script or an attribute value
    starts no comment."""

    TEXT_ONLY = ("title", "textarea")

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=False)
        self._text = text
        # Where each line starts: the parser counts lines by "\n" alone.
        self._lines = [0, *(m.end() for m in re.finditer("\n", text))]
        self._in_text = ""
        self.body_end: int | None = None
        self.head_end: int | None = None

    def _offset(self) -> int:
        line, column = self.getpos()
        return self._lines[line - 1] + column

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._in_text:
            return
        if tag in self.TEXT_ONLY:
            self._in_text = tag
        elif tag == "body" and self.body_end is None:
            self.body_end = self._offset() + len(self.get_starttag_text() or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in_text:
            self._in_text = ""
        elif tag == "head" and not self._in_text and self.head_end is None:
            self.head_end = self._text.find(">", self._offset()) + 1


_DOCUMENT_START = re.compile(
    r"(?:\s*(?:<!doctype[^>]*>|<html(?=[\s/>])[^>]*>))*", re.IGNORECASE
)


def preheader_offset(html: str) -> int:
    """Where the preheader goes in ``html``, so that it is the first thing the
    body shows and never comes before a doctype (which would put browsers in
    quirks mode): right after the ``<body ...>`` tag; without one, after
    ``</head>``; without that, after a leading doctype and ``<html ...>`` tag;
    else at the very start."""
    # Placeholders first, as rendering reads them: a key may hold anything,
    # "-->" or "<body>" too, and the offset must never fall inside one.
    masked = _PLACEHOLDER.sub(lambda m: "_" * len(m.group()), html)
    finder = _BodyFinder(masked)
    finder.feed(masked)
    finder.close()
    found = finder.body_end if finder.body_end is not None else finder.head_end
    if found:
        return found
    start = _DOCUMENT_START.match(masked)
    return 0 if start is None else start.end()


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
            html_part = html_part.inserting(preheader(preview_text), html, preheader_offset(html))
        defaults = {
            key: format_value(value) for key, value in property_fallbacks.items()
            if value is not None and not isinstance(value, (dict, list))
        }
        defaults.update(binding_text(bindings))
        return cls(
            Part.of(subject).on_one_line(), html_part, None if text is None else Part.of(text),
            defaults,
        )


@dataclass
class Rendered:
    """A batch's emails, column by column (what the insert statement unnests);
    ``failed`` counts the recipients whose email could not be made."""

    contact_ids: list[UUID] = field(default_factory=list)
    emails: list[str] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    htmls: list[str] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    failed: int = 0

    def extend(self, more: Rendered) -> None:
        """Add the emails of ``more`` after these."""
        for name in ("contact_ids", "emails", "subjects", "htmls", "texts", "links"):
            getattr(self, name).extend(getattr(more, name))
        self.failed += more.failed


class Renderer:
    """A plan made ready to render one recipient after another: each part as
    a ``%``-format string, its defaults already shown as the part shows
    values (escaped in the html, on one line in the subject), the keys looked
    up in contact properties, and the signer of the unsubscribe links
    (``link`` is the URL up to the token)."""

    def __init__(
        self, plan: Plan, key: TokenKey, link: str, team_id: UUID, topic_id: UUID | None
    ) -> None:
        keys = plan.subject.keys + plan.html.keys + (plan.text.keys if plan.text else [])
        # Contact fields and the link always win over a property of that name.
        self.property_keys = [key for key in dict.fromkeys(keys) if key not in BUILT_IN]
        self._sign = key.signer(team_id, topic_id)
        self._link = link
        self._html_link = html_lib.escape(link)  # a token needs no escaping
        self._subject = _format(plan.subject), tuple(plan.subject.keys), {
            k: one_line(v) for k, v in plan.defaults.items()
        }
        self._html = _format(plan.html), tuple(plan.html.keys), {
            k: html_lib.escape(v) for k, v in plan.defaults.items()
        }
        self.has_text = plan.text is not None
        self._text = None if plan.text is None else (
            _format(plan.text), tuple(plan.text.keys), dict(plan.defaults)
        )

    def render(self, rows: Iterable[Sequence[Any]]) -> Rendered:
        """Every recipient's subject, html and text: its values, then the
        broadcast's defaults, as the module docstring says. A row is
        ``(contact_id, email, first_name, last_name, properties, ...)``,
        ``email`` None when the contact has none or was deleted since the
        snapshot, ``properties`` the values of ``property_keys`` as JSON
        text (None when the contact has none)."""
        out, escape, unsubscribe, loads = Rendered(), html_lib.escape, UNSUBSCRIBE_URL, json.loads
        subject_format, subject_keys, subject_defaults = self._subject
        html_format, html_keys, html_defaults = self._html
        property_keys, sign, link_start, html_link = (
            self.property_keys, self._sign, self._link, self._html_link
        )
        for contact_id, email, first_name, last_name, properties, *_ in rows:
            if email is None:
                out.failed += 1
                continue
            own = {"email": email}
            if first_name is not None:
                own["first_name"] = first_name
            if last_name is not None:
                own["last_name"] = last_name
            if properties:
                for name, written in zip(property_keys, properties, strict=True):
                    if written is not None:
                        value = loads(written)
                        if type(value) is str:
                            own[name] = value
                        elif isinstance(value, (int, float)):  # booleans too
                            own[name] = format_value(value)
            token = sign(contact_id)
            own[unsubscribe] = link_start + token
            try:
                subject = subject_format % tuple([
                    one_line(own[k]) if k in own else subject_defaults[k] for k in subject_keys
                ])
                html = html_format % tuple([
                    (html_link + token if k == unsubscribe else escape(own[k]))
                    if k in own else html_defaults[k] for k in html_keys
                ])
                text = None
                if self._text is not None:
                    text_format, text_keys, text_defaults = self._text
                    text = text_format % tuple([
                        own[k] if k in own else text_defaults[k] for k in text_keys
                    ])
            except KeyError:  # a key with no value for this recipient
                out.failed += 1
                continue
            # The limits a template's render has (POST /emails answers 422):
            # an email over 4 MiB, or a subject too long or with nothing to
            # see, fails for this recipient rather than being sent.
            if subject_fault(subject) is not None or (
                rendered_size(subject, html, text) > MAX_RENDERED_BYTES
            ):
                out.failed += 1
                continue
            out.contact_ids.append(contact_id)
            out.emails.append(email)
            out.subjects.append(subject)
            out.htmls.append(html)
            out.texts.append(text)
            out.links.append(own[unsubscribe])
        return out


def _format(part: Part) -> str:
    """The part as a ``%``-format string with one ``%s`` per key."""
    return "%s".join(piece.replace("%", "%%") for piece in part.pieces)
