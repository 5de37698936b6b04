-- Courier's outbox schema, version 2: the same name grammar for tenant and
-- topic, checked about 25 times faster. A bounded repetition (`{0,127}`) makes
-- PostgreSQL's regex engine build a large automaton, which cost ~5 µs per
-- check, i.e. most of a batched enqueue; an unbounded class plus a length
-- check accepts exactly the same names.
ALTER TABLE {schema}.messages
  DROP CONSTRAINT messages_tenant_check,
  DROP CONSTRAINT messages_topic_check,
  ADD CONSTRAINT messages_tenant_check
    CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND octet_length(tenant) <= 128),
  ADD CONSTRAINT messages_topic_check
    CHECK (topic ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$' AND octet_length(topic) <= 128);
