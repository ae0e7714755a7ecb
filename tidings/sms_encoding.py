"""How a text message is encoded and how many segments it costs (GSM 03.38 / UCS-2).

A message whose every character is in the GSM 03.38 default alphabet or its
extension table is sent in GSM-7: 160 septets in one part, 153 per part when
it needs several (the user data header takes the rest). Extension characters
(``^{}\\[~]|€`` and form feed) are sent as an escape and the character, so
they count twice, and the two septets never straddle two parts. Any other
character forces UCS-2 for the whole message: 70 UTF-16 code units in one
part, 67 per part, so a character outside the Basic Multilingual Plane (an
emoji) counts 2 and its surrogate pair is never split between parts.

Pure: no I/O, no dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Encoding = Literal["GSM-7", "UCS-2"]

# The GSM 03.38 default alphabet, in code order (0x1B, the escape, left out:
# it is not a character a message can contain).
GSM_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ"
    "ÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§"
    "¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
# The extension table: each is sent as ESC + the character (two septets).
GSM_EXTENSION = frozenset("\f^{}\\[~]|€")

GSM_SINGLE = 160
GSM_MULTI = 153
UCS2_SINGLE = 70
UCS2_MULTI = 67


@dataclass(frozen=True)
class SmsEncoding:
    """What a body costs: its encoding, its parts, its length in characters
    (code points) and in units (septets or UTF-16 code units), and the
    characters that forced UCS-2 (each once, in order of appearance)."""

    encoding: Encoding
    segments: int
    characters: int
    units: int
    non_gsm_characters: tuple[str, ...]


def _septets(char: str) -> int:
    return 2 if char in GSM_EXTENSION else 1


def _code_units(char: str) -> int:
    return 2 if ord(char) > 0xFFFF else 1


def _parts(sizes: list[int], single: int, multi: int) -> int:
    """Parts needed for characters of ``sizes`` units, none split between parts."""
    total = sum(sizes)
    if total == 0:
        return 0
    if total <= single:
        return 1
    parts, used = 1, 0
    for size in sizes:
        if used + size > multi:
            parts += 1
            used = 0
        used += size
    return parts


def non_gsm(body: str) -> tuple[str, ...]:
    """The characters of ``body`` GSM-7 cannot carry, each once, in order."""
    seen: dict[str, None] = {}
    for char in body:
        if char not in GSM_BASIC and char not in GSM_EXTENSION:
            seen.setdefault(char, None)
    return tuple(seen)


def encode(body: str) -> SmsEncoding:
    """The encoding and segment count of ``body``."""
    forcing = non_gsm(body)
    if forcing:
        sizes = [_code_units(char) for char in body]
        return SmsEncoding(
            "UCS-2", _parts(sizes, UCS2_SINGLE, UCS2_MULTI), len(body), sum(sizes), forcing
        )
    sizes = [_septets(char) for char in body]
    return SmsEncoding("GSM-7", _parts(sizes, GSM_SINGLE, GSM_MULTI), len(body), sum(sizes), ())


def segments(body: str) -> int:
    return encode(body).segments
