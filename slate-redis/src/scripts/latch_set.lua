-- Slate countdown latch: set the count, only when the latch is open (count zero or no latch).
--
-- KEYS[1]  latch hash: <prefix>{<name>}:latch   (field n = count, s = the request that set
--          it, d:<request> = a count-down that counted)
-- KEYS[2]  last round's record: <prefix>{<name>}:latch:done   (fields s = the request that
--          set the round the latch last opened from, d = the count-down that opened it; TTL =
--          the retry window)
-- ARGV[1]  the count (a positive integer)
-- ARGV[2]  the latch's TTL in milliseconds (an abandoned latch goes away; every count-down
--          renews it)
-- ARGV[3]  this request's id
--
-- Replies (an integer):
--   1  the count was set (also to a retry of the request that set it, even if that round has
--      opened since)
--   0  the latch is closed (a count above zero): nothing was touched
local s = redis.call('HGET', KEYS[1], 's')
if s == ARGV[3] or redis.call('HGET', KEYS[2], 's') == ARGV[3] then
    return 1
end
if s then
    return 0
end
redis.call('HSET', KEYS[1], 'n', ARGV[1], 's', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
