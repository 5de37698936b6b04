-- Sums up the streams of one page of a listing: for each key, its length,
-- its newest entry's id and its groups.
--
-- KEYS: the streams, in listing order. No ARGV.
-- Returns one element per key: false (nil to the client) when the key no
-- longer holds a stream (deleted since the SCAN that found it), else
-- {XLEN, the newest id or false when it holds no entry, XINFO GROUPS}.
--
-- Read-only; one script rather than a pipeline of XINFO STREAM so that a
-- page is summed up as of one moment, and because XINFO STREAM and XREVRANGE
-- answer with whole entries (up to a payload's limit each): here only the
-- newest entry's id leaves the server. Each key costs O(1) plus its number
-- of groups (XINFO GROUPS computes each group's lag from counters).
local summaries = {}
for index, key in ipairs(KEYS) do
  if redis.call('TYPE', key).ok ~= 'stream' then
    summaries[index] = false
  else
    local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    local last_id = false
    if #newest > 0 then
      last_id = newest[1][1]
    end
    summaries[index] = {
      redis.call('XLEN', key),
      last_id,
      redis.call('XINFO', 'GROUPS', key),
    }
  end
end
return summaries
