-- Slate shared mode: acquire (or re-enter) a read, write or permit hold for one holder, in
-- first-come first-served order between processes.
--
-- KEYS[1], KEYS[2]  holders and leases (see the prelude)
-- KEYS[3], KEYS[4]  the waiting processes and what each wants (see the prelude's waiting())
-- KEYS[5]  the fencing counter: <KEYS[1]>:fence (persistent)
-- KEYS[6]  the holder's request record: <KEYS[1]>:req:<holder>, '<request id> <kind> <a> <b>
--          <c>' (kind 'a': acquired, a = token, b = count, c = 1 for a fresh hold; 'r':
--          released, a = count left; 'c': cancelled, the request must do nothing)
-- KEYS[7]  the release channel: <KEYS[1]>:released (a grant that takes the caller's process
--          out of the queue tells the processes behind it that now fit)
-- KEYS[8]  (optional) a semaphore's capacity: <KEYS[1]>:permits (persistent; set to ARGV[10]
--          when absent); or, with ARGV[11] = 'x', the hash of the single lock of the same
--          name (<prefix>{<name>}), which a read-write lock then treats as a writer: no fresh
--          hold is granted while it exists
-- ARGV[1]  holder id
-- ARGV[2]  'w' a write hold (all the capacity), 'r' a shared hold (ARGV[3] permits)
-- ARGV[3]  permits a fresh shared hold takes (1 for a read)
-- ARGV[4]  lease in milliseconds
-- ARGV[5]  queue id of the caller's process ('' = no queue: take what fits)
-- ARGV[6]  claim window in ms: how long a busy caller's entry waits for it to ask again
-- ARGV[7]  request id ('' = no record)
-- ARGV[8]  how long the record is kept, in ms
-- ARGV[9]  '1': a re-entry only (the holder must hold; else {-4}, nothing touched)
-- ARGV[10] the capacity: the write weight of a read-write lock, or a semaphore's permits
--          when KEYS[8] is unset
-- ARGV[11] 'x': KEYS[8] is a single lock to exclude (see KEYS[8]); '' otherwise
-- ARGV[12] the sequence number of this attempt in its process (recorded with a busy
--          answer's entry, so that shared_leave.lua only removes entries older than a drain)
-- ARGV[13] 'SPUBLISH' on a Redis Cluster, anything else 'PUBLISH'
--
-- A fresh hold of k permits is granted when the permits in use, plus those wanted by the
-- live entries queued before the caller's process (all of them if it has none), plus k fit
-- in the capacity: nobody overtakes a process that waits, but everyone who fits behind it
-- comes in with it (the readers at the head of the queue together; a writer alone).
--
-- Replies (arrays of integers):
--   {1, token, count, fresh}  acquired: count = the holder's levels in this mode; fresh = 1
--                             when the holder held nothing before (a new lease and token),
--                             0 for a re-entry or a read covered by the holder's write
--   {0, ms}                   busy: the caller's process was queued; ms = when the caller
--                             should ask again without a message (the earliest lease end
--                             while the holders are in the way; the claim window while only
--                             the queue is)
--   {-3}                      the request was cancelled; nothing was touched
--   {-7}                      the request is older than the holder's record (overtaken, see
--                             `older` in the prelude); nothing was touched: a caller still
--                             waiting sends it again under a fresh id
--   {-4}                      (ARGV[9] = '1') the holder holds nothing: its hold was lost
--   {-5, capacity}            more permits than the capacity: never satisfiable
--   {-6}                      the holder holds shared and asked to write (no upgrade)
local h = ARGV[1]
local req = ARGV[7]
local held = redis.call('ZSCORE', KEYS[2], h)
if req ~= '' then
    local rec = redis.call('GET', KEYS[6])
    if rec then
        local last = string.match(rec, '^(%d+) ')
        if last and older(req, last) then
            return {-7}
        end
        local id, kind, a, b, c = string.match(rec, '^(%d+) (%a) (%-?%d+) (%-?%d+) (%-?%d+)$')
        if id == req then
            if kind == 'c' then
                return {-3}
            end
            if kind == 'a' and held then
                -- A replayed answer writes the record again: a WAIT on the resending
                -- connection then covers this write, and with it the grant before it
                -- (replication is in order); without a write it would count every replica
                -- at once (issue 35, defect 3).
                redis.call('SET', KEYS[6], rec, 'PX', ARGV[8])
                return {1, tonumber(a), tonumber(b), tonumber(c)}
            end
        end
    end
