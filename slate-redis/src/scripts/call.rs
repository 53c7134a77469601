//! Typed bindings: one struct per script, whose fields are the script's `KEYS` and `ARGV`,
//! named and ordered as the script's header states them. A call site names what it sends
//! (`Release { lock, channel, .., holder, lease_ms, .. }`) instead of a positional chain of
//! `.key()` and `.arg()`, and a test holds each binding to its script's header.
//!
//! A binding's optional fields (`Option`) are the script's optional trailing keys or
//! arguments: they are sent in order up to the first `None`, so a `Some` after a `None` is a
//! caller's mistake (checked in debug builds).
//!
//! Every call is one `EVALSHA` command built in one pre-sized buffer ([`cmd`](Acquire::cmd)),
//! sent by [`conn::eval`](crate::client::conn::eval) (which loads the script on `NOSCRIPT`) or
//! in a pipeline. Not redis-rs's `ScriptInvocation`, which allocates two vectors per key and
//! argument before copying them into the command (34 allocations for a release).

use redis::Cmd;

use super::SlateScript;

/// What a call's command holds room for before it is written: the script's arguments with
/// `EVALSHA`, the hash and the key count, and bytes for a typical call's keys and arguments
/// (a lock name of a few dozen bytes and its derived keys), so that writing it rarely grows.
const CMD_ARGS: usize = 24;
const CMD_BYTES: usize = 512;

/// Tracks a binding's optional fields: each is sent only if every optional before it was (a
/// `Some` after a `None` is a caller's mistake, caught in debug builds).
struct Optionals(bool);

impl Optionals {
    fn send<T>(&mut self, opt: Option<T>) -> Option<T> {
        match opt {
            Some(v) => {
                debug_assert!(self.0, "an optional script field is set after an unset one");
                self.0.then_some(v)
            }
            None => {
                self.0 = false;
                None
            }
        }
    }
}

/// Declares a binding: `Name => SCRIPT { keys: [..], optional_keys: [..], args: [..],
/// optional_args: [..] }`. Keys are byte strings; arguments anything redis-rs can send.
macro_rules! script_call {
    (
        $(#[$meta:meta])*
        $name:ident => $script:ident {
            keys: [$($key:ident),* $(,)?],
            optional_keys: [$($okey:ident),* $(,)?],
            args: [$($arg:ident: $aty:ty),* $(,)?],
            optional_args: [$($oarg:ident: $oty:ty),* $(,)?] $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug)]
        pub(crate) struct $name<'a> {
            $(pub(crate) $key: &'a [u8],)*
            $(pub(crate) $okey: Option<&'a [u8]>,)*
            $(pub(crate) $arg: $aty,)*
            $(pub(crate) $oarg: Option<$oty>,)*
        }

        #[allow(dead_code, reason = "a binding is sent alone (`eval`), in a pipeline (`cmd`), or both")]
        impl $name<'_> {
            /// The names of `KEYS[1..]`, then of `ARGV[1..]`, as the script's header has them.
            #[cfg(test)]
            pub(crate) const NAMES: (&'static [&'static str], &'static [&'static str]) = (
                &[$(stringify!($key),)* $(stringify!($okey),)*],
                &[$(stringify!($arg),)* $(stringify!($oarg),)*],
            );

            /// The script this binding calls.
            pub(crate) fn script() -> &'static SlateScript {
                &super::$script
            }

            /// How many keys this call sends.
            #[allow(unused_mut, unused_variables, reason = "a binding may have no optionals")]
            fn key_count(&self) -> usize {
                let mut n = 0;
                $(let _ = self.$key; n += 1;)*
                let mut optionals = super::call::Optionals(true);
                $(n += usize::from(optionals.send(self.$okey).is_some());)*
                n
            }

            /// Keys then arguments, in the script's order.
            #[allow(unused_mut, unused_variables, reason = "a binding may have no optionals")]
            fn write(&self, cmd: &mut Cmd) {
                $(cmd.arg(self.$key);)*
                let mut optionals = super::call::Optionals(true);
                $(if let Some(k) = optionals.send(self.$okey) { cmd.arg(k); })*
                $(cmd.arg(&self.$arg);)*
                let mut optionals = super::call::Optionals(true);
                $(if let Some(a) = optionals.send(self.$oarg.as_ref()) { cmd.arg(a); })*
            }

            /// Runs the call on `conn` (loading the script on `NOSCRIPT`).
            pub(crate) async fn eval<T: redis::FromRedisValue>(
                &self,
                conn: &mut crate::client::conn::Conn,
            ) -> redis::RedisResult<T> {
                crate::client::conn::eval(conn, Self::script(), &self.cmd()).await
            }

            /// `EVALSHA` with this call's keys and arguments (the caller loads the script
            /// and resends on `NOSCRIPT`: `conn::eval`, `conn::eval_then_wait`).
            pub(crate) fn cmd(&self) -> Cmd {
                let mut cmd = Cmd::with_capacity(super::call::CMD_ARGS, super::call::CMD_BYTES);
                cmd.arg("EVALSHA")
                    .arg(Self::script().script.get_hash())
                    .arg(self.key_count());
                self.write(&mut cmd);
                cmd
            }
        }
    };
}

