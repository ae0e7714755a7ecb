-- SMS: sender IDs, messages with their events, and what providers report later.

CREATE TABLE sender_ids (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- Alphanumeric as given; long codes in E.164; short codes as digits.
    value       text NOT NULL,
    type        text NOT NULL CHECK (type IN ('alphanumeric', 'long_code', 'short_code')),
    status      text NOT NULL CHECK (status IN ('pending', 'approved', 'rejected')),
    countries   text[] NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, value)
);
CREATE INDEX sender_ids_team ON sender_ids (team_id, created_at DESC, id DESC);
-- An inbound reply names the number it was sent to: which teams own it.
CREATE INDEX sender_ids_value ON sender_ids (value) WHERE status = 'approved';

-- The three-character pieces of a text: what the search index holds (pg_trgm's
-- idea, with a plain GIN over text arrays, which needs no extension; GIN keeps
-- each distinct piece once per row).
CREATE FUNCTION sms_grams(t text) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT substr(t, i, 3) FROM generate_series(1, length(t) - 2) AS i)
$$;

CREATE TABLE sms_messages (
    id               uuid PRIMARY KEY,
    team_id          uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    to_number        text NOT NULL,  -- E.164
    country          text,           -- ISO 3166-1 alpha-2 of to_number
    from_sender      text NOT NULL,  -- the sender ID's value
    body             text NOT NULL,
    encoding         text NOT NULL CHECK (encoding IN ('GSM-7', 'UCS-2')),
    segments         integer NOT NULL,
    status           text NOT NULL CHECK (status IN (
        'queued', 'processing', 'submitted', 'sent', 'delivered', 'undelivered',
        'rejected', 'failed', 'expired', 'unknown', 'canceled')),
    provider         text NOT NULL,
    message_id       text,           -- the provider's id of the message
    metadata         jsonb,
    scheduled_at     timestamptz,
    failure_code     text,
    failure_message  text,
    submitted_at     timestamptz,
    delivered_at     timestamptz,
    attempt_count    integer NOT NULL DEFAULT 0,
    -- When the send is due; NULL once it has been handed over (or given up).
    next_attempt_at  timestamptz,
    leased_until     timestamptz,
    lease_owner      uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- What GET /sms?search= looks in: recipient, sender, body and provider id,
    -- lowercased, apart (a unit separator keeps a match inside one field).
    search           text GENERATED ALWAYS AS (
        lower(to_number || E'\x1f' || from_sender || E'\x1f' || body || E'\x1f'
              || coalesce(message_id, ''))) STORED
);
-- GET /sms: newest first, alone or with one exact filter.
CREATE INDEX sms_team ON sms_messages (team_id, created_at DESC, id DESC);
CREATE INDEX sms_team_status ON sms_messages (team_id, status, created_at DESC, id DESC);
CREATE INDEX sms_team_sender ON sms_messages (team_id, from_sender, created_at DESC, id DESC);
-- Searches for rare text: rows holding every piece of the term, then LIKE.
CREATE INDEX sms_search ON sms_messages USING gin (sms_grams(search));
-- Status callbacks name the provider's id.
CREATE INDEX sms_provider_id ON sms_messages (message_id) WHERE message_id IS NOT NULL;
-- What the send worker scans: only messages that still have a send to make.
CREATE INDEX sms_due ON sms_messages (team_id, next_attempt_at) WHERE next_attempt_at IS NOT NULL;

-- One row per status move; its id is the id of the webhook event recorded with it.
CREATE TABLE sms_events (
    id           uuid PRIMARY KEY,
    sms_id       uuid NOT NULL REFERENCES sms_messages (id) ON DELETE CASCADE,
    team_id      uuid NOT NULL,
    status       text NOT NULL,
    occurred_at  timestamptz NOT NULL,
    provider     text,
    code         text,
    message      text
);
CREATE INDEX sms_events_sms ON sms_events (sms_id, occurred_at);

-- What a provider announced for later (the sandbox's statuses and its STOP
-- reply): due work, recorded when due_at has come.
CREATE TABLE sms_followups (
    id        uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    sms_id    uuid NOT NULL REFERENCES sms_messages (id) ON DELETE CASCADE,
    kind      text NOT NULL CHECK (kind IN ('status', 'inbound')),
    status    text,
    body      text,
    code      text,
    message   text,
    provider  text NOT NULL,
    due_at    timestamptz NOT NULL
);
CREATE INDEX sms_followups_due ON sms_followups (due_at);
