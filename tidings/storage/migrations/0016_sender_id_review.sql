-- A sender ID the provider could not be asked about stays `pending`; the
-- runtime asks again every TIDINGS_SENDER_ID_REVIEW_SECONDS. `reviewed_at`
-- is when it was last asked, whatever the answer.

ALTER TABLE sender_ids ADD COLUMN reviewed_at timestamptz NOT NULL DEFAULT now();

CREATE INDEX sender_ids_pending ON sender_ids (reviewed_at) WHERE status = 'pending';
