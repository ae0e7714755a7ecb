"""Team quotas: limits on emails and SMS per UTC day and per UTC month.

A send claims its messages with ``claim`` inside the transaction that
records the send: one statement checks both limits and counts the messages
under the row lock of the team's counter, so concurrent sends, in one
process or several, never count past a limit, and a rolled-back send gives
its claim back. Hold the lock briefly: claim as the last statement before
the commit. Limits come from the team's own values (``tidings quotas set``)
or else the settings' defaults (``QuotaDefaults``); 0 means unlimited.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.storage.db import Connection

Channel = Literal["email", "sms"]
Period = Literal["day", "month"]
CHANNELS: tuple[Channel, ...] = ("email", "sms")
PERIODS: tuple[Period, ...] = ("day", "month")
NOUNS = {"email": ("email", "emails"), "sms": ("SMS", "SMS")}

# $1 team, $2 channel, $3 count, $4 the UTC day, $5 the first day of the UTC
# month, $6/$7 the default limits per day/month. The insert runs when the
# team has no counter yet and the count fits the defaults; otherwise the
# conflict path counts, guarded by the limits on the locked, latest row. A
# caller whose clock is behind counts into the newer period already stored.
CLAIM = """
WITH given AS (
    SELECT $1::uuid AS team_id, $2::text AS channel, $3::bigint AS n,
           $4::date AS day, $5::date AS month, $6::bigint AS per_day, $7::bigint AS per_month
)
INSERT INTO team_quotas AS q (team_id, channel, day, day_used, month, month_used)
SELECT team_id, channel, day, n, month, n FROM given
WHERE EXISTS (SELECT 1 FROM team_quotas t WHERE t.team_id = $1 AND t.channel = $2)
   OR ((per_day = 0 OR n <= per_day) AND (per_month = 0 OR n <= per_month))
ON CONFLICT (team_id, channel) DO UPDATE SET
    day = GREATEST(q.day, EXCLUDED.day),
    day_used = CASE WHEN q.day >= EXCLUDED.day THEN q.day_used ELSE 0 END + EXCLUDED.day_used,
    month = GREATEST(q.month, EXCLUDED.month),
    month_used = CASE WHEN q.month >= EXCLUDED.month THEN q.month_used ELSE 0 END
                 + EXCLUDED.month_used
WHERE (COALESCE(q.per_day, $6) = 0
       OR CASE WHEN q.day >= EXCLUDED.day THEN q.day_used ELSE 0 END + EXCLUDED.day_used
          <= COALESCE(q.per_day, $6))
  AND (COALESCE(q.per_month, $7) = 0
       OR CASE WHEN q.month >= EXCLUDED.month THEN q.month_used ELSE 0 END
          + EXCLUDED.month_used <= COALESCE(q.per_month, $7))
RETURNING day_used, month_used
"""

SELECT_QUOTAS = """
SELECT channel, per_day, per_month, day, day_used, month, month_used
FROM team_quotas WHERE team_id = $1 AND ($2::text IS NULL OR channel = $2)
"""

# $2 channels; per channel: $3 whether to set per_day, $4 its value, $5/$6 the
# same for per_month. A value of NULL goes back to the default.
SET_LIMITS = """
WITH given AS (
    SELECT * FROM unnest($2::text[], $3::bool[], $4::bigint[], $5::bool[], $6::bigint[])
        AS g(channel, set_day, per_day, set_month, per_month)
)
INSERT INTO team_quotas AS q (team_id, channel, per_day, per_month)
SELECT $1, channel, per_day, per_month FROM given
ON CONFLICT (team_id, channel) DO UPDATE SET
    per_day = CASE WHEN (SELECT set_day FROM given WHERE channel = EXCLUDED.channel)
                   THEN EXCLUDED.per_day ELSE q.per_day END,
    per_month = CASE WHEN (SELECT set_month FROM given WHERE channel = EXCLUDED.channel)
                     THEN EXCLUDED.per_month ELSE q.per_month END
