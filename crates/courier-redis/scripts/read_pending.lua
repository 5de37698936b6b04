-- Re-reads a consumer's own pending entries and returns each with its
-- delivery count as it stands after the read.
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer, ARGV[3]: the id to
-- read after (exclusive), ARGV[4]: count.
-- Returns {id, deliveries, fields} per entry, fields nil for an entry that
-- was trimmed or deleted (still pending).
--
-- XREADGROUP with an explicit id serves the consumer's pending list: it adds
-- one delivery and refreshes the delivery time of each entry still in the
-- stream, and reports the others as {id, nil} without counting them. Its
-- reply carries no counts, so XPENDING over the same ids reads them; both run
-- in this one script so no other client's claim or ack comes between them.
-- Touches only KEYS[1]. NOGROUP when the key or group does not exist.
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', ARGV[4],
  'STREAMS', key, ARGV[3])
local entries = {}
if read and read[1] then
  entries = read[1][2]
end
if #entries == 0 then
  return {}
end

local deliveries = {}
local pending = redis.call('XPENDING', key, group, entries[1][1], entries[#entries][1],
  #entries, consumer)
for _, row in ipairs(pending) do
  deliveries[row[1]] = row[4]
end

local out = {}
for i, entry in ipairs(entries) do
  out[i] = {entry[1], deliveries[entry[1]] or 0, entry[2]}
end
return out
