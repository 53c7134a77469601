-- Slate multi-node locks: write a node's marker (see `Node::mark`).
--
-- KEYS[1]  the node marker: <prefix>node-marker, '<stamp>[ q=<bound ms>]' or, while a
--          quarantine runs, 'pending <stamp> <until ms>[ q=<bound ms>]'
-- ARGV[1]  the stamp (the server's run id and start, see ServerInfo::marker_stamp)
-- ARGV[2]  the quarantine bound in ms ('' for none); a bound never goes down but by 'adopt'
-- ARGV[3]  the mode: 'adopt' (set exactly, reading nothing); 'stamp' (stamp a node whose
--          quarantine ran its course on this server, or add a bound to its own stamp:
--          refused when the marker is missing, another server's, or pending with time left);
--          'pend' (start a quarantine of ARGV[4] ms on the server's clock, keep the one this
--          server already runs, at most the bound from now, or leave alone a stamp of this
--          very server)
-- ARGV[4]  ('pend') the quarantine in ms
--
-- Replies (an array):
--   {bound or -1, ms left of the quarantine (0: none), 1 if written as asked else 0}
local suffix = ''
if ARGV[2] ~= '' then
    suffix = ' q=' .. ARGV[2]
end
if ARGV[3] == 'adopt' then
    redis.call('SET', KEYS[1], ARGV[1] .. suffix)
    return {tonumber(ARGV[2]) or -1, 0, 1}
end
local q = tonumber(ARGV[2])
local cur = redis.call('GET', KEYS[1])
local old_q = cur and tonumber(string.match(cur, ' q=(%d+)$') or '')
if old_q and (not q or old_q > q) then
    q = old_q
end
suffix = ''
if q then
    suffix = string.format(' q=%d', q)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A quarantine this very server runs: 'pending <stamp> <until ms>'.
local until_ms = nil
if cur then
    local stamp, u = string.match(cur, '^pending (.+) (%d+) q=%d+$')
    if not stamp then
        stamp, u = string.match(cur, '^pending (.+) (%d+)$')
    end
    if stamp == ARGV[1] then
        until_ms = tonumber(u)
    end
end
local own = cur == ARGV[1] or (cur and string.sub(cur, 1, #ARGV[1] + 3) == ARGV[1] .. ' q=')
if ARGV[3] == 'pend' then
    -- Stamped by this very server since it was read: a quarantine of this server ran its
    -- course after the loss the caller saw; left alone.
    if own then
        return {q or -1, 0, 0}
    end
    if until_ms then
        -- More time left than the bound: the server's clock went back; counted from now.
        if q and until_ms - now > q then
            until_ms = now + q
        end
        redis.call('SET', KEYS[1], string.format('pending %s %d', ARGV[1], until_ms) .. suffix)
        return {q or -1, math.max(until_ms - now, 0), 1}
    end
    local wait = tonumber(ARGV[4]) or 0
    redis.call('SET', KEYS[1], string.format('pending %s %d', ARGV[1], now + wait) .. suffix)
    return {q or -1, wait, 1}
end
-- 'stamp'
if not ((until_ms and until_ms <= now) or own) then
    local left = 0
    if until_ms then
        left = until_ms - now
    end
    return {q or -1, left, 0}
end
redis.call('SET', KEYS[1], ARGV[1] .. suffix)
return {q or -1, 0, 1}
