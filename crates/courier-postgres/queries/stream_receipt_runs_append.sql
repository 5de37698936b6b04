-- Writes subscription $1's receipts of one run of stream $2's entries,
-- majors $3 and minors $4 (stored form, migration 0017; sorted, spanning at
-- most the run span), as one row, without looking for receipts already
-- stored: the caller found none when it looked them up before running their
-- handlers. An entry recorded meanwhile by another consumer is stored twice,
-- and lookups still find it once.
INSERT INTO {schema}.stream_receipt_runs
  (subscription, stream, first_major, last_major, majors, minors)
VALUES ($1, $2, $3[1], $3[cardinality($3)], $3, $4)
