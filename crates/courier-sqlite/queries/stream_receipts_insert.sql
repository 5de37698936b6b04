-- Writes subscription ?1's receipts for the correlation ids ?2 (a JSON
-- array); the rows changed are the new ones. Touches: stream_receipts.
INSERT INTO stream_receipts (subscription, correlation_id)
SELECT ?1, value FROM json_each(?2) WHERE true
ON CONFLICT (subscription, correlation_id) DO NOTHING
