-- Team quotas: per team and channel, limits on messages per UTC day and per
-- UTC month, and what the current day and month have used of them. One row
-- holds both counters, so a claim checks and counts both under one row lock.

CREATE TABLE team_quotas (
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    channel     text NOT NULL CHECK (channel IN ('email', 'sms')),
    -- The team's own limits. NULL: the setting's default; 0: unlimited.
    per_day     bigint CHECK (per_day >= 0),
    per_month   bigint CHECK (per_month >= 0),
    -- The UTC day and the first day of the UTC month the counters belong to
    -- (NULL: nothing counted yet). A claim in a later period starts from 0.
    day         date,
    day_used    bigint NOT NULL DEFAULT 0 CHECK (day_used >= 0),
    month       date,
    month_used  bigint NOT NULL DEFAULT 0 CHECK (month_used >= 0),
    PRIMARY KEY (team_id, channel)
);
