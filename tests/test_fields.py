"""The field error and the NUL check every request goes through."""

from __future__ import annotations

import math
import sys

import pytest

from tidings.fields import (
    NUL_REASON,
    FieldError,
    has_non_finite,
    has_nul,
    refuse_nul,
    refuse_unstorable,
    strict_json,
)


def test_a_field_error_names_the_field_and_the_reason() -> None:
    error = FieldError("to.3", "must be a string")
    assert (error.field, error.reason) == ("to.3", "must be a string")
    assert str(error) == "to.3: must be a string"
    assert isinstance(error, ValueError)


def test_nul_is_found_in_strings_keys_and_nested_values() -> None:
    for value in ["a\x00", {"k\x00": 1}, {"k": ["x", {"y": "\x00"}]}, ["\x00"]]:
        assert has_nul(value), value
        with pytest.raises(ValueError, match="NUL"):
            refuse_nul(value)
    for value in ["a", {"k": [1, None, True]}, 3, None]:
        assert not has_nul(value) and refuse_nul(value) is value
    assert "\\u0000" in NUL_REASON


def test_non_finite_numbers_are_found_however_deep_and_refused() -> None:
    # A whole number beyond a double's range is one too: JSON readers that
    # hold numbers as doubles (JavaScript's) read it as Infinity.
    for value in [math.nan, {"k": [1, {"y": math.inf}]}, [-math.inf], 10**400, [-(10**309)]]:
        assert has_non_finite(value), value
        with pytest.raises(ValueError, match="finite"):
            refuse_unstorable(value)
    # The largest whole number a double rounds to a finite one is still one.
    below = int(sys.float_info.max) + 2**969
    for value in [1.5, {"k": [1, None, "NaN"]}, 10**308, below, True, None]:
        assert not has_non_finite(value) and refuse_unstorable(value) is value
    with pytest.raises(ValueError, match="NUL"):
        refuse_unstorable({"k": "\x00"})


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "[1e400]", "-1E999",
                                  "[1" + "0" * 400 + "]"])
def test_strict_json_refuses_what_json_has_not(text: str) -> None:
    with pytest.raises(ValueError):
        strict_json(text)
    assert strict_json('{"a": [1.5, 1e308, 100000000000000000000000]}')["a"][1] == 1e308
