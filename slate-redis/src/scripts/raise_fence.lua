-- Slate multi-node locks: raise a node's fencing counter to at least a token.
--
-- KEYS[1]  fencing counter: the lock's slot counter, <prefix>fence:{<slot tag>} (persistent,
--          never expires; see acquire.lua)
-- ARGV[1]  the token (positive integer)
--
-- Replies (an integer):
--   n       the counter's value afterwards (>= ARGV[1]); it never goes down
--
-- Every integer is compared explicitly: in Lua, 0 is true.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
    return redis.call('INCRBY', KEYS[1], wanted - current)
end
return current
