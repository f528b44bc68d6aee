-- Fuzzy string search: the edit distance operators, the gpu_metric index
-- (List of Clusters and SSS) exact against levenshtein() from fuzzystrmatch
-- where it is installed (else against <~> row by row) at radii 0..3 and for
-- k-NN, through index and bitmap scans and the batch functions, after
-- inserts, deletes and VACUUM; NULLs, empty strings, bad input, plans.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
\i test/sql/explain_function.inc
-- The reference distance: levenshtein() when fuzzystrmatch is available.
SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'fuzzystrmatch') AS have_fuzzy \gset
\if :have_fuzzy
CREATE EXTENSION IF NOT EXISTS fuzzystrmatch;
\set dist 'levenshtein(w.word, q.q)'
\else
\set dist '(w.word <~> q.q)'
\endif
RESET client_min_messages;

--
-- The operators, without an index.
--
-- Code points, not bytes: ñ and ó are one symbol each.
SELECT 'cañón' <~> 'canon' AS accents, 'kitten' <~> 'sitting' AS kitten, 'casa' <~> 'cassa' AS one,
       '日本語' <~> '日本' AS cjk, 'a' <~> 'a' AS same;
-- Empty strings: the distance is the other's length; NULL has none.
SELECT '' <~> 'abc' AS empty_left, 'abc' <~> '' AS empty_right, '' <~> '' AS both_empty,
       'x' <~> NULL AS null_right, NULL <~> 'x' AS null_left;
-- Symmetric, and equal to the dynamic programme on long words (past 64 code points).
SELECT repeat('ab', 50) <~> repeat('ba', 50) AS long1, repeat('ba', 50) <~> repeat('ab', 50) AS long2,
       repeat('abc', 40) <~> (repeat('abc', 39) || 'xbc') AS long3;
-- Ranges: within radius edits.
SELECT 'casa' <% edit_range('cassa', 1) AS within, 'casa' <% edit_range('cassa', 0) AS outside,
       'casa' <% ('cassa', 1)::edit_range AS cast_form, '' <% edit_range('ab', 2) AS empty_word;
SELECT edit_range('cassa', 2) AS range, (edit_range('cassa', 2)).radius AS radius;
-- A NULL word or radius holds nothing (NULL, as SQL comparisons with NULL).
SELECT 'x' <% edit_range('x', NULL) AS null_radius, 'x' <% edit_range(NULL, 3) AS null_word,
       'x' <% ('x', NULL)::edit_range AS null_field, 'x' <% NULL::edit_range AS null_range;
-- A negative radius is an error, however the range is written.
SELECT edit_range('cassa', -1);
SELECT 'casa' <% ('cassa', -2)::edit_range;
-- Not pg_trgm's operators: <~> and <% (text, edit_range) are gpu_ivfpq's.
SELECT oprname, oprleft::regtype, oprright::regtype, oprresult::regtype, oprcode
FROM pg_operator WHERE oprname IN ('<~>', '<%') AND oprright IN ('text'::regtype, 'edit_range'::regtype)
  AND oprcode::text LIKE 'gpu_metric%' ORDER BY 1;

--
-- A word set: three-syllable words (Spanish letters, accents included),
-- words with one or two edits of each other, and special cases.
--
CREATE TABLE words (id serial PRIMARY KEY, word text) WITH (autovacuum_enabled = off);
INSERT INTO words (word)
SELECT a || b || c
FROM unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) WITH ORDINALITY x(a, i),
     unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) WITH ORDINALITY y(b, j),
     unnest(ARRAY['', 's', 'ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú']) WITH ORDINALITY z(c, k)
WHERE (i * 31 + j * 17 + k * 7) % 3 <> 0
ORDER BY i, j, k;
INSERT INTO words (word) VALUES ('cassa'), ('casa'), ('caza'), ('cañón'), ('canon'), (''), ('a'),
	(NULL), (NULL), (repeat('ab', 40)), ('日本語'), ('casa');
SELECT count(*) AS words, count(word) AS not_null, count(DISTINCT word) AS distinct_words FROM words;
CREATE TABLE queries (qid int, q text);
INSERT INTO queries VALUES
	(1, 'cassa'), (2, 'casa'), (3, 'cañon'), (4, ''), (5, 'a'), (6, 'ñoño'), (7, 'xyz'),
	(8, 'pesamo'), (9, 'zazaza'), (10, 'tilámo'), (11, 'rúrúrú'), (12, 'ceza'),
	(13, repeat('ab', 40)), (14, repeat('ab', 39) || 'b'), (15, '日本'), (16, 'camotis'),
	(17, 'saño'), (18, 'lápesca'), (19, 'mortí'), (20, 'zz');

