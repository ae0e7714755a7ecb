"""A plain-text part derived from an HTML email body.

``html_to_text`` keeps what a reader of the plain-text part needs: the words,
paragraphs and line breaks, list items, and the targets of links (``label
(https://...)``). It drops what only a browser uses: ``<head>``, ``<style>``,
``<script>``, elements hidden with ``display: none`` or ``hidden`` (such as
inbox preheaders), comments, attributes and invisible filler characters.
Whitespace is collapsed as a browser would, except inside ``<pre>``.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

# Elements that start and end on a line of their own.
_LINE = frozenset({
    "address", "article", "aside", "center", "dd", "div", "dl", "dt", "fieldset",
    "figcaption", "figure", "footer", "form", "header", "li", "main", "nav", "section",
    "tr",
})
# Elements set off by a blank line.
_PARAGRAPH = frozenset({
    "blockquote", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "ol", "p", "pre", "table", "ul",
})
# Elements whose content is not for the reader.
_HIDDEN = frozenset({"head", "script", "style", "template", "title", "noscript"})
# Elements without an end tag.
_VOID = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
})
_LINK_SCHEMES = ("mailto:", "tel:")

_DISPLAY_NONE = re.compile(r"display\s*:\s*none", re.IGNORECASE)
# Zero-width and other invisible characters that pad preheaders and split words.
_INVISIBLE = re.compile("[\u00ad\u034f\u200b-\u200d\u2060\ufeff]")
_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANKS = re.compile(r"\n{3,}")


class _TextWriter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pending = 0  # line breaks owed before the next text (0, 1 or 2)
        self.line_start = True
        self.hidden = 0
        # Elements hidden by their attributes: [tag, how many of that tag are open].
        self.hiding: list[list[Any]] = []
        self.pre = 0
        self.lists: list[list[int]] = []  # per open list: [next number] for ol, [] for ul
        self.links: list[tuple[str, int]] = []  # (href, len(out) when the link opened)

    # --- output ---------------------------------------------------------------

    def text(self, data: str, *, verbatim: bool = False) -> None:
        if self.hidden:
            return
        if not (self.pre or verbatim):
            data = _SPACES.sub(" ", data)
            if self.line_start or self.pending or self._ends_with_space():
                data = data.lstrip(" ")
            if not data:
                return
        if self.pending:
            if self.out:
                self.out.append("\n" * self.pending)
            self.pending = 0
        self.out.append(data)
        self.line_start = data.endswith("\n")

    def _ends_with_space(self) -> bool:
        return bool(self.out) and self.out[-1].endswith((" ", "\n"))

    def block(self, breaks: int) -> None:
        self.pending = max(self.pending, breaks)
        self.line_start = True

    # --- parser events ----------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HIDDEN:
            self.hidden += 1
            return
        if tag not in _VOID:
            if self.hiding and self.hiding[-1][0] == tag:
                self.hiding[-1][1] += 1
            elif _hides(attrs):
                self.hiding.append([tag, 1])
                self.hidden += 1
                return
        if tag in _PARAGRAPH:
            self.block(2)
        elif tag in _LINE:
            self.block(1)
        if tag == "pre":
            self.pre += 1
        elif tag == "br":
            if self.hidden:
                return
            self.out.append("\n")
            self.pending = 0
            self.line_start = True
        elif tag == "ul":
            self.lists.append([])
        elif tag == "ol":
            self.lists.append([1])
        elif tag == "li":
            self._bullet()
        elif tag == "a":
            self.links.append((dict(attrs).get("href") or "", len(self.out)))
        elif tag == "img":
            alt = (dict(attrs).get("alt") or "").strip()
            if alt:
                self.text(alt)
        elif tag in ("td", "th"):
            self.text(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
            return
        if self.hiding and self.hiding[-1][0] == tag:
            self.hiding[-1][1] -= 1
            if self.hiding[-1][1] == 0:
                self.hiding.pop()
                self.hidden = max(0, self.hidden - 1)
                return
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        elif tag in ("ul", "ol") and self.lists:
            self.lists.pop()
        elif tag == "a" and self.links:
            self._close_link(*self.links.pop())
        if tag in _PARAGRAPH:
            self.block(2)
        elif tag in _LINE:
            self.block(1)

    def handle_data(self, data: str) -> None:
        self.text(data)

    # --- lists and links --------------------------------------------------------

    def _bullet(self) -> None:
        depth = max(len(self.lists), 1)
        marker = "-"
        if self.lists and self.lists[-1]:
            number = self.lists[-1][0]
            self.lists[-1][0] = number + 1
            marker = f"{number}."
        self.text("  " * (depth - 1) + marker + " ", verbatim=True)

    def _close_link(self, href: str, opened: int) -> None:
        href = href.strip()
        if not href or href.startswith("#") or self.hidden:
            return
        label = "".join(self.out[opened:]).strip()
        bare = href
        for scheme in _LINK_SCHEMES:
            if bare.lower().startswith(scheme):
                bare = bare[len(scheme):]
        if label in (href, bare):
            return
        self.text(f" ({href})" if label else href)

    def result(self) -> str:
        self.close()
        text = _INVISIBLE.sub("", "".join(self.out)).replace("\xa0", " ")
        text = _TRAILING.sub("\n", text)
        text = _BLANKS.sub("\n\n", text)
        return text.strip("\n ").rstrip()


def _hides(attrs: list[tuple[str, str | None]]) -> bool:
    for name, value in attrs:
        if name == "hidden" or (name == "style" and value and _DISPLAY_NONE.search(value)):
            return True
    return False


def html_to_text(html: str) -> str:
    """The plain-text reading of ``html``."""
    writer = _TextWriter()
    writer.feed(html)
    return writer.result()
