-- ALTER EXTENSION gpu_ivfpq UPDATE brings an install of an older version to
-- exactly what a fresh install of the current version has: the same objects
-- (pg_describe_object over the extension's pg_depend entries), with the same
-- descriptions, definitions and privileges. Also: every object of a fresh
-- install has a description. In a database of its own.
SET client_min_messages = warning;
\set test_db :DBNAME
CREATE DATABASE gpu_ivfpq_update;
\c gpu_ivfpq_update
SET client_min_messages = warning;

CREATE TABLE ext_objects (install text, object text, description text, definition text);
-- What an object is, beyond its name: a function's definition and ACL, a
-- view's query and ACL, an operator's function and commutator, an operator
-- family's members, an access method's handler.
CREATE FUNCTION record_objects(install text) RETURNS void LANGUAGE sql AS $$
INSERT INTO ext_objects
SELECT install, pg_describe_object(d.classid, d.objid, 0),
       obj_description(d.objid, c.relname),
       CASE c.relname
         WHEN 'pg_proc' THEN (SELECT pg_get_functiondef(p.oid) || coalesce(p.proacl::text, '')
                              FROM pg_proc p WHERE p.oid = d.objid)
         WHEN 'pg_class' THEN (SELECT pg_get_viewdef(r.oid) || coalesce(r.relacl::text, '')
                               FROM pg_class r WHERE r.oid = d.objid)
         WHEN 'pg_operator' THEN (SELECT o.oprcode::text || ' ' || o.oprcom::regoperator::text
                                  FROM pg_operator o WHERE o.oid = d.objid)
         WHEN 'pg_opfamily' THEN (SELECT string_agg(m, ', ' ORDER BY m) FROM (
                                    SELECT pg_describe_object('pg_amop'::regclass, a.oid, 0) || ' ' || a.amoppurpose::text AS m
                                    FROM pg_amop a WHERE a.amopfamily = d.objid
                                    UNION ALL
                                    SELECT pg_describe_object('pg_amproc'::regclass, a.oid, 0)
                                    FROM pg_amproc a WHERE a.amprocfamily = d.objid) members)
         WHEN 'pg_opclass' THEN (SELECT o.opcintype::regtype::text || ' ' || o.opcdefault
                                 FROM pg_opclass o WHERE o.oid = d.objid)
         WHEN 'pg_am' THEN (SELECT a.amhandler::text FROM pg_am a WHERE a.oid = d.objid)
       END
FROM pg_depend d JOIN pg_class c ON c.oid = d.classid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'gpu_ivfpq')
  -- Newer PostgreSQL versions also record the implicit types as members (a
  -- view's row type, the array type of every type): they come with their
  -- view or type, so they are left out and every version lists the same.
  AND NOT EXISTS (SELECT 1 FROM pg_type t
                  WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                    AND (EXISTS (SELECT 1 FROM pg_type e WHERE e.typarray = t.oid)
                         OR EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.typrelid AND r.relkind <> 'c')))
$$;

-- The oldest version, updated to the current one.
CREATE EXTENSION gpu_ivfpq VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'gpu_ivfpq';
SELECT record_objects('0.1.0');
ALTER EXTENSION gpu_ivfpq UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'gpu_ivfpq') AS current_version
FROM pg_extension WHERE extname = 'gpu_ivfpq';
SELECT record_objects('updated');
DROP EXTENSION gpu_ivfpq;

-- A fresh install of the current version.
CREATE EXTENSION gpu_ivfpq;
SELECT record_objects('fresh');

-- No differences, in either direction.
(SELECT 'only after the update' AS where_, object, description, definition FROM ext_objects WHERE install = 'updated'
 EXCEPT SELECT 'only after the update', object, description, definition FROM ext_objects WHERE install = 'fresh')
UNION ALL
(SELECT 'only in a fresh install', object, description, definition FROM ext_objects WHERE install = 'fresh'
 EXCEPT SELECT 'only in a fresh install', object, description, definition FROM ext_objects WHERE install = 'updated');
SELECT install, count(*) AS objects, count(description) AS described FROM ext_objects GROUP BY install ORDER BY install;
-- The comparison sees what an update changes: 0.1.0 lacked the descriptions.
SELECT count(*) AS differing_before_the_update FROM (
	SELECT object, description, definition FROM ext_objects WHERE install = '0.1.0'
	EXCEPT SELECT object, description, definition FROM ext_objects WHERE install = 'fresh') d;
SELECT object AS undescribed FROM ext_objects WHERE install = 'fresh' AND description IS NULL;

-- The objects, as \dx+ lists them (without the implicit types).
SELECT object AS "Object description" FROM ext_objects WHERE install = 'fresh' ORDER BY 1;

-- Every version on offer has an update path to the current one.
SELECT source, target FROM pg_extension_update_paths('gpu_ivfpq')
WHERE path IS NOT NULL AND target = (SELECT default_version FROM pg_available_extensions WHERE name = 'gpu_ivfpq')
ORDER BY 1;

\c :test_db
SET client_min_messages = warning;
DROP DATABASE gpu_ivfpq_update;