/// One name of an [`AcquireMany`] call: its `acquire.lua` keys, queue id and tenure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ManyName<'a> {
    pub(crate) lock: &'a [u8],
    pub(crate) fence: &'a [u8],
    pub(crate) queue: &'a [u8],
    pub(crate) turn: &'a [u8],
    pub(crate) record: &'a [u8],
    pub(crate) queue_id: &'a str,
    pub(crate) tenure: u32,
}

/// `acquire_many.lua`: several names of one server (or cluster slot) for one holder, in
/// order, until the first that is not granted. Written by hand: its keys and two of its
/// arguments repeat per name, which `script_call!` does not express.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AcquireMany<'a> {
    pub(crate) names: &'a [ManyName<'a>],
    pub(crate) holder: &'a str,
    pub(crate) lease_ms: u64,
    pub(crate) request: u64,
    pub(crate) record_ms: u64,
    pub(crate) resent: &'static str,
    /// Raise each name's fencing counter to the server's clock first (`acquire.lua`
    /// ARGV[10]); sent after the names' arguments.
    pub(crate) raise: bool,
}

impl AcquireMany<'_> {
    /// The script this binding calls.
    pub(crate) fn script() -> &'static SlateScript {
        &super::ACQUIRE_MANY
    }

    /// `EVALSHA` with every name's five keys, then the common arguments, then each name's
    /// queue id and tenure (the script's header).
    pub(crate) fn cmd(&self) -> Cmd {
        let n = self.names.len();
        let mut cmd = Cmd::with_capacity(8 + 7 * n, CMD_BYTES * n.max(1));
        cmd.arg("EVALSHA")
            .arg(Self::script().script.get_hash())
            .arg(5 * n);
        for name in self.names {
            cmd.arg(name.lock)
                .arg(name.fence)
                .arg(name.queue)
                .arg(name.turn)
                .arg(name.record);
        }
        cmd.arg(self.holder)
            .arg(self.lease_ms)
            .arg(self.request)
            .arg(self.record_ms)
            .arg(self.resent);
        for name in self.names {
            cmd.arg(name.queue_id).arg(name.tenure);
        }
        if self.raise {
            cmd.arg("1");
        }
        cmd
    }
}

/// One name of a [`ReleaseMany`] call: its `release.lua` keys and the arguments that are its
/// own (its holder: a name passed within this process is released as its remote holder).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseName<'a> {
    pub(crate) lock: &'a [u8],
    pub(crate) channel: &'a [u8],
    pub(crate) queue: &'a [u8],
    pub(crate) turn: &'a [u8],
    pub(crate) record: &'a [u8],
    pub(crate) holder: &'a str,
    pub(crate) lease_ms: u64,
    pub(crate) queue_id: &'a str,
    pub(crate) tenure: u32,
    pub(crate) local_waiters: u8,
    pub(crate) reserve_ms: u64,
    pub(crate) holds: u32,
}

/// `release_many.lua`: one level of several names of one server (or cluster slot), every
/// name whatever the others answer. Written by hand, as [`AcquireMany`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseMany<'a> {
    pub(crate) names: &'a [ReleaseName<'a>],
    pub(crate) request: u64,
    pub(crate) record_ms: u64,
    pub(crate) publish: &'static str,
    pub(crate) resent: &'static str,
}