end
if ARGV[9] == '1' and not held then
    return {-4}
end
local function remember(token, count, fresh)
    if req ~= '' then
        local rec = string.format('%s a %d %d %d', req, token, count, fresh)
        redis.call('SET', KEYS[6], rec, 'PX', ARGV[8])
    end
end
local lease_end = now + tonumber(ARGV[4])
local mode = ARGV[2]
if held then
    local f = redis.call('HMGET', KEYS[1], 'w:' .. h, 't:' .. h)
    local w, token = tonumber(f[1] or '0'), tonumber(f[2] or '0')
    local count
    if mode == 'w' then
        if w == 0 then
            return {-6}
        end
        count = redis.call('HINCRBY', KEYS[1], 'w:' .. h, 1)
    else
        count = redis.call('HINCRBY', KEYS[1], 'r:' .. h, 1)
    end
    redis.call('ZADD', KEYS[2], lease_end, h)
    settle()
    remember(token, count, 0)
    return {1, token, count, 0}
end
local cap = tonumber(ARGV[10])
if ARGV[11] == 'x' then
    if redis.call('EXISTS', KEYS[8]) == 1 then
        -- The single lock of this name holds: as a writer would (its release message goes to
        -- its own channel, so the hint is its remaining lease, capped by the spin wait).
        return {0, math.max(redis.call('PTTL', KEYS[8]), 0)}
    end
elseif #KEYS >= 8 then
    local c = redis.call('GET', KEYS[8])
    if c then
        cap = tonumber(c)
    else
        redis.call('SET', KEYS[8], ARGV[10])
    end
end
local k = tonumber(ARGV[3])
if mode == 'w' then
    k = cap
end
if k > cap then
    return {-5, cap}
end
local used = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local qid = ARGV[5]
local ahead = 0
if qid ~= '' then
    for _, e in ipairs(waiting()) do
        if e[1] == qid then
            break
        end
        ahead = ahead + e[2]
    end
end
if used + ahead + k > cap then
    local claim = tonumber(ARGV[6])
    if qid ~= '' then
        if not redis.call('ZSCORE', KEYS[3], qid) then
            -- Last in line, strictly after everyone queued (a score tie would sort by queue
            -- id and put a newcomer before entries it counted as ahead of it).
            local score = now_us
            local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
            if #last > 0 and tonumber(last[2]) >= score then
                score = tonumber(last[2]) + 1
            end
            redis.call('ZADD', KEYS[3], score, qid)
        end
        redis.call('HSET', KEYS[4], qid, k .. ' ' .. (now + claim) .. ' ' .. ARGV[12])
        local keep = math.max(claim, tonumber(ARGV[4]))
        redis.call('PEXPIRE', KEYS[3], keep)
        redis.call('PEXPIRE', KEYS[4], keep)
    end
    local hint = claim
    if used + k > cap then
        local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
        if #first > 0 then
            hint = math.max(tonumber(first[2]) - now, 0)
        end
    end
    return {0, hint}
end
local left_queue = qid ~= '' and redis.call('ZREM', KEYS[3], qid) == 1
if left_queue then
    redis.call('HDEL', KEYS[4], qid)
end
redis.call('HINCRBY', KEYS[1], 'n', k)
local token = redis.call('INCR', KEYS[5])
local levels = 'r:'
if mode == 'w' then
    levels = 'w:'
end
redis.call('HSET', KEYS[1], 'p:' .. h, k, levels .. h, 1, 't:' .. h, token)
redis.call('ZADD', KEYS[2], lease_end, h)
settle()
remember(token, 1, 1)
if left_queue then
    -- The processes that waited behind this one may fit beside it now.
    wake(KEYS[7], cap, ARGV[13])
end
return {1, token, 1, 1}
