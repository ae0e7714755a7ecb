-- The rows written for every message (the message, its events, its due
-- outcomes, its webhook events and deliveries) keep no foreign key to a
-- team or to their message. A foreign key is checked by a query of its own
-- for every row inserted, and locks the row it points to: a third of what
-- PostgreSQL does to queue a broadcast email. Teams, emails and SMS are
-- never deleted, so the cascades these keys declared never ran; the rows
-- are written with the ids of rows the same statement reads or writes.
-- The keys that deletes do follow stay: a webhook delivery goes with its
-- endpoint and with its event, an attempt with its delivery.
ALTER TABLE emails DROP CONSTRAINT emails_team_id_fkey;
ALTER TABLE email_events DROP CONSTRAINT email_events_email_id_fkey;
ALTER TABLE email_followups DROP CONSTRAINT email_followups_email_id_fkey;
ALTER TABLE sms_messages DROP CONSTRAINT sms_messages_team_id_fkey;
ALTER TABLE sms_events DROP CONSTRAINT sms_events_sms_id_fkey;
ALTER TABLE sms_followups DROP CONSTRAINT sms_followups_sms_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_team_id_fkey;
ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_team_id_fkey;

-- A report names its email by the Message-ID Tidings gave it,
-- <email id@domain>: it is found by the id, through the primary key. Every
-- status move of an email rewrote an entry of this index too.
DROP INDEX emails_smtp_message_id;
