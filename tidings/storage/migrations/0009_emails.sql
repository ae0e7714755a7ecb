-- Emails, the events of each email, and the outcomes a provider reports later.

CREATE TABLE emails (
    id                   uuid PRIMARY KEY,
    team_id              uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    -- As shown: 'Acme <hi@acme.example>'; from_email is the bare address.
    from_address         text NOT NULL,
    from_email           text NOT NULL,
    to_addresses         text[] NOT NULL,
    cc                   text[] NOT NULL DEFAULT '{}',
    bcc                  text[] NOT NULL DEFAULT '{}',
    reply_to             text[] NOT NULL DEFAULT '{}',
    -- The bare addresses of `to` in lowercase: what GET /emails?to= matches.
    to_lookup            text[] NOT NULL,
    -- The envelope recipients (to, cc and bcc, bare) that are not suppressed.
    send_to              text[] NOT NULL,
    subject              text NOT NULL,
    html                 text,
    text                 text,
    headers              jsonb NOT NULL DEFAULT '{}',
    tags                 jsonb NOT NULL DEFAULT '[]',
    -- The last event's type.
    status               text NOT NULL CHECK (status IN (
        'scheduled', 'queued', 'sent', 'delivered', 'delivery_delayed', 'bounced',
        'complained', 'failed', 'suppressed', 'canceled')),
    status_at            timestamptz NOT NULL DEFAULT now(),
    scheduled_at         timestamptz,
    template_id          uuid,
    template_version_id  uuid,
    -- The sending domain (the part of from_email after the @) and the
    -- Message-ID header, fixed at acceptance so that a retry carries the same.
    domain               text NOT NULL,
    smtp_message_id      text NOT NULL,
    provider             text,
    attempt_count        integer NOT NULL DEFAULT 0,
    -- When the send is due; NULL once nothing is left to send. A claim moves
    -- it to the lease's end, so that an email whose process died is due again.
    next_attempt_at      timestamptz,
    leased_until         timestamptz,
    lease_owner          uuid,
    last_error           text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX emails_team ON emails (team_id, created_at DESC, id DESC);
CREATE INDEX emails_team_status ON emails (team_id, status, created_at DESC, id DESC);
CREATE INDEX emails_to ON emails USING gin (to_lookup);
CREATE INDEX emails_smtp_message_id ON emails (smtp_message_id);
-- What the send worker scans: only emails that still have a send to make.
CREATE INDEX emails_due ON emails (team_id, next_attempt_at) WHERE next_attempt_at IS NOT NULL;

-- One row per state change of an email; its id is the id of the webhook
-- event recorded with it.
CREATE TABLE email_events (
    id           uuid PRIMARY KEY,
    email_id     uuid NOT NULL REFERENCES emails (id) ON DELETE CASCADE,
    team_id      uuid NOT NULL,
    type         text NOT NULL CHECK (type IN (
        'scheduled', 'queued', 'sent', 'delivered', 'delivery_delayed', 'bounced',
        'complained', 'failed', 'suppressed', 'canceled')),
    recipient    text,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    provider     text,
    code         text,
    message      text
);
CREATE INDEX email_events_email ON email_events (email_id, occurred_at DESC, id DESC);

-- Outcomes a provider reports after the send (the sandbox's delivered,
-- bounced, ...): due work in PostgreSQL, recorded when due_at has come.
CREATE TABLE email_followups (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email_id     uuid NOT NULL REFERENCES emails (id) ON DELETE CASCADE,
    recipient    text NOT NULL,
    type         text NOT NULL,
    due_at       timestamptz NOT NULL,
    provider     text NOT NULL,
    code         text,
    message      text
);
CREATE INDEX email_followups_due ON email_followups (due_at);
