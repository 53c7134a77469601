//! The Lua scripts of the Redis primitives (`scripts/*.lua`), run by `EVALSHA`, each called
//! through its typed binding in [`call`].
//!
//! A binding's `cmd()` builds the `EVALSHA` command. A single call goes through its `eval()`
//! (`conn::eval`), which, on a `NOSCRIPT` reply (a restarted server has an empty script cache),
//! loads the script and sends the call once more; in a pipeline (renewal, and a script followed
//! by its `WAIT`: `conn::eval_then_wait`) the caller loads the script and resends what
//! answered `NOSCRIPT`, once.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind};
use slate_core::HolderId;
use slate_core::mutant::{self, Mutant};

pub(crate) mod call;
pub(crate) mod keys;
pub(crate) mod request;

/// One script: its text, and redis-rs's `Script` (which knows the SHA1).
pub(crate) struct SlateScript {
    pub(crate) code: &'static str,
    pub(crate) script: Script,
}

impl SlateScript {
    fn new(code: &'static str) -> Self {
        SlateScript {
            code,
            script: Script::new(code),
        }
    }

    /// The script, or, with `m` switched on (a mutant build, `slate_core::mutant`), the
    /// script with `from` replaced by `to`: the one place a mutant breaks a script.
    fn mutated(code: &'static str, m: Mutant, from: &str, to: &str) -> Self {
        if !mutant::active(m) {
            return SlateScript::new(code);
        }
        assert!(
            code.contains(from),
            "mutant {}: the script no longer contains {from:?}",
            m.name()
        );
        // Leaked once per process, and only in a mutant build run with the mutant on.
        SlateScript::new(String::leak(code.replacen(from, to, 1)))
    }

    /// `SCRIPT LOAD <code>`.
    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.code);
        cmd
    }
}

/// The fast path's existence check in `acquire.lua` (the first of its two `EXISTS` of the four
/// keys: the one followed by the fast path's guard), as its mutants find it.
const FAST_PATH_EXISTS: &str =
    "present = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4], KEYS[5])\n    if present == 0 and";

/// `acquire.lua`: acquire or re-enter.
pub(crate) static ACQUIRE: LazyLock<SlateScript> = LazyLock::new(|| {
    // Its mutants (one runs at a time): what each replaces, and with what.
    let mutants = [
        // The counter is never raised to the clock: a server back with older data repeats
        // tokens.
        (
            Mutant::FenceRaiseSkipped,
            "(last == n or ARGV[10] == '1')",
            "last == n",
        ),
        // A free lock reserved for another process's turn goes to whoever asks.
        (
            Mutant::GrantIgnoresTurn,
            "elseif until_ms > now then",
            "elseif false then",
        ),
        // The fast path's guard (`present == 0`, not a re-entry-only call), each part left out
        // in turn: the record key, the line and turn, the re-entry-only refusal.
        (
            Mutant::FastPathSkipsRecord,
            FAST_PATH_EXISTS,
            "present = redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[4])\n    if present == 0 and",
        ),
        (
            Mutant::FastPathSkipsTurn,
            FAST_PATH_EXISTS,
            "present = redis.call('EXISTS', KEYS[1], KEYS[5])\n    if present == 0 and",
        ),
        (
            Mutant::FastPathGrantsReentryOnly,
            "if present == 0 and ARGV[7] ~= '1' then\n        return grant(false)",
            "if present == 0 then\n        return grant(false)",
        ),
        // Takes a token without looking at the holder: a re-entry returns a new token.
        (
            Mutant::TokenBeforeHolderCheck,
            "local token = tonumber(entry[2] or '0')",
            "local token = take_tokens(1)",
        ),
    ];
    let (m, from, to) = mutants
        .iter()
        .find(|(m, ..)| mutant::active(*m))
        .unwrap_or(&mutants[0]);
    SlateScript::mutated(include_str!("acquire.lua"), *m, from, to)
});
/// A batch script's text: the one-name script `one` (as this build sends it, mutants included)
/// wrapped as the function `one(KEYS, ARGV)`, then the batch's `driver`. Built once per
/// process and static.
fn with_driver(one: &str, driver: &str) -> &'static str {
    String::leak(format!(
        "local function one(KEYS, ARGV)\n{one}\nend\n{driver}"
    ))
}

