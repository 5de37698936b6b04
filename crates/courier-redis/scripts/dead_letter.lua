-- Moves a pending entry to the dead-letter stream: appends it there and acks
-- it in its group, both or neither.
--
-- KEYS[1]: the stream, KEYS[2]: its dead-letter stream. ARGV[1]: group,
-- ARGV[2]: the entry's id, ARGV[3..]: the dead-letter entry's fields.
-- Returns 1 when the entry was pending (appended and acked), 0 when it was
-- not (nothing changed: another consumer acked it).
--
-- The pending check reads only, the XADD is the only write that can fail
-- (wrong type, ids exhausted, out of memory) and comes before the XACK, which
-- cannot fail once the check passed: an error leaves both streams as they
-- were. NOGROUP when the key or group does not exist.
local key, dead, group, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if #redis.call('XPENDING', key, group, id, id, 1) == 0 then
  return 0
end
redis.call('XADD', dead, '*', unpack(ARGV, 3))
redis.call('XACK', key, group, id)
return 1
