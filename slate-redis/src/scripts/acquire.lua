-- Slate: acquire (or re-enter) a lock for one holder, with a fair turn between processes.
--
-- KEYS[1]  lock hash: <prefix>{<name>}, TTL = lease. Fields: <holder id> = reentry count (at
--          most one holder: the lock is exclusive); 't' = the holder's fencing token; 'r' = the
--          holder's last request record (below); 'w' = '1' once another process was told busy
--          or a turn was kept while this hold lasted (the release then keeps the turn's books
--          and publishes; without it nobody waits, and the release only deletes). Holder ids
--          always contain ':', so these names never collide with one
-- KEYS[2]  fencing counter of the lock's cluster hash slot: <prefix>fence:{<slot tag>} (see
--          `keys.rs`), shared by every lock whose key hashes to that slot; persistent. A
--          missing counter is seeded from the server clock in µs, so that tokens keep growing
--          after a restart that lost it (unless the clock stepped back by more than the time
--          since the last token); on a multi-node lock's node (with KEYS[6]) it starts at 1
-- KEYS[3]  waiting processes: <prefix>{<name>}:queue, a sorted set (member = process id,
--          score = server time in ms when it first got busy): the processes' FIFO
-- KEYS[4]  the turn: <prefix>{<name>}:turn, a hash {o = queue id, u = reserved until (server
--          ms, 0 while held), n = acquisitions in a row}: the local queue (process) a free lock
--          is reserved for, and its tenure
-- KEYS[5]  the holder's request record key: <prefix>{<name>}:req:<holder>. A request record
--          is '<request id> <kind> <a> <b>' (kind 'a': acquired, a = token, b = count; 'r':
--          released, a = count left; 'c': cancelled, the request must do nothing; 'b': a resend
--          of it was refused, so its first send must do nothing, and a further resend is
--          answered anew). The key's expiry is never shortened by a write. Every
--          request keeps its record in the lock hash (field 'r'), which costs no command and
--          lives as long as the hold. Only a request that may have been sent before (ARGV[8],
--          a resend after a broken connection) and the release's undo also write this key,
--          which outlives the hold for the retry window: so that a stale copy of the request
--          arriving after the hold ended (a first send that stalled on its way) does nothing
-- KEYS[6]  (optional, multi-node locks) the node marker: <prefix>node-marker, a persistent key
--          written once per server; its absence means the server lost its data. Its value
--          ends in ' q=<ms>', the node set's quarantine, which bounds every lease here
-- ARGV[1]  holder id (the text of a HolderId)
-- ARGV[2]  lease in milliseconds (positive integer)
-- ARGV[3]  queue id of the caller ('' = no turn: take a free lock whatever the queue;
--          KEYS[3] and KEYS[4] are then not written)
-- ARGV[4]  tenure: acquisitions in a row a queue may keep while others wait
-- ARGV[5]  request id (decimal digits, unique per call; '' = no record)
-- ARGV[6]  how long the record key is kept, in ms (the window in which a copy may arrive)
-- ARGV[7]  '1': a re-entry only ('': any acquisition). The caller holds the lock in its
--          process, so the holder's field must exist; if it does not (the lease was lost),
--          nothing is touched and {-4} is answered: a fresh hold must never be counted as one
--          more level
-- ARGV[8]  '1': this request may have been sent before (a resend on a new connection): write
--          its record to KEYS[5] too, and when it does not grant, mark it cancelled there
--          ('<id> c 0 0'), so that the first send, if it arrives later, does nothing ('': a
--          first send)
-- ARGV[9]  (optional) block: a first acquisition reserves this many fencing
--          tokens (the counter moves by the block; the reply's token is the block's first) so
--          that the caller's process may pass the hold to up to block - 1 more local holders
--          in a row without a round trip, each taking the next token of the block (lock
--          cohorting; the holder id of such a hold is minted for it and never given to a
--          caller, so no other process can name it). '' or absent: 1. With a turn (ARGV[3]
--          not '') while another process waits, the block is cut to what is left of the
--          tenure's row (a process that took the lock 7 times in a row of a tenure of 8 may
--          reserve 1 token, not 8), so that passes never stretch a row past the tenure
-- ARGV[10] (optional) '1': a fresh hold's block starts at the server clock in µs when the
--          slot's counter is below it (not on a multi-node lock's node). A client
--          asks it at its first grant in a slot on a server it has not used before (a restart
--          or a failover included, `RedisClient::fence_floor_needed`): a server that came back
--          with older data (a snapshot, an AOF that lost its last second, a replica that
--          missed the last increments) has an older counter, and tokens, which grow by a
--          few per acquisition and so stay behind the clock in µs, then stay above every
--          token issued before
--
-- Replies (always an array of integers):
--   {1, token}         acquired: the lock was free; created holder -> 1 with the lease and
--                      took the next fencing token of the slot's counter
--   {1, token, block}  (only when ARGV[9] is a number) the same, with a block: token is the
--                      block's first, block the tokens reserved (at most ARGV[9])
--   {2, token, count}  re-entered: the holder's field existed; count is its new value, the TTL
--                      was reset to the lease, token is the holder's token (field 't'; after a
--                      block, the block's first: the client keeps its current holder's own)
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
--                      request of the same holder, see `older`), or its own acquisition
--                      already ran and that hold has ended; nothing was touched. A caller
--                      still waiting sends it again under a fresh id
--   {-4}               (only with ARGV[7] = '1') the holder's field does not exist: its hold
--                      was lost; nothing was touched
--
-- A request whose record says it already acquired, while that hold lasts, answers {1, token}
-- or {2, token, count} as it did the first time and changes nothing but the record (a write,
-- so that a WAIT after the replay covers the grant).
--
-- The common case costs four commands besides the call itself: EXISTS over the lock, queue,
-- turn and record key (none exists: free, nobody waits, no copy of an earlier request is
-- about), INCR of the slot's counter, HSET of the holder, its token and record, and PEXPIRE.
-- A re-entry, or a busy answer while nobody else is queued, costs EXISTS, HMGET and its own
-- writes.
--
-- Every integer is compared explicitly: in Lua, 0 is true.
local marker = false
local marker_refused = false
if #KEYS >= 6 then
    marker = redis.call('GET', KEYS[6])
    -- Missing (the server lost its data), or a quarantine under way ('pending ...').
    marker_refused = not marker or string.sub(marker, 1, 8) == 'pending '