-- The reference: every (query, word) distance, row by row, kept in a table
-- that refresh_ref() recomputes after each change of the words.
CREATE VIEW ref_now AS
	SELECT q.qid, w.id, w.ctid AS tid, :dist AS d FROM queries q, words w WHERE w.word IS NOT NULL;
CREATE TABLE ref AS SELECT * FROM ref_now;
CREATE FUNCTION refresh_ref() RETURNS bigint LANGUAGE sql AS $$
	TRUNCATE ref;
	INSERT INTO ref SELECT * FROM ref_now;
	ANALYZE ref;
	SELECT count(*) FROM ref;
$$;
-- <~> equals the reference on every pair (levenshtein where installed).
SELECT count(*) AS pairs, count(*) FILTER (WHERE r.d <> (w.word <~> q.q)) AS mismatches
FROM ref r JOIN words w ON w.id = r.id JOIN queries q ON q.qid = r.qid;

-- What an index returns for every query at radii 0..3 against the
-- reference: answers, and the ones missing or extra (both must be 0).
CREATE FUNCTION range_check() RETURNS TABLE (radius int, answers bigint, missing bigint, extra bigint)
LANGUAGE sql AS $$
	WITH got AS (SELECT q.qid, r.radius, w.id
				 FROM queries q CROSS JOIN generate_series(0, 3) r(radius),
					  LATERAL (SELECT id FROM words w WHERE w.word <% edit_range(q.q, r.radius)) w),
		 want AS (SELECT qid, r.radius, id FROM ref CROSS JOIN generate_series(0, 3) r(radius) WHERE d <= r.radius)
	SELECT r.radius,
		   (SELECT count(*) FROM want WHERE want.radius = r.radius),
		   (SELECT count(*) FROM (SELECT * FROM want WHERE want.radius = r.radius
								  EXCEPT SELECT * FROM got WHERE got.radius = r.radius) x),
		   (SELECT count(*) FROM (SELECT * FROM got WHERE got.radius = r.radius
								  EXCEPT SELECT * FROM want WHERE want.radius = r.radius) x)
	FROM generate_series(0, 3) r(radius) ORDER BY 1
$$;
-- Queries whose k nearest (ORDER BY <~> LIMIT k) are not the reference's
-- k first by (distance, heap TID): the index returns ties in TID order.
CREATE FUNCTION knn_check(k int) RETURNS bigint LANGUAGE sql AS $$
	SELECT count(*) FROM queries q
	WHERE ARRAY(SELECT w.id FROM words w ORDER BY w.word <~> q.q LIMIT k) IS DISTINCT FROM
		  ARRAY(SELECT id FROM ref WHERE ref.qid = q.qid ORDER BY d, tid LIMIT k)
$$;
-- The same through the batch functions (an index named explicitly).
CREATE FUNCTION batch_check(idx regclass) RETURNS TABLE (radius int, range_mismatches bigint, knn_mismatches bigint)
LANGUAGE sql AS $$
	SELECT r.radius,
		   (SELECT count(*) FROM (
				(SELECT q.qid, b.tid, b.distance FROM gpu_metric_range_batch(idx, (SELECT array_agg(q ORDER BY qid) FROM queries), r.radius) b
				 JOIN queries q ON q.qid = b.query
				 EXCEPT SELECT qid, tid, d FROM ref WHERE d <= r.radius)
				UNION ALL
				(SELECT qid, tid, d FROM ref WHERE d <= r.radius
				 EXCEPT SELECT q.qid, b.tid, b.distance FROM gpu_metric_range_batch(idx, (SELECT array_agg(q ORDER BY qid) FROM queries), r.radius) b
				 JOIN queries q ON q.qid = b.query)) x),
		   (SELECT count(*) FROM queries q
			WHERE ARRAY(SELECT b.tid FROM gpu_metric_knn_batch(idx, ARRAY[q.q], 5 * (r.radius + 1)) b ORDER BY b.rank) IS DISTINCT FROM
				  ARRAY(SELECT tid FROM ref WHERE ref.qid = q.qid ORDER BY d, tid LIMIT 5 * (r.radius + 1)))
	FROM generate_series(0, 3) r(radius) ORDER BY 1
