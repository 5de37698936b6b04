-- Deletes up to $1 marks whose delivery no longer waits and that came due
-- more than a minute ago, for subscriptions no claimer reads any more
-- (claimers delete their own, see claim_marks_due.sql). Skips rows another
-- statement holds. Touches: claim_marks, reads deliveries by primary key.
DELETE FROM {schema}.claim_marks m
WHERE (m.subscription, m.delivery_id) IN (
  SELECT s.subscription, s.delivery_id FROM {schema}.claim_marks s
  WHERE s.due_at < statement_timestamp() - interval '1 minute'
    AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                    WHERE d.id = s.delivery_id AND d.state = 'available')
  LIMIT $1
  FOR UPDATE SKIP LOCKED
)