end
local holder, lease = ARGV[1], ARGV[2]
local req = ARGV[5] or ''
local careful = ARGV[8] == '1' and req ~= ''
local pid = ARGV[3] or ''
local asked_block = tonumber(ARGV[9] or '')
local block = asked_block or 1
-- Writes the record key, never shortening what it has left: a mark that must outlive a copy
-- of an earlier request (a combination node's, kept for a lease) is not cut short by a later
-- request's shorter window.
local function keep_record(value)
    local ms = tonumber(ARGV[6])
    local left = redis.call('PTTL', KEYS[5])
    if left > ms then
        ms = left
    end
    redis.call('SET', KEYS[5], value, 'PX', ms)
end
local function record(token, count)
    return string.format('%s a %d %d', req, token, count)
end
-- The next block of tokens from the slot's counter. A counter that did not exist (a new
-- server, or one that lost its data), or one below the server clock in µs when the caller asks
-- for the raise (ARGV[10]: a server that came back with older data), moves up to the clock
-- first: the block then starts there. Not on a multi-node lock's node (KEYS[6]): there the
-- counters of the nodes must agree, or every acquisition would have to raise the others to the
-- highest (a round trip), and clocks differ; a node that lost its data is quarantined, and its
-- counter raised, by the multi-node lock.
local function take_tokens(n)
    local last
    if n == 1 then
        last = redis.call('INCR', KEYS[2])
    else
        last = redis.call('INCRBY', KEYS[2], n)
    end
    if #KEYS < 6 and (last == n or ARGV[10] == '1') then
        local t = redis.call('TIME')
        local floor = tonumber(t[1]) * 1000000 + tonumber(t[2]) + n - 1
        if last < floor then
            last = floor
            redis.call('SET', KEYS[2], string.format('%d', last))
        end
    end
    return last - n + 1
