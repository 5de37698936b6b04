-- Courier's outbox schema, version 17: plain stream subscriptions' receipts
-- as runs.
--
-- A plain (non-transactional) stream handler's receipts are written after
-- its batch's effects, one statement per batch. As one row per entry they
-- cost each entry a heap tuple and two index entries (the primary key on
-- the `{subscription}:{stream}:{id}` text and `created_at`): 125 bytes a
-- receipt, and writing 100 took 0.8 ms (BENCHMARKS.md, session 24). Here a
-- batch of one stream is one row per run: the entry ids (majors and minors
-- in parallel arrays, sorted), found through the run's highest major; 21
-- bytes a receipt, 0.5 ms for 100.
--
-- A run spans at most 1,000 majors (last_major - first_major <= 1000; the
-- writer splits a batch that spans more), so the runs holding any of a set
-- of ids are among those with last_major between the set's lowest major and
-- its highest plus 1,000 and first_major at most its highest. A lookup is
-- split the way a batch is (each part spans at most 1,000 majors), so it
-- reads only runs overlapping its parts: a lookup of new entries (above
-- every run) reads one index page and no run, and two ids an hour apart are
-- two probes, not a scan of the hour.
--
-- Majors and minors are u64; they are stored with the sign bit flipped
-- (v XOR 2^63 as bigint), which keeps their order.
--
-- stream_receipts stays: transactional handlers write their receipt in
-- their effect's transaction there, and receipts written before this
-- migration are found there as before.
CREATE TABLE {schema}.stream_receipt_runs (
  subscription text        NOT NULL,
  stream       text        NOT NULL,
  first_major  bigint      NOT NULL,
  last_major   bigint      NOT NULL,
  majors       bigint[]    NOT NULL,
  minors       bigint[]    NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT statement_timestamp(),
  CHECK (first_major <= last_major),
  CHECK (cardinality(majors) = cardinality(minors) AND cardinality(majors) > 0)
);

CREATE INDEX stream_receipt_runs_last
  ON {schema}.stream_receipt_runs (subscription, stream, last_major, first_major);
CREATE INDEX stream_receipt_runs_created
  ON {schema}.stream_receipt_runs (created_at);