$$;
-- Index scans, bitmap scans, k-NN for LIMIT 1, 10 and every row, batches.
CREATE FUNCTION check_exact(idx regclass) RETURNS TABLE (path text, radius int, answers bigint, missing bigint, extra bigint)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('enable_seqscan', 'off', true);
	PERFORM set_config('enable_bitmapscan', 'off', true);
	RETURN QUERY SELECT 'index scan', c.* FROM range_check() c;
	PERFORM set_config('enable_bitmapscan', 'on', true);
	PERFORM set_config('enable_indexscan', 'off', true);
	RETURN QUERY SELECT 'bitmap scan', c.* FROM range_check() c;
	PERFORM set_config('enable_indexscan', 'on', true);
	RETURN QUERY SELECT 'k-NN, k = ' || k, NULL::int, NULL::bigint, knn_check(k), NULL::bigint
		FROM unnest(ARRAY[1, 10, 100000]) k;
	RETURN QUERY SELECT 'batch range, k-NN', b.radius, NULL::bigint, b.range_mismatches, b.knn_mismatches
		FROM batch_check(idx) b;
END
$$;

--
-- List of Clusters.
--
CREATE INDEX words_lc ON words USING gpu_metric (word) WITH (method = lc, bucket = 4);
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <% edit_range('cassa', 2)$q$) AS "QUERY PLAN";
SET enable_bitmapscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <% edit_range('cassa', 2)$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id, word <~> 'cassa' FROM words ORDER BY word <~> 'cassa' LIMIT 5$q$) AS "QUERY PLAN";
-- The checks' per-query scans are parameterized index scans.
SELECT * FROM explain_plan($q$SELECT q.qid, w.id FROM queries q, LATERAL (SELECT id FROM words w WHERE w.word <% edit_range(q.q, 2)) w$q$) AS "QUERY PLAN";
RESET enable_bitmapscan;
RESET enable_seqscan;
SELECT word, word <~> 'cassa' AS d FROM words WHERE word <% edit_range('cassa', 1) ORDER BY d, word;
-- k-NN: ascending distance, equal distances in heap order.
SET enable_seqscan = off;
SELECT id, word, word <~> 'cassa' AS d FROM words ORDER BY word <~> 'cassa' LIMIT 6;
RESET enable_seqscan;
SELECT * FROM check_exact('words_lc');
DROP INDEX words_lc;
-- The default bucket size.
CREATE INDEX words_lc ON words USING gpu_metric (word);
SELECT * FROM check_exact('words_lc') WHERE missing <> 0 OR extra <> 0;
DROP INDEX words_lc;

--
-- Sparse Spatial Selection.
--
CREATE INDEX words_sss ON words USING gpu_metric (word) WITH (method = sss, alpha = 0.5);
SELECT * FROM check_exact('words_sss');
DROP INDEX words_sss;
CREATE INDEX words_sss ON words USING gpu_metric (word) WITH (method = sss, alpha = 0.3);
SELECT * FROM check_exact('words_sss') WHERE missing <> 0 OR extra <> 0;
DROP INDEX words_sss;

--
-- Two range predicates at once, and a range with an ORDER BY.
--
CREATE INDEX words_lc ON words USING gpu_metric (word) WITH (bucket = 8);
SET enable_seqscan = off;
SELECT word FROM words WHERE word <% edit_range('casa', 2) AND word <% edit_range('caza', 1) ORDER BY word;
-- Both in one index scan: the range's rows by distance, ties in heap order.
SET enable_bitmapscan = off;
SET enable_sort = off;
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <% edit_range('cañon', 2) ORDER BY word <~> 'casa' LIMIT 4$q$) AS "QUERY PLAN";
SELECT id, word, word <~> 'casa' AS d FROM words WHERE word <% edit_range('cañon', 2)
ORDER BY word <~> 'casa' LIMIT 4;
RESET enable_sort;
RESET enable_bitmapscan;
RESET enable_seqscan;
SELECT word FROM words WHERE word <% edit_range('casa', 2) AND word <% edit_range('caza', 1) ORDER BY word;

