-- Slate countdown latch: set the count, only when the latch is open (count zero or no latch).
--
-- KEYS[1]  latch hash: <prefix>{<name>}:latch   (field n = count, g = the round: the id of the
--          request that set it)
-- KEYS[2]  this request's record: <prefix>{<name>}:latch:r:<request>   (its answer, kept for
--          the retry window)
-- ARGV[1]  the count (a positive integer)
-- ARGV[2]  the latch's TTL in milliseconds (an abandoned latch goes away; every count-down
--          renews it)
-- ARGV[3]  this request's id (the round's id if it sets the count)
-- ARGV[4]  the retry window in milliseconds
--
-- Replies (an integer; a request sent again gets the answer its first run gave):
--   1  the count was set
--   0  the latch is closed (a count above zero): nothing was touched
local seen = redis.call('GET', KEYS[2])
if seen then
    return tonumber(seen)
end
local answer = 0
-- Read, not EXISTS: a key of another type under the latch's name is an error (WRONGTYPE), not
-- a latch counting down.
if not redis.call('HGET', KEYS[1], 'n') then
    redis.call('HSET', KEYS[1], 'n', ARGV[1], 'g', ARGV[3])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    answer = 1
end
redis.call('SET', KEYS[2], answer, 'PX', ARGV[4])
return answer
