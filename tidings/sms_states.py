"""The states of an SMS message and the moves between them (CONTRACT §8).

Statuses move only forward: queued → processing → submitted → sent, then
one final status: delivered, undelivered, failed, expired, rejected or
canceled. ``unknown`` (the provider could not say) may come at any point
before a final status; what follows it must be submitted or later, and past
the furthest status the message had reached before it (``reached``), so
that ``sent``, ``unknown``, ``submitted`` does not take a message back. A
move backwards, a repeat, or a move out of a final status is not a move: it
is ignored, because providers report out of order (a late ``sent`` after
``delivered``) and more than once.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidings.providers.sms import SMS_STATUSES, SmsStatus

__all__ = ["FINAL", "SMS_STATUSES", "furthest", "may_move", "moves"]

FINAL: frozenset[str] = frozenset(
    {"delivered", "undelivered", "failed", "expired", "rejected", "canceled"}
)
_RANK = {"queued": 0, "processing": 1, "submitted": 2, "sent": 3}


def furthest(statuses: Iterable[str]) -> str | None:
    """The furthest of queued, processing, submitted and sent among ``statuses``."""
    ranked = [status for status in statuses if status in _RANK]
    return max(ranked, key=_RANK.__getitem__) if ranked else None


def may_move(current: str, new: str, reached: str | None = None) -> bool:
    """Whether a message in ``current`` moves to ``new``; ``reached`` is the
    furthest of queued to sent it has been in (``current`` itself, unless
    that is ``unknown``)."""
    if current in FINAL or new == current:
        return False
    if new in FINAL or new == "unknown":
        return True
    if current == "unknown":
        before = _RANK[reached] if reached in _RANK else -1
        return _RANK[new] >= _RANK["submitted"] and _RANK[new] > before
    return _RANK[new] > _RANK[current]


def moves(
    current: str, reported: Iterable[SmsStatus], reached: str | None = None
) -> list[SmsStatus]:
    """Of the statuses reported in order, those that are moves, starting at
    ``current`` (with ``reached`` as ``may_move`` takes it)."""
    taken: list[SmsStatus] = []
    reached = furthest([current, reached or current])
    for status in reported:
        if may_move(current, status, reached):
            taken.append(status)
            current = status
            reached = furthest([status, reached or status])
    return taken
