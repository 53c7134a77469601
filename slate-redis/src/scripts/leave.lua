-- Slate single lock: a process whose local waiters all left (timed out, cancelled, a try_lock
-- told busy) gives up its place among the waiting processes, and a turn reserved for it that
-- it will not claim goes to the next process in line, as a release would give it.
--
-- KEYS[1]  waiting processes: <prefix>{<name>}:queue
-- KEYS[2]  turn: <prefix>{<name>}:turn
-- KEYS[3]  release channel: <prefix>{<name>}:released
-- ARGV[1]  the process's queue id
-- ARGV[2]  how long a turn stays reserved for the process it is handed to, in milliseconds
-- ARGV[3]  the lease in milliseconds (the turn's TTL, as release.lua sets it)
-- ARGV[4]  'SPUBLISH' on a Redis Cluster; anything else = 'PUBLISH'
--
-- Replies (an integer):
--   1  a turn reserved for the process (or whose reservation lapsed unclaimed) was handed on
--      (or dropped, nobody being in line)
--   0  only its place in line, if any, was given up
redis.call('ZREM', KEYS[1], ARGV[1])
local turn = redis.call('HMGET', KEYS[2], 'o', 'u')
if turn[1] ~= ARGV[1] then
    return 0
end
-- u = 0: the process holds the lock and keeps its turn while it does (nothing to hand on).
-- Otherwise the lock is free and reserved for it, or was until its reservation lapsed (any
-- grant since would have made the turn its own): either way the next process is told now.
if tonumber(turn[2] or '0') == 0 then
    return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local publish = 'PUBLISH'
if ARGV[4] == 'SPUBLISH' then
    publish = 'SPUBLISH'
end
local others = redis.call('ZRANGE', KEYS[1], 0, 0)
if #others == 1 then
    redis.call('HSET', KEYS[2], 'o', others[1], 'u', now + tonumber(ARGV[2]), 'n', 0)
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    redis.call(publish, KEYS[3], others[1])
else
    redis.call('DEL', KEYS[2])
    redis.call(publish, KEYS[3], '')
end
return 1
