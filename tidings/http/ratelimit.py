"""The per-token rate limit: a token bucket per credential, in process memory.

Each process keeps its own buckets, so N processes on one database allow up
to N times the configured rate to one token.

And the bound on one team's requests whose body is still arriving
(``UploadLimit``): a body that trickles in holds a place among the requests
in flight until it is whole or the body timeout ends it, so without a bound
one team's slow (or stalled) uploads could take every place and have every
other team's requests shed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from tidings.http.envelope import ApiError

# How often buckets that have filled up again are forgotten (a forgotten
# bucket starts full: the same as one that refilled).
FORGET_AFTER_SECONDS = 300.0


# What a team told to wait for one of its uploads in flight is told to wait.
UPLOAD_RETRY_SECONDS = 1
# Requests that carry no token and read a body (the providers' callbacks,
# the MTA's reports) count as one team: slow bodies sent to them take at
# most that team's share of the places, as any one team's do.
NO_TOKEN = UUID(int=0)


class UploadLimit:
    """At most ``per_team`` requests of one team receive their body at once in
    this process; one more is answered 429 before its body is read."""

    def __init__(self, per_team: int) -> None:
        self.per_team = per_team
        self._receiving: dict[UUID, int] = {}

    def count(self, team_id: UUID) -> int:
        """The team's requests receiving their body now."""
        return self._receiving.get(team_id, 0)

    @contextmanager
    def receiving(self, team_id: UUID) -> Iterator[None]:
        count = self._receiving.get(team_id, 0)
        if count >= self.per_team:
            raise ApiError(
                429,
                "TOO_MANY_REQUESTS",
                f"{self.per_team} requests "
                f"{'without a token' if team_id == NO_TOKEN else 'of this team'} "
                "are sending their bodies already; "
                f"retry after {UPLOAD_RETRY_SECONDS} s",
                headers={"Retry-After": str(UPLOAD_RETRY_SECONDS)},
            )
        self._receiving[team_id] = count + 1
        try:
            yield
        finally:
            left = self._receiving[team_id] - 1
            if left:
                self._receiving[team_id] = left
            else:
                del self._receiving[team_id]


class RateLimiter:
    def __init__(self, per_second: float, burst: int, uploads_per_team: int = 32) -> None:
        self.per_second = per_second
        self.burst = burst
        self.uploads = UploadLimit(uploads_per_team)
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
        # Only a bucket that would be full by now: one forgotten while it
        # still refills would start full, above what the token is owed.
        burst, rate = float(self.burst), self.per_second
        stale = [k for k, (level, seen) in self._buckets.items()
                 if level + (now - seen) * rate >= burst]
        for key in stale:
            del self._buckets[key]
