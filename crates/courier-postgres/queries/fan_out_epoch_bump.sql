-- Marks a change of the subscriptions' topics, so REPEATABLE READ producers
-- whose snapshot predates it fail to fan out (40001) rather than miss it.
-- Touches: fan_out_epoch. Runs under the fan-out lock.
UPDATE {schema}.fan_out_epoch SET epoch = epoch + 1 WHERE id = 1
