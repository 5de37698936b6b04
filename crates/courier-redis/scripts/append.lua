-- Appends a batch of entries to one stream, all or nothing.
--
-- KEYS[1]: the stream. ARGV: for each entry, its number of field/value
-- arguments, then those arguments (`3 payload {} headers {...}` ...).
-- Returns the new ids in order.
--
-- Touches only KEYS[1]. A script runs alone, so no reader ever sees part of
-- the batch. Redis has no rollback: an XADD that fails after others went in
-- (the stream's ids exhausted, say) is undone here by deleting what this call
-- added, and the stream itself if this call created it, before the error is
-- returned; only the stream's id counter stays advanced, so ids are never
-- reused. The first XADD is the first write, so an out-of-memory refusal
-- comes before anything changed.
local key = KEYS[1]
local kind = redis.call('TYPE', key).ok
if kind ~= 'stream' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local function undo(ids)
  if kind == 'none' then
    redis.call('DEL', key)
    return
  end
  -- unpack() is limited to a few thousand values: delete in chunks.
  for first = 1, #ids, 1000 do
    redis.call('XDEL', key, unpack(ids, first, math.min(first + 999, #ids)))
  end
end

local ids = {}
local at = 1
while at <= #ARGV do
  local n = tonumber(ARGV[at])
  local reply = redis.pcall('XADD', key, '*', unpack(ARGV, at + 1, at + n))
  if type(reply) == 'table' and reply.err then
    undo(ids)
    return reply
  end
  ids[#ids + 1] = reply
  at = at + n + 1
end
return ids
