-- Appends one relayed outbox message to a stream, at most once per message.
--
-- KEYS[1]: the stream, `{prefix}{tenant}:{stream}`. KEYS[2]: the message's
-- dedupe key, `{prefix}{tenant}:{stream}:dedupe:{message id}`.
-- ARGV[1]: the dedupe key's time to live, in milliseconds. ARGV[2]: the
-- stream's approximate maximum length (`XADD MAXLEN ~`), `0` for none.
-- ARGV[3..]: the entry's field/value pairs, encoded as Courier's Redis
-- stream store encodes an entry (so stream subscriptions read it).
-- Returns {1, id} when this call appended entry `id`, {0, id} when the
-- dedupe key already held the id of the entry an earlier call appended
-- (nothing is appended then).
--
-- Touches KEYS[1] and KEYS[2]. A script runs alone, so two relays of one
-- message (a redelivery racing a worker that lost its lease) cannot both
-- append: whichever runs second finds the key. The key is claimed first
-- (SET NX), so under maxmemory the refusal comes before anything changed.
-- Redis has no rollback: if the XADD fails (the key holds another type), the
-- claim is deleted again before the error is returned, so a later attempt can
-- still append. An entry trimmed by MAXLEN keeps its dedupe key: a trimmed
-- message is still one that was relayed.
local claimed = redis.call('SET', KEYS[2], 'appending', 'NX', 'PX', ARGV[1])
if not claimed then
  return {0, redis.call('GET', KEYS[2])}
end

local xadd = {'XADD', KEYS[1]}
if ARGV[2] ~= '0' then
  xadd[#xadd + 1] = 'MAXLEN'
  xadd[#xadd + 1] = '~'
  xadd[#xadd + 1] = ARGV[2]
end
xadd[#xadd + 1] = '*'
for i = 3, #ARGV do
  xadd[#xadd + 1] = ARGV[i]
end
local id = redis.pcall(unpack(xadd))
if type(id) == 'table' and id.err then
  redis.call('DEL', KEYS[2])
  return id
end
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {1, id}
