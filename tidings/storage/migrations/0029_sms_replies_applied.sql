-- Replies (Twilio's MessageSid) whose STOP or START was applied. A request
-- Twilio sends again (its answer lost) or one replayed by whoever copied it
-- (a signature has no time in it) changes consent once: a START replayed
-- after a later STOP must not opt the number back in. Keywords are few
-- among messages; the rows stay.
CREATE TABLE sms_replies_applied (
    message_sid  text PRIMARY KEY,
    applied_at   timestamptz NOT NULL DEFAULT now()
);
