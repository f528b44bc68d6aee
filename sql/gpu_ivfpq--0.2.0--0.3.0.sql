-- gpu_ivfpq 0.2.0 -> 0.3.0: the mirrors view shows each mirror's placement
-- over the GPUs, and a view lists the GPUs.
\echo Use "ALTER EXTENSION gpu_ivfpq UPDATE TO '0.3.0'" to load this file. \quit

DROP VIEW gpu_ivfpq_mirrors;
DROP FUNCTION gpu_ivfpq_mirrors();
CREATE FUNCTION gpu_ivfpq_mirrors(
	OUT datid oid, OUT indexrelid oid, OUT relfilenode oid, OUT build_id int8,
	OUT entries int8, OUT size_mb float8, OUT queries int8, OUT vectors bool, OUT filter_keys bool,
	OUT placement text, OUT devices int4[])
	RETURNS SETOF record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_mirrors AS
	SELECT m.datid, d.datname, m.indexrelid,
		   CASE WHEN m.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
				THEN m.indexrelid::regclass::text END AS index,
		   m.relfilenode, m.build_id, m.entries, m.size_mb, m.queries, m.vectors, m.filter_keys,
		   m.placement, m.devices
	FROM gpu_ivfpq_mirrors() m LEFT JOIN pg_database d ON d.oid = m.datid;


-- The GPUs of the GPU process: memory, work and health of each.
CREATE FUNCTION gpu_ivfpq_devices(
	OUT device int4, OUT description text, OUT alive bool, OUT memory_budget_mb float8,
	OUT memory_used_mb float8, OUT mirrors int4, OUT queries int8, OUT batches int8, OUT busy_ms float8)
	RETURNS SETOF record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_devices AS SELECT * FROM gpu_ivfpq_devices();

REVOKE ALL ON FUNCTION gpu_ivfpq_mirrors(), gpu_ivfpq_devices() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpu_ivfpq_mirrors(), gpu_ivfpq_devices() TO pg_monitor;
GRANT SELECT ON gpu_ivfpq_mirrors, gpu_ivfpq_devices TO pg_monitor;

COMMENT ON FUNCTION gpu_ivfpq_mirrors() IS 'indexes mirrored in GPU memory (the view gpu_ivfpq_mirrors)';
COMMENT ON VIEW gpu_ivfpq_mirrors IS 'indexes mirrored in GPU memory, in every database';
COMMENT ON FUNCTION gpu_ivfpq_devices() IS 'the GPUs the service uses (the view gpu_ivfpq_devices)';
COMMENT ON VIEW gpu_ivfpq_devices IS 'the GPUs the service uses: memory, work and health of each';
