-- Slate shared mode: an operator's view and actions.
--
-- KEYS[1], KEYS[2]  holders and leases (see the prelude)
-- KEYS[3]  the release channel
-- KEYS[4]  (optional, semaphore) the capacity key
-- ARGV[1]  'inspect': read; 'clear': drop every holder and wake every waiter; 'permits':
--          set the semaphore's capacity to ARGV[2] and wake every waiter
-- ARGV[2]  ('permits') the new capacity
-- ARGV[3]  'SPUBLISH' on a Redis Cluster, anything else 'PUBLISH'
--
-- Replies:
--   inspect  {in use, capacity or -1, {holder, permits, reads, writes, token, lease ms left}...}
--   clear    the number of holders dropped
--   permits  the permits in use (holders above the new capacity keep theirs until they
--            release; nobody new comes in until the use is below it)
local publish = 'PUBLISH'
if ARGV[3] == 'SPUBLISH' then
    publish = 'SPUBLISH'
end
if ARGV[1] == 'clear' then
    local n = redis.call('ZCARD', KEYS[2])
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call(publish, KEYS[3], '')
    return n
end
if ARGV[1] == 'permits' then
    redis.call('SET', KEYS[4], ARGV[2])
    redis.call(publish, KEYS[3], '')
    return tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
end
local cap = -1
if #KEYS >= 4 then
    cap = tonumber(redis.call('GET', KEYS[4]) or '-1')
end
local holders = {}
local leases = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #leases, 2 do
    local h = leases[i]
    local f = redis.call('HMGET', KEYS[1], 'p:' .. h, 'r:' .. h, 'w:' .. h, 't:' .. h)
    holders[#holders + 1] = {h, tonumber(f[1] or '0'), tonumber(f[2] or '0'),
        tonumber(f[3] or '0'), tonumber(f[4] or '0'), tonumber(leases[i + 1]) - now}
end
return {tonumber(redis.call('HGET', KEYS[1], 'n') or '0'), cap, holders}
