"""The field error and the NUL check every request goes through."""

from __future__ import annotations

import pytest

from tidings.fields import NUL_REASON, FieldError, has_nul, refuse_nul


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
