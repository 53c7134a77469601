-- Slate single lock: renew a holder's lease.
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
--
-- Replies (an integer):
--   1  renewed: the holder's field exists; the key's TTL was reset to the lease
--   0  not held: the field is gone; nothing was touched (renewal never re-creates an entry)
--
-- Every integer is compared explicitly: in Lua, 0 is true.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
