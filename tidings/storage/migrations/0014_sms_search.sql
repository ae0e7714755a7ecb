-- GET /sms?search=: one index that answers a term of any length.
--
-- The index holds, for every position of the lowercased search column, the
-- piece of up to four characters that starts there (shorter only at the end
-- of the text), as the lexemes of a tsvector: built in, no extension.
-- A term of one to four characters occurs in a text exactly when some piece
-- starts with it, which a GIN index over a tsvector answers as a prefix
-- match ('term':*); a longer term needs every one of its four-character
-- pieces (then LIKE checks the order). Four characters rather than three:
-- digits and hex ids have few distinct three-character pieces, each in a
-- large share of the rows.

-- The pieces are cut by four regular expressions (one per starting offset
-- modulo 4) that put a \x01 after every fourth character, and split there;
-- a \x01 of the text itself is read as \x02 (on both sides, see
-- sms_pieces_query: LIKE then tells them apart). Far cheaper than one
-- substr() per position.
CREATE FUNCTION sms_pieces_of(t text) RETURNS tsvector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT array_to_tsvector(array_remove(
           string_to_array(regexp_replace(t, '(.{4})', E'\\1\x01', 'g'), E'\x01')
        || string_to_array(regexp_replace(substr(t, 2), '(.{4})', E'\\1\x01', 'g'), E'\x01')
        || string_to_array(regexp_replace(substr(t, 3), '(.{4})', E'\\1\x01', 'g'), E'\x01')
        || string_to_array(regexp_replace(substr(t, 4), '(.{4})', E'\\1\x01', 'g'), E'\x01'),
        ''))
$$;

CREATE FUNCTION sms_pieces(search text) RETURNS tsvector
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT sms_pieces_of(replace(search, E'\x01', E'\x02'))
$$;

-- A tsquery lexeme, quoted as tsquery's input reads it.
CREATE FUNCTION sms_piece_quoted(piece text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT '''' || replace(replace(piece, '\', '\\'), '''', '''''') || ''''
$$;

-- What the index is asked for a search term (lowercased here, as the column is).
-- A term of up to four characters: as a prefix of the pieces. A longer one:
-- by some of its pieces, chosen by how common they are (ANALYZE's most common
-- lexemes of the index, pg_stats): every piece asked for costs a walk through
-- its list of rows, and the list of a piece in a quarter of the rows ("ship")
-- costs more than the few rows it would rule out (strpos checks those). So:
-- the pieces in under 15% of the rows or not among the most common (at most
-- six, the rarest first), and at least the two rarest.
CREATE FUNCTION sms_pieces_query(term text) RETURNS tsquery
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE AS $$
DECLARE
    t text := replace(lower(term), E'\x01', E'\x02');
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

DROP INDEX sms_search;
DROP FUNCTION sms_grams(text);
-- With the default pending list (4 MB): an insert appends its pieces there and
-- a search reads all of it, which costs well under a millisecond when full;
-- a smaller list makes inserts merge it into the index more often.
CREATE INDEX sms_search ON sms_messages USING gin (sms_pieces(search));
