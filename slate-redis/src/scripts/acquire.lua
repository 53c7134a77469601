-- Slate: acquire (or re-enter) a lock for one holder, with a fair turn between processes.
--
-- KEYS[1]  lock hash: <prefix>{<name>}; field = holder id, value = reentry count, TTL = lease
-- KEYS[2]  fencing counter: <prefix>{<name>}:fence (persistent, never expires, unless ARGV[8]
--          gives it an expiry)
-- KEYS[3]  waiting processes: <prefix>{<name>}:queue, a sorted set (member = process id,
--          score = server time in ms when it first got busy): the processes' FIFO
-- KEYS[4]  the turn: <prefix>{<name>}:turn, a hash {o = queue id, u = reserved until (server
--          ms, 0 while held), n = acquisitions in a row}: the local queue (process) a free lock
--          is reserved for, and its tenure
-- KEYS[5]  the holder's request record: <prefix>{<name>}:req:<holder>, a string
--          '<request id> <kind> <a> <b>' that lets a retried request answer what it did the
--          first time instead of doing it twice (kind 'a': acquired, a = token, b = count;
--          'r': released, a = count left; 'c': cancelled, the request must do nothing).
--          Touched only when ARGV[5] is not ''.
-- KEYS[6]  (optional, multi-node locks) the node marker: <prefix>node-marker, a persistent key
--          written once per server; its absence means the server lost its data. Its value
--          ends in ' q=<ms>', the node set's quarantine, which bounds every lease here
-- ARGV[1]  holder id (the text of a HolderId)
-- ARGV[2]  lease in milliseconds (positive integer)
-- ARGV[3]  queue id of the caller ('' = no turn: take a free lock whatever the queue;
--          KEYS[3] and KEYS[4] are then not touched)
-- ARGV[4]  tenure: acquisitions in a row a queue may keep while others wait
-- ARGV[5]  request id (decimal digits, unique per call; '' = no record)
-- ARGV[6]  how long the record is kept, in ms (the window in which a retry may arrive)
-- ARGV[7]  (optional) '1': a re-entry only ('' or absent: any acquisition). The caller holds
--          the lock in its process, so the holder's field must exist; if it does not (the lease
--          was lost), nothing is touched and {-4} is answered: a fresh hold must never be
--          counted as one more level
-- ARGV[8]  (optional) fence expiry in ms ('' or absent: the counter is persistent and a first
--          acquisition INCRs it). When given, a first acquisition takes max(counter + 1, server
--          time in µs) and sets the counter to it with this TTL, and a re-entry resets the TTL:
--          an idle lock's counter goes away, and a new one starts above every earlier token as
--          long as the server's clock does not step back by more than the expiry
-- ARGV[9]  (optional) block: a first acquisition reserves this many fencing
--          tokens (the counter moves by the block; the reply's token is the block's first) so
--          that the caller's process may pass the hold to up to block - 1 more local holders
--          in a row without a round trip, each taking the next token of the block (lock
--          cohorting; the holder id of such a hold is minted for it and never given to a
--          caller, so no other process can name it). '' or absent: 1. With a turn (ARGV[3]
--          not '') while another process waits, the block is cut to what is left of the
--          tenure's row (a process that took the lock 7 times in a row of a tenure of 8 may
--          reserve 1 token, not 8), so that passes never stretch a row past the tenure
--
-- Replies (always an array of integers):
--   {1, token}         acquired: the key was absent; created holder -> 1 with the lease and
--                      took the next fencing token (INCR of the counter)
--   {1, token, block}  (only when ARGV[9] is given) the same, with a block: token is the
--                      block's first, block the tokens reserved (at most ARGV[9])
--   {2, token, count}  re-entered: the holder's field existed; count is its new value, the TTL
--                      was reset to the lease, token is the counter's current value (it only
--                      moves when a new holder acquires, so it is this holder's token; after
--                      a block, the block's last token: the client keeps its holder's own)
--   {0, ms}            busy: another holder has the lock (ms = its PTTL), or the free lock is
--                      reserved for another process's turn (ms = what is left of the
--                      reservation); the caller's process was queued
--   {-2}               (only with KEYS[6]) the node marker is missing (the server lost its
--                      data since it was marked) or pending (quarantined); nothing was
--                      touched
--   {-3}               the request was cancelled (its caller gave up and undid it); nothing
--                      was touched
--   {-8, q}            (only with KEYS[6]) the lease is longer than the quarantine q (ms)
--                      the node marker records; nothing was touched
--   {-7}               the request is older than the holder's record (overtaken by a later
--                      request of the same holder, see `older`); nothing was touched. A
--                      caller still waiting sends it again under a fresh id
--   {-4}               (only with ARGV[7] = '1') the holder's field does not exist: its hold
--                      was lost; nothing was touched
--
-- A request whose record says it already acquired, while the holder's field still exists,
-- answers {1, token} or {2, token, count} as it did the first time and changes nothing but
-- the record's expiry (a write, so that a WAIT after the replay covers the grant).
--
-- Every integer is compared explicitly: in Lua, 0 is true.
local marker = false
if #KEYS >= 6 then
    marker = redis.call('GET', KEYS[6])
    -- Missing (the server lost its data), or a quarantine under way ('pending ...').
    if not marker or string.sub(marker, 1, 8) == 'pending ' then
        return {-2}
    end
