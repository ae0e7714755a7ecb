-- A STOP is kept on the number's suppression whatever its reason: a number
-- suppressed by hand that then replies STOP stays opted out when the manual
-- suppression is lifted, until it replies START.

ALTER TABLE suppressions ADD COLUMN sms_opted_out_at timestamptz;
UPDATE suppressions SET sms_opted_out_at = created_at WHERE reason = 'sms_opt_out';
