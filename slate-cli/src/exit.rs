//! Exit codes of `slate` (documented in `--help` and the README).

/// Success.
pub const OK: u8 = 0;
/// A check failed (the demo's history checker found a violation), or `slate latch set` found
/// the latch already counting down.
pub const FAILED: u8 = 1;
/// Usage error: bad arguments (clap also exits with 2), `unlock` without `--force`.
pub const USAGE: u8 = 2;
/// Redis could not be used: connection refused, timeout, authentication, too few nodes
/// (sysexits `EX_UNAVAILABLE`).
pub const REDIS: u8 = 69;
/// Internal error of slate itself (sysexits `EX_SOFTWARE`).
pub const INTERNAL: u8 = 70;
/// The lock could not be had within `--wait` (sysexits `EX_TEMPFAIL`, as `flock -w` users
/// usually ask `-E` for).
pub const BUSY: u8 = 75;
/// The lease was lost while CMD ran, and CMD was signalled as `--on-lost` says; or it was
/// lost while the lock was being taken, and CMD never started.
pub const LEASE_LOST: u8 = 76;
/// CMD was found but could not be executed (as in POSIX shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// CMD was not found (as in POSIX shells).
pub const NOT_FOUND: u8 = 127;
/// Added to a signal number when CMD (or slate, while waiting) ended by that signal.
pub const SIGNAL_BASE: u8 = 128;

/// Reports `e` on stderr and answers its exit code: [`USAGE`] for bad input (the message names
/// the fix), [`REDIS`] for anything the server or the network did.
pub fn of_error(e: &slate_core::Error) -> u8 {
    eprintln!("slate: {e}");
    if e.is_invalid_input() { USAGE } else { REDIS }
}

/// The exit-code table shown by `slate --help` and `slate run --help`.
pub const TABLE: &str = "\
Exit codes:
  CMD's code  slate run: CMD's own exit code; 128+N if CMD died of signal N
  0           success (status, unlock, demo, latch)
  1           demo: the history checker found a violation; latch set: already counting down
  2           usage error (bad arguments; unlock without --force)
  69          Redis unavailable: connection refused or timed out, authentication, too few nodes
  70          internal error
  75          slate run: the lock was not acquired within --wait (held by another holder);
              slate latch wait: the latch was still closed after --timeout
  76          slate run: the lease was lost while CMD ran and CMD was killed/terminated (--on-lost),
              or was lost while the lock was being taken (CMD never started)
  126, 127    slate run: CMD could not be executed / was not found
  129,130,143 slate run: SIGHUP / SIGINT / SIGTERM while waiting for the lock (CMD not started)";
