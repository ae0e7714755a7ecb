"""The states of an SMS message and the moves between them (CONTRACT §8).

Statuses move only forward: queued → processing → submitted → sent, then
one final status: delivered, undelivered, failed, expired, rejected or
canceled. ``unknown`` (the provider could not say) may come at any point
before a final status, and anything from submitted on may follow it. A move
backwards, a repeat, or a move out of a final status is not a move: it is
ignored, because providers report out of order (a late ``sent`` after
``delivered``) and more than once.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidings.providers.sms import SMS_STATUSES, SmsStatus

__all__ = ["FINAL", "SMS_STATUSES", "may_move", "moves"]

FINAL: frozenset[str] = frozenset(
    {"delivered", "undelivered", "failed", "expired", "rejected", "canceled"}
)
_RANK = {"queued": 0, "processing": 1, "submitted": 2, "sent": 3}


def may_move(current: str, new: str) -> bool:
    """Whether a message in ``current`` moves to ``new``."""
    if current in FINAL or new == current:
        return False
    if new in FINAL or new == "unknown":
        return True
    if current == "unknown":
        return _RANK[new] >= _RANK["submitted"]
    return _RANK[new] > _RANK[current]


def moves(current: str, reported: Iterable[SmsStatus]) -> list[SmsStatus]:
    """Of the statuses reported in order, those that are moves, starting at ``current``."""
    taken: list[SmsStatus] = []
    for status in reported:
        if may_move(current, status):
            taken.append(status)
            current = status
    return taken
