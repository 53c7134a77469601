-- Slate single lock: acquire (or re-enter) the lock for one holder.
--
-- KEYS[1]  lock hash: <prefix>{<name>}; field = holder id, value = reentry count, TTL = lease
-- KEYS[2]  fencing counter: <prefix>{<name>}:fence (persistent, never expires)
-- KEYS[3]  (optional, multi-node locks) the node marker: <prefix>node-marker, a persistent key
--          written once per server; its absence means the server lost its data
-- ARGV[1]  holder id (the text of a HolderId)
-- ARGV[2]  lease in milliseconds (positive integer)
--
-- Replies (always an array of integers):
--   {1, token}         acquired: the key was absent; created holder -> 1 with the lease and
--                      took the next fencing token (INCR of the counter)
--   {2, token, count}  re-entered: the holder's field existed; count is its new value, the TTL
--                      was reset to the lease, token is the counter's current value (it only
--                      moves when a new holder acquires, so it is this holder's token)
--   {0, pttl}          busy: another holder has the lock; pttl is its remaining lease in ms
--                      (as PTTL answers it)
--   {-2}               (only with KEYS[3]) the node marker is missing: the server lost its
--                      data since it was marked; nothing was touched
--
-- Every integer is compared explicitly: in Lua, 0 is true.
if #KEYS >= 3 and redis.call('EXISTS', KEYS[3]) == 0 then
    return {-2}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('HSET', KEYS[1], ARGV[1], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local token = redis.call('INCR', KEYS[2])
    return {1, token}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local token = tonumber(redis.call('GET', KEYS[2]) or '0')
    return {2, token, count}
end
return {0, redis.call('PTTL', KEYS[1])}
