-- A long code or a short code is a number one team sends from and takes
-- replies on: it belongs to one team. Where several teams registered one
-- before this rule, the first keeps it and the others' become `rejected`.

UPDATE sender_ids s SET status = 'rejected', updated_at = now()
WHERE s.type IN ('long_code', 'short_code') AND s.status <> 'rejected'
  AND EXISTS (
      SELECT 1 FROM sender_ids o
      WHERE o.value = s.value AND o.type IN ('long_code', 'short_code')
        AND o.status <> 'rejected' AND (o.created_at, o.id) < (s.created_at, s.id)
  );

CREATE UNIQUE INDEX sender_ids_number_owner ON sender_ids (value)
WHERE type IN ('long_code', 'short_code') AND status <> 'rejected';