end
-- Request ids grow in each process (`request.rs`: above every id the process sent before, and
-- drawn from the clock in µs, so ids of different processes compare too), and a holder's
-- requests come from its process. A request older than the holder's record was overtaken by
-- a later request of the same holder: it stalled on its way, and its caller gave up on it
-- (undoing it) and may hold the lock again since. It must do nothing, or it would add a level
-- nobody holds (issue 35, defect 12). Ids are decimal digits without leading zeros.
local function older(x, y)
    return #x < #y or (#x == #y and x < y)
end
local req = ARGV[5] or ''
if req ~= '' then
    local rec = redis.call('GET', KEYS[5])
    if rec then
        local last = string.match(rec, '^(%d+) ')
        if last and older(req, last) then
            return {-7}
        end
        local id, kind, a, b = string.match(rec, '^(%d+) (%a) (%-?%d+) (%-?%d+)$')
        if id == req then
            if kind == 'c' then
                return {-3}
            end
            if kind == 'a' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
                -- A replayed answer writes the record again: a WAIT on the resending
                -- connection then covers this write, and with it the grant before it
                -- (replication is in order); without a write it would count every replica
                -- at once (issue 35, defect 3).
                redis.call('SET', KEYS[5], rec, 'PX', ARGV[6])
                if tonumber(b) == 1 then
                    return {1, tonumber(a)}
                end
                return {2, tonumber(a), tonumber(b)}
            end
        end
    end
end
if ARGV[7] == '1' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
    return {-4}
end
-- A lease longer than the quarantine the marker records would outlive another process's
-- quarantine of this node after a data loss (issue 28, item 3). Checked after the replay (a
-- resent grant answers as it did) and for every acquisition but a re-entry-only call (which
-- renews the lease its hold passed the check with): a first-level call that finds the
-- holder's field re-enters and sets the key's TTL to its own lease, which may be another
-- lock handle's, longer (review finding).
if marker and ARGV[7] ~= '1' then
    local q = tonumber(string.match(marker, ' q=(%d+)$') or '')
    if q and tonumber(ARGV[2]) > q then
        return {-8, q}
    end
end
local function remember(token, count)
    if req ~= '' then
        -- '%d': concatenation would format a µs-scale token (fence expiry) as 1.7e+15, which
        -- the record's pattern does not match (issue 35, defect 9).
        redis.call('SET', KEYS[5], string.format('%s a %d %d', req, token, count), 'PX', ARGV[6])
    end
end
local pid = ARGV[3] or ''
local fence_expiry = ARGV[8] or ''
local asked_block = tonumber(ARGV[9] or '')
local block = asked_block or 1
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function enqueue(now)
    if pid ~= '' then
        redis.call('ZADD', KEYS[3], 'NX', now, pid)
        redis.call('PEXPIRE', KEYS[3], ARGV[2])
    end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
    local tenure = 1
    -- The turn's bookkeeping is skipped while no turn is kept and no process is queued (one
    -- EXISTS over both keys instead of HMGET, TIME, ZREM, HSET and PEXPIRE): nobody waits, so
    -- there is no order to keep; a release that then finds no turn counts this acquisition
    -- as the first of a row (release.lua). Under contention it costs one command more.
    if pid ~= '' and redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
        local turn = redis.call('HMGET', KEYS[4], 'o', 'u', 'n')
        local owner = turn[1]
        if owner then
            local now = now_ms()
            local until_ms = tonumber(turn[2])
            if owner == pid then
                tenure = tonumber(turn[3]) + 1
            elseif until_ms > now then
                enqueue(now)
                return {0, until_ms - now}
            else
                -- The reserved process did not claim its turn in time: it leaves the queue.
                redis.call('ZREM', KEYS[3], owner)
            end
        end
        redis.call('ZREM', KEYS[3], pid)
        redis.call('HSET', KEYS[4], 'o', pid, 'u', 0, 'n', tenure)
        redis.call('PEXPIRE', KEYS[4], ARGV[2])
    end
    if block > 1 and pid ~= '' and redis.call('ZCARD', KEYS[3]) > 0 then
        -- Another process waits and this acquisition is the row's `tenure`-th: reserve no
        -- more than the row has left. (Nobody else waiting, the row does not count.)
        block = math.max(1, math.min(block, tonumber(ARGV[4]) - tenure + 1))
    end
    redis.call('HSET', KEYS[1], ARGV[1], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    local token
    if fence_expiry ~= '' then
        local t = redis.call('TIME')
        local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
        token = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now_us)
        redis.call('SET', KEYS[2], string.format('%d', token + block - 1), 'PX', fence_expiry)
    elseif block > 1 then
        token = redis.call('INCRBY', KEYS[2], block) - block + 1
    else
        token = redis.call('INCR', KEYS[2])
    end
    remember(token, 1)
    if asked_block then
        return {1, token, block}
    end
    return {1, token}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    local count = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if fence_expiry ~= '' then
        redis.call('PEXPIRE', KEYS[2], fence_expiry)
    end
    local token = tonumber(redis.call('GET', KEYS[2]) or '0')
    remember(token, count)
    return {2, token, count}
end
if pid ~= '' then
    enqueue(now_ms())
end
return {0, redis.call('PTTL', KEYS[1])}
