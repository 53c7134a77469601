-- Slate shared mode: a process whose local waiters all left gives up its place among the
-- waiting processes, unless a later busy answer renewed it, and tells the processes behind
-- it that now fit.
--
-- KEYS[1]..KEYS[4]  holders, leases, waiting processes, what they want (see the prelude)
-- KEYS[5]  the release channel
-- KEYS[6]  (optional, semaphore) the capacity key
-- ARGV[1]  the process's queue id
-- ARGV[2]  the sequence number of the process's last attempt sent before its queue drained:
--          an entry written by a later attempt (a larger sequence number) stays
-- ARGV[3]  'SPUBLISH' on a Redis Cluster, anything else 'PUBLISH'
-- ARGV[4]  the capacity (as ARGV[10] of shared_acquire.lua)
--
-- Replies (an integer): 1 the entry was removed, 0 it was absent or newer.
local want = redis.call('HGET', KEYS[4], ARGV[1])
if not want then
    return 0
end
local seq = string.match(want, '^%d+ %d+ (%d+)$')
if seq and tonumber(seq) > tonumber(ARGV[2]) then
    return 0
end
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
wake(KEYS[5], capacity(KEYS[6], ARGV[4]), ARGV[3])
return 1
