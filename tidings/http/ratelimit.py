"""The per-token rate limit: a token bucket per credential, in process memory.

Each process keeps its own buckets, so N processes on one database allow up
to N times the configured rate to one token.
"""

from __future__ import annotations

import math
import time
from uuid import UUID

from tidings.http.envelope import ApiError

# Buckets of tokens not seen for this long are forgotten.
FORGET_AFTER_SECONDS = 300.0


class RateLimiter:
    def __init__(self, per_second: float, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._buckets: dict[UUID, tuple[float, float]] = {}
        self._last_prune = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self.per_second > 0

    def check(self, key: UUID) -> None:
        """Take one request from the bucket of ``key``, or raise 429."""
        if not self.enabled:
            return
        now = time.monotonic()
        level, seen = self._buckets.get(key, (float(self.burst), now))
        level = min(float(self.burst), level + (now - seen) * self.per_second)
        if level < 1.0:
            self._buckets[key] = (level, now)
            retry_after = max(1, math.ceil((1.0 - level) / self.per_second))
            raise ApiError(
                429,
                "TOO_MANY_REQUESTS",
                f"rate limit of {self.per_second:g} requests per second exceeded; "
                f"retry after {retry_after} s",
                headers={"Retry-After": str(retry_after)},
            )
        self._buckets[key] = (level - 1.0, now)
        if now - self._last_prune > FORGET_AFTER_SECONDS:
            self._prune(now)

    def _prune(self, now: float) -> None:
        self._last_prune = now
        stale = [k for k, (_, seen) in self._buckets.items() if now - seen > FORGET_AFTER_SECONDS]
        for key in stale:
            del self._buckets[key]
