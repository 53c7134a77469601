-- Slate: release one level of a holder's hold; at zero, pass the turn on.
--
-- KEYS[1]  lock hash: <prefix>{<name>}
-- KEYS[2]  release channel: <prefix>{<name>}:released
-- KEYS[3]  waiting processes: <prefix>{<name>}:queue (see acquire.lua)
-- KEYS[4]  the turn: <prefix>{<name>}:turn (see acquire.lua)
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds (the TTL a partial release resets)
-- ARGV[3]  (optional) queue id of the caller ('' or absent = no turn: publish to anyone)
-- ARGV[4]  tenure: acquisitions in a row a process may keep while other processes wait
-- ARGV[5]  1 if tasks of the caller's process wait for this lock, else 0
-- KEYS[5]  the holder's request record: <prefix>{<name>}:req:<holder> (see acquire.lua);
--          touched only when ARGV[7] is not ''
-- ARGV[6]  how long a turn stays reserved for the process it is given to, in ms
-- ARGV[7]  request id (decimal digits, unique per call; '' = no record)
-- ARGV[8]  how long the record is kept, in ms
-- ARGV[9]  (optional) undo: the id of an acquire request whose caller gave up on it. The
--          level is released only if that acquire ran (its record is still the holder's
--          latest); otherwise the acquire is marked cancelled, so that it does nothing if it
--          runs later, and -2 is answered
-- ARGV[10] (optional) 'SPUBLISH' on a Redis Cluster (sharded pub/sub: the message stays on
--          the shard that owns the lock); anything else or absent = 'PUBLISH'
-- ARGV[11] (optional) holds: how many local holders this remote hold served (1 plus the
--          local passes it made, see acquire.lua ARGV[9]); they count towards the tenure as
--          that many acquisitions. '' or absent: 1
--
-- Replies (an integer):
--   -2      (undo only) the acquire had not run (or its record was gone): it is cancelled
--   -1      not held: the holder has no field (lease ran out, force-unlocked, never held);
--           nothing was touched (no key or field is ever created here)
--   0       released: the count reached zero and the key was deleted. With no process queued
--           and no turn kept, that is all (nobody waits remotely). Otherwise the turn stays
--           with the caller's process if it has waiters and tenure left (nobody else is
--           woken), else goes to the first waiting process: a message carrying that process's
--           id is published (an empty message, anyone may retry, when nobody is queued)
--   n > 0   still held n times by this holder; the TTL was reset to the lease
--
-- A request whose record says it already released answers the count it answered the first
-- time and changes nothing (no double decrement, no spurious 'not held' after the last level).
--
-- Every integer is compared explicitly: in Lua, 0 is true.
-- Request ids grow in each process (`request.rs`: above every id the process sent before, and
-- drawn from the clock in µs, so ids of different processes compare too), and a holder's
-- requests come from its process. An acquire older than the holder's record was overtaken by
-- a later request of the same holder: it stalled on its way, and its caller gave up on it
-- (undoing it) and may hold the lock again since. It must do nothing, or it would add a level
-- nobody holds (issue 35, defect 12). Ids are decimal digits without leading zeros.
local function older(x, y)
    return #x < #y or (#x == #y and x < y)
end
local publish = 'PUBLISH'
if ARGV[10] == 'SPUBLISH' then publish = 'SPUBLISH' end
local req = ARGV[7] or ''
if req ~= '' then
    local rec = redis.call('GET', KEYS[5])
    local id, kind, a
    if rec then
        id, kind, a = string.match(rec, '^(%d+) (%a) (%-?%d+)')
    end
    if id == req and kind == 'r' then
        return tonumber(a)
    end
    local undo = ARGV[9] or ''
    if undo ~= '' and not (id == undo and kind == 'a') then
        -- A record newer than the undone acquire is kept: that acquire, if it runs later,
        -- is older than the record and does nothing (acquire.lua, `older`).
        if not (id and older(undo, id)) then
            redis.call('SET', KEYS[5], undo .. ' c 0 0', 'PX', ARGV[8])
        end
        return -2
    end
end
-- One read for the check and the count; the last level deletes the key without writing the
-- count down first.
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if held <= 0 then
    return -1
end
local count = held - 1
if count > 0 then
    redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
end
if req ~= '' then
    redis.call('SET', KEYS[5], string.format('%s r %d 0', req, count), 'PX', ARGV[8])
end
if count > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return count
end
redis.call('DEL', KEYS[1])
local pid = ARGV[3] or ''
if pid == '' then
    redis.call(publish, KEYS[2], '')
    return 0
end
-- No turn is kept and no process is queued: no other process waits (a waiting process's head
-- is queued by its busy answer), so there is nobody to wake and no turn to keep (one EXISTS
-- over both keys instead of HMGET, TIME, ZREM, ZRANGE, DEL and PUBLISH). The caller's own
-- waiters take the free lock next.
if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
    return 0
end
local turn = redis.call('HMGET', KEYS[4], 'o', 'n')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reserve = tonumber(ARGV[6])
local holds = tonumber(ARGV[11] or '') or 1
local tenure = 0
if turn[1] == pid then
    tenure = tonumber(turn[2]) + holds - 1
elseif not turn[1] then
    -- The hold began while nobody was queued (acquire.lua kept no turn): it is the first of
    -- this process's row.
    tenure = holds
end
redis.call('ZREM', KEYS[3], pid)
local others = redis.call('ZRANGE', KEYS[3], 0, 0)
if ARGV[5] == '1' and (tenure < tonumber(ARGV[4]) or #others == 0) then
    redis.call('HSET', KEYS[4], 'o', pid, 'u', now + reserve, 'n', tenure)
    redis.call('PEXPIRE', KEYS[4], ARGV[2])
    return 0
end
if #others == 1 then
    redis.call('HSET', KEYS[4], 'o', others[1], 'u', now + reserve, 'n', 0)
    redis.call('PEXPIRE', KEYS[4], ARGV[2])
    redis.call(publish, KEYS[2], others[1])
else
    redis.call('DEL', KEYS[4])
    redis.call(publish, KEYS[2], '')
end
return 0