impl ReleaseMany<'_> {
    /// `EVALSHA` with every name's five keys, then the common arguments, then each name's
    /// seven (the script's header).
    pub(crate) fn cmd(&self) -> Cmd {
        let n = self.names.len();
        let mut cmd = Cmd::with_capacity(7 + 12 * n, CMD_BYTES * n.max(1));
        cmd.arg("EVALSHA")
            .arg(super::RELEASE_MANY.script.get_hash())
            .arg(5 * n);
        for name in self.names {
            cmd.arg(name.lock)
                .arg(name.channel)
                .arg(name.queue)
                .arg(name.turn)
                .arg(name.record);
        }
        cmd.arg(self.request)
            .arg(self.record_ms)
            .arg(self.publish)
            .arg(self.resent);
        for name in self.names {
            cmd.arg(name.holder)
                .arg(name.lease_ms)
                .arg(name.queue_id)
                .arg(name.tenure)
                .arg(name.local_waiters)
                .arg(name.reserve_ms)
                .arg(name.holds);
        }
        cmd
    }
}

script_call! {
    /// `acquire.lua`: acquire or re-enter the single lock (or one node of a multi-node lock).
    Acquire => ACQUIRE {
        keys: [lock, fence, queue, turn, record],
        optional_keys: [marker],
        args: [
            holder: &'a str,
            lease_ms: u64,
            queue_id: &'a str,
            tenure: u32,
            request: u64,
            record_ms: u64,
            reentry: &'static str,
            resent: &'static str,
        ],
        optional_args: [block: u32, raise: &'static str],
    }
}

script_call! {
    /// `release.lua`: release one level, pass the turn, publish.
    Release => RELEASE {
        keys: [lock, channel, queue, turn, record],
        optional_keys: [],
        args: [
            holder: &'a str,
            lease_ms: u64,
            queue_id: &'a str,
            tenure: u32,
            local_waiters: u8,
            reserve_ms: u64,
            request: u64,
            record_ms: u64,
            undo: &'a str,
            publish: &'static str,
            holds: u32,
            resent: &'static str,
        ],
        optional_args: [],
    }
}

script_call! {
    /// `renew.lua`: renew a holder's lease (with the single lock's turn and current holder
    /// when given).
    Renew => RENEW {
        keys: [lock],
        optional_keys: [turn, current],
        args: [holder: &'a str, lease_ms: u64],
        optional_args: [passed_to: &'a str],
    }
}

script_call! {
    /// `force_unlock.lua`: delete whoever holds the lock, and publish.
    ForceUnlock => FORCE_UNLOCK {
        keys: [lock, channel],
        optional_keys: [],
        args: [publish: &'static str],
        optional_args: [],
    }
}

script_call! {
    /// `leave.lua`: a drained process gives up its place in line and hands on its turn.
    Leave => LEAVE {
        keys: [queue, turn, channel],
        optional_keys: [],
        args: [queue_id: &'a str, reserve_ms: u64, lease_ms: u64, publish: &'static str],
        optional_args: [],
    }
}

script_call! {
    /// `latch_set.lua`: set a countdown latch's count, only when it is open.
    LatchSet => LATCH_SET {
        keys: [latch, record],
        optional_keys: [],
        args: [count: u64, ttl_ms: u64, request: &'a str, window_ms: u64],
        optional_args: [],
    }
}

script_call! {
    /// `latch_down.lua`: count a countdown latch down by one, once per request.
    LatchDown => LATCH_DOWN {
        keys: [latch, record, channel],
        optional_keys: [],
        args: [ttl_ms: u64, window_ms: u64, publish: &'static str],
        optional_args: [],
    }
}

script_call! {
    /// `inspect.lua`: the holders, their depths and leases, the fence, the current holder.
    Inspect => INSPECT {
        keys: [lock, fence, current],
        optional_keys: [],
        args: [],
        optional_args: [],
    }
}

script_call! {
    /// `raise_fence.lua`: raise a fencing counter to at least a token.
    RaiseFence => RAISE_FENCE {
        keys: [fence],
        optional_keys: [],
        args: [token: u64],
        optional_args: [],
    }
}

script_call! {
    /// `mark.lua`: write a combination node's marker.
    Mark => MARK {
        keys: [marker],
        optional_keys: [],
        args: [stamp: &'a str, bound_ms: &'a str, mode: &'static str, wait_ms: &'a str],
        optional_args: [],
    }
}

script_call! {
    /// `shared_acquire.lua`: acquire or re-enter a read, write or permit hold.
    SharedAcquire => SHARED_ACQUIRE {
        keys: [holders, leases, queue, wants, fence, record, channel],
        optional_keys: [capacity_or_excluded],
        args: [
            holder: &'a str,
            mode: &'static str,
            permits: u32,
            lease_ms: u64,
            queue_id: &'a str,
            claim_ms: u64,
            request: u64,
            record_ms: u64,
            reentry: &'static str,
            capacity: u32,
            exclude: &'static str,
            seq: u64,
            publish: &'static str,
        ],
        optional_args: [],
    }
}

script_call! {
    /// `shared_release.lua`: release one shared-mode level and wake what now fits.
    SharedRelease => SHARED_RELEASE {
        keys: [holders, leases, queue, wants, channel, record],
        optional_keys: [capacity_key],
        args: [
            holder: &'a str,
            mode: &'static str,
            lease_ms: u64,
            request: u64,
            record_ms: u64,
            undo: &'a str,
            publish: &'static str,
            capacity: u32,
        ],
        optional_args: [],
    }
}

script_call! {
    /// `shared_renew.lua`: renew a shared-mode holder's lease.
    SharedRenew => SHARED_RENEW {
        keys: [holders, leases],
        optional_keys: [],
        args: [holder: &'a str, lease_ms: u64],
        optional_args: [],
    }
}

script_call! {
    /// `shared_leave.lua`: a drained process gives up its place in the queue.
    SharedLeave => SHARED_LEAVE {
        keys: [holders, leases, queue, wants, channel],
        optional_keys: [capacity_key],
        args: [queue_id: &'a str, seq: u64, publish: &'static str, capacity: u32],
        optional_args: [],
    }
}

script_call! {
    /// `shared_admin.lua`: inspect, clear, or set a semaphore's permits.
    SharedAdmin => SHARED_ADMIN {
        keys: [holders, leases, channel],
        optional_keys: [capacity_key],
        args: [op: &'a str, n: u32, publish: &'static str],
        optional_args: [],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The highest `NAME[n]` the script's header declares: lines `-- NAME[n]  what`,
    /// `-- NAME[1], NAME[2]  what` or `-- NAME[1]..NAME[4]  what`.
    fn declared(code: &str, name: &str) -> usize {
        let index = |s: &str| -> Option<(usize, usize)> {
            let rest = s.strip_prefix(name)?.strip_prefix('[')?;
            let end = rest.find(']')?;
            Some((rest[..end].parse().ok()?, name.len() + 1 + end + 1))
        };
        code.lines()
            .filter_map(|line| {
                let (first, used) = index(line.strip_prefix("-- ")?)?;
                let rest = &line[3 + used..];
                let second = rest
                    .strip_prefix(", ")
                    .or_else(|| rest.strip_prefix(".."))
                    .and_then(|r| index(r).map(|(n, _)| n));
                Some(second.unwrap_or(first))
            })
            .max()
            .unwrap_or(0)
    }

    /// The highest `NAME[n]` the code (comments left out) reads.
    fn read(code: &str, name: &str) -> usize {
        let pat = format!("{name}[");
        code.lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .flat_map(|line| line.match_indices(&pat).map(move |(i, _)| &line[i..]))
            .filter_map(|at| {
                let rest = &at[pat.len()..];
                rest[..rest.find(']')?].parse::<usize>().ok()
            })
            .max()
            .unwrap_or(0)
    }

    macro_rules! check {
        ($($binding:ident),* $(,)?) => {{
            let mut checked = 0;
            $(
                let code = $binding::script().code;
                let (keys, args) = $binding::NAMES;
                let name = stringify!($binding);
                assert_eq!(keys.len(), declared(code, "KEYS"), "{name}: the header's KEYS");
                assert_eq!(args.len(), declared(code, "ARGV"), "{name}: the header's ARGV");
                // The shared prelude's helpers read what the scripts that call them declare.
                let body = code.strip_prefix(include_str!("shared_prelude.lua")).unwrap_or(code);
                assert!(read(body, "KEYS") <= keys.len(), "{name} reads an undeclared key");
                assert!(read(body, "ARGV") <= args.len(), "{name} reads an undeclared argument");
                checked += 1;
            )*
            checked
        }};
    }

    #[test]
    fn every_binding_names_each_key_and_argument_its_script_reads() {
        let checked = check!(
            Acquire,
            Release,
            Renew,
            ForceUnlock,
            Inspect,
            RaiseFence,
            Mark,
            SharedAcquire,
            SharedRelease,
            SharedRenew,
            SharedLeave,
            SharedAdmin,
            LatchSet,
            LatchDown,
            Leave,
        );
        assert_eq!(checked, 15);
    }

    /// A command's arguments as bytes.
    fn plain_args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<not a plain argument>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn acquire_many_sends_five_keys_per_name_then_the_common_and_per_name_arguments() {
        let name = |lock: &'static [u8], queue_id| ManyName {
            lock,
            fence: b"fence:{x}",
            queue: b"q",
            turn: b"t",
            record: b"r",
            queue_id,
            tenure: 8,
        };
        let names = [name(b"a", "qa"), name(b"b", "qb")];
        let call = AcquireMany {
            names: &names,
            holder: "h",
            lease_ms: 30_000,
            request: 77,
            record_ms: 2_000,
            resent: "",
            raise: false,
        };
        let args = plain_args(&call.cmd());
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[2], b"10");
        assert_eq!(args[3], b"a");
        assert_eq!(args[8], b"b");
        // ARGV[1..5] after the ten keys, then name 1's and name 2's queue id and tenure, as
        // the driver reads them (ARGV[6 + 2i], ARGV[7 + 2i]).
        assert_eq!(args[13], b"h");
        assert_eq!(args[15], b"77");
        assert_eq!(&args[18..], [&b"qa"[..], b"8", b"qb", b"8"]);
        let header = AcquireMany::script().code;
        assert!(header.contains("ARGV[6+2i], ARGV[7+2i]"));
        // The raise, when asked, follows the names' arguments (ARGV[6 + 2n]).
        let raised = plain_args(
            &AcquireMany {
                raise: true,
                ..call
            }
            .cmd(),
        );
        assert_eq!(&raised[18..], [&b"qa"[..], b"8", b"qb", b"8", b"1"]);
        assert!(header.contains("ARGV[6+2n]"));
    }

    #[test]
    fn release_many_sends_five_keys_per_name_then_the_common_and_per_name_arguments() {
        let name = |lock: &'static [u8], holder| ReleaseName {
            lock,
            channel: b"c",
            queue: b"q",
            turn: b"t",
            record: b"r",
            holder,
            lease_ms: 30_000,
            queue_id: "q1",
            tenure: 8,
            local_waiters: 1,
            reserve_ms: 500,
            holds: 3,
        };
        let names = [name(b"a", "ha"), name(b"b", "hb")];
        let call = ReleaseMany {
            names: &names,
            request: 77,
            record_ms: 2_000,
            publish: "PUBLISH",
            resent: "1",
        };
        let args = plain_args(&call.cmd());
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(
            args[1],
            super::super::RELEASE_MANY.script.get_hash().as_bytes()
        );
        assert_eq!(args[2], b"10");
        assert_eq!(args[3], b"a");
        assert_eq!(args[8], b"b");
        // ARGV[1..4] after the ten keys, then each name's seven (ARGV[5 + 7i..11 + 7i]).
        assert_eq!(&args[13..17], [&b"77"[..], b"2000", b"PUBLISH", b"1"]);
        let own =
            |h: &'static [u8]| -> Vec<&[u8]> { vec![h, b"30000", b"q1", b"8", b"1", b"500", b"3"] };
        assert_eq!(args[17..24], own(b"ha"));
        assert_eq!(args[24..], own(b"hb"));
        assert!(
            super::super::RELEASE_MANY
                .code
                .contains("ARGV[5+7i..11+7i]")
        );
    }

    #[test]
    fn optional_fields_are_sent_up_to_the_first_unset_one() {
        let renew = Renew {
            lock: b"l",
            turn: Some(b"t"),
            current: None,
            holder: "h",
            lease_ms: 5,
            passed_to: None,
        };
        let packed = renew.cmd().get_packed_command();
        let text = String::from_utf8_lossy(&packed);
        assert!(text.contains("\r\n2\r\n"), "two keys: {text}");
        assert!(text.ends_with("$1\r\nh\r\n$1\r\n5\r\n"), "{text}");
        assert_eq!(renew.key_count(), 2);
    }

    #[test]
    fn a_call_sends_evalsha_its_keys_then_its_arguments() {
        let acquire = Acquire {
            lock: b"k",
            fence: b"fence:{3ce}",
            queue: b"k:queue",
            turn: b"k:turn",
            record: b"k:req:h",
            marker: Some(b"node-marker"),
            holder: "h",
            lease_ms: 30_000,
            queue_id: "q",
            tenure: 4,
            request: 77,
            record_ms: 2_000,
            reentry: "",
            resent: "",
            block: Some(8),
            raise: None,
        };
        let args = plain_args(&acquire.cmd());
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[2], b"6");
        assert_eq!(args[3], b"k");
        assert_eq!(args[8], b"node-marker");
        assert_eq!(args.last().unwrap(), b"8");
        assert_eq!(args.len(), 3 + 6 + 9);
    }
}
