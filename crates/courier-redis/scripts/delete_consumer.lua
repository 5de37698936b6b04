-- Deletes a consumer unless it has pending entries.
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer.
-- Returns {'deleted', 0}, {'missing', 0} or {'pending', count}.
--
-- XGROUP DELCONSUMER alone drops the consumer's pending entries (they would
-- never be delivered again) and answers 0 both for a consumer without
-- entries and for one that does not exist. XINFO CONSUMERS tells which case
-- this is and how many entries are pending, and the check and the delete run
-- in one script so no read can hand the consumer an entry between them.
-- Touches only KEYS[1]. NOGROUP when the key or group does not exist.
local key, group, name = KEYS[1], ARGV[1], ARGV[2]
redis.call('XPENDING', key, group, '-', '+', 0)
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', key, group)) do
  local found, pending = false, 0
  for i = 1, #consumer, 2 do
    if consumer[i] == 'name' and consumer[i + 1] == name then
      found = true
    elseif consumer[i] == 'pending' then
      pending = consumer[i + 1]
    end
  end
  if found then
    if pending > 0 then
      return {'pending', pending}
    end
    redis.call('XGROUP', 'DELCONSUMER', key, group, name)
    return {'deleted', 0}
  end
end
return {'missing', 0}
