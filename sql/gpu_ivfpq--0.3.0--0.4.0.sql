-- gpu_ivfpq 0.3.0 -> 0.4.0: scans reach the GPU process through the direct
-- path, and the status view shows its stages (queue wait, waiting for the
-- change log, the GPU's work, delivering the answers) instead of the
-- service's rounds.
\echo Use "ALTER EXTENSION gpu_ivfpq UPDATE TO '0.4.0'" to load this file. \quit

DROP VIEW gpu_ivfpq_status;
DROP FUNCTION gpu_ivfpq_status();
CREATE FUNCTION gpu_ivfpq_status(
	OUT state text, OUT service_pid int4, OUT device text, OUT service_starts int4,
	OUT started_at timestamptz, OUT queries_gpu int8, OUT queries_cpu int8,
	OUT gpu_fallbacks int8, OUT batches int8, OUT mean_batch float8, OUT batch_histogram int8[],
	OUT mirrors int4, OUT memory_used_mb float8, OUT memory_budget_mb float8, OUT last_error text,
	OUT gpu_process_pid int4, OUT gpu_restarts int4, OUT last_gpu_exit text,
	OUT last_gpu_exit_at timestamptz, OUT queued_searches int8, OUT mean_queue_wait_us float8,
	OUT mean_log_wait_us float8, OUT mean_gpu_us float8, OUT mean_deliver_us float8,
	OUT append_calls int8, OUT mean_append_us float8, OUT mean_append_device_us float8)
	RETURNS record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_status AS SELECT * FROM gpu_ivfpq_status();

REVOKE ALL ON FUNCTION gpu_ivfpq_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpu_ivfpq_status() TO pg_monitor;
GRANT SELECT ON gpu_ivfpq_status TO pg_monitor;
COMMENT ON FUNCTION gpu_ivfpq_status() IS 'the GPU service''s state and counters (the view gpu_ivfpq_status)';
COMMENT ON VIEW gpu_ivfpq_status IS 'the GPU service''s state and counters';
