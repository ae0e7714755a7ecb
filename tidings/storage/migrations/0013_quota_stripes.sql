-- Team quota counters in stripes. One counter row per team and channel made
-- every send of a team wait for the row lock of the send before it until that
-- one committed. Now each team and channel has up to 16 stripes (rows) that
-- count apart: a send counts on one unlocked stripe, so sends of one team
-- commit side by side. What the team used is the sum of its stripes.
--
-- A limit stays exact: each stripe may count only up to its `*_allowed`,
-- and the allowances of a period add up to at most its limit (they were
-- shared out, for the limit in `*_limit`, by a claim that locked every
-- stripe: tidings/storage/quotas.py). A stripe whose allowance is used up,
-- or shared for another limit or an earlier period, sends its claim to that
-- slow path, which sums, checks and shares out again.

CREATE TABLE team_quota_stripes (
    team_id       uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    channel       text NOT NULL CHECK (channel IN ('email', 'sms')),
    stripe        smallint NOT NULL CHECK (stripe >= 0),
    -- The UTC day and the first day of the UTC month the counters belong to.
    day           date NOT NULL,
    day_used      bigint NOT NULL DEFAULT 0 CHECK (day_used >= 0),
    -- The limit the allowance was shared for (0: unlimited; -1: none yet),
    -- and what this stripe may count up to in its day.
    day_limit     bigint NOT NULL DEFAULT -1,
    day_allowed   bigint NOT NULL DEFAULT 0,
    month         date NOT NULL,
    month_used    bigint NOT NULL DEFAULT 0 CHECK (month_used >= 0),
    month_limit   bigint NOT NULL DEFAULT -1,
    month_allowed bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, channel, stripe)
);

-- What was counted so far becomes stripe 0; its allowance is shared out
-- again at the next claim under a limit.
INSERT INTO team_quota_stripes (team_id, channel, stripe, day, day_used, month, month_used)
SELECT team_id, channel, 0, day, day_used, COALESCE(month, day), month_used
FROM team_quotas WHERE day IS NOT NULL;

-- team_quotas keeps the team's own limits only.
ALTER TABLE team_quotas
    DROP COLUMN day, DROP COLUMN day_used, DROP COLUMN month, DROP COLUMN month_used;
