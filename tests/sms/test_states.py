"""The forward-only state machine of SMS messages."""

from __future__ import annotations

import itertools

import pytest

from tidings.sms_states import FINAL, SMS_STATUSES, may_move, moves

FORWARD = ["queued", "processing", "submitted", "sent"]


def test_the_happy_path_moves_forward() -> None:
    assert moves("queued", ["processing", "submitted", "sent", "delivered"]) == [
        "processing", "submitted", "sent", "delivered",
    ]


@pytest.mark.parametrize(("earlier", "later"), itertools.combinations(FORWARD, 2))
def test_never_backwards(earlier: str, later: str) -> None:
    assert may_move(earlier, later)
    assert not may_move(later, earlier)


@pytest.mark.parametrize(
    ("final", "other"), itertools.product(sorted(FINAL), SMS_STATUSES)
)
def test_nothing_leaves_a_final_status(final: str, other: str) -> None:
    assert not may_move(final, other)


@pytest.mark.parametrize("status", SMS_STATUSES)
def test_a_repeat_is_not_a_move(status: str) -> None:
    assert not may_move(status, status)


def test_any_open_status_may_end_or_become_unknown() -> None:
    for current in [*FORWARD, "unknown"]:
        for final in FINAL:
            assert may_move(current, final)
    for current in FORWARD:
        assert may_move(current, "unknown")


def test_after_unknown_only_what_the_provider_can_report() -> None:
    assert may_move("unknown", "submitted")
    assert may_move("unknown", "sent")
    assert not may_move("unknown", "queued")
    assert not may_move("unknown", "processing")


def test_unknown_does_not_take_a_message_back() -> None:
    # Only past the furthest status reached before unknown.
    assert not may_move("unknown", "submitted", reached="sent")
    assert not may_move("unknown", "sent", reached="sent")
    assert may_move("unknown", "sent", reached="submitted")
    assert may_move("unknown", "delivered", reached="sent")
    assert moves("sent", ["unknown", "submitted", "unknown", "sent", "delivered"]) == [
        "unknown", "delivered",
    ]
    assert moves("queued", ["unknown", "submitted", "unknown", "submitted", "sent"]) == [
        "unknown", "submitted", "unknown", "sent",
    ]


def test_late_and_repeated_reports_are_ignored() -> None:
    assert moves("sent", ["submitted", "sent", "delivered", "sent", "failed"]) == ["delivered"]
    assert moves("delivered", ["undelivered"]) == []
    assert set(SMS_STATUSES) == {*FORWARD, "unknown", *FINAL}
    assert len(SMS_STATUSES) == 11
