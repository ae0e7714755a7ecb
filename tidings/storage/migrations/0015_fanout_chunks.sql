-- A broadcast's snapshot kept in chunks: one row per batch of eligible
-- contacts (an array), instead of one row per contact. The fanout claims a
-- chunk with FOR UPDATE SKIP LOCKED, queues its emails and marks it done in
-- one transaction, so several connections can work on one broadcast at once
-- and a restart resumes with the chunks not done.

CREATE TABLE broadcast_chunks (
    broadcast_id  uuid NOT NULL REFERENCES broadcasts (id) ON DELETE CASCADE,
    chunk         integer NOT NULL,
    contact_ids   uuid[] NOT NULL,
    done          boolean NOT NULL DEFAULT false,
    PRIMARY KEY (broadcast_id, chunk)
);

-- What a broadcast fanning out during the upgrade had left to do.
INSERT INTO broadcast_chunks (broadcast_id, chunk, contact_ids)
SELECT r.broadcast_id, ((r.position - b.fanout_cursor - 1) / 2000)::integer,
       array_agg(r.contact_id ORDER BY r.position)
FROM broadcast_recipients r JOIN broadcasts b ON b.id = r.broadcast_id
WHERE b.status IN ('queued', 'scheduled') AND r.position > b.fanout_cursor
GROUP BY 1, 2;

DROP TABLE broadcast_recipients;

-- The guard that a contact never gets two emails of one broadcast is now the
-- primary key: a broadcast email's id is made from its broadcast and contact
-- (tidings.storage.broadcasts_fanout), so this index is not needed.
DROP INDEX emails_broadcast_contact;
