-- Courier's outbox schema, version 18: the native relay's look and append
-- serialized per (stream, message).
--
-- The native relay appends a message to a stream in the delivery's own
-- transaction unless the stream already holds an entry of that message.
-- As one statement (schema 11's index, session 30's query) the look read
-- the statement's snapshot: two transactions relaying one message to one
-- stream at once (two subscriptions relaying a topic into the same stream)
-- each missed the other's uncommitted entry, and both appended. The index
-- cannot be UNIQUE (see 0011), so the relay takes a transaction-level
-- advisory lock on (tenant, stream, message id) first and only then looks:
-- in a volatile function at READ COMMITTED each statement takes a new
-- snapshot, so the look, run once the lock is granted, sees the entry of a
-- transaction that held it and committed. Still one round trip.
--
-- The look keeps the OFFSET 0 fence of schema 11's query: without it a
-- generic plan (plpgsql caches one after five calls) walks the stream in
-- id order filtering on message_id.
CREATE FUNCTION {schema}.relay_append(
  p_tenant text, p_stream text, p_payload jsonb, p_headers jsonb,
  p_message_id uuid, p_origin_tenant text, p_topic text, p_schema_version integer,
  OUT entry_major bigint, OUT entry_minor bigint, OUT is_duplicate boolean
) LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(
    '{schema}:relay:' || p_tenant || chr(10) || p_stream || chr(10) || p_message_id::text, 0));
  SELECT o.major, o.minor INTO entry_major, entry_minor
  FROM (
    SELECT e.major, e.minor
    FROM {schema}.stream_entries e
    WHERE e.tenant = p_tenant AND e.stream = p_stream AND e.message_id = p_message_id
    OFFSET 0
  ) o
  ORDER BY o.major, o.minor
  LIMIT 1;
  IF FOUND THEN
    is_duplicate := true;
    RETURN;
  END IF;
  -- As in stream_append: only the stream's readers wake, at commit.
  PERFORM pg_notify('{schema}.streams', p_tenant || chr(10) || p_stream)
  FROM {schema}.stream_waiters w
  WHERE w.tenant = p_tenant AND w.stream = p_stream AND w.until > statement_timestamp();
  INSERT INTO {schema}.stream_entries AS e
    (tenant, stream, major, minor, payload, headers, message_id, origin_tenant, topic,
     schema_version)
  VALUES (p_tenant, p_stream, pg_current_xact_id()::text::bigint,
          nextval('{schema}.stream_entry_minor'), p_payload, p_headers, p_message_id,
          p_origin_tenant, p_topic, p_schema_version)
  RETURNING e.major, e.minor INTO entry_major, entry_minor;
  is_duplicate := false;
END
$fn$;
