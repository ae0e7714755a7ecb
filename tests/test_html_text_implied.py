"""The derived text part and the end tags HTML lets go unwritten: an element
closed by implication (``<body>`` closing ``<head>``, a block closing ``<p>``,
``<li>`` closing ``<li>``…) stops hiding what follows, as in a browser."""

from __future__ import annotations

import time

import pytest

from tidings.html_text import MAX_DEPTH, html_to_text


def test_body_closes_a_head_without_its_end_tag() -> None:
    html = (
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>R</title>'
        "<body><p>Hello</p>"
    )
    assert html_to_text(html) == "Hello"
    assert html_to_text("<html><head><style>p{}</style><body><p>Your receipt</p>") == (
        "Your receipt"
    )


def test_body_content_closes_a_head_without_body_tag() -> None:
    assert html_to_text("<head><title>R</title><p>Hello</p>") == "Hello"
    assert html_to_text("<head><title>R</title>Hello") == "Hello"


def test_a_block_closes_a_hidden_paragraph() -> None:
    assert html_to_text('<p style="display:none">preheader<p>Hello</p>') == "Hello"
    assert html_to_text('<p style="display:none">pre<div>Body</div>') == "Body"
    assert html_to_text('<p hidden>pre<h1>Title</h1><ul><li>item</ul>') == "Title\n\n- item"


def test_a_table_closes_a_hidden_paragraph() -> None:
    # As in a page with a doctype; in quirks mode a browser would nest the
    # table in the paragraph, but losing the body is worse than a preheader.
    text = html_to_text('<p style="display:none">pre<table><tr><td>Body</td></tr></table>')
    assert text == "Body"


def test_a_list_item_closes_a_hidden_list_item() -> None:
    assert html_to_text("<li hidden>x<li>y") == "- y"
    assert html_to_text("<ol><li hidden>x<li>y<li>z</ol>") == "1. y\n2. z"
    # An item of a nested list does not close the item holding that list.
    assert html_to_text("<ul><li hidden>x<ul><li>y</ul><li>z</ul>") == "- z"


def test_a_cell_or_row_closes_a_hidden_cell_or_row() -> None:
    assert "y" in html_to_text("<td hidden>x<td>y")
    assert html_to_text("<table><tr><td hidden>x<td>y</table>") == "y"
    assert html_to_text("<table><tr hidden><td>x<tr><td>y<td>z</table>") == "y z"


def test_a_term_or_definition_closes_a_hidden_one() -> None:
    assert html_to_text("<dl><dt hidden>x<dd>y<dd hidden>z<dt>w</dl>") == "y\nw"


def test_an_end_tag_closes_the_hidden_elements_left_open_inside() -> None:
    assert html_to_text("<p><span hidden>x</p>y") == "y"
    assert html_to_text("<div><span hidden>x<b>bold</div>y") == "y"
    assert html_to_text("<table><tr><td><span hidden>x</table>y") == "y"


def test_an_end_tag_of_nothing_open_changes_nothing() -> None:
    # A stray </p> only inserts an empty paragraph, and a stray </div> is
    # ignored: the span stays open, and hides what follows, in a browser too.
    assert html_to_text("<span hidden>x</p>y</span>z") == "z"
    assert html_to_text("<span hidden>x</div>y</span>z") == "z"
    # An inline end tag does not reach past a block opened inside its element:
    # the span closes only at the </span> after that block's end.
    assert html_to_text("<span hidden><div>x</span>y</div>z</span>w") == "w"


def test_closed_and_nested_hidden_elements_stay_hidden() -> None:
    html = (
        '<div style="display:none">a<div>b</div><div hidden>c</div>d</div>'
        "<p hidden>e<span>f</span></p>"
        '<span hidden>g<span>h</span>i</span>'
        "<ul hidden><li>j<li>k</ul>"
        "<p>shown</p>"
    )
    assert html_to_text(html) == "shown"


def test_a_head_start_tag_in_the_body_is_ignored() -> None:
    assert html_to_text("<body><p>Hello<head><p>World") == "Hello\n\nWorld"


def test_a_link_or_bold_closes_past_a_block_opened_inside_it() -> None:
    assert html_to_text('<a href="https://acme.example"><div>Go</a> on</div>') == (
        "Go (https://acme.example) on"
    )
    assert html_to_text('<b hidden><div>x</b>y</div>') == "y"
    # A link left open ends with the document and keeps its target.
    assert html_to_text('<p>See <a href="https://acme.example">this') == (
        "See this (https://acme.example)"
    )


@pytest.mark.parametrize("html", [
    "<div>" * 20000 + "x",
    "<p><button>" + "<div>" * 20000 + "x",
    "<li>" + "<div>" * 500 + "<li>x" * 20000,
    "<table>" + "<tr><td>x" * 20000,
])
def test_deep_or_long_markup_costs_time_in_proportion_to_its_size(html: str) -> None:
    """A close walks the stack of open elements; unbounded, 20,000 nested
    <div>s took 48 s (every start tag walked them all). The stack is kept
    to MAX_DEPTH, and a walk for a tag that is not open costs nothing."""
    started = time.perf_counter()
    assert "x" in html_to_text(html)
    assert time.perf_counter() - started < 5.0


def test_elements_deeper_than_the_cap_keep_their_text() -> None:
    deep = "<div>" * (MAX_DEPTH + 10) + "<p>kept</p>" + "</div>" * (MAX_DEPTH + 10) + "after"
    assert html_to_text(deep) == "kept\n\nafter"
    hidden = "<div>" * (MAX_DEPTH - 5) + '<span hidden>gone</span>shown'
    assert html_to_text(hidden) == "shown"


@pytest.mark.parametrize(("html", "text"), [
    ("<p>hi<!-- a comment the document never closes", "hi"),
    ("<p>hi<!-- closed --> there<!-- not closed <p>gone", "hi there"),
    ('<p>hi<b class="x', "hi"),
    ("<p>hi</p", "hi"),
    ("<p>hi<!doctype", "hi"),
    ("<p>hi<?php echo 1", "hi"),
    ("<p>x<", "x<"),  # a lone "<" at the end is text, for a browser too
    ("<p>a < b", "a < b"),
])
def test_markup_cut_off_by_the_end_of_the_document_is_not_text(html: str, text: str) -> None:
    """A browser reads an unclosed comment to the end of the document and
    drops an unfinished tag: neither shows, so the text part shows neither."""
    assert html_to_text(html) == text
