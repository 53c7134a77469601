-- Slate countdown latch: count down by one; at zero the latch opens (its hash is deleted)
-- and every waiter is told.
--
-- KEYS[1]  latch hash: <prefix>{<name>}:latch   (field n = count, g = the round)
-- KEYS[2]  this request's record: <prefix>{<name>}:latch:r:<request>   (its answer, kept for
--          the retry window)
-- KEYS[3]  open channel: <prefix>{<name>}:latch:open
-- ARGV[1]  the latch's TTL in milliseconds (renewed)
-- ARGV[2]  the retry window in milliseconds
-- ARGV[3]  'SPUBLISH' on a Redis Cluster; anything else = 'PUBLISH'
--
-- Replies (an integer): the count left (0: the latch is open). A request sent again gets the
-- answer its first run gave and counts nothing: a count-down counts once however many times
-- it is sent within the retry window, also when the latch opened and was set again between
-- two of its sends.
local seen = redis.call('GET', KEYS[2])
if seen then
    return tonumber(seen)
end
local n = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if n > 0 then
    n = n - 1
    if n == 0 then
        redis.call('DEL', KEYS[1])
        if ARGV[3] == 'SPUBLISH' then
            redis.call('SPUBLISH', KEYS[3], '')
        else
            redis.call('PUBLISH', KEYS[3], '')
        end
    else
        redis.call('HSET', KEYS[1], 'n', n)
        redis.call('PEXPIRE', KEYS[1], ARGV[1])
    end
end
redis.call('SET', KEYS[2], n, 'PX', ARGV[2])
return n
