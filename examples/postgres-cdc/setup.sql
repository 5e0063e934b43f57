-- The table the postgres-cdc example reads: one row per page view of the sample
-- (examples/data/pageviews.jsonl), ids numbering the lines. Run it with psql from the
-- repository root (\copy reads the file there):
--
--   psql postgres://postgres@127.0.0.1:5432/test -f examples/postgres-cdc/setup.sql
CREATE TABLE pageviews (
    id bigint PRIMARY KEY,
    user_id text NOT NULL,
    views integer NOT NULL,
    bytes integer NOT NULL,
    last_seen timestamptz NOT NULL
);
CREATE TEMPORARY TABLE pageviews_json (line bigserial, doc jsonb);
\copy pageviews_json (doc) FROM 'examples/data/pageviews.jsonl'
INSERT INTO pageviews (id, user_id, views, bytes, last_seen)
SELECT line, doc->>'user_id', (doc->>'views')::integer, (doc->>'bytes')::integer,
       (doc->>'last_seen')::timestamptz
FROM pageviews_json;
