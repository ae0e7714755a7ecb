-- Every secret rotated out keeps signing for its 24 hours, not only the last
-- one: a second rotation within a day no longer cuts off the first old
-- secret at once, which a receiver may still hold. Newest first, each with
-- the time it stops signing (a list of its own, element for element).
ALTER TABLE webhook_endpoints
    ADD COLUMN previous_secrets text[] NOT NULL DEFAULT '{}',
    ADD COLUMN previous_secrets_until timestamptz[] NOT NULL DEFAULT '{}';

UPDATE webhook_endpoints
SET previous_secrets = ARRAY[previous_secret],
    previous_secrets_until = ARRAY[previous_secret_until]
WHERE previous_secret IS NOT NULL AND previous_secret_until > now();

ALTER TABLE webhook_endpoints
    DROP COLUMN previous_secret,
    DROP COLUMN previous_secret_until;
