-- Sending domains: the DKIM key made for each, and the DNS records its owner
-- publishes, with what the last lookup found for each.

CREATE TABLE domains (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id           uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- Lower case, IDNs in their xn-- (A-label) form, no trailing dot.
    name              text NOT NULL CHECK (name = lower(name) AND char_length(name) BETWEEN 3 AND 253),
    status            text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'verified', 'failed')),
    dkim_selector     text NOT NULL,
    -- PKCS#1 PEM of the 2048-bit RSA key; never shown by the API.
    dkim_private_key  text NOT NULL,
    -- [{"type", "name", "value", "purpose", "status", "checked_at", "changed_at"}, ...]
    records           jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    verified_at       timestamptz,
    last_checked_at   timestamptz,
    UNIQUE (team_id, name)
);
CREATE INDEX domains_team_created ON domains (team_id, created_at DESC, id DESC);
-- The periodic re-verification walks the verified domains, oldest check first.
CREATE INDEX domains_verified_checked ON domains (last_checked_at NULLS FIRST)
    WHERE status = 'verified';
