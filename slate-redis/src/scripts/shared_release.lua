-- Slate shared mode: release one level of a read, write or permit hold, and wake the waiting
-- processes that now fit.
--
-- KEYS[1]..KEYS[4]  holders, leases, waiting processes, what they want (see the prelude)
-- KEYS[5]  the release channel: <KEYS[1]>:released
-- KEYS[6]  the holder's request record (see shared_acquire.lua)
-- KEYS[7]  (optional, semaphore) the capacity key (see shared_acquire.lua)
-- ARGV[1]  holder id
-- ARGV[2]  'w' a write level, 'r' a shared level
-- ARGV[3]  lease in milliseconds (reset by a release that leaves the holder holding)
-- ARGV[4]  request id ('' = no record)
-- ARGV[5]  how long the record is kept, in ms
-- ARGV[6]  '' or the request id of an acquire to undo: release the level it added if it ran,
--          else mark it cancelled
-- ARGV[7]  'SPUBLISH' on a Redis Cluster, anything else 'PUBLISH'
-- ARGV[8]  the capacity, as ARGV[10] of shared_acquire.lua
--
-- The last write level of a holder that also reads keeps one permit (a downgrade: its read
-- goes on without a gap); the last read level of a holder that also writes gives nothing
-- back (the write covers it). When permits come back, each waiting process that now fits,
-- in queue order, is sent its queue id on the channel (up to 16; then an empty message,
-- anyone may try).
--
-- Replies (an integer):
--   -2      (undo only) the acquire had not run: it is cancelled
--   -1      not held in this mode: nothing was touched
--   n >= 0  the levels the holder still holds in this mode
local h = ARGV[1]
local req = ARGV[4]
local function record()
    local rec = redis.call('GET', KEYS[6])
    if rec then
        return string.match(rec, '^(%d+) (%a) (%-?%d+)')
    end
end
if req ~= '' then
    local id, kind, a = record()
    if id == req and kind == 'r' then
        return tonumber(a)
    end
end
if ARGV[6] ~= '' then
    local id, kind = record()
    if not (id == ARGV[6] and kind == 'a') then
        -- A record newer than the undone acquire is kept (see `older` in the prelude).
        if not (id and older(ARGV[6], id)) then
            redis.call('SET', KEYS[6], ARGV[6] .. ' c 0 0 0', 'PX', ARGV[5])
        end
        return -2
    end
end
if not redis.call('ZSCORE', KEYS[2], h) then
    return -1
end
local f = redis.call('HMGET', KEYS[1], 'r:' .. h, 'w:' .. h, 'p:' .. h)
local r, w, p = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
local mine, other = r, w
local field = 'r:'
if ARGV[2] == 'w' then
    mine, other, field = w, r, 'w:'
end
if mine <= 0 then
    return -1
end
local left = mine - 1
if left > 0 then
    redis.call('HSET', KEYS[1], field .. h, left)
else
    redis.call('HDEL', KEYS[1], field .. h)
end
if req ~= '' then
    redis.call('SET', KEYS[6], string.format('%s r %d 0 0', req, left), 'PX', ARGV[5])
end
-- The permits the holder keeps: all while levels of this mode remain or its write covers the
-- read it released; one when its write ends under its read; none when it holds nothing more.
local keep = p
if left == 0 and other == 0 then
    keep = 0
elseif left == 0 and ARGV[2] == 'w' then
    keep = 1
end
if keep > 0 then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), h)
    if keep < p then
        redis.call('HSET', KEYS[1], 'p:' .. h, keep)
    end
else
    redis.call('HDEL', KEYS[1], 'p:' .. h, 't:' .. h)
    redis.call('ZREM', KEYS[2], h)
end
if keep < p then
    redis.call('HINCRBY', KEYS[1], 'n', keep - p)
end
settle()
if keep == p then
    return left
end
wake(KEYS[5], capacity(KEYS[7], ARGV[8]), ARGV[7])
return left
