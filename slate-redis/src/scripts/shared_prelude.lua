-- Slate shared mode (read-write lock, semaphore): the prelude of every shared script.
--
-- KEYS[1]  the holders: <prefix>{<name>}:rw (read-write lock) or <prefix>{<name>}:sem
--          (semaphore), a hash: n = permits in use; for each holder h: p:h = the permits it
--          holds (1 for a read hold, the write weight for a write hold, k for k permits),
--          r:h = its shared levels (reads, or 1 for a permit hold), w:h = its write levels,
--          t:h = its fencing token
-- KEYS[2]  the leases: <KEYS[1]>:leases, a sorted set (member = holder, score = server time
--          in ms at which its lease ends)
--
-- A holder whose lease ended is removed (its permits given back) by the next script that
-- runs, before anything else: the holders' state is what it would be had the server expired
-- each lease on time. Both keys live as long as the latest lease and are deleted when nobody
-- holds.
--
-- Every integer is compared explicitly: in Lua, 0 is true.
-- The server's time, in µs and in ms.
local now_us, now
do
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now = math.floor(now_us / 1000)
end
do
    local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
    if #dead > 0 then
        for _, h in ipairs(dead) do
            local p = tonumber(redis.call('HGET', KEYS[1], 'p:' .. h) or '0')
            if p > 0 then
                redis.call('HINCRBY', KEYS[1], 'n', -p)
            end
            redis.call('HDEL', KEYS[1], 'p:' .. h, 'r:' .. h, 'w:' .. h, 't:' .. h)
        end
        redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    end
end
-- Sets both keys' TTL to the latest lease, or deletes them when nobody holds.
local function settle()
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    if #last == 0 then
        redis.call('DEL', KEYS[1], KEYS[2])
        return
    end
    local ttl = math.max(tonumber(last[2]) - now, 1)
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
end
-- The live entries of the waiting processes (KEYS[3], a sorted set: member = queue id,
-- score = server µs when it first got busy, strictly increasing along the queue; KEYS[4], a hash: queue id -> '<permits wanted>
-- <server ms until which the entry waits for its process to ask again> <the sequence
-- number of the attempt that wrote it>'), oldest first, as
-- {id, wanted} pairs; entries whose process did not come back in time are removed.
local function waiting()
    local out = {}
    if redis.call('EXISTS', KEYS[3]) == 0 then
        return out
    end
    for _, e in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
        local want = redis.call('HGET', KEYS[4], e)
        local k, until_ms
        if want then
            k, until_ms = string.match(want, '^(%d+) (%d+)')
        end
        if k and tonumber(until_ms) > now then
            out[#out + 1] = {e, tonumber(k)}
        else
            redis.call('ZREM', KEYS[3], e)
            redis.call('HDEL', KEYS[4], e)
        end
    end
    return out
end
-- The capacity: a semaphore's stored in `key` (when given and set), else `default`.
local function capacity(key, default)
    if key then
        return tonumber(redis.call('GET', key) or default)
    end
    return tonumber(default)
end
-- Sends its queue id on `channel` to each waiting process that now fits, in queue order
-- (the readers at the head together, or the writer at the head; up to 16, then an empty
-- message: anyone may try). `cap`: the capacity; `publish`: 'SPUBLISH' on a cluster.
local function wake(channel, cap, publish)
    local queue = waiting()
    if #queue == 0 then
        return
    end
    local cmd = 'PUBLISH'
    if publish == 'SPUBLISH' then
        cmd = 'SPUBLISH'
    end
    local room = cap - tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
    for i, e in ipairs(queue) do
        if e[2] > room then
            break
        end
        if i > 16 then
            redis.call(cmd, channel, '')
            break
        end
        room = room - e[2]
        redis.call(cmd, channel, e[1])
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
