"""The stripes of the team quota counters: the statements of ``tidings.storage.quotas``.

Each team and channel counts on ``STRIPES`` rows (migration 0013). The fast
path is one statement that counts on one stripe whose allowance has room,
picked at random among those no other transaction holds; its parts are
shared with the statements that accept a send and claim its quota at once.
The slow path locks every stripe, sums, checks and shares the room under
each limit out again (``allowances``).
"""

from __future__ import annotations

# Counter rows per team and channel: more than the claims one team usually
# has in flight at once (a process's pool is 10 connections by default).
STRIPES = 16

# The fast path's parts, shared with the statements that accept a send and
# claim its quota at once (``tidings.storage.sms``, ``emails``). Parameters:
# {team}, {channel}, {n} the count, {day} the UTC day, {month} the first day
# of the UTC month, {per_day}/{per_month} the default limits.
FAST_LIMITS = """
quota_limits AS (
    SELECT COALESCE((SELECT per_day FROM team_quotas
                     WHERE team_id = {team} AND channel = {channel}), {per_day}) AS per_day,
           COALESCE((SELECT per_month FROM team_quotas
                     WHERE team_id = {team} AND channel = {channel}), {per_month}) AS per_month
)"""
# A stripe may take the claim: each limited period's allowance was shared for
# this limit, in this period (or a later one: a caller whose clock is behind
# counts into the newer period), and has room for it.
FITS = """
(l.per_day = 0 OR (s.day >= {day} AND s.day_limit = l.per_day
                   AND s.day_used + {n} <= s.day_allowed))
AND (l.per_month = 0 OR (s.month >= {month} AND s.month_limit = l.per_month
                         AND s.month_used + {n} <= s.month_allowed))"""
FAST_COUNT = """
quota_pick AS (
    SELECT s.stripe FROM team_quota_stripes s, quota_limits l
    WHERE s.team_id = {team} AND s.channel = {channel} AND {fits}{ready}
    ORDER BY random() LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
), quota_counted AS (
    UPDATE team_quota_stripes s SET
        day = GREATEST(s.day, {day}),
        day_used = CASE WHEN s.day >= {day} THEN s.day_used ELSE 0 END + {n},
        month = GREATEST(s.month, {month}),
        month_used = CASE WHEN s.month >= {month} THEN s.month_used ELSE 0 END + {n}
    FROM quota_pick p, quota_limits l
    WHERE s.team_id = {team} AND s.channel = {channel} AND s.stripe = p.stripe AND {fits}
    RETURNING s.stripe, s.day, s.day_used, s.month, s.month_used
)"""
# What the team has used, this claim included: the counted stripe plus the
# others of the same period (as the statement's snapshot sees them).
FAST_USAGE = """
SELECT c.day_used + COALESCE((SELECT sum(o.day_used) FROM team_quota_stripes o
                              WHERE o.team_id = {team} AND o.channel = {channel}
                                AND o.stripe <> c.stripe AND o.day = c.day), 0) AS day_used,
       c.month_used + COALESCE((SELECT sum(o.month_used) FROM team_quota_stripes o
                                WHERE o.team_id = {team} AND o.channel = {channel}
                                  AND o.stripe <> c.stripe AND o.month = c.month), 0)
           AS month_used
FROM quota_counted c"""


def fast_claim_sql(*, ready: str = "", **params: str) -> tuple[str, str]:
    """The fast path's CTEs (``quota_limits``, ``quota_pick``, ``quota_counted``)
    and the SELECT of the usage after it, for the given parameter references.
    ``ready`` adds a condition to the pick (a send that is refused claims
    nothing)."""
    fits = FITS.format(**params)
    ctes = FAST_LIMITS.format(**params) + ", " + FAST_COUNT.format(
        fits=fits, ready=ready, **params
    )
    return ctes, FAST_USAGE.format(**params)


_PARAMS = {"team": "$1::uuid", "channel": "$2::text", "n": "$3::bigint", "day": "$4::date",
           "month": "$5::date", "per_day": "$6::bigint", "per_month": "$7::bigint"}
# The fast path alone. $1 team, $2 channel, $3 count, $4 the UTC day, $5 the
# first day of the UTC month, $6/$7 the default limits per day/month.
CLAIM_UNLOCKED = "WITH {} {}".format(*fast_claim_sql(**_PARAMS))

# The slow path: every stripe, locked in one order (so two slow paths never
# deadlock), with the team's own limits.
LOCK_STRIPES = """
SELECT s.stripe, s.day, s.day_used, s.month, s.month_used, q.per_day, q.per_month
FROM team_quota_stripes s
LEFT JOIN team_quotas q ON q.team_id = s.team_id AND q.channel = s.channel
WHERE s.team_id = $1 AND s.channel = $2
ORDER BY s.stripe
FOR UPDATE OF s
"""
ADD_STRIPES = """
INSERT INTO team_quota_stripes (team_id, channel, stripe, day, month)
SELECT $1, $2, g, $4, $5 FROM generate_series(0, $3 - 1) AS g
ON CONFLICT DO NOTHING
"""
# $3/$4 the day and its limit, $5/$6 the month and its limit; per stripe ($7):
# used and allowed of the day ($8, $9) and of the month ($10, $11).
SHARE_OUT = """
UPDATE team_quota_stripes s SET
    day = $3, day_used = v.day_used, day_limit = $4, day_allowed = v.day_allowed,
    month = $5, month_used = v.month_used, month_limit = $6, month_allowed = v.month_allowed
FROM unnest($7::smallint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[])
    AS v(stripe, day_used, day_allowed, month_used, month_allowed)
WHERE s.team_id = $1 AND s.channel = $2 AND s.stripe = v.stripe
"""


def allowances(used: list[int], limit: int) -> list[int]:
    """What each stripe may count up to: its use plus an even share of the room
    left under ``limit`` (0: unlimited, no allowance needed)."""
    if not limit:
        return [0] * len(used)
    share, extra = divmod(limit - sum(used), len(used))
    return [u + share + (1 if index < extra else 0) for index, u in enumerate(used)]
