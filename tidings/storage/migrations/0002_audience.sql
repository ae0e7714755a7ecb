-- The audience of a team: contact properties, topics and each contact's
-- choices, segments and their members, and suppressed addresses.

-- The keys a contact's `properties` may hold, with their types.
CREATE TABLE contact_properties (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id         uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    key             text NOT NULL,
    type            text NOT NULL CHECK (type IN ('string', 'number', 'boolean', 'date')),
    -- A JSON value of `type`, or NULL for none.
    fallback_value  jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, key)
);
CREATE INDEX contact_properties_team_created ON contact_properties (team_id, created_at DESC, id DESC);

CREATE TABLE topics (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id               uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name                  text NOT NULL,
    description           text,
    default_subscription  text NOT NULL CHECK (default_subscription IN ('opt_in', 'opt_out')),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX topics_team_created ON topics (team_id, created_at DESC, id DESC);

-- Explicit choices only: a contact without a row here has the topic's default.
CREATE TABLE topic_subscriptions (
    topic_id      uuid NOT NULL REFERENCES topics (id) ON DELETE CASCADE,
    contact_id    uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    subscription  text NOT NULL CHECK (subscription IN ('opt_in', 'opt_out')),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, contact_id)
);
CREATE INDEX topic_subscriptions_contact ON topic_subscriptions (contact_id);

CREATE TABLE segments (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id     uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX segments_team_created ON segments (team_id, created_at DESC, id DESC);

-- The primary key counts a segment's members; the second index pages them
-- newest first; the third finds a contact's segments and serves cascades.
CREATE TABLE segment_contacts (
    segment_id   uuid NOT NULL REFERENCES segments (id) ON DELETE CASCADE,
    contact_id   uuid NOT NULL REFERENCES contacts (id) ON DELETE CASCADE,
    assigned_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (segment_id, contact_id)
);
CREATE INDEX segment_contacts_segment_assigned
    ON segment_contacts (segment_id, assigned_at DESC, contact_id DESC);
CREATE INDEX segment_contacts_contact ON segment_contacts (contact_id);

-- Addresses that must not be sent to: emails lowercased, phones in E.164.
CREATE TABLE suppressions (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id            uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    address            text NOT NULL,
    kind               text NOT NULL CHECK (kind IN ('email', 'phone')),
    reason             text NOT NULL
        CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribe', 'manual', 'sms_opt_out')),
    source_message_id  uuid,
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, address)
);
CREATE INDEX suppressions_team_created ON suppressions (team_id, created_at DESC, id DESC);

-- Contact filters: unsubscribed contacts newest first, and lookups by phone
-- (an SMS keyword reply names the phone, not the contact).
CREATE INDEX contacts_team_unsubscribed ON contacts (team_id, created_at DESC, id DESC)
    WHERE unsubscribed;
CREATE INDEX contacts_team_phone ON contacts (team_id, normalized_phone)
    WHERE normalized_phone IS NOT NULL;

-- The unique index on lower(email) is partial, and the planner takes no
-- statistics from partial indexes: without these it misjudges every join on
-- lower(email), the import's above all.
CREATE STATISTICS contacts_lower_email ON (lower(email)) FROM contacts;
