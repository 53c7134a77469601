-- Slate: release one level on each of several single locks of one server (or one cluster
-- slot), in one server step: the multi-lock's unlock (`primitives/multi.rs`).
--
-- The script that runs is `release.lua` wrapped as a function, `one(KEYS, ARGV)`, followed by
-- this driver (see `scripts::RELEASE_MANY`): each name gets exactly what its own `release.lua`
-- call would do and answer, with its holder check, its turn, its release message and its
-- request record. Every name is released whatever the others answer (a name whose lease was
-- lost answers -1 and the rest are still released), so the reply has one entry per name.
--
-- Idempotent as `release.lua` is, name by name: a resend (ARGV[4] = '1') answers from each
-- name's record, and a copy that arrives late finds each name's record of this request (or of
-- a newer one) and does nothing.
--
-- KEYS     five per name: KEYS[5i+1..5i+5] = name i's lock hash, release channel, queue, turn
--          and the holder's request record key (`release.lua` KEYS[1..5])
-- ARGV[1]  request id (the same for every name: each name keeps its own record)
-- ARGV[2]  how long a record key is kept, in ms
-- ARGV[3]  'SPUBLISH' on a Redis Cluster, anything else = 'PUBLISH' (`release.lua` ARGV[10])
-- ARGV[4]  '1': this call may have been sent before (`release.lua` ARGV[12]); '' otherwise
-- ARGV[5+7i..11+7i]
--          name i's holder id, lease in ms, queue id, tenure, 1 if tasks of the caller's
--          process wait for the name (else 0), how long a turn stays reserved in ms, and how
--          many local holders its remote hold served (`release.lua` ARGV[1..6], ARGV[11])
--
-- Replies: an array with one entry per name, in the order of KEYS: that name's `release.lua`
-- reply (-7 overtaken, -1 not held, 0 released, n > 0 still held n times), or, for a name one
-- of whose keys has another type, that error's text ('WRONGTYPE ...'; what ran of that name's
-- release before the error stays, as for a single `release.lua` call). Any other error (a
-- replica's READONLY, OOM) is the whole call's, with its code.
if #KEYS == 0 or #KEYS % 5 ~= 0 or #ARGV ~= 4 + 7 * (#KEYS / 5) then
    return redis.error_reply('release_many: five KEYS and seven ARGV per name, got '
        .. #KEYS .. ' KEYS and ' .. #ARGV .. ' ARGV')
end
local replies = {}
for i = 0, #KEYS / 5 - 1 do
    local k, a = 5 * i, 4 + 7 * i
    local ok, reply = pcall(one,
        {KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]},
        {ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6],
            ARGV[1], ARGV[2], '', ARGV[3], ARGV[a + 7], ARGV[4]}
    )
    if not ok then
        local text = reply
        if type(reply) == 'table' and reply.err then
            text = reply.err
        end
        text = tostring(text)
        if string.sub(text, 1, 10) ~= 'WRONGTYPE ' then
            -- Not this name's own (a replica's READONLY, a server out of memory...): the call
            -- answers it, code first, as a single release would fail with it. (Raised again,
            -- it would come back behind the script's position, its code lost.)
            return redis.error_reply(text)
        end
        -- This name's own error (one of its keys is not Slate's) is its answer, as text with
        -- the code first: it does not keep the names after it from being released, nor
        -- change their answers. (An error reply nested in the array would fail the whole
        -- call in the client.)
        reply = text
    end
    replies[i + 1] = reply
end
return replies
