//! The Lua scripts of the single lock (`scripts/*.lua`), run by `EVALSHA`.
//!
//! Single calls go through [`redis::Script`], whose `invoke_async` sends `EVALSHA` and, on a
//! `NOSCRIPT` reply (a restarted server has an empty script cache), loads the script and sends
//! it once more. Pipelines (renewal, and a script followed by its `WAIT`:
//! `conn::eval_then_wait`) cannot use it, so [`SlateScript::evalsha`] builds the command and
//! the caller loads the script and resends what answered `NOSCRIPT`, once.

use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind};
use slate_core::HolderId;
use slate_core::mutant::{self, Mutant};

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

    /// `EVALSHA <sha> <#keys> <keys...>`: the caller adds the arguments.
    pub(crate) fn evalsha(&self, keys: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        cmd
    }

    /// `EVALSHA <sha> <#keys> <keys...> <args...>`.
    pub(crate) fn evalsha_cmd(&self, keys: &[&[u8]], args: &[&[u8]]) -> Cmd {
        let mut cmd = self.evalsha(keys);
        for a in args {
            cmd.arg(*a);
        }
        cmd
    }
}

/// `acquire.lua`: acquire or re-enter.
pub(crate) static ACQUIRE: LazyLock<SlateScript> = LazyLock::new(|| {
    let code = include_str!("acquire.lua");
    if mutant::active(Mutant::GrantIgnoresTurn) {
        // A free lock reserved for another process's turn goes to whoever asks.
        return SlateScript::mutated(
            code,
            Mutant::GrantIgnoresTurn,
            "elseif until_ms > now then",
            "elseif false then",
        );
    }
    // Burns a token before looking at the holder: a re-entry returns a new token.
    SlateScript::mutated(
        code,
        Mutant::TokenBeforeHolderCheck,
        "if redis.call('EXISTS', KEYS[1]) == 0 then",
        "redis.call('INCR', KEYS[2])\nif redis.call('EXISTS', KEYS[1]) == 0 then",
    )
});
/// `release.lua`: release one level.
pub(crate) static RELEASE: LazyLock<SlateScript> = LazyLock::new(|| {
    // A missing field counts as a hold: the release deletes whoever holds the lock.
    SlateScript::mutated(
        include_str!("release.lua"),
        Mutant::ReleaseSkipsHolderCheck,
        "redis.call('HGET', KEYS[1], ARGV[1]) or '0'",
        "redis.call('HGET', KEYS[1], ARGV[1]) or '1'",
    )
});
/// `renew.lua`: renew a holder's lease.
pub(crate) static RENEW: LazyLock<SlateScript> = LazyLock::new(|| {
    // Extends the key whoever holds it.
    SlateScript::mutated(
        include_str!("renew.lua"),
        Mutant::RenewAnyHolder,
        "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then",
        "if redis.call('EXISTS', KEYS[1]) == 1 then",
    )
});
/// `force_unlock.lua`: delete whoever holds it, and publish.
pub(crate) static FORCE_UNLOCK: LazyLock<SlateScript> =
    LazyLock::new(|| SlateScript::new(include_str!("force_unlock.lua")));

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

/// Every script, for loading them on a new connection.
pub(crate) static ALL: [&LazyLock<SlateScript>; 9] = [
    &ACQUIRE,
    &RELEASE,
    &RENEW,
    &FORCE_UNLOCK,
    &SHARED_ACQUIRE,
    &SHARED_RELEASE,
    &SHARED_RENEW,
    &SHARED_ADMIN,
    &SHARED_LEAVE,
];

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
    let ms = lease_ms(lease).to_string();
    SHARED_RENEW.evalsha_cmd(&[key, leases], &[holder.as_bytes(), ms.as_bytes()])
}

/// The renewal of one hold, for a pipeline.
///
/// `turn`: the single lock's turn key (refreshed with the lease); `fence`: its fencing counter
/// and expiry when the counter expires (needs `turn`).
pub(crate) fn renew_cmd(
    key: &[u8],
    turn: Option<&[u8]>,
    fence: Option<&(Arc<[u8]>, Duration)>,
    holder: HolderId,
    lease: Duration,
    alias: Option<(&[u8], HolderId)>,
) -> Cmd {
    let holder = holder.to_string();
    let ms = lease_ms(lease).to_string();
    if let (Some(turn), Some((alias, to))) = (turn, alias) {
        // KEYS[3] is the fence only with a fence expiry (ARGV[3]); else a placeholder.
        let (fence, idle) = match fence {
            Some((fence, idle)) => (&**fence, lease_ms(*idle).to_string()),
            None => (turn, String::new()),
        };
        let to = to.to_string();
        return RENEW.evalsha_cmd(
            &[key, turn, fence, alias],
            &[
                holder.as_bytes(),
                ms.as_bytes(),
                idle.as_bytes(),
                to.as_bytes(),
            ],
        );
    }
    match (turn, fence) {
        (Some(turn), Some((fence, idle))) => {
            let idle = lease_ms(*idle).to_string();
            RENEW.evalsha_cmd(
                &[key, turn, fence],
                &[holder.as_bytes(), ms.as_bytes(), idle.as_bytes()],
            )
        }
        (Some(turn), None) => RENEW.evalsha_cmd(&[key, turn], &[holder.as_bytes(), ms.as_bytes()]),
        (None, _) => RENEW.evalsha_cmd(&[key], &[holder.as_bytes(), ms.as_bytes()]),
    }
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
    fn lease_is_whole_milliseconds() {
        assert_eq!(lease_ms(Duration::from_micros(1500)), 1);
        assert_eq!(lease_ms(Duration::from_secs(30)), 30_000);
        assert_eq!(lease_ms(Duration::ZERO), 1);
    }
}
