"""The token bucket of ``tidings.http.ratelimit`` over time, on a clock the
test moves."""

from __future__ import annotations

from uuid import uuid4

import pytest

from tidings.http import ratelimit
from tidings.http.envelope import ApiError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def allowed(limiter: ratelimit.RateLimiter, key: object, requests: int) -> int:
    passed = 0
    for _ in range(requests):
        try:
            limiter.check(key)  # type: ignore[arg-type]
            passed += 1
        except ApiError as refused:
            assert refused.status == 429
    return passed


def test_a_slow_rate_is_kept_across_the_forgetting_of_idle_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(ratelimit.time, "monotonic", clock)
    # 20 at once, then one every 50 s: a bucket takes 1,000 s to refill.
    limiter = ratelimit.RateLimiter(per_second=0.02, burst=20)
    slow, other = uuid4(), uuid4()
    assert allowed(limiter, slow, 22) == 20
    clock.now += 302  # past FORGET_AFTER_SECONDS: another token's request prunes
    assert allowed(limiter, other, 1) == 1
    # 302 s at 0.02/s refilled 6 requests, not the whole burst of 20.
    assert allowed(limiter, slow, 22) == 6


def test_buckets_that_filled_up_again_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(ratelimit.time, "monotonic", clock)
    limiter = ratelimit.RateLimiter(per_second=100, burst=200)
    tokens = [uuid4() for _ in range(50)]
    for token in tokens:
        assert allowed(limiter, token, 3) == 3
    clock.now += ratelimit.FORGET_AFTER_SECONDS + 1
    assert allowed(limiter, uuid4(), 1) == 1
    assert len(limiter._buckets) == 1  # the 50 idle ones are gone
