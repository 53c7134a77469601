-- Slate: read one lock's state on one server in one round trip (operators, `slate status`).
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  fencing counter: <prefix>{<name>}:fence
--
-- Replies (an array):
--   {pttl, fence, holder1, count1, holder2, count2, ...}
--   pttl is PTTL of the lock hash (-2: no lock), fence the counter (0 when absent), then the
--   hash's fields and values (normally zero or one holder).
local out = {redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '0')}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields do
    out[#out + 1] = fields[i]
end
return out
