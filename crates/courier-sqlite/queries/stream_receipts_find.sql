-- Which of the correlation ids ?2 (a JSON array) have a receipt of
-- subscription ?1. Touches: stream_receipts (read).
SELECT r.correlation_id
FROM stream_receipts r
WHERE r.subscription = ?1
  AND r.correlation_id IN (SELECT value FROM json_each(?2))
