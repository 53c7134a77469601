-- Slate countdown latch: count down by one; at zero the latch opens (its hash is deleted)
-- and every waiter is told.
--
-- KEYS[1]  latch hash: <prefix>{<name>}:latch   (field n = count, s = the request that set
--          it, d:<request> = a count-down that counted)
-- KEYS[2]  last round's record: <prefix>{<name>}:latch:done   (fields s = the request that
--          set the round the latch last opened from, d = the count-down that opened it; TTL =
--          the retry window)
-- KEYS[3]  open channel: <prefix>{<name>}:latch:open
-- ARGV[1]  this request's id
-- ARGV[2]  the latch's TTL in milliseconds (renewed)
-- ARGV[3]  the retry window in milliseconds (how long the last round's record is kept)
-- ARGV[4]  'SPUBLISH' on a Redis Cluster; anything else = 'PUBLISH'
--
-- Replies (an integer): the count left (0: the latch is open).
--
-- A count-down counts once however many times it is sent: while the latch is closed its id
-- is kept in the hash, and the one that opened it in the last round's record, so that a
-- retry arriving after the latch was set again does not count in the new round.
if redis.call('HGET', KEYS[2], 'd') == ARGV[1] then
    return 0
end
local entry = redis.call('HMGET', KEYS[1], 'n', 's')
local n = tonumber(entry[1] or '0')
if n <= 0 then
    return 0
end
local mark = 'd:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], mark) == 1 then
    return n
end
n = n - 1
if n == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('HSET', KEYS[2], 's', entry[2] or '', 'd', ARGV[1])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    if ARGV[4] == 'SPUBLISH' then
        redis.call('SPUBLISH', KEYS[3], '')
    else
        redis.call('PUBLISH', KEYS[3], '')
    end
    return 0
end
redis.call('HSET', KEYS[1], 'n', n, mark, '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return n
