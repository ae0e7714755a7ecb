-- Stored responses that hold a secret in plain text (written before responses
-- with secrets were sealed) are deleted: a replay of them becomes a new request.
DELETE FROM idempotency_keys
WHERE response_body IS NOT NULL
  AND (position(convert_to('svc_team_', 'UTF8') IN response_body) > 0
       OR position(convert_to('whsec_', 'UTF8') IN response_body) > 0);
