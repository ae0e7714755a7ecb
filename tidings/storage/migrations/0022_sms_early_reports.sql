-- A provider may report a message's status before the send worker has stored
-- the message's provider id (Twilio calls back as soon as it has answered the
-- send, and the worker records answers in batches). Such a report is kept
-- here and applied once the id is stored; one that never matches a message
-- is deleted after a day by the retention sweeper.
CREATE TABLE sms_early_reports (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id   text NOT NULL,          -- the provider's id of the message
    provider     text NOT NULL,
    status       text NOT NULL,
    code         text,
    message      text,
    received_at  timestamptz NOT NULL DEFAULT now()
);
-- What the callback and the send worker look up, and what retention scans.
CREATE INDEX sms_early_reports_message ON sms_early_reports (message_id);
CREATE INDEX sms_early_reports_received ON sms_early_reports (received_at);
