-- A team's own emails are claimed before its broadcasts' emails, however
-- long the broadcasts' queue (tidings.storage.emails_sending, LEASES): the
-- claim walks the due emails that belong to no broadcast through this
-- index first. Broadcast emails are not in it, so a fanout writes no
-- entry here.
CREATE INDEX emails_due_own ON emails (team_id, next_attempt_at)
    WHERE next_attempt_at IS NOT NULL AND broadcast_id IS NULL;
