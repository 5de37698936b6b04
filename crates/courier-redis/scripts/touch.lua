-- Restarts the idle time of the entries that are pending to a consumer,
-- without counting a delivery: XCLAIM ... JUSTID to the consumer that
-- already holds each, checked first with XPENDING so that an entry another
-- consumer claimed meanwhile is left to it, and with XRANGE so that a
-- trimmed entry is left pending (XCLAIM would drop it from the pending
-- list, and its re-read or claim would no longer report it deleted).
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer, ARGV[3..]: ids.
-- Returns how many were pending to the consumer. Touches only KEYS[1].
-- NOGROUP when the key or group does not exist.
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local touched = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer
    and #redis.call('XRANGE', key, id, id) == 1 then
    redis.call('XCLAIM', key, group, consumer, 0, id, 'JUSTID')
    touched = touched + 1
  end
end
return touched
