-- Autovacuum (and any ANALYZE or REINDEX run with a search_path of its own)
-- evaluates the piece index's expression, sms_pieces(search), where
-- sms_pieces_of is not found unless named with its schema: every automatic
-- analysis of sms_messages failed, so the table never had statistics. The
-- function now names it with the schema the migrations run in. Same result,
-- so the index stands as it is.
DO $migration$
BEGIN
    EXECUTE format($function$
        CREATE OR REPLACE FUNCTION %1$I.sms_pieces(search text) RETURNS tsvector
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $body$
            SELECT %1$I.sms_pieces_of(replace(search, E'\x01', E'\x02'))
        $body$
    $function$, current_schema());
END
$migration$;