--
-- NULLs and empty strings.
--
SET enable_seqscan = off;
-- NULL words are not in the index: no range holds them, and an ORDER BY
-- through the index leaves them out (they would sort last).
SELECT count(*) AS in_range FROM words WHERE word <% edit_range('zz', 1000);
SELECT count(*) AS ordered FROM (SELECT id FROM words ORDER BY word <~> 'casa') x;
-- A NULL range holds no row. (ORDER BY word <~> NULL is a constant NULL
-- to the planner: no index scan orders by it.)
SELECT count(*) FROM words WHERE word <% NULL::edit_range;
SELECT count(*) FROM words WHERE word <% edit_range('casa', NULL);
SELECT count(*) AS rows, count(word <~> NULL) AS distances FROM (SELECT word FROM words ORDER BY word <~> NULL LIMIT 1000) x;
-- The empty word is indexed; the empty query ranks words by length.
SELECT quote_literal(word) AS word FROM words WHERE word <% edit_range('', 1) ORDER BY word;
SELECT quote_literal(word) AS word, word <~> '' AS d FROM words ORDER BY word <~> '' LIMIT 3;
RESET enable_seqscan;

--
-- Inserts, updates, deletes and VACUUM keep both methods exact. Both
-- indexes take every change; each is checked alone (the other dropped in a
-- transaction rolled back after the check), so that its scans serve.
--
-- Index scans (ranges at radii 0..3, the 10 nearest) against the
-- reference: a lighter check_exact for the steps in between.
CREATE FUNCTION check_quick(idx regclass) RETURNS TABLE (path text, radius int, answers bigint, missing bigint, extra bigint)
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('enable_seqscan', 'off', true);
	PERFORM set_config('enable_bitmapscan', 'off', true);
	RETURN QUERY SELECT 'index scan', c.* FROM range_check() c;
	RETURN QUERY SELECT 'k-NN, k = 10', NULL::int, NULL::bigint, knn_check(10), NULL::bigint;
END
$$;
CREATE INDEX words_sss ON words USING gpu_metric (word) WITH (method = sss);
-- New words: edits of existing ones and fresh ones, enough for new pages
-- (a few hundred records fit a page) and new clusters.
INSERT INTO words (word)
SELECT CASE WHEN i % 3 = 0 THEN overlay(w.word placing 'x' from 1 + i % greatest(length(w.word), 1) for 1)
			WHEN i % 3 = 1 THEN w.word || chr(97 + i % 26)
			ELSE chr(97 + i % 26) || chr(97 + (i / 26) % 26) || 'ño' END
FROM generate_series(1, 1500) i JOIN words w ON w.id = 1 + (i * 37) % 600;
UPDATE words SET word = word || 'z' WHERE id % 50 = 0;
SELECT count(*) AS words FROM words;
SELECT refresh_ref() AS pairs;
BEGIN;
DROP INDEX words_sss;
SELECT 'lc' AS method, * FROM check_quick('words_lc');
ROLLBACK;
BEGIN;
DROP INDEX words_lc;
SELECT 'sss' AS method, * FROM check_quick('words_sss');
ROLLBACK;
DELETE FROM words WHERE id % 7 = 0;
SELECT refresh_ref() AS pairs;
BEGIN;
DROP INDEX words_sss;
SELECT 'lc' AS method, * FROM check_quick('words_lc') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
BEGIN;
DROP INDEX words_lc;
SELECT 'sss' AS method, * FROM check_quick('words_sss') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
VACUUM words;
BEGIN;
DROP INDEX words_sss;
SELECT 'lc' AS method, * FROM check_exact('words_lc') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
BEGIN;
DROP INDEX words_lc;
SELECT 'sss' AS method, * FROM check_exact('words_sss') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
-- Inserts after VACUUM, rolled back ones (dead entries) and VACUUM again.
BEGIN;
INSERT INTO words (word) SELECT word || 'q' FROM words WHERE id % 5 = 0;
ROLLBACK;
INSERT INTO words (word) SELECT 'ca' || word FROM words WHERE id % 11 = 0;
SELECT refresh_ref() AS pairs;
BEGIN;
DROP INDEX words_sss;
SELECT 'lc' AS method, * FROM check_quick('words_lc') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
BEGIN;
DROP INDEX words_lc;
SELECT 'sss' AS method, * FROM check_quick('words_sss') WHERE missing <> 0 OR extra <> 0;
ROLLBACK;
VACUUM words;
BEGIN;
DROP INDEX words_sss;
SELECT 'lc' AS method, * FROM check_exact('words_lc');
ROLLBACK;
BEGIN;
DROP INDEX words_lc;
SELECT 'sss' AS method, * FROM check_exact('words_sss');
ROLLBACK;
-- The index's live entries, as VACUUM counts them.
SELECT relname, reltuples::int = (SELECT count(word) FROM words) AS counted
FROM pg_class WHERE relname IN ('words_lc', 'words_sss') ORDER BY 1;

