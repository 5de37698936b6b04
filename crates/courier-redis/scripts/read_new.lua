-- Hands a consumer entries its group has not handed out yet, without
-- blocking, and makes sure the consumer exists.
--
-- KEYS[1]: the stream. ARGV[1]: group, ARGV[2]: consumer, ARGV[3]: count.
-- Returns XREADGROUP's reply (nil when nothing was ready).
--
-- XREADGROUP creates a consumer only when it hands it something (Redis 7.0),
-- but a consumer exists from its first read on, whatever it got: XGROUP
-- CREATECONSUMER, after the read, so that a missing key or group fails with
-- XREADGROUP's NOGROUP. Touches only KEYS[1].
local key, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', ARGV[3],
  'STREAMS', key, '>')
redis.call('XGROUP', 'CREATECONSUMER', key, group, consumer)
return read
