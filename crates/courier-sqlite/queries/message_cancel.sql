-- Removes message ?1 itself, after its deliveries; no row changed means
-- there was no such message.
DELETE FROM messages WHERE id = ?1
