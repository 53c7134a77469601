-- Slate single lock: delete the lock whoever holds it (operators only; unsafe for correctness).
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  release channel: <prefix>{<name>}:released
-- ARGV[1]  (optional) 'SPUBLISH' on a Redis Cluster; anything else or absent = 'PUBLISH'
--
-- Replies (an integer):
--   1  the key existed and was deleted; a message was published so that waiters retry at once
--   0  there was no key; nothing was touched
--
-- The fencing counter is left alone: deleting it would let tokens repeat.
if redis.call('DEL', KEYS[1]) == 1 then
    if ARGV[1] == 'SPUBLISH' then
        redis.call('SPUBLISH', KEYS[2], '')
    else
        redis.call('PUBLISH', KEYS[2], '')
    end
    return 1
end
return 0