/// `acquire_many.lua`: several names of one server (or slot) in one step, in order, until the
/// first that is not granted: `acquire.lua` (as this build sends it, mutants included) wrapped
/// as the function `one(KEYS, ARGV)`, then the driver.
pub(crate) static ACQUIRE_MANY: LazyLock<SlateScript> = LazyLock::new(|| {
    let code = with_driver(ACQUIRE.code, include_str!("acquire_many.lua"));
    // Goes on past a name it does not grant: a caller waiting for it holds names after it.
    SlateScript::mutated(
        code,
        Mutant::BatchPastRefusal,
        "then\n        break\n    end",
        "then\n    end",
    )
});
/// `release.lua`: release one level.
pub(crate) static RELEASE: LazyLock<SlateScript> = LazyLock::new(|| {
    // A missing field counts as a hold: the release deletes whoever holds the lock.
    SlateScript::mutated(
        include_str!("release.lua"),
        Mutant::ReleaseSkipsHolderCheck,
        "local held = tonumber(entry[1] or '0')",
        "local held = tonumber(entry[1] or '1')",
    )
});
/// `release_many.lua`: one level of several names of one server (or slot) in one step, every
/// name whatever the others answer: `release.lua` (as this build sends it, mutants included)
/// wrapped as the function `one(KEYS, ARGV)`, then the driver.
pub(crate) static RELEASE_MANY: LazyLock<SlateScript> = LazyLock::new(|| {
    let code = with_driver(RELEASE.code, include_str!("release_many.lua"));
    // Leaves the last name held.
    SlateScript::mutated(
        code,
        Mutant::ReleaseManySkipsAName,
        "for i = 0, #KEYS / 5 - 1 do",
        "for i = 0, #KEYS / 5 - 2 do",
    )
});
/// `renew.lua`: renew a holder's lease.
pub(crate) static RENEW: LazyLock<SlateScript> = LazyLock::new(|| {
    // Extends the key whoever holds it.
    SlateScript::mutated(
        include_str!("renew.lua"),
        Mutant::RenewAnyHolder,
        "if redis.call('HGET', KEYS[1], ARGV[1]) then",
        "if redis.call('EXISTS', KEYS[1]) == 1 then",
    )
});
/// `force_unlock.lua`: delete whoever holds it, and publish.
pub(crate) static FORCE_UNLOCK: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("force_unlock.lua")));

/// `inspect.lua`: one lock's state in one round trip.
pub(crate) static INSPECT: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("inspect.lua")));
/// `raise_fence.lua`: raise a multi-node lock's fencing counter on one node.
pub(crate) static RAISE_FENCE: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("raise_fence.lua")));
/// `mark.lua`: write a multi-node lock's node marker.
pub(crate) static MARK: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("mark.lua")));

/// `leave.lua`: a drained process gives up its place in line and hands on its turn.
pub(crate) static LEAVE: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("leave.lua")));
/// `latch_set.lua`: set a countdown latch's count.
pub(crate) static LATCH_SET: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("latch_set.lua")));
/// `latch_down.lua`: count a countdown latch down, once per request.
pub(crate) static LATCH_DOWN: LazyLock<SlateScript> = LazyLock::new(|| {
    // A count-down's id is not looked at: every copy of it counts.
    SlateScript::mutated(
        include_str!("latch_down.lua"),
        Mutant::LatchCountsResends,
        "if seen then",
        "if false then",
    )
});

/// The shared-mode scripts (read-write lock, semaphore): each is `shared_prelude.lua`
/// followed by its body.
macro_rules! shared_script {
    ($file:literal) => {
        LazyLock::new(|| {
            SlateScript::new(concat!(
                include_str!("shared_prelude.lua"),
                include_str!(concat!("", $file))
            ))
        })
    };
}

/// `shared_acquire.lua`: acquire or re-enter a read, write or permit hold.
pub(crate) static SHARED_ACQUIRE: LazyLock<SlateScript> = shared_script!("shared_acquire.lua");
/// `shared_release.lua`: release one level and wake the processes that now fit.
pub(crate) static SHARED_RELEASE: LazyLock<SlateScript> = shared_script!("shared_release.lua");
/// `shared_renew.lua`: renew a shared-mode holder's lease.
pub(crate) static SHARED_RENEW: LazyLock<SlateScript> = shared_script!("shared_renew.lua");
/// `shared_leave.lua`: a drained process gives up its place in the queue.
pub(crate) static SHARED_LEAVE: LazyLock<SlateScript> = shared_script!("shared_leave.lua");
/// `shared_admin.lua`: inspect, clear, or set a semaphore's permits.
pub(crate) static SHARED_ADMIN: LazyLock<SlateScript> = shared_script!("shared_admin.lua");

/// Every script the locks send in normal operation, for loading them on a new connection
/// (a script missing here costs a `NOSCRIPT` and a `SCRIPT LOAD` on each connection's first
/// use; the inspection and node-marker scripts are left to that).
pub(crate) static ALL: [&LazyLock<SlateScript>; 14] = [
    &ACQUIRE,
    &ACQUIRE_MANY,
    &RELEASE,
    &RELEASE_MANY,
    &RENEW,
    &FORCE_UNLOCK,
    &LEAVE,
    &SHARED_ACQUIRE,
    &SHARED_RELEASE,
    &SHARED_RENEW,
    &SHARED_ADMIN,
    &SHARED_LEAVE,
    &LATCH_SET,
    &LATCH_DOWN,
];