end
-- A fresh hold: the holder's field, its token and record in one write. `waiting`: another
-- process waits or a turn is kept (the release must keep the turn's books).
local function grant(waiting)
    local token = take_tokens(block)
    local rec = ''
    if req ~= '' then
        rec = record(token, 1)
    end
    if waiting then
        redis.call('HSET', KEYS[1], holder, 1, 't', token, 'r', rec, 'w', 1)
    else
        redis.call('HSET', KEYS[1], holder, 1, 't', token, 'r', rec)
    end
    redis.call('PEXPIRE', KEYS[1], lease)
    if careful then
        keep_record(rec)
    end
    if asked_block then
        return {1, token, block}
    end
    return {1, token}
end

-- The common case is decided here, before the other helpers are made (each `local function`
-- is a closure built on every call, and the Lua work is most of a call's server time; see
-- docs/BENCHMARKS.md, "where the server's time goes"): on a server without a node marker, a
-- lock that is free, with nobody queued, no turn kept and no record about, is taken at once
-- (unless the call is a re-entry only, refused below).
local present = false
if #KEYS < 6 then
    present = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
    if present == 0 and ARGV[7] ~= '1' then
        return grant(false)
    end
end

-- A lease longer than the quarantine the marker records would outlive another process's
-- quarantine of this node after a data loss (issue 28, item 3). Checked for every
-- acquisition but a re-entry-only call (which renews the lease its hold passed the check
-- with), and after a replay (a resent grant answers as it did).
local function over_quarantine()
    if marker and ARGV[7] ~= '1' then
        local q = tonumber(string.match(marker, ' q=(%d+)$') or '')
        if q and tonumber(lease) > q then
            return q
        end
    end
    return nil
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
-- The record key's value, read once (false: none).
local outer_read, outer_value = false, false
local function outer()
    if not outer_read then
        outer_read, outer_value = true, redis.call('GET', KEYS[5])
    end
    return outer_value
end
-- A resend that does not grant: its first send, if still on its way, must not grant either
-- when it arrives later, even after every hold of the holder has ended and taken the lock
-- hash's record with it. The record key says so (cancelled), unless it holds a newer record.
-- Kind 'b' (refused while sent again): a first send that finds it does nothing ({-3}); a
-- later resend of the same request is answered anew.
local function refuse(reply)
    if careful then
        local o = outer()
        local oid = o and string.match(o, '^(%d+) ')
        if not (oid and older(req, oid)) then
            keep_record(req .. ' b 0 0')
        end
    end
    return reply
end

if marker_refused then
    return refuse({-2})
end

-- The refusals every acquisition checks before it grants or re-enters: a re-entry-only call
-- whose hold is gone ({-4}), a lease over the node's quarantine ({-8, q}). `held`: the holder's
-- field exists.
local function refusal(held)
    if ARGV[7] == '1' and not held then
        return refuse({-4})
    end
    local q = over_quarantine()
    if q then
        return refuse({-8, q})
    end
    return nil
end

if present == false then
    present = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
end
if present == 0 then
    -- Free, nobody queued, no turn kept, no record about: take it.
    return refusal(false) or grant(false)
end

local entry = redis.call('HMGET', KEYS[1], holder, 't', 'r', 'w')
-- Every hold has a token field: with one key present and the hold's token there, the lock
-- hash is that key, and there is no record key, queue or turn to read (a busy answer or a
-- re-entry then costs two commands less).
local held_alone = present == 1 and entry[2] ~= false
if held_alone then
    outer_read, outer_value = true, false
end
local count = tonumber(entry[1] or '0')
local inner = false
if count > 0 then
    inner = entry[3]
end
if req ~= '' then
    -- The holder's latest record: the lock hash's (while the holder's field exists), or the
    -- record key's, whichever is newer.
    local latest = inner
    local o = outer()
    local lid = latest and string.match(latest, '^(%d+) ')
    local oid = o and string.match(o, '^(%d+) ')
    if oid and (not lid or older(lid, oid)) then
        latest, lid = o, oid
    end
    if lid and older(req, lid) then
        return refuse({-7})
    end
    if lid == req then
        local _, kind, a, b = string.match(latest, '^(%d+) (%a) (%-?%d+) (%-?%d+)$')
        if kind == 'c' or (kind == 'b' and not careful) then
            return {-3}
        end
        if kind == 'a' then
            if inner and string.match(inner, '^(%d+) ') == req then
                -- This request's hold lasts: answer as the first time. The write makes a WAIT
                -- on the resending connection cover the grant before it (replication is in
                -- order); without a write it would count every replica at once (issue 35,
                -- defect 3).
                redis.call('HSET', KEYS[1], 'r', inner)
                if careful then
                    keep_record(inner)
                end
                if tonumber(b) == 1 then
                    return {1, tonumber(a)}
                end
                return {2, tonumber(a), tonumber(b)}
            end
            -- It acquired, and that hold has ended since: a copy of it must not start another.
            return refuse({-7})
        end
    end
end
local refused = refusal(count > 0)
if refused then
    return refused
end
if count > 0 then
    -- Re-entry.
    count = count + 1
    local token = tonumber(entry[2] or '0')
    local rec = ''
    if req ~= '' then
        rec = record(token, count)
    end
    redis.call('HSET', KEYS[1], holder, count, 'r', rec)
    redis.call('PEXPIRE', KEYS[1], lease)
    if careful then
        keep_record(rec)
    end
    return {2, token, count}
end
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function enqueue(now)
    if pid ~= '' then
        redis.call('ZADD', KEYS[3], 'NX', now, pid)
        redis.call('PEXPIRE', KEYS[3], lease)
    end
end
if held_alone or redis.call('EXISTS', KEYS[1]) == 1 then
    -- Held by another holder: busy. The hold learns that someone waits ('w'), so that its
    -- release publishes.
    if not entry[4] then
        redis.call('HSET', KEYS[1], 'w', 1)
    end
    if pid ~= '' then
        enqueue(now_ms())
    end
    return refuse({0, redis.call('PTTL', KEYS[1])})
end
-- Free, with a queue, a turn or a record about.
local tenure = 1
local waiting = false
if pid ~= '' and redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
    waiting = true
    local turn = redis.call('HMGET', KEYS[4], 'o', 'u', 'n')
    local owner = turn[1]
    if owner then
        local now = now_ms()
        local until_ms = tonumber(turn[2])
        if owner == pid then
            tenure = tonumber(turn[3]) + 1
        elseif until_ms > now then
            enqueue(now)
            return refuse({0, until_ms - now})
        else
            -- The reserved process did not claim its turn in time: it leaves the queue.
            redis.call('ZREM', KEYS[3], owner)
        end
    end
    redis.call('ZREM', KEYS[3], pid)
    redis.call('HSET', KEYS[4], 'o', pid, 'u', 0, 'n', tenure)
    redis.call('PEXPIRE', KEYS[4], lease)
    if block > 1 and redis.call('ZCARD', KEYS[3]) > 0 then
        -- Another process waits and this acquisition is the row's `tenure`-th: reserve no
        -- more than the row has left. (Nobody else waiting, the row does not count.)
        block = math.max(1, math.min(block, tonumber(ARGV[4]) - tenure + 1))
    end
end
return grant(waiting)