--
-- The planner: the index for ranges and ORDER BY ... LIMIT, not for others.
--
DROP INDEX words_sss;
ANALYZE words;
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <% edit_range('cassa', 1)$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM words ORDER BY word <~> 'cassa' LIMIT 10$q$) AS "QUERY PLAN";
-- Every row by distance: a sort of a sequential scan.
SELECT * FROM explain_plan($q$SELECT id FROM words ORDER BY word <~> 'cassa'$q$) AS "QUERY PLAN";
-- A radius that holds every word: a sequential scan.
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <% edit_range('cassa', 100)$q$) AS "QUERY PLAN";
-- Other operators: not this index.
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word = 'casa'$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM words WHERE word <~> 'cassa' <= 1$q$) AS "QUERY PLAN";
DROP INDEX words_lc;

--
-- Empty tables, unlogged tables, other column types.
--
CREATE TABLE empty_words (word text);
CREATE INDEX empty_lc ON empty_words USING gpu_metric (word);
CREATE INDEX empty_sss ON empty_words USING gpu_metric (word) WITH (method = sss);
INSERT INTO empty_words VALUES ('casa'), ('cassa'), ('caza'), (NULL), ('perro');
SET enable_seqscan = off;
SELECT word FROM empty_words WHERE word <% edit_range('cosa', 1) ORDER BY word;
SELECT word FROM empty_words ORDER BY word <~> 'perros' LIMIT 2;
SELECT * FROM gpu_metric_knn_batch('empty_sss', ARRAY['cosa'], 10);
DROP INDEX empty_lc;
SELECT word FROM empty_words WHERE word <% edit_range('cosa', 1) ORDER BY word;
RESET enable_seqscan;
CREATE UNLOGGED TABLE unlogged_words (word varchar(20));
CREATE INDEX unlogged_lc ON unlogged_words USING gpu_metric (word);
INSERT INTO unlogged_words SELECT word FROM words WHERE id <= 100;
SET enable_seqscan = off;
SELECT count(*) FROM unlogged_words WHERE word <% edit_range('casa', 2);
SELECT count(*) FROM words WHERE id <= 100 AND word <% edit_range('casa', 2);
RESET enable_seqscan;
DROP TABLE empty_words, unlogged_words;
-- SSS keeps no more pivots than maintenance_work_mem holds (a byte per word
-- and pivot); the index stays exact.
CREATE TABLE pivot_words AS SELECT substr(md5(i::text), 1, 6) AS word FROM generate_series(1, 10000) i;
SET maintenance_work_mem = '1MB';
CREATE INDEX pivot_sss ON pivot_words USING gpu_metric (word) WITH (method = sss, alpha = 0.2);
RESET maintenance_work_mem;
SET enable_seqscan = off;
CREATE TEMP TABLE pivot_hits AS SELECT word FROM pivot_words WHERE word <% edit_range('abcdef', 4);
RESET enable_seqscan;
SELECT count(*) > 0 AS some_hits,
       count(*) = (SELECT count(*) FROM pivot_words WHERE (word <~> 'abcdef') <= 4) AS same_hits
  FROM pivot_hits;
SELECT (SELECT array_agg(distance ORDER BY rank) FROM gpu_metric_knn_batch('pivot_sss', ARRAY['abcdef'], 5)) =
       (SELECT array_agg(d ORDER BY d) FROM (SELECT word <~> 'abcdef' AS d FROM pivot_words ORDER BY 1 LIMIT 5) s)
       AS same_nearest;
