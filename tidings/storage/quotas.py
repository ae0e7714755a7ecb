"""Team quotas: limits on emails and SMS per UTC day and per UTC month.

A send claims its messages with ``claim`` inside the transaction that
records the send, so a rolled-back send gives its claim back. The counters
of a team and channel are ``STRIPES`` rows (stripes) that count apart, so
that concurrent sends of one team do not wait for each other's commit: what
the team used is their sum (migration 0013).

Limits stay exact, in one process or several. Each stripe may count only up
to its allowance, and the allowances of a period add up to at most the
limit. A claim counts on one stripe whose allowance fits it, picked at
random among those no other transaction holds (the fast path, one
statement); when none fits, it locks every stripe of the team and channel,
sums them, checks the limits and shares what is left out again as new
allowances (the slow path). So a team far from its limits claims on the
fast path, a team near them falls back to one-at-a-time claims, and an
unlimited quota only counts. Limits come from the team's own values
(``tidings quotas set``) or else the settings' defaults (``QuotaDefaults``);
0 means unlimited.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Literal
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.storage.db import Connection, Row
from tidings.storage.quota_stripes import (
    ADD_STRIPES,
    CLAIM_UNLOCKED,
    LOCK_STRIPES,
    SHARE_OUT,
    STRIPES,
    allowances,
)

Channel = Literal["email", "sms"]
Period = Literal["day", "month"]
CHANNELS: tuple[Channel, ...] = ("email", "sms")
PERIODS: tuple[Period, ...] = ("day", "month")
NOUNS = {"email": ("email", "emails"), "sms": ("SMS", "SMS")}

SELECT_QUOTAS = """
SELECT channel, per_day, per_month FROM team_quotas
WHERE team_id = $1 AND ($2::text IS NULL OR channel = $2)
"""
SELECT_STRIPES = """
SELECT channel, day, day_used, month, month_used FROM team_quota_stripes
WHERE team_id = $1 AND ($2::text IS NULL OR channel = $2)
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
    """What the current day and month of a channel have used, after a claim, as
    the claim saw it: exact on the slow path; on the fast path, claims of other
    transactions not yet committed are not in it."""

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


def claim_args(
    team_id: UUID, channel: Channel, count: int, defaults: QuotaDefaults, now: datetime
) -> list[object]:
    """The parameters of ``CLAIM_UNLOCKED``, in order ($1..$7)."""
    per_day, per_month = defaults.for_channel(channel)
    return [team_id, channel, count, period_start("day", now), period_start("month", now),
            per_day, per_month]


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
    given back if that transaction rolls back. The stripe it counted on stays
    locked until then; other sends of the team count on other stripes.
    """
    if count < 0:
        raise ValueError(f"cannot claim {count} messages")
    now = now or datetime.now(UTC)
    if count == 0:
        return Usage(0, 0)
    args = claim_args(team_id, channel, count, defaults, now)
    # A stripe with room that no one holds. Never a wait for one that is held:
    # a statement waiting for one stripe may hold another it found used up,
    # which a slow path may be waiting for.
    row = await fast_attempt(conn, CLAIM_UNLOCKED, args, lambda row: row is not None)
    if row is not None:
        return Usage(row["day_used"], row["month_used"])
    return await claim_slowly(conn, team_id, channel, count, defaults, now)


class _Undo(Exception):
    pass


async def fast_attempt(
    conn: Connection, statement: str, args: Sequence[object], counted: Callable[[Row | None], bool]
) -> Row | None:
    """Run a statement that holds the quota's fast path and return its row.

    A stripe can be left locked by a statement that did not count on it: it
    had room when the statement began, and none once its holder committed.
    A claim that goes on to the slow path must not hold it (two slow paths
    could then wait for each other), so inside a transaction a statement
    that did not count (``counted`` false) is rolled back to a savepoint.
    Outside one, its locks end with it.
    """
    if not conn.is_in_transaction():
        return await conn.fetchrow(statement, *args)
    row = None
    try:
        async with conn.transaction():
            row = await conn.fetchrow(statement, *args)
            if not counted(row):
                raise _Undo
    except _Undo:
        pass
    return row


async def claim_slowly(
    conn: Connection,
    team_id: UUID,
    channel: Channel,
    count: int,
    defaults: QuotaDefaults,
    now: datetime,
) -> Usage:
    """The slow path of ``claim``: lock every stripe, sum, check, count on one
    and share the room left under each limit out as the stripes' allowances.
    Inside the caller's transaction."""
    day, month = period_start("day", now), period_start("month", now)
    rows = await conn.fetch(LOCK_STRIPES, team_id, channel)
    if len(rows) < STRIPES:
        await conn.execute(ADD_STRIPES, team_id, channel, STRIPES, day, month)
        rows = await conn.fetch(LOCK_STRIPES, team_id, channel)
    default_day, default_month = defaults.for_channel(channel)
    own_day, own_month = rows[0]["per_day"], rows[0]["per_month"]
    per_day = default_day if own_day is None else own_day
    per_month = default_month if own_month is None else own_month
    # A caller whose clock is behind counts into the newer period already stored.
    day = max([day, *(row["day"] for row in rows)])
    month = max([month, *(row["month"] for row in rows)])
    day_used = [row["day_used"] if row["day"] == day else 0 for row in rows]
    month_used = [row["month_used"] if row["month"] == month else 0 for row in rows]
    used_day, used_month = sum(day_used), sum(month_used)
    month_blocks = bool(per_month) and used_month + count > per_month
    if month_blocks or (per_day and used_day + count > per_day):
        # The monthly quota if it blocks (the daily reset would not help).
        period: Period = "month" if month_blocks else "day"
        limit, used = (per_month, used_month) if month_blocks else (per_day, used_day)
        raise QuotaExceeded(channel, period, limit, used, count, resets_at(period, now), now)
    day_used[0] += count
    month_used[0] += count
    await conn.execute(
        SHARE_OUT, team_id, channel, day, per_day, month, per_month,
        [row["stripe"] for row in rows],
        day_used, allowances(day_used, per_day), month_used, allowances(month_used, per_month),
    )
    return Usage(used_day + count, used_month + count)


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
    stripes = await conn.fetch(SELECT_STRIPES, team_id, channel)
    statuses = []
    for name in CHANNELS if channel is None else (channel,):
        row = rows.get(name)
        for period, default in zip(PERIODS, defaults.for_channel(name), strict=True):
            own = None if row is None else row[f"per_{period}"]
            limit = default if own is None else own
            counted = [(s[period], s[f"{period}_used"]) for s in stripes if s["channel"] == name]
            current = max([period_start(period, now), *(stored for stored, _ in counted)])
            statuses.append(
                QuotaStatus(
                    channel=name,
                    period=period,
                    limit=limit or None,
                    default=own is None,
                    used=sum(used for stored, used in counted if stored == current),
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
