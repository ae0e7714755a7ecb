-- A hard bounce suppresses an address with the reason `bounce` (CONTRACT §7),
-- the name outside programs are written against; it was `hard_bounce`.

ALTER TABLE suppressions DROP CONSTRAINT suppressions_reason_check;
UPDATE suppressions SET reason = 'bounce' WHERE reason = 'hard_bounce';
ALTER TABLE suppressions ADD CONSTRAINT suppressions_reason_check
    CHECK (reason IN ('bounce', 'complaint', 'unsubscribe', 'manual', 'sms_opt_out'));
