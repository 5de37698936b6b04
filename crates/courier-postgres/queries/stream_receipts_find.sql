-- Which of the correlation ids $2 have a receipt of subscription $1.
SELECT r.correlation_id
FROM {schema}.stream_receipts r
WHERE r.subscription = $1 AND r.correlation_id = ANY ($2::text[])
