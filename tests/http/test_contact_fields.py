"""The field checks shared by POST/PATCH /contacts and the import.

Addresses and phone numbers are tested in tests/test_addresses.py and
tests/test_phones.py."""

from __future__ import annotations

import pytest

from tidings.fields import FieldError
from tidings.http.contact_fields import check_properties, normalize_email, property_from_text


def test_property_values_are_checked_against_their_type() -> None:
    known = {"plan": "string", "seats": "number", "vip": "boolean", "renews": "date"}
    values = {"plan": "pro", "seats": 3.5, "vip": False, "renews": "2027-02-28", "old": None}
    with pytest.raises(FieldError, match="^properties.old: no contact property"):
        check_properties(values, known)  # type: ignore[arg-type]
    del values["old"]
    values["plan"] = None
    to_set, removed = check_properties(values, known)  # type: ignore[arg-type]
    assert to_set == {"seats": 3.5, "vip": False, "renews": "2027-02-28"}
    assert removed == ["plan"]
    wrong = [
        ("seats", "3"), ("seats", True), ("seats", float("nan")), ("vip", 1), ("vip", "true"),
        ("plan", 5), ("renews", "2027-02-30"), ("renews", "28/02/2027"), ("renews", 20270228),
    ]
    for key, value in wrong:
        with pytest.raises(FieldError, match=f"^properties.{key}: must be"):
            check_properties({key: value}, known)  # type: ignore[arg-type]


def test_csv_cells_become_typed_property_values() -> None:
    assert property_from_text("number", "42", "p") == 42
    assert property_from_text("number", "-1.5", "p") == -1.5
    assert property_from_text("boolean", "Yes", "p") is True
    assert property_from_text("boolean", "0", "p") is False
    assert property_from_text("date", "2026-01-31", "p") == "2026-01-31"
    assert property_from_text("string", "007", "p") == "007"
    assert property_from_text("number", "1e3", "p") == 1000.0
    assert property_from_text("number", " .5 ", "p") == 0.5
    # Beyond what Python's int() reads (4,300 digits): leading zeros go first.
    assert property_from_text("number", "-" + "0" * 5000 + "7", "p") == -7
    for text in ("1" * 5000, "-" + "9" * 400, "9" * 310):
        with pytest.raises(FieldError, match="^p: must be a finite number"):
            property_from_text("number", text, "p")
    # Decimal notation in ASCII only: not what else Python's int() and float() read.
    for kind, text in [("number", "ten"), ("number", "inf"), ("number", "nan"),
                       ("number", "1_000"), ("number", "١٢"), ("number", "0x10"),
                       ("boolean", "maybe"), ("date", "2026-13-01")]:
        with pytest.raises(FieldError, match="^p: must be"):
            property_from_text(kind, text, "p")  # type: ignore[arg-type]


def test_the_email_type_reports_the_reason_without_a_prefix() -> None:
    with pytest.raises(ValueError, match="^value is not a valid email address: "):
        normalize_email("ada.example.com")
