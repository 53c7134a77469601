-- Slate: acquire several single locks of one server (or one cluster slot) for one holder, in
-- one server step, in the multi-lock's canonical order (`primitives/multi.rs`).
--
-- The script that runs is `acquire.lua` wrapped as a function, `one(KEYS, ARGV)`, followed by
-- this driver (see `scripts::ACQUIRE_MANY`): each name gets exactly what its own `acquire.lua`
-- call would answer at that point, with its queue, turn, re-entry, request record and fencing
-- token, and the names are taken in order until the first that is not granted. That one (busy,
-- reserved for another process's turn, or refused) ends the call: the names after it are not
-- touched, so the caller never holds a name after one it waits for (the multi-lock's
-- invariant), and never has to give one back.
--
-- All or nothing as the caller sees it: a name granted here before a busy one stays held while
-- the caller waits for the busy one in its queue (the canonical order makes that
-- deadlock-free); the caller's guard exists only once every name is held.
--
-- Idempotent as `acquire.lua` is, name by name: a resend (ARGV[5] = '1') replays the grants
-- its first send made (each name's record), and the first name it does not grant is marked
-- refused, so that a first send arriving later stops there too (every copy runs the names in
-- the same order and stops at the first it does not grant). An undo by the request id (the
-- caller gave up on the reply) releases each name's level or marks it cancelled.
--
-- KEYS     five per name, in canonical order: KEYS[5i+1..5i+5] = name i's lock hash, fencing
--          counter, queue, turn and request record key (`acquire.lua` KEYS[1..5])
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  request id (the same for every name: each name keeps its own record)
-- ARGV[4]  how long a record key is kept, in ms
-- ARGV[5]  '1': this call may have been sent before (`acquire.lua` ARGV[8]); '' otherwise
-- ARGV[6+2i], ARGV[7+2i]
--          name i's queue id and tenure (`acquire.lua` ARGV[3], ARGV[4])
-- ARGV[6+2n] (optional, n names) '1': raise each name's fencing counter to the server's clock
--          before its token (`acquire.lua` ARGV[10])
--
-- Replies: an array with one entry per name taken or tried, in order: each is that name's
-- `acquire.lua` reply ({1, token} acquired, {2, token, count} re-entered, {0, ms} busy and
-- queued, {-3}, {-7}); the last one is the first that is not a grant, unless every name was
-- granted. Names after it have no entry.
if #KEYS == 0 or #KEYS % 5 ~= 0 then
    return redis.error_reply('acquire_many: five KEYS per name, got ' .. #KEYS)
end
local n = #KEYS / 5
local raise = ARGV[6 + 2 * n] or ''
local replies = {}
for i = 0, n - 1 do
    local base = 5 * i
    local reply = one(
        {KEYS[base + 1], KEYS[base + 2], KEYS[base + 3], KEYS[base + 4], KEYS[base + 5]},
        {ARGV[1], ARGV[2], ARGV[6 + 2 * i], ARGV[7 + 2 * i], ARGV[3], ARGV[4], '', ARGV[5], '',
         raise}
    )
    replies[i + 1] = reply
    if reply[1] ~= 1 and reply[1] ~= 2 then
        break
    end
end
return replies
