-- Discards dead letters for good (their messages are then pruned by retention).
-- Selected like dead_letters_retry.sql, ?5 (tenants) and ?9 (fingerprint)
-- included.
-- Touches: deliveries (delete); the deliveries_discarded trigger records each
-- in discards (migrations/0007_plain_completions.sql), so that the admin views
-- do not take the delivery it leaves missing for a completion.
-- Locks: one autocommit statement.
DELETE FROM deliveries
WHERE state = 'dead'
  AND (?5 IS NULL OR tenant IN (SELECT value FROM json_each(?5)))
  AND ((?1 IS NOT NULL AND id IN (SELECT value FROM json_each(?1)))
       OR (?1 IS NULL
           AND (?2 IS NULL OR tenant = ?2)
           AND (?3 IS NULL OR topic = ?3)
           AND (?4 IS NULL OR subscription = ?4)
           AND (?6 IS NULL OR message_id = ?6)
           AND (?7 IS NULL OR dead_at >= ?7)
           AND (?8 IS NULL OR dead_at < ?8)
           AND (?9 IS NULL OR coalesce(error_fingerprint, 'unknown') = ?9)))
