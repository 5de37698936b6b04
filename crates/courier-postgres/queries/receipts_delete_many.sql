-- Takes back the receipts of deliveries whose handlers failed inside an
-- isolating transactional batch (their work was rolled back to its
-- savepoint; the receipts were written for the whole batch up front), in the
-- batch's transaction, so that the next attempt applies the effect.
DELETE FROM {schema}.receipts r
USING unnest($1::uuid[], $2::text[]) AS f (message_id, subscription)
WHERE r.message_id = f.message_id AND r.subscription = f.subscription
