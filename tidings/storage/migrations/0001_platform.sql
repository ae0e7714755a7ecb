-- Teams, their API tokens, idempotency records and contacts.

CREATE TABLE teams (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id      uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name         text,
    -- SHA-256 of the secret; the secret itself is never stored.
    secret_hash  bytea NOT NULL UNIQUE,
    -- The first characters of the secret, to tell tokens apart in listings.
    prefix       text NOT NULL,
    permissions  text[] NOT NULL,
    step_up      boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX api_tokens_team ON api_tokens (team_id, created_at DESC);

CREATE TABLE idempotency_keys (
    -- The credential the key belongs to: the token id.
    scope            uuid NOT NULL,
    key              text NOT NULL,
    fingerprint      bytea NOT NULL,
    -- Which attempt holds the key: set anew each time the key is claimed.
    claim            uuid NOT NULL,
    status           text NOT NULL CHECK (status IN ('processing', 'completed')),
    locked_until     timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    response_status  integer,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);

CREATE TABLE contacts (
    id                      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id                 uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    email                   text,
    phone                   text,
    normalized_phone        text,
    phone_country           text,
    sms_consent_status      text NOT NULL DEFAULT 'unknown'
        CHECK (sms_consent_status IN ('unknown', 'opted_in', 'opted_out')),
    sms_consent_updated_at  timestamptz,
    sms_consent_source      text,
    first_name              text,
    last_name               text,
    unsubscribed            boolean NOT NULL DEFAULT false,
    properties              jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CHECK (email IS NOT NULL OR phone IS NOT NULL)
);
CREATE UNIQUE INDEX contacts_team_email ON contacts (team_id, lower(email)) WHERE email IS NOT NULL;
CREATE INDEX contacts_team_created ON contacts (team_id, created_at DESC, id DESC);
