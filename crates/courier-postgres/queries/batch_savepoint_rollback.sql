-- Undoes the work of the delivery whose handler failed inside an isolating
-- transactional batch, back to its savepoint; the batch's other work stays.
-- Touches: whatever the handler wrote (rolled back); locks nothing new.
ROLLBACK TO SAVEPOINT courier_item
