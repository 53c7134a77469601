-- Slate single lock: release one level of a holder's hold.
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  release channel: <prefix>{<name>}:released
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds (the TTL a partial release resets)
--
-- Replies (an integer):
--   -1      not held: the holder has no field (lease ran out, force-unlocked, never held);
--           nothing was touched (no key or field is ever created here)
--   0       released: the count reached zero; the key was deleted and a message published on
--           the channel so that waiters retry at once
--   n > 0   still held n times by this holder; the TTL was reset to the lease
--
-- Every integer is compared explicitly: in Lua, 0 is true.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
    return -1
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if count > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return count
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 0
