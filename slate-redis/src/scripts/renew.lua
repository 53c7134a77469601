-- Slate: renew a holder's lease.
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  (optional; the single lock, a combination node) the turn: <prefix>{<name>}:turn (see acquire.lua). While
--          the lock is held, the turn records the holder's process and its tenure; it must
--          live as long as the hold, or the release would read a tenure of 0 and keep the turn
--          for ever (a hold longer than the lease would defeat the tenure)
-- KEYS[3]  (optional, single lock) the current holder: <prefix>{<name>}:holder
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  (with KEYS[3]) the local holder this hold was passed to inside its process (lock
--          cohorting): KEYS[3] is set to '<ARGV[1]> <ARGV[3]>' with the lease as TTL, so that
--          an operator's status read names who holds the lock now, not only the hold's id
--
-- Replies (an integer):
--   1  renewed: the holder's field exists; the key's TTL (and the turn's, if it exists) was
--      reset to the lease
--   0  not held: the field is gone; nothing was touched (renewal never re-creates an entry)
--
-- Every integer is compared explicitly: in Lua, 0 is true.
if redis.call('HGET', KEYS[1], ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if #KEYS >= 2 then
        redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
    if #KEYS >= 3 then
        redis.call('SET', KEYS[3], ARGV[1] .. ' ' .. ARGV[3], 'PX', ARGV[2])
    end
    return 1
end
return 0
