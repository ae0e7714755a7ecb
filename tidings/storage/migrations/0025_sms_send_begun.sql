-- When the send of a message to a provider that texts people began: set just
-- before the request, cleared when its attempt is recorded. A message found
-- with it set had a send whose answer was lost (the process stopped, or the
-- answer came too late): it becomes `unknown` rather than sent again, which
-- could text the person twice. Nullable, no default: no rewrite of the table.
ALTER TABLE sms_messages ADD COLUMN send_begun_at timestamptz;
