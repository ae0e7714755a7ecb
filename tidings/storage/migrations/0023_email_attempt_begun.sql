-- An email given back after its attempt began (cut short, or its recording
-- failed) may have reached some recipients: it is no longer scheduled, for
-- cancel and PATCH, whoever holds its lease later (emails_sending.GIVE_BACK,
-- emails_manage.STILL_SCHEDULED). A constant default: no rewrite of the table.
ALTER TABLE emails ADD COLUMN attempt_begun boolean NOT NULL DEFAULT false;