DROP TABLE pivot_words, pivot_hits;
-- A table whose words need more than maintenance_work_mem is refused while
-- it is read (the count of words read so far is in the error), not after.
CREATE TABLE many_words AS SELECT substr(md5(i::text), 1, 6) AS word FROM generate_series(1, 30000) i;
SET maintenance_work_mem = '1MB';
CREATE INDEX many_lc ON many_words USING gpu_metric (word);
RESET maintenance_work_mem;
DROP TABLE many_words;
-- Ties go by the rows' own TIDs (ctid), not the index's: a HOT update
-- moves row 1 to the end of the page while the index keeps its chain's root.
CREATE TABLE hot_words (id int, w text, note text) WITH (fillfactor = 50);
INSERT INTO hot_words SELECT i, 'same', 'x' FROM generate_series(1, 50) i;
CREATE INDEX hot_words_lc ON hot_words USING gpu_metric (w);
UPDATE hot_words SET note = 'y' WHERE id = 1;
SELECT (SELECT array_agg(tid ORDER BY rank) FROM gpu_metric_knn_batch('hot_words_lc', ARRAY['same'], 3)) =
       (SELECT array_agg(ctid) FROM (SELECT ctid FROM hot_words ORDER BY ctid LIMIT 3) s) AS knn_ties_by_ctid,
       (SELECT array_agg(tid) FROM gpu_metric_range_batch('hot_words_lc', ARRAY['same'], 0)) =
       (SELECT array_agg(ctid ORDER BY ctid) FROM hot_words) AS range_ties_by_ctid;
-- The index scan orders ties the same way (ORDER BY w <~> q equals ORDER BY w <~> q, ctid).
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT (SELECT array_agg(ctid) FROM (SELECT ctid FROM hot_words ORDER BY w <~> 'same' LIMIT 3) s) =
       (SELECT array_agg(ctid) FROM (SELECT ctid FROM hot_words ORDER BY ctid LIMIT 3) s) AS scan_ties_by_ctid,
       (SELECT array_agg(ctid) FROM (SELECT ctid FROM hot_words WHERE w <% edit_range('sama', 1) ORDER BY w <~> 'sama') s) =
       (SELECT array_agg(ctid ORDER BY ctid) FROM hot_words) AS range_scan_ties_by_ctid;
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP TABLE hot_words;

--
-- Bad input.
--
-- Options: a method's option with the other method, out of range, unknown.
CREATE INDEX bad ON words USING gpu_metric (word) WITH (method = sss, bucket = 8);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (alpha = 0.5);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (method = sss, alpha = 0);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (method = sss, alpha = 1.5);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (method = bktree);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (bucket = 0);
CREATE INDEX bad ON words USING gpu_metric (word) WITH (lists = 4);
-- One text column.
CREATE INDEX bad ON words USING gpu_metric (word, word);
CREATE INDEX bad ON words USING gpu_metric (id);
-- A word too long for an index page.
CREATE TABLE long_words (word text);
CREATE INDEX long_lc ON long_words USING gpu_metric (word);
INSERT INTO long_words VALUES (repeat('a', 3000));
INSERT INTO long_words VALUES (repeat('a', 2000));
SELECT length(word) FROM long_words;
DROP TABLE long_words;
-- Batch functions: radius, k, index kind.
CREATE INDEX words_lc ON words USING gpu_metric (word);
SELECT * FROM gpu_metric_range_batch('words_lc', ARRAY['casa'], -1);
SELECT * FROM gpu_metric_knn_batch('words_lc', ARRAY['casa'], 0);
SELECT * FROM gpu_metric_knn_batch('words_lc', ARRAY['casa'], 1001);
SELECT * FROM gpu_metric_range_batch('words_pkey', ARRAY['casa'], 1);
SELECT * FROM gpu_metric_range_batch('words', ARRAY['casa'], 1);
SELECT * FROM gpu_metric_range_batch(0, ARRAY['casa'], 1);
-- NULL queries have no answers; the others keep their numbers; words come
-- from the index, distances by query.
SELECT query, word, distance FROM gpu_metric_range_batch('words_lc', ARRAY[NULL, 'cassa', NULL, 'cañón'], 1)
ORDER BY query, distance, tid;
SELECT query, rank, word, distance FROM gpu_metric_knn_batch('words_lc', ARRAY['cañón', NULL, ''], 2)
ORDER BY query, rank;
SELECT count(*) FROM gpu_metric_range_batch('words_lc', ARRAY[]::text[], 1);
SELECT count(*) FROM gpu_metric_range_batch('words_lc', NULL, 1);
-- A negative radius in a scan.
SET enable_seqscan = off;
SELECT count(*) FROM words WHERE word <% ('casa', -1)::edit_range;
RESET enable_seqscan;
-- Texts past the longest an edit distance takes (8192 characters) are
-- refused at once, whatever their alphabet: on either side of the
-- operators, in edit_range, as scan and batch queries.
SET statement_timeout = '10s';
SELECT repeat('ab', 200000) <~> repeat('ba', 200000);
SELECT 'casa' <~> repeat('ñb', 4097);
SELECT (SELECT string_agg(chr(i), '') FROM generate_series(65536, 65536 + 9999) i) <~> 'casa';
SELECT repeat('a', 8193) <% edit_range('casa', 1);
SELECT edit_range(repeat('a', 8193), 1);
SELECT 'casa' <% (repeat('a', 8193), 1)::edit_range;
SET enable_seqscan = off;
SELECT count(*) FROM words WHERE word <% (repeat('a', 8193), 1)::edit_range;
SELECT word FROM words ORDER BY word <~> repeat('a', 8193) LIMIT 1;
RESET enable_seqscan;
SELECT * FROM gpu_metric_range_batch('words_lc', ARRAY['casa', repeat('a', 8193)], 1);
SELECT * FROM gpu_metric_knn_batch('words_lc', ARRAY[repeat('a', 8193)], 1);
-- The longest texts are measured, the one of 8192 distinct characters too.
SELECT repeat('ab', 4096) <~> repeat('ba', 4096) AS longest_ab,
       t <~> t AS same, t <~> (substr(t, 2) || 'a') AS shifted,
       repeat('a', 8192) <% edit_range(t, 8192) AS within
