"""A plain-text part derived from an HTML email body.

``html_to_text`` keeps what a reader of the plain-text part needs: the words,
paragraphs and line breaks, list items, and the targets of links (``label
(https://...)``). It drops what only a browser uses: ``<head>``, ``<style>``,
``<script>``, elements hidden with ``display: none`` or ``hidden`` (such as
inbox preheaders), comments, attributes and invisible filler characters.
Whitespace is collapsed as a browser would, except inside ``<pre>``.

HTML lets many end tags go unwritten (``</head>``, ``</p>``, ``</li>``,
``</td>``…), so the writer keeps a stack of open elements and closes them as a
browser's parser does (a simplified form of the WHATWG tree-construction
rules): ``<body>`` or any body content closes ``<head>``, a block such as
``<p>``, ``<div>`` or ``<table>`` closes an open ``<p>``, ``<li>`` an open
``<li>``, ``<tr>`` and ``<td>`` the open row or cell, and an end tag closes
everything opened after its element. Whether text is hidden is read from that
stack, so an element hidden or dropped stops hiding whichever way it closes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from html.parser import HTMLParser
from typing import NamedTuple

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
_HIDDEN = frozenset({
    "head", "script", "style", "template", "title", "noscript", "iframe", "noembed",
    "noframes",
})
# Elements a browser reads as raw text up to their end tag, even when written
# as <script/>: the slash is ignored, so what follows is the element's.
_RAW_TEXT = frozenset({"script", "style", "iframe", "noembed", "noframes", "xmp"})
# Elements without an end tag: they never go on the stack of open elements.
_VOID = frozenset({
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "hr", "img", "input",
    "keygen", "link", "meta", "param", "source", "track", "wbr",
})

# --- implied end tags (WHATWG HTML, "the rules for parsing tokens in HTML content") ---

# What may stand in <head>; any other start tag, or text, closes it.
_HEAD_CONTENT = frozenset({
    "base", "basefont", "bgsound", "link", "meta", "noscript", "script", "style",
    "template", "title",
})
# Start tags that close an open <p>: a paragraph cannot hold a block. (<table>
# does not in a quirks-mode page, but a hidden preheader that swallowed the
# whole body would cost far more than one shown by mistake.)
_CLOSES_P = frozenset({
    "address", "article", "aside", "blockquote", "center", "dd", "details", "dialog",
    "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form",
    "h1", "h2", "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "li", "listing",
    "main", "menu", "nav", "ol", "p", "plaintext", "pre", "search", "section",
    "summary", "table", "ul", "xmp",
})
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
# The "special" elements: an end tag of an inline element does not reach past
# one, and an <li> or <dd> closes no item past one (but address, div and p).
_SPECIAL = _CLOSES_P | _HEAD_CONTENT | frozenset({
    "applet", "body", "button", "caption", "colgroup", "frameset", "head", "html",
    "iframe", "marquee", "noembed", "noframes", "object", "select", "tbody", "td",
    "textarea", "tfoot", "th", "thead", "tr",
})
# Formatting elements: their end tag closes them even past a block opened inside
# them, whose content the browser then carries on outside them ("adoption agency").
_FORMATTING = frozenset({
    "a", "b", "big", "code", "em", "font", "i", "nobr", "s", "small", "strike",
    "strong", "tt", "u",
})
# Scopes: an end tag or an implied close does not reach past these elements.
_SCOPE = frozenset({
    "applet", "caption", "html", "marquee", "object", "table", "td", "template", "th",
})
_LIST_SCOPE = _SCOPE | {"ol", "ul"}
_BUTTON_SCOPE = _SCOPE | {"button"}
_TABLE_SCOPE = frozenset({"html", "table", "template"})
_TABLE_PARTS = frozenset({"caption", "table", "tbody", "td", "tfoot", "th", "thead", "tr"})
# For a start tag of a table part, the open parts of the same table it closes.
_CLOSES_CELLS = {
    "td": {"td", "th"}, "th": {"td", "th"}, "tr": {"tr", "td", "th"},
    **dict.fromkeys(("tbody", "thead", "tfoot"), {"tbody", "thead", "tfoot", "tr", "td", "th"}),
}

_LINK_SCHEMES = ("mailto:", "tel:")

_DISPLAY_NONE = re.compile(r"display\s*:\s*none", re.IGNORECASE)
# Zero-width and other invisible characters that pad preheaders and split words.
_INVISIBLE = re.compile("[\u00ad\u034f\u200b\u2060\ufeff]")
# The joiners (ZWNJ, ZWJ) are padding only next to a space or another
# invisible character: between two visible ones they are part of the text
# (an emoji family, Persian and Indic spelling) and stay.
_PAD = "\\s\u00a0\u00ad\u034f\u200b-\u200d\u2060\ufeff"
_PADDING_JOINERS = re.compile(f"(?<![^{_PAD}])[\u200c\u200d]|[\u200c\u200d](?![^{_PAD}])")
_SPACES = re.compile(r"\s+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANKS = re.compile(r"\n{3,}")


# The deepest the stack of open elements goes: an element opened deeper is
# read as if it closed at once (its text is kept). Browsers cap nesting too
# (Blink at 512); here it bounds what each tag may cost, since an implied or
# explicit close walks the stack: 100 is far deeper than any email nests.
MAX_DEPTH = 100


class _Open(NamedTuple):
    """An open element: whether it hides its content, and for a link, its
    target and where its label starts in the output."""

    tag: str
    hides: bool
    link: tuple[str, int] | None = None


class _TextWriter(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.pending = 0  # line breaks owed before the next text (0, 1 or 2)
        self.line_start = True
        self.stack: list[_Open] = []  # the open elements, innermost last
        self.open = Counter[str]()  # how many of each tag the stack holds
        self.hidden = 0  # how many elements of the stack hide their content
        self.past_head = False  # a later <head> start tag is ignored, as browsers do
        self.pre = 0
        self.lists: list[list[int]] = []  # per open list: [next number] for ol, [] for ul

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
        if self.hidden:  # a hidden block takes no room
            return
        self.pending = max(self.pending, breaks)
        self.line_start = True

    # --- parser events ----------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "head":
            if self.past_head:
                return
            self.past_head = True
        elif tag != "html" and tag not in _HEAD_CONTENT:
            self._leave_head()
        self._close_implied(tag)
        hides = tag in _HIDDEN or _hides(attrs)
        if tag not in _VOID and len(self.stack) < MAX_DEPTH:
            href = (dict(attrs).get("href") or "") if tag == "a" else None
            link = None if href is None or hides else (href, len(self.out))
            self.stack.append(_Open(tag, hides, link))
            self.open[tag] += 1
            if hides:
                self.hidden += 1
        if hides:
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
        elif tag == "img":
            alt = (dict(attrs).get("alt") or "").strip()
            if alt:
                self.text(alt)
        elif tag in ("td", "th"):
            self.text(" ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # A browser ignores the slash of <div/>; reading it as <div></div> keeps
        # XHTML-style markup from hiding or swallowing what follows. A raw
        # text element (<script/>) does swallow it, up to its end tag.
        self.handle_starttag(tag, attrs)
        if tag in _RAW_TEXT:
            self.set_cdata_mode(tag)
        elif tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("body", "html", "br"):
            self._leave_head()
        if tag == "br":  # </br> is read as <br>
            self.handle_starttag("br", [])
            return
        index = self._find({tag}, self._end_scope(tag))
        if index is None:
            if tag == "p":  # a stray </p> is read as <p></p>
                self.handle_starttag("p", [])
                # Closed where it was opened (nowhere, past MAX_DEPTH).
                self._close(self._find({"p"}, _BUTTON_SCOPE))
            return  # an end tag of nothing open is ignored
        if tag in _FORMATTING and any(e.tag in _SPECIAL for e in self.stack[index + 1:]):
            # The blocks opened inside it stay open, now outside it.
            self._end(self._pop(index))
        else:
            self._close(index)

    def handle_data(self, data: str) -> None:
        # Text is body content, but for that of <title>, <style> and the like.
        if data.strip(" \t\n\r\f") and not (self.stack and self.stack[-1].tag in _HEAD_CONTENT):
            self._leave_head()
        self.text(data)

    # --- the stack of open elements ----------------------------------------------

    def _find(self, tags: Collection[str], scope: Collection[str]) -> int | None:
        """Where the innermost open element among ``tags`` is on the stack, if
        one is open inside the innermost element of ``scope``."""
        if not any(self.open[tag] for tag in tags):
            return None  # the common case, in constant time
        for index in range(len(self.stack) - 1, -1, -1):
            name = self.stack[index].tag
            if name in tags:
                return index
            if name in scope:
                return None
        return None

    @staticmethod
    def _end_scope(tag: str) -> Collection[str]:
        if tag in _FORMATTING:
            return _SCOPE
        if tag not in _SPECIAL:  # span, label, custom elements…: not past a block
            return _SPECIAL
        if tag in _TABLE_PARTS:
            return _TABLE_SCOPE
        return {"li": _LIST_SCOPE, "p": _BUTTON_SCOPE}.get(tag, _SCOPE)

    def _close_implied(self, tag: str) -> None:
        """Close the open elements that a start tag of ``tag`` ends."""
        if tag in ("li", "dd", "dt"):
            # The open item, unless a block other than address, div or p (a
            # nested list, say) stands between.
            items = ("li",) if tag == "li" else ("dd", "dt")
            for index in range(len(self.stack) - 1 if any(map(self.open.get, items)) else -1,
                               -1, -1):
                name = self.stack[index].tag
                if name in items:
                    self._close(index)
                    break
                if name in _SPECIAL and name not in ("address", "div", "p"):
                    break
        if tag in _CLOSES_P:
            self._close(self._find({"p"}, _BUTTON_SCOPE))
        if tag in _HEADINGS and self.stack and self.stack[-1].tag in _HEADINGS:
            self._close(len(self.stack) - 1)
        if tag in _CLOSES_CELLS:
            # The outermost open row part of the same table: closing it closes
            # what is inside it.
            outermost = None
            parts = _CLOSES_CELLS[tag]
            for index in range(len(self.stack) - 1 if any(map(self.open.get, parts)) else -1,
                               -1, -1):
                name = self.stack[index].tag
                if name in _TABLE_SCOPE:
                    break
                if name in _CLOSES_CELLS[tag]:
                    outermost = index
            self._close(outermost)
        if tag in ("option", "optgroup") and self.stack and self.stack[-1].tag == "option":
            self._close(len(self.stack) - 1)
        if tag == "optgroup" and self.stack and self.stack[-1].tag == "optgroup":
            self._close(len(self.stack) - 1)

    def _leave_head(self) -> None:
        self.past_head = True
        if self.stack and self.stack[-1].tag == "head":
            self._close(len(self.stack) - 1)

    def _close(self, index: int | None) -> None:
        """Close the open element at ``index`` and all opened after it."""
        if index is None:
            return
        while len(self.stack) > index:
            self._end(self._pop(len(self.stack) - 1))

    def _pop(self, index: int) -> _Open:
        element = self.stack.pop(index)
        self.open[element.tag] -= 1
        return element

    def _end(self, element: _Open) -> None:
        if element.hides:
            self.hidden -= 1
            return
        tag = element.tag
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        elif tag in ("ul", "ol") and self.lists:
            self.lists.pop()
        elif element.link is not None:
            self._close_link(*element.link)
        if tag in _PARAGRAPH:
            self.block(2)
        elif tag in _LINE:
            self.block(1)

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
        # Markup the document ends in the middle of (an unclosed comment, tag
        # or declaration) is no text for a browser: a comment runs to the
        # end, the rest is dropped. The parser would give it back as text.
        if _UNFINISHED.match(self.rawdata):
            self.rawdata = ""
        self.close()
        self._close(0)  # what is still open ends with the document
        text = _PADDING_JOINERS.sub("", "".join(self.out))
        text = _INVISIBLE.sub("", text).replace("\xa0", " ")
        text = _TRAILING.sub("\n", text)
        text = _BLANKS.sub("\n\n", text)
        return text.strip("\n ").rstrip()


_UNFINISHED = re.compile(r"<[a-zA-Z/!?]")


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
