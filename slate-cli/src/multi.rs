//! `slate run --lock a --lock b ... -- CMD`: several names held as one (a multi-lock), with
//! every name's readers drained as for a single name, and the command bound by the earliest
//! lease of them all.
//!
//! CMD gets `SLATE_LOCK` (the names, comma-separated, in the order they are taken),
//! `SLATE_FENCING_TOKENS` (`a=12,b=40`: each name's own token) and `SLATE_HOLDER`; no
//! `SLATE_FENCING_TOKEN`, so that a script written for one token fails instead of using one
//! name's token for another.

use std::ops::Deref;

use futures::future::select_all;
use slate_core::lease::{self, LeaseWatch};
use slate_core::{Error, Hold, LockGuard, Result};
use slate_redis::{MultiLock, MultiLockGuard, RwLock, SingleLockGuard};

use crate::run::{DRAIN_POLL, Mode, RunSpec, drain, run_locked, usage};

/// The multi-lock's guard as `slate run` drives a guard: one hold whose lease is the earliest
/// of the names' (and lost when any is), its token the first name's (the command gets every
/// name's token in `SLATE_FENCING_TOKENS` instead).
struct MultiHold {
    guard: MultiLockGuard,
    hold: Hold,
}

impl MultiHold {
    fn new(guard: MultiLockGuard) -> Self {
        let first = &guard.guards()[0];
        let hold = Hold::new(
            guard.holder(),
            first.fencing_token(),
            first.depth(),
            combined(guard.guards()),
        );
        MultiHold { guard, hold }
    }
}

impl Deref for MultiHold {
    type Target = Hold;

    fn deref(&self) -> &Hold {
        &self.hold
    }
}

impl LockGuard for MultiHold {
    fn unlock(self) -> impl Future<Output = Result<u32>> + Send {
        self.guard.unlock()
    }
}

/// One lease for several: its deadline is the earliest of theirs, and it is lost as soon as
/// any of them is. Followed by a task that ends when every name's lease is closed (released),
/// when one is lost, or when nobody watches the combined one any more.
fn combined(guards: &[SingleLockGuard]) -> LeaseWatch {
    let mut watches: Vec<LeaseWatch> = guards.iter().map(|g| g.lease().clone()).collect();
    let earliest = |w: &[LeaseWatch]| w.iter().map(LeaseWatch::deadline).min();
    let (keeper, watch) =
        lease::channel(earliest(&watches).unwrap_or_else(std::time::Instant::now));
    // A name already lost is lost in the combined lease at once, before anyone reads it.
    if let Some(reason) = watches.iter().find_map(LeaseWatch::loss_reason) {
        keeper.lose(reason);
        return watch;
    }
    tokio::spawn(async move {
        loop {
            if let Some(reason) = watches.iter().find_map(LeaseWatch::loss_reason) {
                keeper.lose(reason);
                return;
            }
            if let Some(d) = earliest(&watches) {
                keeper.set_deadline(d);
            }
            if keeper.is_abandoned() || watches.iter().all(LeaseWatch::is_closed) {
                // Dropping the keeper leaves the deadline to the watch (it is lost when the
                // deadline passes).
                return;
            }
            let changes: Vec<_> = watches
                .iter_mut()
                .filter(|w| !w.is_closed())
                .map(|w| Box::pin(w.changed()))
                .collect();
            if changes.is_empty() {
                return;
            }
            select_all(changes).await;
        }
    });
    watch
}

/// Runs `slate run` over several names.
pub async fn run(spec: RunSpec) -> u8 {
    if spec.mode != Mode::Write {
        return usage(&Error::invalid_input(
            "--read/--permits",
            "several --lock names are held as one exclusive set",
            "take one name with --read or --permits, or drop them",
        ));
    }
    if let Some(bad) = spec.names.iter().find(|n| n.contains([',', '='])) {
        return usage(&Error::invalid_input(
            "--lock",
            format!("{bad:?} contains ',' or '='"),
            "name the locks of a set without ',' and '=' (SLATE_FENCING_TOKENS lists them as \
             name=token,...)",
        ));
    }
    let client = match spec
        .servers
        .one_client("several --lock names (a multi-lock)")
    {
        Ok(c) => c,
        Err(e) if e.is_invalid_input() => return usage(&e),
        Err(e) => {
            eprintln!("slate: {e}");
            return crate::exit::REDIS;
        }
    };
    if let Err(e) = client.check_topology().await
        && e.is_invalid_input()
    {
        return usage(&e);
    }
    let set = match MultiLock::builder(&client, &spec.names)
        .lease(spec.lease)
        .key_prefix(&spec.prefix)
        .build()
    {
        Ok(m) => m,
        Err(e) => return usage(&e),
    };
    // Each name's read-write lock, which treats the name's single lock as a writer (as a
    // plain `slate run` of one name does).
    let mut readers: Vec<(RwLock, String)> = Vec::new();
    for l in set.locks() {
        let name = l.name().to_string();
        match RwLock::builder(&client, &name)
            .lease(spec.lease)
            .key_prefix(&spec.prefix)
            .spin_wait(DRAIN_POLL)
            .exclude_single_lock(true)
            .build()
        {
            Ok(r) => readers.push((r, name)),
            Err(e) => return usage(&e),
        }
    }
    let take = async |h, w| {
        let guard = set.acquire(h, w).await?;
        for (r, name) in &readers {
            if let Err(e) = drain(r, w, name).await {
                let _ = guard.unlock().await;
                return Err(e);
            }
        }
        Ok(MultiHold::new(guard))
    };
    let busy = async || {
        let mut held = Vec::new();
        for l in set.locks() {
            if l.is_locked().await.unwrap_or(false) {
                held.push(l.name().to_string());
            }
        }
        if held.is_empty() {
            "held by other holders".to_owned()
        } else {
            format!("held by other holders: {}", held.join(", "))
        }
    };
    let env = |m: &MultiHold| {
        let names: Vec<String> = m
            .guard
            .fencing_tokens()
            .map(|(n, _)| n.to_string())
            .collect();
        let tokens: Vec<String> = m
            .guard
            .fencing_tokens()
            .map(|(n, t)| format!("{n}={}", t.get()))
            .collect();
        vec![
            ("SLATE_LOCK", names.join(",")),
            ("SLATE_FENCING_TOKENS", tokens.join(",")),
        ]
    };
    run_locked(take, busy, &spec, env).await
}
