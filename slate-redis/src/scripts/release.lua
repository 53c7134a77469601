-- Slate: release one level of a holder's hold; at zero, pass the turn on.
--
-- KEYS[1]  lock hash: <prefix>{<name>} (fields: see acquire.lua)
-- KEYS[2]  release channel: <prefix>{<name>}:released
-- KEYS[3]  waiting processes: <prefix>{<name>}:queue (see acquire.lua)
-- KEYS[4]  the turn: <prefix>{<name>}:turn (see acquire.lua)
-- KEYS[5]  the holder's request record key: <prefix>{<name>}:req:<holder> (see acquire.lua);
--          read and written only by an undo (ARGV[9]) or a resend (ARGV[12])
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds (the TTL a partial release resets)
-- ARGV[3]  queue id of the caller ('' = no turn: publish to anyone). ARGV[3] to ARGV[12] may
--          be left out (an operator's call): '' (or 1 for ARGV[11]) then
-- ARGV[4]  tenure: acquisitions in a row a process may keep while other processes wait
-- ARGV[5]  1 if tasks of the caller's process wait for this lock, else 0
-- ARGV[6]  how long a turn stays reserved for the process it is given to, in ms
-- ARGV[7]  request id (decimal digits, unique per call; '' = no record)
-- ARGV[8]  how long the record key is kept, in ms
-- ARGV[9]  undo: the id of an acquire request whose caller gave up on it ('' = none). The
--          level is released only if that acquire ran (its record is still the holder's
--          latest); otherwise the acquire is marked cancelled in the record key, so that it
--          does nothing if it runs later, and -2 is answered
-- ARGV[10] 'SPUBLISH' on a Redis Cluster (sharded pub/sub: the message stays on the shard
--          that owns the lock); anything else = 'PUBLISH'
-- ARGV[11] holds: how many local holders this remote hold served (1 plus the local passes it
--          made, see acquire.lua ARGV[9]); they count towards the tenure as that many
--          acquisitions
-- ARGV[12] '1': this request may have been sent before (a resend on a new connection): its
--          record is written to KEYS[5] too ('': a first send)
--
-- Replies (an integer):
--   -7      (not an undo) the request is older than the holder's latest record (overtaken by
--           a later request of the same holder); nothing was touched
--   -2      (undo only) the acquire had not run (or its record was gone): it is cancelled
--   -1      not held: the holder has no field (lease ran out, force-unlocked, never held, or
--           a first send of this very request released the last level); nothing was
--           touched (no key or field is ever created here)
--   0       released: the count reached zero and the key was deleted. With nobody told busy
--           and no turn kept during the hold (no 'w' field), that is all: nobody waits.
--           Otherwise the turn stays with the caller's process if it has waiters and tenure
--           left (nobody else is woken), else goes to the first waiting process: a message
--           carrying that process's id is published (an empty message, anyone may retry,
--           when nobody is queued or there is no turn)
--   n > 0   still held n times by this holder; the TTL was reset to the lease
--
-- A request whose record says it already released answers the count it answered the first
-- time and changes nothing (no double decrement). The record of a release that ends the hold
-- goes with the lock hash: a resend of it answers -1, which the client reads as released when
-- the hold's lease cannot have run out by then (`release_remote`); a copy of it that arrives
-- later finds no field of the holder, or the record of a newer request of it, and does
-- nothing.
--
-- The common case costs three commands: HMGET of the holder's count and the hold's fields,
-- and DEL.
--
-- Every integer is compared explicitly: in Lua, 0 is true.
local holder = ARGV[1]
local req = ARGV[7] or ''
local undo = ARGV[9] or ''
local careful = req ~= '' and (undo ~= '' or ARGV[12] == '1')
local entry = redis.call('HMGET', KEYS[1], holder, 'r', 'w')
local held = tonumber(entry[1] or '0')
-- Request ids grow in each process (`request.rs`); ids are decimal digits without leading
-- zeros.
local function older(x, y)
    return #x < #y or (#x == #y and x < y)
end
-- Writes the record key, never shortening what it has left (see acquire.lua, KEYS[5]).
local function keep_record(value)
    local ms = tonumber(ARGV[8])
    local left = redis.call('PTTL', KEYS[5])
    if left > ms then
        ms = left
    end
    redis.call('SET', KEYS[5], value, 'PX', ms)
end
if req ~= '' then
    -- The holder's latest record: the lock hash's (while the holder's field exists), or, for
    -- an undo or a resend, the record key's, whichever is newer.
    local latest = false
    if held > 0 then
        latest = entry[2]
    end
    local lid = latest and string.match(latest, '^(%d+) ')
    local oid = false
    if careful then
        local outer = redis.call('GET', KEYS[5])
        oid = outer and string.match(outer, '^(%d+) ')
        if oid and (not lid or older(lid, oid)) then
            latest, lid = outer, oid
        end
    end
    local kind, a
    if lid then
        kind, a = string.match(latest, '^%d+ (%a) (%-?%d+)')
    end
    if lid == req and kind == 'r' then
        return tonumber(a)
    end
    if undo == '' and lid and older(req, lid) then
        -- Overtaken by a later request of the same holder: a copy of a release that stalled on
        -- its way (its resend ran, and the holder acquired again since) must not take a level
        -- of the newer hold. A caller still waiting sends it again under a fresh id.
        return -7
    end
    if undo ~= '' and not (lid == undo and kind == 'a' and held > 0) then
        -- A newer record in the record key is kept: that acquire, if it runs later, is older
        -- than the record and does nothing (acquire.lua, `older`). A newer record in the lock
        -- hash only is not enough: it goes with the hold.
        if not (oid and older(undo, oid)) then
            keep_record(undo .. ' c 0 0')
        end
        return -2
    end
end
if held <= 0 then
    return -1
end
local count = held - 1
if count > 0 then
    local rec = ''
    if req ~= '' then
        rec = string.format('%s r %d 0', req, count)
    end
    redis.call('HSET', KEYS[1], holder, count, 'r', rec)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if careful then
        keep_record(rec)
    end
    return count
end
if careful then
    keep_record(string.format('%s r 0 0', req))
end
redis.call('DEL', KEYS[1])
if not entry[3] then
    -- Nobody was told busy and no turn was kept while the hold lasted: nobody waits
    -- remotely, and there is no turn to keep. The caller's own waiters take the free lock.
    return 0
end
local publish = 'PUBLISH'
if ARGV[10] == 'SPUBLISH' then publish = 'SPUBLISH' end
local pid = ARGV[3] or ''
if pid == '' then
    redis.call(publish, KEYS[2], '')
    return 0
end
if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
    redis.call(publish, KEYS[2], '')
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
