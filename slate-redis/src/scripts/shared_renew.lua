-- Slate shared mode: renew a holder's lease.
--
-- KEYS[1], KEYS[2]  holders and leases (see the prelude)
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
--
-- Replies (an integer):
--   1  renewed: the holder's lease now ends a lease from now
--   0  not held: its lease had ended (or it was force-unlocked); nothing was touched
--      (renewal never re-creates a hold)
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
    settle()
    return 1
end
return 0
