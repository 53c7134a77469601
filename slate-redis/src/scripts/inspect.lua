-- Slate: read one lock's state on one server in one round trip (operators, `slate status`).
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  fencing counter: <prefix>{<name>}:fence
-- KEYS[3]  current holder: <prefix>{<name>}:holder (see renew.lua)
--
-- Replies (an array):
--   {pttl, fence, passed, holder1, count1, holder2, count2, ...}
--   pttl is PTTL of the lock hash (-2: no lock), fence the counter (0 when absent), passed
--   '<holder> <local holder>' when the hold of a holder listed here was passed inside its
--   process to that local holder (as of the hold's last renewal), else ''; then the hash's
--   fields and values (normally zero or one holder).
local passed = redis.call('GET', KEYS[3]) or ''
if passed ~= '' then
    local remote = string.match(passed, '^(%S+) ')
    if not remote or redis.call('HEXISTS', KEYS[1], remote) == 0 then
        passed = ''
    end
end
local out = {redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '0'), passed}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields do
    out[#out + 1] = fields[i]
end
return out
