-- Events (the transactional outbox), webhook endpoints, deliveries and attempts.

CREATE TABLE events (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    type         text NOT NULL,
    channel      text CHECK (channel IN ('email', 'sms')),
    message_id   uuid,
    recipient    text,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    data         jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_team ON events (team_id, created_at DESC, id DESC);
CREATE INDEX events_team_type ON events (team_id, type, created_at DESC);
CREATE INDEX events_message ON events (team_id, message_id) WHERE message_id IS NOT NULL;

CREATE TABLE webhook_endpoints (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id               uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    url                   text NOT NULL,
    -- Event types, or {'*'} for every type.
    events                text[] NOT NULL,
    description           text,
    status                text NOT NULL DEFAULT 'enabled'
        CHECK (status IN ('enabled', 'disabled')),
    secret                text NOT NULL,
    -- After a rotation the old secret signs too, until it expires.
    previous_secret       text,
    previous_secret_until timestamptz,
    consecutive_failures  integer NOT NULL DEFAULT 0,
    last_failure_at       timestamptz,
    disabled_reason       text CHECK (disabled_reason IN ('manual', 'failure_threshold')),
    disabled_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoints_team ON webhook_endpoints (team_id, created_at DESC, id DESC);

CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id          uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event_id         uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    event_type       text NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'retrying', 'succeeded', 'failed')),
    attempt_count    integer NOT NULL DEFAULT 0,
    -- The attempt count at the last manual retry: the retry schedule counts from here.
    retry_base       integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    -- A process that claimed the delivery owns its next attempt until then.
    leased_until     timestamptz,
    lease_owner      uuid,
    response_status  integer,
    response_body    text,
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- What the claimers scan: only deliveries that still have an attempt to make.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint_id, next_attempt_at)
    WHERE status IN ('pending', 'retrying');
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at DESC, id DESC);
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);

CREATE TABLE webhook_attempts (
    delivery_id      uuid NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    number           integer NOT NULL,
    started_at       timestamptz NOT NULL,
    duration_ms      integer NOT NULL,
    response_status  integer,
    response_body    text,
    error            text,
    PRIMARY KEY (delivery_id, number)
);
