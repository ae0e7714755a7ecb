-- Broadcasts, the snapshot of each one's eligible audience, and the link
-- from an email to the broadcast and contact it was queued for.

CREATE TABLE broadcasts (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id            uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name               text NOT NULL,
    status             text NOT NULL DEFAULT 'draft' CHECK (status IN (
        'draft', 'scheduled', 'queued', 'sent', 'failed', 'canceled')),
    -- No foreign keys: a segment or topic deleted after the broadcast was
    -- written leaves it readable; sending it then fails.
    segment_id         uuid NOT NULL,
    topic_id           uuid,
    from_email         text NOT NULL,
    from_name          text,
    reply_to_email     text,
    subject            text NOT NULL,
    preview_text       text,
    html               text NOT NULL,
    text               text,
    variable_bindings  jsonb NOT NULL DEFAULT '{}',
    scheduled_at       timestamptz,
    queued_at          timestamptz,
    sent_at            timestamptz,
    canceled_at        timestamptz,
    failed_at          timestamptz,
    failure_reason     text,
    audience_count     bigint NOT NULL DEFAULT 0,
    eligible_count     bigint NOT NULL DEFAULT 0,
    suppressed_count   bigint NOT NULL DEFAULT 0,
    queued_count       bigint NOT NULL DEFAULT 0,
    failed_count       bigint NOT NULL DEFAULT 0,
    revision           bigint NOT NULL DEFAULT 1 CHECK (revision >= 1),
    -- Fanout: when the audience was resolved (NULL: not yet), and the
    -- position in the snapshot up to which recipients have been handled.
    snapshot_at        timestamptz,
    fanout_cursor      bigint NOT NULL DEFAULT 0,
    lease_owner        uuid,
    leased_until       timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX broadcasts_team_created ON broadcasts (team_id, created_at DESC, id DESC);
-- What the fanout dispatcher polls: broadcasts with fanout to do.
CREATE INDEX broadcasts_due ON broadcasts ((coalesce(scheduled_at, queued_at)))
    WHERE status IN ('queued', 'scheduled');

-- The eligible members of a broadcast's segment when its fanout began,
-- numbered from 1: the fanout's cursor walks these positions. A contact is
-- in it once (it comes from the segment's primary key); what guards against
-- a second email is the unique index on emails below.
CREATE TABLE broadcast_recipients (
    broadcast_id  uuid NOT NULL REFERENCES broadcasts (id) ON DELETE CASCADE,
    position      bigint NOT NULL,
    contact_id    uuid NOT NULL,
    PRIMARY KEY (broadcast_id, position)
);

-- An email queued by a broadcast names it and its contact; the unique index
-- is the guard that a contact never gets two emails of one broadcast.
ALTER TABLE emails ADD COLUMN broadcast_id uuid, ADD COLUMN contact_id uuid;
CREATE UNIQUE INDEX emails_broadcast_contact ON emails (broadcast_id, contact_id)
    WHERE broadcast_id IS NOT NULL;

-- Keys the service made for itself (the unsubscribe signing key when
-- TIDINGS_SECRET_KEY is not set), shared by every process.
CREATE TABLE service_keys (
    name        text PRIMARY KEY,
    key         bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