FROM (SELECT string_agg(chr(i), '') t FROM generate_series(65536, 65536 + 8191) i) s;
RESET statement_timeout;

--
-- Who may call the batch functions: SELECT on the table, no row-level security.
--
SET client_min_messages = warning;
DROP ROLE IF EXISTS gpu_metric_nobody;
RESET client_min_messages;
CREATE ROLE gpu_metric_nobody;
SET ROLE gpu_metric_nobody;
SELECT * FROM gpu_metric_range_batch('words_lc', ARRAY['casa'], 1);
SELECT * FROM gpu_metric_knn_batch('words_lc', ARRAY['casa'], 1);
RESET ROLE;
GRANT SELECT ON words TO gpu_metric_nobody;
ALTER TABLE words ENABLE ROW LEVEL SECURITY;
CREATE POLICY short_words ON words FOR SELECT USING (length(word) < 6);
SET ROLE gpu_metric_nobody;
SELECT * FROM gpu_metric_range_batch('words_lc', ARRAY['casa'], 1);
-- Index scans apply the policy.
SET enable_seqscan = off;
SELECT word FROM words WHERE word <% edit_range('casa', 1) ORDER BY word;
SELECT word FROM words ORDER BY word <~> 'casas' LIMIT 3;
RESET enable_seqscan;
RESET ROLE;
ALTER TABLE words DISABLE ROW LEVEL SECURITY;
DROP POLICY short_words ON words;
REVOKE SELECT ON words FROM gpu_metric_nobody;
DROP ROLE gpu_metric_nobody;

-- The operator class is valid; the indexed column is distance-orderable.
SELECT opcname, amvalidate(oid) FROM pg_opclass WHERE opcname = 'text_edit_ops';
SELECT pg_index_column_has_property('words_lc'::regclass, 1, 'distance_orderable') AS distance_orderable,
       pg_index_column_has_property('words_lc'::regclass, 1, 'orderable') AS orderable;
-- Two distances to order by: a scan would follow the first alone, so the
-- index serves neither; the rows come in both keys' order, as the same
-- order by the distance function (which no index serves) gives them.
SELECT array_agg(word) = ARRAY(SELECT word FROM words ORDER BY gpu_metric_edit_distance(word, 'casa'),
                                      gpu_metric_edit_distance(word, 'cosa'), id LIMIT 6)
       AS two_keys_in_order
FROM (SELECT word FROM words ORDER BY word <~> 'casa', word <~> 'cosa', id LIMIT 6) s;

DROP TABLE words CASCADE;
DROP TABLE queries, ref;
DROP FUNCTION refresh_ref(), range_check(), knn_check(int), batch_check(regclass), check_exact(regclass),
	check_quick(regclass), explain_plan(text);