"""

SELECT_TEAM = "SELECT id FROM teams WHERE name = $1"


def period_start(period: Period, now: datetime) -> date:
    """The first UTC day of the ``period`` that ``now`` falls in."""
    today = now.astimezone(UTC).date()
    return today if period == "day" else today.replace(day=1)


def resets_at(period: Period, now: datetime) -> datetime:
    """When the ``period`` that ``now`` falls in ends: the next UTC midnight, or
    the first UTC midnight of the next month."""
    start = period_start(period, now)
    if period == "day":
        following = start + timedelta(days=1)
    else:
        following = (start + timedelta(days=32)).replace(day=1)
    return datetime.combine(following, time(), UTC)


class QuotaExceeded(Exception):
    """A claim that would pass a quota; nothing was counted. The HTTP layer
    answers it with 402 PAYMENT_REQUIRED."""

    def __init__(
        self,
        channel: Channel,
        period: Period,
        limit: int,
        used: int,
        requested: int,
        resets_at: datetime,
        now: datetime,
    ) -> None:
        self.channel = channel
        self.period = period
        self.limit = limit
        self.used = used
        self.requested = requested
        self.resets_at = resets_at
        # Seconds until the claim could succeed; None when it never can.
        self.retry_after: int | None = (
            None if requested > limit else max(1, math.ceil((resets_at - now).total_seconds()))
        )
        # The quota's name, as ``tidings quotas`` and the settings call it.
        self.quota = f"{'emails' if channel == 'email' else 'sms'}_per_{period}"
        one, many = NOUNS[channel]
        quota = f"the team's quota of {limit} {one if limit == 1 else many} per {period}"
        reset = resets_at.isoformat().replace("+00:00", "Z")
        if requested > limit:
            message = f"{requested} {many} are more than {quota} allows; it resets at {reset}"
        else:
            message = (
                f"{quota} is used up ({used} used, {requested} requested); it resets at {reset}"
            )
        super().__init__(message)
        self.message = str(self)


@dataclass(frozen=True)
class Usage:
    """What the current day and month of a channel have used, after a claim."""

    day_used: int
    month_used: int


@dataclass(frozen=True)
class QuotaStatus:
    """One quota of a team as ``tidings quotas show`` prints it."""

    channel: Channel
    period: Period
    # None: unlimited.
    limit: int | None
    # True when the limit is the setting's default, not the team's own.
    default: bool
    used: int
    resets_at: datetime


@dataclass(frozen=True)
class LimitChange:
    """A new limit for one quota of a team; ``limit`` None goes back to the default."""

    channel: Channel
    period: Period
    limit: int | None


def _used(stored_period: date | None, used: int, current: date) -> int:
    return used if stored_period is not None and stored_period >= current else 0


async def claim(
    conn: Connection,
    team_id: UUID,
    channel: Channel,
    count: int,
    defaults: QuotaDefaults,
    *,
    now: datetime | None = None,
) -> Usage:
    """Count ``count`` messages of ``channel`` against the team's quotas, all or none.

    Raises QuotaExceeded, counting nothing, when that would pass the daily or
    the monthly limit. Call it inside the send's transaction: the count is
    given back if that transaction rolls back, and concurrent claims wait for
    it on the counter's row lock.
    """
    if count < 0:
        raise ValueError(f"cannot claim {count} messages")
    now = now or datetime.now(UTC)
    day, month = period_start("day", now), period_start("month", now)
    per_day, per_month = defaults.for_channel(channel)
    if count == 0:
        return Usage(0, 0)
    row = await conn.fetchrow(CLAIM, team_id, channel, count, day, month, per_day, per_month)
    if row is not None:
        return Usage(row["day_used"], row["month_used"])
    raise await _refusal(conn, team_id, channel, count, defaults, now)


async def _refusal(
    conn: Connection,
    team_id: UUID,
    channel: Channel,
    count: int,
    defaults: QuotaDefaults,
    now: datetime,
) -> QuotaExceeded:
    """Which quota refused a claim: the monthly one if it does (the daily reset
    would not help), else the daily one."""
    statuses = {s.period: s for s in await quota_status(conn, team_id, defaults, now, channel)}
    chosen = statuses["day"]
    month = statuses["month"]
    if month.limit is not None and month.used + count > month.limit:
        chosen = month
    elif chosen.limit is None:
        chosen = month
    limit = chosen.limit if chosen.limit is not None else 0
    return QuotaExceeded(channel, chosen.period, limit, chosen.used, count, chosen.resets_at, now)


async def quota_status(
    conn: Connection,
    team_id: UUID,
    defaults: QuotaDefaults,
    now: datetime | None = None,
    channel: Channel | None = None,
) -> list[QuotaStatus]:
    """The team's quotas (of one channel, or of both), their use and resets."""
    now = now or datetime.now(UTC)
    rows = {row["channel"]: row for row in await conn.fetch(SELECT_QUOTAS, team_id, channel)}
    statuses = []
    for name in CHANNELS if channel is None else (channel,):
        row = rows.get(name)
        for period, default in zip(PERIODS, defaults.for_channel(name), strict=True):
            own = None if row is None else row[f"per_{period}"]
            limit = default if own is None else own
            current = period_start(period, now)
            used = 0 if row is None else _used(row[period], row[f"{period}_used"], current)
            statuses.append(
                QuotaStatus(
                    channel=name,
                    period=period,
                    limit=limit or None,
                    default=own is None,
                    used=used,
                    resets_at=resets_at(period, now),
                )
            )
    return statuses


async def set_limits(conn: Connection, team_id: UUID, changes: Sequence[LimitChange]) -> None:
    """Set (or reset to the default) some of the team's limits, in one statement."""
    by_channel: dict[Channel, dict[Period, int | None]] = {}
    for change in changes:
        if change.limit is not None and change.limit < 0:
            raise ValueError(f"a limit cannot be negative: {change.limit}")
        by_channel.setdefault(change.channel, {})[change.period] = change.limit
    channels = list(by_channel)
    if not channels:
        return
    await conn.execute(
        SET_LIMITS,
        team_id,
        channels,
        ["day" in by_channel[c] for c in channels],
        [by_channel[c].get("day") for c in channels],
        ["month" in by_channel[c] for c in channels],
        [by_channel[c].get("month") for c in channels],
    )


async def team_by_name(conn: Connection, name: str) -> UUID | None:
    team_id: UUID | None = await conn.fetchval(SELECT_TEAM, name)
    return team_id
