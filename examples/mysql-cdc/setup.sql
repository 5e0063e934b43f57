-- The table the mysql-cdc example reads: one row per page view of the sample
-- (examples/data/pageviews.jsonl), ids numbering the lines. Run it with the mariadb
-- client from the repository root (LOAD DATA LOCAL reads the file there):
--
--   mariadb -h 127.0.0.1 -u root --local-infile=1 test < examples/mysql-cdc/setup.sql
CREATE TABLE pageviews (
    id BIGINT PRIMARY KEY,
    user_id VARCHAR(16) NOT NULL,
    views INT NOT NULL,
    bytes INT NOT NULL,
    last_seen TIMESTAMP NOT NULL
);
CREATE TEMPORARY TABLE pageviews_json (line BIGINT AUTO_INCREMENT PRIMARY KEY, doc LONGTEXT);
LOAD DATA LOCAL INFILE 'examples/data/pageviews.jsonl' INTO TABLE pageviews_json
    FIELDS TERMINATED BY '\t' ESCAPED BY '' LINES TERMINATED BY '\n' (doc);
SET time_zone = '+00:00';
INSERT INTO pageviews
    SELECT line, JSON_VALUE(doc, '$.user_id'), JSON_VALUE(doc, '$.views'),
           JSON_VALUE(doc, '$.bytes'),
           STR_TO_DATE(JSON_VALUE(doc, '$.last_seen'), '%Y-%m-%dT%H:%i:%sZ')
    FROM pageviews_json ORDER BY line;
