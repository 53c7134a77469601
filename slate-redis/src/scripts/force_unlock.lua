-- Slate single lock: delete the lock whoever holds it (operators only; unsafe for correctness).
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  release channel: <prefix>{<name>}:released
-- ARGV     none
--
-- Replies (an integer):
--   1  the key existed and was deleted; a message was published so that waiters retry at once
--   0  there was no key; nothing was touched
--
-- The fencing counter is left alone: deleting it would let tokens repeat.
if redis.call('DEL', KEYS[1]) == 1 then
    redis.call('PUBLISH', KEYS[2], '')
    return 1
end
return 0
