"""Segment counts by the GSM 03.38 and UCS-2 rules, at every edge."""

from __future__ import annotations

import pytest

from tidings.sms_encoding import GSM_BASIC, GSM_EXTENSION, encode, non_gsm


@pytest.mark.parametrize(
    ("length", "parts"),
    [(1, 1), (160, 1), (161, 2), (306, 2), (307, 3), (459, 3), (460, 4)],
)
def test_gsm7_parts_are_160_then_153(length: int, parts: int) -> None:
    found = encode("a" * length)
    assert (found.encoding, found.segments, found.characters, found.units) == (
        "GSM-7", parts, length, length,
    )


@pytest.mark.parametrize(
    ("length", "parts"), [(1, 1), (70, 1), (71, 2), (134, 2), (135, 3)]
)
def test_ucs2_parts_are_70_then_67(length: int, parts: int) -> None:
    found = encode("й" * length)
    assert (found.encoding, found.segments, found.units) == ("UCS-2", parts, length)
    assert found.non_gsm_characters == ("й",)


def test_extension_characters_count_twice() -> None:
    assert encode("€" * 80).segments == 1  # 160 septets
    assert encode("€" * 80 + "a").segments == 2  # 161
    assert encode("a" * 159 + "^").units == 161
    assert encode("a" * 159 + "^").segments == 2
    assert encode("a" * 158 + "[").segments == 1


def test_an_extension_character_is_never_split_between_parts() -> None:
    # 152 septets then an escape pair: it does not fit in the first part's
    # last septet, so it opens the second part.
    body = "a" * 152 + "{" + "a" * 152
    assert encode(body).units == 306
    assert encode(body).segments == 3  # 152 | 2 + 151 | 1
    assert encode("a" * 151 + "{" + "a" * 153).segments == 2  # 153 | 153


def test_an_emoji_counts_two_code_units_and_is_never_split() -> None:
    assert encode("😀").units == 2
    assert encode("😀" * 35).segments == 1  # 70 units
    assert encode("😀" * 35 + "a").segments == 2
    # 66 units, then a pair that would straddle the boundary: three parts.
    body = "a" * 66 + "😀" + "a" * 66
    assert encode(body).units == 134
    assert encode(body).segments == 3
    assert encode("a" * 65 + "😀" + "a" * 67).segments == 2
    assert encode("a😀").non_gsm_characters == ("😀",)


def test_one_non_gsm_character_makes_the_whole_message_ucs2() -> None:
    body = "a" * 69 + "ç"  # ç is not GSM (Ç is)
    found = encode(body)
    assert (found.encoding, found.segments, found.non_gsm_characters) == ("UCS-2", 1, ("ç",))
    assert encode("a" * 70 + "ç").segments == 2
    assert encode("Ç" * 160).encoding == "GSM-7"


def test_non_gsm_characters_are_listed_once_in_order() -> None:
    assert non_gsm("“Hi” — ok “") == ("“", "”", "—")
    assert encode("Hello, world!").non_gsm_characters == ()


def test_the_tables_are_the_gsm_ones() -> None:
    assert len(GSM_BASIC) == 127  # 128 codes less the escape
    assert len(GSM_EXTENSION) == 10
    assert "\x1b" not in GSM_BASIC
    assert encode("\x1b").encoding == "UCS-2"
    assert encode("").segments == 0
