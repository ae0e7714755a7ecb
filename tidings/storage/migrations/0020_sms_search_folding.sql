-- GET /sms?search= without regard to case, for every letter: the search
-- column and the term are both folded by sms_fold, which lowercases as
-- before and then maps what lower() leaves apart: the Greek final sigma
-- (ς) to σ, so that ΟΔΥΣΣΕΑΣ finds Οδυσσέας, and ß to ss (STRASSE finds
-- straße).

CREATE FUNCTION sms_fold(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT replace(translate(lower(t), 'ς', 'σ'), 'ß', 'ss')
$$;

-- The column is generated: it is dropped (its piece index with it) and
-- added again with the folded expression, which rewrites the table.
ALTER TABLE sms_messages DROP COLUMN search;
ALTER TABLE sms_messages ADD COLUMN search text GENERATED ALWAYS AS (
    sms_fold(to_number || E'\x1f' || from_sender || E'\x1f' || body || E'\x1f'
             || coalesce(message_id, ''))) STORED;
CREATE INDEX sms_search ON sms_messages USING gin (sms_pieces(search));

-- The term, folded as the column is (it was lowercased only).
CREATE OR REPLACE FUNCTION sms_pieces_query(term text) RETURNS tsquery
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    t text := replace(sms_fold(term), E'\x01', E'\x02');
    common text[];
    freqs real[];
    chosen text;
BEGIN
    IF length(t) <= 4 THEN
        RETURN (sms_piece_quoted(t) || ':*')::tsquery;
    END IF;
    SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs INTO common, freqs
    FROM pg_stats AS s
    WHERE s.schemaname = current_schema() AND s.tablename = 'sms_search'
      AND s.attname = 'sms_pieces';
    SELECT string_agg(sms_piece_quoted(piece), ' & ') INTO chosen
    FROM (
        SELECT piece, freq, row_number() OVER (ORDER BY freq NULLS FIRST, piece) AS rank
        FROM (
            SELECT DISTINCT substr(t, i, 4) AS piece,
                   freqs[array_position(common, substr(t, i, 4))] AS freq
            FROM generate_series(1, length(t) - 3) AS i
        ) AS pieces
    ) AS ranked
    WHERE rank <= 2 OR (coalesce(freq, 0) < 0.15 AND rank <= 6);
    RETURN chosen::tsquery;
END
$$;
