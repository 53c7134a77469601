-- Slate: read one lock's state on one server in one round trip (operators, `slate status`).
--
-- KEYS[1]  lock hash: <prefix>{<name>} (fields: see acquire.lua)
-- KEYS[2]  fencing counter: the lock's slot counter, <prefix>fence:{<slot tag>}
-- KEYS[3]  current holder: <prefix>{<name>}:holder (see renew.lua)
--
-- Replies (an array):
--   {pttl, fence, passed, holder1, count1, holder2, count2, ...}
--   pttl is PTTL of the lock hash (-2: no lock), fence the counter as its text ('0' when
--   absent: the last
--   token taken in the lock's slot, which is at least the lock's last), passed
--   '<holder> <local holder>' when the hold of a holder listed here was passed inside its
--   process to that local holder (as of the hold's last renewal), else ''; then the holders
--   and their reentry counts (normally zero or one; the hash's own fields 't', 'r' and 'w' are
--   left out).
local passed = redis.call('GET', KEYS[3]) or ''
if passed ~= '' then
    local remote = string.match(passed, '^(%S+) ')
    if not remote or not redis.call('HGET', KEYS[1], remote) then
        passed = ''
    end
end
-- The counter goes back as the text it is stored as: a number through Lua would be a double,
-- exact only below 2^53.
local out = {redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0', passed}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
    local f = fields[i]
    if f ~= 't' and f ~= 'r' and f ~= 'w' then
        out[#out + 1] = fields[i]
        out[#out + 1] = fields[i + 1]
    end
end
return out
