-- Removes message ?1's deliveries (checked unstarted in the same write
-- transaction); returns how many.
DELETE FROM deliveries WHERE message_id = ?1
