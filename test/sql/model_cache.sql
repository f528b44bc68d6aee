-- A scan that continues after other indexes were searched: the backend's
-- model cache holds models within gpu_ivfpq.model_cache_memory, so nine
-- other indexes (of 128 dimensions: 140 kB of quantizers each, past the 1MB
-- set here) evict this scan's model between its rounds; the scan must go on
-- with its own index's quantizers and return exactly what it returns
-- without the interruption.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
SET gpu_ivfpq.rerank = 4;
SET gpu_ivfpq.model_cache_memory = '1MB';
SET enable_seqscan = off;
CREATE TABLE mc0 (id int, v real[]);
INSERT INTO mc0 SELECT i, ARRAY[sin(i), cos(i * 0.5), sin(i * 0.25), cos(i * 0.125)]::real[]
FROM generate_series(1, 2000) i;
CREATE INDEX mc0_v ON mc0 USING gpu_ivfpq (v) WITH (lists = 16, m = 2);
DO $$
BEGIN
	FOR t IN 1..9 LOOP
		EXECUTE format('CREATE TABLE mc%s (id int, v real[])', t);
		EXECUTE format('INSERT INTO mc%s SELECT i, ARRAY(SELECT cos(i * %s + j) * sin(j * %s) FROM generate_series(1, 128) j)::real[] FROM generate_series(1, 500) i',
					   t, t, t);
		EXECUTE format('CREATE INDEX mc%s_v ON mc%s USING gpu_ivfpq (v) WITH (lists = %s, m = 2)', t, t, 4 + t);
	END LOOP;
END $$;

-- The reference: 60 rows in one go (several rounds of 4, 8, 16, ... candidates).
CREATE TEMP TABLE ref AS
SELECT row_number() OVER () AS n, id FROM (SELECT id FROM mc0 ORDER BY v <-> '{0.5,0.5,0.5,0.5}' LIMIT 60) s;

-- The same scan through a cursor, with nine other indexes searched between fetches.
CREATE TEMP TABLE got (n serial, id int);
CREATE FUNCTION search_others() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	FOR t IN 1..9 LOOP
		EXECUTE format('SELECT id FROM mc%s ORDER BY v <-> array_fill(0.1::real, ARRAY[128]) LIMIT 3', t);
	END LOOP;
END $$;
BEGIN;
DECLARE c CURSOR FOR SELECT id FROM mc0 ORDER BY v <-> '{0.5,0.5,0.5,0.5}' LIMIT 60;
DO $$
DECLARE
	cur refcursor := 'c';
	r record;
BEGIN
	FOR i IN 1..60 LOOP
		FETCH cur INTO r;
		EXIT WHEN NOT FOUND;
		INSERT INTO got (id) VALUES (r.id);
		IF i % 5 = 0 THEN
			PERFORM search_others();
		END IF;
	END LOOP;
END $$;
COMMIT;
SELECT count(*) AS rows_compared, count(*) FILTER (WHERE ref.id = got.id) AS same_rows
FROM ref JOIN got USING (n);

DROP FUNCTION search_others();
DROP TABLE mc0, mc1, mc2, mc3, mc4, mc5, mc6, mc7, mc8, mc9;
