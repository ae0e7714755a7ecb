-- Email templates and their immutable, numbered versions.

CREATE TABLE templates (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id               uuid NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    name                  text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 100),
    alias                 text CHECK (alias ~ '^[A-Za-z0-9_-]{1,100}$'),
    category              text CHECK (category IN ('otp', 'welcome', 'receipt', 'alert',
                                                   'notification', 'custom')),
    -- The newest version: the draft that PATCH builds on.
    current_version_id    uuid NOT NULL,
    -- The version that sends use; NULL until the first publish.
    published_version_id  uuid,
    published_at          timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, id)
);
CREATE UNIQUE INDEX templates_team_alias ON templates (team_id, alias) WHERE alias IS NOT NULL;
CREATE INDEX templates_team_created ON templates (team_id, created_at DESC, id DESC);

CREATE TABLE template_versions (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id              uuid NOT NULL,
    template_id          uuid NOT NULL,
    version_number       integer NOT NULL CHECK (version_number >= 1),
    subject              text NOT NULL,
    html                 text NOT NULL,
    text                 text,
    from_email           text,
    from_name            text,
    reply_to_email       text,
    -- [{"key", "type", "fallback_value"}, ...]
    variables            jsonb NOT NULL DEFAULT '[]'::jsonb,
    -- The version this one was made from, always of the same template. No foreign
    -- key: versions go only with their template, all at once, and ON DELETE SET
    -- NULL would be an update.
    based_on_version_id  uuid,
    change_note          text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (template_id, version_number),
    UNIQUE (template_id, id),
    FOREIGN KEY (team_id, template_id) REFERENCES templates (team_id, id) ON DELETE CASCADE
);

-- A template points only at versions of its own. Deferred: a template and its
-- first version are inserted by one statement.
ALTER TABLE templates
    ADD FOREIGN KEY (id, current_version_id) REFERENCES template_versions (template_id, id)
        DEFERRABLE INITIALLY DEFERRED,
    ADD FOREIGN KEY (id, published_version_id) REFERENCES template_versions (template_id, id)
        DEFERRABLE INITIALLY DEFERRED;

-- Versions are immutable: no statement may change one. Changes make new versions.
CREATE FUNCTION template_versions_are_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'template version % is immutable', OLD.id
        USING ERRCODE = 'restrict_violation';
END
$$;

CREATE TRIGGER template_versions_immutable
    BEFORE UPDATE ON template_versions
    FOR EACH ROW EXECUTE FUNCTION template_versions_are_immutable();
