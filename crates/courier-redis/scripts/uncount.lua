-- Takes back the latest delivery of the entries that are pending to a
-- consumer: XCLAIM ... RETRYCOUNT (count - 1, not below 0) IDLE (its idle
-- time) JUSTID to the consumer that already holds each, so the count drops
-- and neither the owner nor the idle time changes. Checked first with
-- XPENDING (an entry another consumer claimed meanwhile is left to it) and
-- with XRANGE (XCLAIM would drop a trimmed entry from the pending list, and
-- its re-read or claim would no longer report it deleted).
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer, ARGV[3..]: ids.
-- Returns how many were taken back. Touches only KEYS[1]. NOGROUP when the
-- key or group does not exist.
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local uncounted = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', key, group, id, id, 1)
  if #pending == 1 and pending[1][2] == consumer
    and #redis.call('XRANGE', key, id, id) == 1 then
    local idle, deliveries = pending[1][3], pending[1][4]
    redis.call('XCLAIM', key, group, consumer, 0, id, 'IDLE', idle,
      'RETRYCOUNT', math.max(deliveries - 1, 0), 'JUSTID')
    uncounted = uncounted + 1
  end
end
return uncounted
