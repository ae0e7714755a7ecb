"""The renderer alone: substitution, fallbacks, typed values, escaping, errors,
and the text part derived from html."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tidings.html_text import html_to_text
from tidings.rendering import (
    MAX_RENDERED_BYTES,
    RenderError,
    RenderTooLarge,
    TemplateError,
    Variable,
    WrongType,
    _CompiledCache,
    compile_template,
    format_value,
    render,
)


@dataclass(frozen=True)
class Version:
    html: str
    subject: str = "Hello"
    text: str | None = None
    variables: Sequence[Variable] = field(default_factory=tuple)


NAME = Variable("NAME", "string", "friend")
TOTAL = Variable("TOTAL", "number")
VIP = Variable("VIP", "boolean", False)


def test_supplied_values_then_fallbacks_fill_every_part() -> None:
    version = Version(
        subject="Hi {{{NAME}}}",
        html="<p>{{{NAME}}} owes {{{ TOTAL }}}; vip={{{VIP}}}</p>",
        text="{{{NAME}}}: {{{TOTAL}}}",
        variables=(NAME, TOTAL, VIP),
    )
    rendered = render(version, {"TOTAL": 12})
    assert rendered.subject == "Hi friend"
    assert rendered.html == "<p>friend owes 12; vip=false</p>"
    assert rendered.text == "friend: 12"
    rendered = render(version, {"NAME": "Ada", "TOTAL": 2.5, "VIP": True})
    assert rendered.subject == "Hi Ada"
    assert rendered.html == "<p>Ada owes 2.5; vip=true</p>"


def test_a_placeholder_may_repeat_and_percent_signs_stay() -> None:
    version = Version(html="{{{NAME}}} 100% {{{NAME}}} %s %(NAME)s", variables=(NAME,))
    assert render(version, {"NAME": "A"}).html == "A 100% A %s %(NAME)s"
    assert render(Version(html="50% off"), {}).html == "50% off"


def test_missing_values_are_all_named() -> None:
    version = Version(
        html="{{{A}}}{{{B}}}{{{C}}}",
        variables=(Variable("A", "string"), Variable("B", "number"), Variable("C", "string", "c")),
    )
    with pytest.raises(RenderError) as raised:
        render(version, {})
    assert raised.value.missing == ("A", "B")
    assert "A, B" in str(raised.value) and "C" not in str(raised.value)


def test_wrong_types_are_named_and_a_bool_is_not_a_number() -> None:
    version = Version(html="{{{NAME}}}{{{TOTAL}}}{{{VIP}}}", variables=(NAME, TOTAL, VIP))
    with pytest.raises(RenderError) as raised:
        render(version, {"NAME": 1, "TOTAL": True, "VIP": "yes"})
    assert raised.value.wrong == (
        WrongType("NAME", "string", "number"),
        WrongType("TOTAL", "number", "boolean"),
        WrongType("VIP", "boolean", "string"),
    )
    assert raised.value.missing == ()  # TOTAL was supplied, wrongly: not also "missing"
    message = str(raised.value)
    assert "TOTAL must be a number, got boolean" in message
    for value, got in ((None, "null"), ([1], "array"), ({"a": 1}, "object"),
                       (float("nan"), "non-finite number"), (float("inf"), "non-finite number")):
        with pytest.raises(RenderError) as raised:
            render(version, {"TOTAL": value})
        assert raised.value.wrong == (WrongType("TOTAL", "number", got),)


def test_supplied_keys_the_version_does_not_declare_are_refused() -> None:
    version = Version(html="{{{NAME}}}", variables=(NAME,))
    with pytest.raises(RenderError) as raised:
        render(version, {"NAME": "a", "ZED": 1, "EXTRA": "x"})
    assert raised.value.unknown == ("EXTRA", "ZED")
    assert "not declared by the template: EXTRA, ZED" in str(raised.value)


def test_every_problem_is_reported_at_once() -> None:
    version = Version(html="{{{TOTAL}}}{{{VIP}}}", variables=(TOTAL, VIP))
    with pytest.raises(RenderError) as raised:
        render(version, {"VIP": 1, "X": 1})
    assert (raised.value.missing, raised.value.unknown) == (("TOTAL",), ("X",))
    assert raised.value.wrong == (WrongType("VIP", "boolean", "number"),)


def test_html_gets_escaped_values_subject_and_text_raw() -> None:
    version = Version(
        subject="For {{{NAME}}}",
        html='<a title="{{{NAME}}}">{{{NAME}}}</a>',
        text="For {{{NAME}}}",
        variables=(NAME,),
    )
    evil = "<script>alert('x')</script> & \"q\""
    rendered = render(version, {"NAME": evil})
    assert "<script>" not in rendered.html
    assert rendered.html == (
        '<a title="&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;">'
        "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;q&quot;</a>"
    )
    assert rendered.subject == f"For {evil}"
    assert rendered.text == f"For {evil}"
    # Fallbacks are escaped alike.
    fallback = Version(html="{{{N}}}", variables=(Variable("N", "string", "a<b"),))
    assert render(fallback, {}).html == "a&lt;b"


def test_line_breaks_in_values_do_not_reach_the_subject() -> None:
    version = Version(subject="Hi {{{NAME}}}", html="{{{NAME}}}", text="{{{NAME}}}",
                      variables=(NAME,))
    rendered = render(version, {"NAME": "Ada\r\nBcc: x@evil.example\nY\rZ"})
    assert rendered.subject == "Hi Ada Bcc: x@evil.example Y Z"
    assert rendered.text == "Ada\r\nBcc: x@evil.example\nY\rZ"


def test_values_are_formatted_like_json() -> None:
    assert format_value(True) == "true"
    assert format_value(3) == "3"
    assert format_value(3.0) == "3"
    assert format_value(-0.5) == "-0.5"
    assert format_value(1e20) == "100000000000000000000"
    assert format_value("x") == "x"


def test_undeclared_placeholders_and_bad_variables_do_not_compile() -> None:
    with pytest.raises(TemplateError) as raised:
        compile_template(
            Version(html="{{{A}}}{{{B}}}{{{A}}}", variables=(Variable("B", "string"),))
        )
    assert raised.value.field == "html" and "{{{A}}}" in raised.value.message
    with pytest.raises(TemplateError) as raised:
        compile_template(Version(html="x", subject="{{{Q}}}"))
    assert raised.value.field == "subject"
    with pytest.raises(TemplateError) as raised:
        compile_template(Version(html="x", variables=(NAME, Variable("NAME", "number"))))
    assert raised.value.field == "variables.1.key"
    assert "duplicate key 'NAME'" in raised.value.message
    with pytest.raises(TemplateError) as raised:
        compile_template(Version(html="x", variables=(Variable("N", "number", True),)))
    assert raised.value.field == "variables.0.fallback_value"


def test_a_version_without_text_gets_one_from_its_html_with_raw_values() -> None:
    version = Version(
        html='<p>Hello {{{NAME}}},</p><p>see <a href="https://x.example/{{{NAME}}}">your order</a>'
        "</p>",
        variables=(NAME,),
    )
    rendered = render(version, {"NAME": "A&B"})
    assert rendered.text == "Hello A&B,\n\nsee your order (https://x.example/A&B)"
    assert "A&amp;B" in rendered.html


def test_entity_encoded_braces_are_text_not_placeholders() -> None:
    # A browser shows {{{X}}} for this html: no placeholder, so no variable is needed.
    literal = Version(html="<p>&#123;&#123;&#123;X}}} &lbrace;{{ Y }}}</p>")
    rendered = render(literal, {})
    assert rendered.html == "<p>&#123;&#123;&#123;X}}} &lbrace;{{ Y }}}</p>"
    assert rendered.text == "{{{X}}} {{{ Y }}}"
    # With X declared, only the real placeholder gets its value.
    both = Version(
        html='<p>&#123;&#123;&#123;X}}} is {{{X}}}</p><a href="https://x.example/{{{X}}}">go</a>',
        variables=(Variable("X", "string"),),
    )
    rendered = render(both, {"X": "<v>"})
    assert rendered.html == (
        '<p>&#123;&#123;&#123;X}}} is &lt;v&gt;</p><a href="https://x.example/&lt;v&gt;">go</a>'
    )
    assert rendered.text == "{{{X}}} is <v>\n\ngo (https://x.example/<v>)"


def test_private_use_characters_in_the_html_stay_text() -> None:
    # The derived text marks placeholders with private-use characters; those
    # the html holds itself, literally or as entities, are left alone.
    version = Version(
        html="\U000f0000 &#983041; &#xF0002; {{{A}}}{{{B}}}",
        variables=(Variable("A", "string"), Variable("B", "string")),
    )
    rendered = render(version, {"A": "a", "B": "b"})
    assert rendered.text == "\U000f0000 \U000f0001 \U000f0002 ab"


def test_a_render_over_the_size_limit_is_refused_before_it_is_made() -> None:
    version = Version(html="<p>{{{A}}}</p>" * 1000, variables=(Variable("A", "string"),))
    with pytest.raises(RenderTooLarge) as raised:
        render(version, {"A": "<" * 1100})  # "&lt;" in the html: 4.4 MB
    assert isinstance(raised.value, RenderError)  # handled wherever RenderError is
    # Subject, html (escaped values) and the derived text (raw values), in UTF-8 bytes.
    assert raised.value.size == len("Hello") + 1000 * (7 + 4 * 1100) + 1000 * 1100 + 999 * 2
    assert raised.value.limit == MAX_RENDERED_BYTES
    assert f"over the limit of {MAX_RENDERED_BYTES} bytes (4 MiB)" in str(raised.value)
    assert render(version, {"A": "<" * 100}).html.count("&lt;") == 100_000


def test_the_size_limit_counts_every_part_in_utf8_bytes() -> None:
    version = Version(
        subject="{{{A}}}", html="h{{{A}}}", text="t", variables=(Variable("A", "string"),)
    )
    room = MAX_RENDERED_BYTES - len("h") - len("t")
    # The subject and the html each hold the value once.
    assert len(render(version, {"A": "a" * (room // 2)}).html) == room // 2 + 1
    with pytest.raises(RenderTooLarge) as raised:
        render(version, {"A": "a" * (room // 2 + 1)})
    assert raised.value.size == MAX_RENDERED_BYTES + 2
    # "é" is two bytes in UTF-8.
    render(version, {"A": "é" * (room // 4)})
    with pytest.raises(RenderTooLarge):
        render(version, {"A": "é" * (room // 4 + 1)})
    # Fallbacks count too.
    huge = Variable("A", "string", "x" * MAX_RENDERED_BYTES)
    fallback = Version(html="{{{A}}}", variables=(huge,))
    with pytest.raises(RenderTooLarge):
        render(fallback, {})


def test_compiling_is_cached_by_content() -> None:
    version = Version(html="{{{NAME}}}", variables=(NAME,))
    assert compile_template(version) is compile_template(Version(html="{{{NAME}}}",
                                                                 variables=[NAME]))


@pytest.mark.parametrize(("kind", "valid", "invalid"), [
    ("number", 1, True), ("number", 0, False), ("boolean", True, 1), ("boolean", False, 0),
])
def test_a_cached_version_lets_no_fallback_of_another_type_through(
    kind: str, valid: object, invalid: object
) -> None:
    """``True == 1`` in Python: a version compiled (and checked) once must not
    stand in for the same content whose fallback is of the wrong type."""
    checked = compile_template(Version(html="{{{N}}}", variables=(Variable("N", kind, valid),)))
    with pytest.raises(TemplateError) as raised:
        compile_template(Version(html="{{{N}}}", variables=(Variable("N", kind, invalid),)))
    assert raised.value.field == "variables.0.fallback_value"
    same = compile_template(Version(html="{{{N}}}", variables=(Variable("N", kind, valid),)))
    assert same is checked


def test_the_cache_keeps_within_its_budget_and_drops_the_least_recent() -> None:
    cache = _CompiledCache(max_chars=40_000)  # room for about 6 of these
    keys = [Version(subject="Hi", html=f"<p>{n}</p>" + "x" * 1000) for n in range(12)]
    first = cache.get(keys[0])
    for key in keys[1:]:
        cache.get(key)
        cache.get(keys[0])  # kept in use: never the least recent
        assert cache.chars <= cache.max_chars
    assert 1 < len(cache) < len(keys)
    assert cache.get(keys[0]) is first
    assert keys[1] not in cache and keys[-1] in cache
    # A template larger than the whole budget is compiled but not kept.
    huge = Version(subject="Hi", html="y" * 20_000)
    assert cache.get(huge) is not cache.get(huge)


# --- html_to_text -------------------------------------------------------------------


def test_text_keeps_paragraphs_line_breaks_and_collapses_spaces() -> None:
    html = """<html><head><title>T</title><style>p {color: red}</style></head>
    <body><h1>Welcome,   Ada</h1>
    <p>First   line<br>second line<br/>third</p>
    <div>A div</div><div>Another</div>
    <!-- a comment -->
    <script>var x = 1;</script>
    <p>Fish &amp; chips&nbsp;&mdash; &lt;tag&gt;</p></body></html>"""
    assert html_to_text(html) == (
        "Welcome, Ada\n\nFirst line\nsecond line\nthird\n\nA div\nAnother\n\n"
        "Fish & chips — <tag>"
    )


def test_text_keeps_link_targets() -> None:
    html = (
        '<p><a href="https://acme.example/a">Track it</a> or '
        '<a href="https://acme.example/b">https://acme.example/b</a> or '
        '<a href="mailto:help@acme.example">help@acme.example</a> or '
        '<a href="#top">top</a> or '
        '<a href="https://acme.example/logo"><img src="l.png" alt="Acme"></a> or '
        '<a href="https://acme.example/c"><img src="c.png"></a></p>'
    )
    assert html_to_text(html) == (
        "Track it (https://acme.example/a) or https://acme.example/b or "
        "help@acme.example or top or Acme (https://acme.example/logo) or "
        "https://acme.example/c"
    )


def test_text_of_lists_tables_and_pre() -> None:
    html = (
        "<ul><li>one</li><li>two<ol><li>a</li><li>b</li></ol></li></ul>"
        "<table><tr><td>Item</td><td>Price</td></tr><tr><td>Tea</td><td>3</td></tr></table>"
        "<pre>  keep\n    this</pre>"
    )
    assert html_to_text(html) == (
        "- one\n- two\n\n  1. a\n  2. b\n\nItem Price\nTea 3\n\n  keep\n    this"
    )


def test_text_of_plain_or_broken_html() -> None:
    assert html_to_text("just text") == "just text"
    assert html_to_text("") == ""
    assert html_to_text("<p>unclosed <b>bold") == "unclosed bold"
    assert html_to_text("a</p>b<p>") == "a\n\nb"


def test_text_leaves_out_hidden_elements_and_invisible_padding() -> None:
    html = (
        '<div style="display:none;max-height:0">Preheader &#8204;&#65279;&#847;'
        "<div>nested</div> still hidden</div>"
        '<p hidden>not shown</p><span style="DISPLAY: NONE">no</span>'
        "<p>Shown, soft&shy;hyphen and zero&#8203;width</p>"
    )
    assert html_to_text(html) == "Shown, softhyphen and zerowidth"
