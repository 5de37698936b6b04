-- Claims idle pending entries for a consumer and returns each with its
-- delivery count as it stands after the claim.
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer, ARGV[3]: min idle
-- (ms), ARGV[4]: cursor (inclusive), ARGV[5]: count.
-- Returns {next cursor, {{id, deliveries, fields}, ...}, {deleted id, ...}}.
--
-- XAUTOCLAIM scans at most 10 x count pending entries from the cursor, takes
-- the idle ones over (one more delivery each), drops pending ids whose entry
-- was trimmed (Redis 7) and returns where the scan stopped (0-0: the end).
-- Its reply carries no counts, so XPENDING reads each claimed id's count in
-- the same script: no other claim or ack comes between them. One XPENDING
-- per id, not a range, because the claimer may own other entries between the
-- first and the last claimed one. XAUTOCLAIM creates the claiming consumer
-- only when it takes something (Redis 7.0); XGROUP CREATECONSUMER makes it
-- exist from its first claim on. Touches only KEYS[1]. NOGROUP when the key
-- or group does not exist.
local key, group = KEYS[1], ARGV[1]
local reply = redis.call('XAUTOCLAIM', key, group, ARGV[2], ARGV[3], ARGV[4],
  'COUNT', ARGV[5])
redis.call('XGROUP', 'CREATECONSUMER', key, group, ARGV[2])

local out = {}
for i, entry in ipairs(reply[2]) do
  local row = redis.call('XPENDING', key, group, entry[1], entry[1], 1)
  local deliveries = 0
  if row[1] then
    deliveries = row[1][4]
  end
  out[i] = {entry[1], deliveries, entry[2]}
end
return {reply[1], out, reply[3] or {}}
