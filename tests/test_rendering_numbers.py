"""The renderer's writing of numbers and of subjects: plain decimal numbers,
and subjects without line breaks or other control characters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from tidings.http.emails_input import SendEmail
from tidings.http.template_models import CreateTemplate
from tidings.rendering import Variable, format_value, one_line, render


@dataclass(frozen=True)
class Version:
    html: str = "<p>x</p>"
    subject: str = "Hello"
    text: str | None = None
    variables: Sequence[Variable] = field(default_factory=tuple)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        # Whole numbers: plain digits, never an exponent nor ".0".
        (3.0, "3"),
        (-0.0, "0"),
        (1e16, "10000000000000000"),
        (-1.5e16, "-15000000000000000"),
        (1e20, "100000000000000000000"),
        (1e21, "1000000000000000000000"),
        (1e23, "100000000000000000000000"),  # the shortest digits, not 99999999999999991611392
        (2**60, "1152921504606846976"),
        (12345678901234567890123, "12345678901234567890123"),
        # Fractions: the shortest digits that read back as the same double.
        (2.5, "2.5"),
        (0.1, "0.1"),
        (1 / 3, "0.3333333333333333"),
        (123.456, "123.456"),
        (0.000123, "0.000123"),
        (1e-6, "0.000001"),
        (1.5e-6, "0.0000015"),
        # Below 1e-6, JavaScript's exponent (no zero padding, unlike Python's).
        (1e-7, "1e-7"),
        (-1e-7, "-1e-7"),
        (1.5e-7, "1.5e-7"),
        (1.5e-10, "1.5e-10"),
        (5e-324, "5e-324"),
        (True, "true"),
        (False, "false"),
        ("1e16", "1e16"),
    ],
)
def test_numbers_are_written_in_plain_decimal(value: float | int | bool | str,
                                              written: str) -> None:
    assert format_value(value) == written


def test_a_rendered_whole_number_has_no_exponent() -> None:
    version = Version(
        subject="{{{N}}} / {{{F}}}", html="<p>{{{N}}} {{{F}}}</p>", text="{{{N}}} {{{F}}}",
        variables=(Variable("N", "number"), Variable("F", "number", 1e-7)),
    )
    rendered = render(version, {"N": 1e16})
    assert rendered.subject == "10000000000000000 / 1e-7"
    assert rendered.html == "<p>10000000000000000 1e-7</p>"
    assert rendered.text == "10000000000000000 1e-7"


def test_one_line_turns_line_breaks_into_spaces_and_drops_other_controls() -> None:
    assert one_line("plain\ttext é ✓") == "plain\ttext é ✓"
    assert one_line("a\r\nb\nc\rd") == "a b c d"
    assert one_line("a\u2028b\u000bc\u0085d\u2029e\x0cf\x1cg") == "a b c d e f g"
    assert one_line("a\x1bb\x7fc\x00d\x9fe\x08f") == "abcdef"


def test_a_rendered_subject_loses_control_characters() -> None:
    version = Version(subject="Hi {{{A}}}", variables=(Variable("A", "string"),))
    rendered = render(version, {"A": "a\u2028b\u000bc\u0085d\x1be\x7f\u2029f"})
    assert rendered.subject == "Hi a b c de f"
    # The html and the text part keep the value as it is (escaped in the html).
    plain = Version(subject="Hi {{{A}}}", html="{{{A}}}", text="{{{A}}}",
                    variables=(Variable("A", "string"),))
    assert render(plain, {"A": "a\u2028b"}).text == "a\u2028b"


def test_a_subject_stored_with_control_characters_renders_without_them() -> None:
    # A version stored before the subject was checked for them.
    version = Version(
        subject="Sale\x1b[31m\u2028now {{{A}}}\x7f", variables=(Variable("A", "string"),)
    )
    assert render(version, {"A": "x"}).subject == "Sale[31m now x"
    # Removing a character never makes a placeholder of the text around it.
    braces = Version(subject="{{\x1b{A}}}", variables=(Variable("A", "string"),))
    assert render(braces, {"A": "x"}).subject == "{{{A}}}"


def _refused_by_emails(subject: str) -> bool:
    try:
        SendEmail.model_validate(
            {"from": "a@acme.example", "to": "b@example.com", "subject": subject, "html": "h"}
        )
    except ValueError:
        return True
    return False


def _refused_by_templates(subject: str) -> bool:
    try:
        CreateTemplate.model_validate({"name": "t", "subject": subject, "html": "h"})
    except ValueError:
        return True
    return False


def test_a_template_subject_refuses_what_post_emails_refuses() -> None:
    characters = [*range(0x0, 0x3000), 0xFEFF, 0xFFFD, 0x1F600]
    differ = [
        hex(code) for code in characters
        if _refused_by_emails(f"a{chr(code)}b") != _refused_by_templates(f"a{chr(code)}b")
    ]
    assert differ == []
    for character in "\x00\x0b\x1b\x7f\x85\u2028\u2029\r\n":
        assert _refused_by_templates(f"a{character}b"), repr(character)
    assert not _refused_by_templates("a\tb é")