/// Every script by its file name (without `.lua`).
static NAMED: [(&str, &LazyLock<SlateScript>); 17] = [
    ("acquire", &ACQUIRE),
    ("acquire_many", &ACQUIRE_MANY),
    ("release", &RELEASE),
    ("release_many", &RELEASE_MANY),
    ("renew", &RENEW),
    ("force_unlock", &FORCE_UNLOCK),
    ("inspect", &INSPECT),
    ("raise_fence", &RAISE_FENCE),
    ("mark", &MARK),
    ("shared_acquire", &SHARED_ACQUIRE),
    ("shared_release", &SHARED_RELEASE),
    ("shared_renew", &SHARED_RENEW),
    ("shared_leave", &SHARED_LEAVE),
    ("shared_admin", &SHARED_ADMIN),
    ("leave", &LEAVE),
    ("latch_set", &LATCH_SET),
    ("latch_down", &LATCH_DOWN),
];

/// One of the Lua scripts Slate runs on a Redis server, as this build sends it: for an
/// operator who audits what runs on the server or preloads it (`SCRIPT LOAD`) where clients
/// may not load scripts, and for tools that call a script directly.
///
/// # Examples
///
/// ```
/// let release = slate_redis::lua_script("release").expect("a script of Slate's");
/// assert_eq!(release.sha1.len(), 40);
/// assert!(release.source.contains("KEYS[1]"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LuaScript {
    /// The script's name: its file name in `slate-redis/src/scripts` without `.lua` (the
    /// shared-mode scripts' source is `shared_prelude.lua` followed by that file;
    /// `acquire_many`'s is `acquire.lua` wrapped as a function, followed by that file).
    pub name: &'static str,
    /// The SHA1 digest `EVALSHA` names it by.
    pub sha1: &'static str,
    /// The source, whose header states its keys, arguments and replies.
    pub source: &'static str,
}

/// Every Lua script Slate runs on a Redis server (see [`LuaScript`]).
///
/// # Examples
///
/// ```
/// for script in slate_redis::lua_scripts() {
///     println!("{} {}", script.sha1, script.name);
/// }
/// ```
pub fn lua_scripts() -> impl Iterator<Item = LuaScript> {
    NAMED.iter().map(|(name, s)| {
        let s: &'static SlateScript = s;
        LuaScript {
            name,
            sha1: s.script.get_hash(),
            source: s.code,
        }
    })
}

/// The Lua script named `name` (see [`LuaScript::name`]), or `None`.
///
/// # Examples
///
/// ```
/// assert!(slate_redis::lua_script("acquire").is_some());
/// assert!(slate_redis::lua_script("nope").is_none());
/// ```
pub fn lua_script(name: &str) -> Option<LuaScript> {
    lua_scripts().find(|s| s.name == name)
}

/// A lease as the scripts' ARGV: whole milliseconds, at least 1.
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The renewal of a shared-mode hold (holders `key`, leases `leases`), for a pipeline.
pub(crate) fn shared_renew_cmd(
    key: &[u8],
    leases: &[u8],
    holder: HolderId,
    lease: Duration,
) -> Cmd {
    let holder = holder.to_string();
    call::SharedRenew {
        holders: key,
        leases,
        holder: &holder,
        lease_ms: lease_ms(lease),
    }
    .cmd()
}

/// The renewal of one hold, for a pipeline.
///
/// `turn`: the single lock's turn key (refreshed with the lease); `alias`: the single lock's
/// current holder key and the local holder the hold was passed to (needs `turn`).
pub(crate) fn renew_cmd(
    key: &[u8],
    turn: Option<&[u8]>,
    holder: HolderId,
    lease: Duration,
    alias: Option<(&[u8], HolderId)>,
) -> Cmd {
    let holder = holder.to_string();
    let passed_to = alias.map(|(_, to)| to.to_string());
    call::Renew {
        lock: key,
        turn,
        // The current holder goes only with the turn (KEYS[2]).
        current: turn.and(alias.map(|(current, _)| current)),
        holder: &holder,
        lease_ms: lease_ms(lease),
        passed_to: turn.and(passed_to.as_deref()),
    }
    .cmd()
}

/// Whether a reply says the server does not know the script.
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_states_keys_argv_and_replies() {
        for s in ALL {
            assert!(s.code.contains("KEYS[1]"));
            assert!(s.code.contains("ARGV"));
            assert!(s.code.contains("Replies"));
            assert_eq!(s.script.get_hash().len(), 40);
        }
    }

    #[test]
    fn every_script_is_listed_once_by_its_file_name() {
        let names: std::collections::BTreeSet<_> = lua_scripts().map(|s| s.name).collect();
        assert_eq!(names.len(), NAMED.len());
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts"))
            .expect("the scripts folder")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|f| f.strip_suffix(".lua").map(str::to_owned))
            .filter(|f| f != "shared_prelude")
            .collect::<std::collections::BTreeSet<_>>();
        assert_eq!(names, files.iter().map(String::as_str).collect());
        for s in ALL {
            assert!(lua_scripts().any(|l| l.sha1 == s.script.get_hash()));
        }
    }

    #[test]
    fn lease_is_whole_milliseconds() {
        assert_eq!(lease_ms(Duration::from_micros(1500)), 1);
        assert_eq!(lease_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(lease_ms(Duration::ZERO), 1);
    }
}
