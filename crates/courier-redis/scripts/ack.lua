-- Acknowledges ids in a group and returns how many were pending.
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2..]: ids.
--
-- XACK answers 0 for a group that does not exist; this script tells that
-- apart from "nothing was pending" by asking XPENDING (count 0 reads nothing
-- but fails with NOGROUP for a missing key or group). XACK goes in chunks
-- because unpack() is limited to a few thousand values. Touches only KEYS[1].
local key, group = KEYS[1], ARGV[1]
local acked = 0
for first = 2, #ARGV, 1000 do
  acked = acked + redis.call('XACK', key, group, unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if acked == 0 then
  redis.call('XPENDING', key, group, '-', '+', 0)
end
return acked
