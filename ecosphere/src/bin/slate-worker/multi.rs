//! `--multi a,b,...`: `contend` on a multi-lock (or, with `--caller-order`, on its names taken
//! by hand as single locks in the order given: the negative control).
//!
//! Each name's calls are recorded under that name, so that the checker judges every name as
//! the lock it is (exclusion, tokens, validity per name): an acquisition of the set is one
//! `acq_invoke` per name before the call, one `acq_ok` per name with that name's holder,
//! token and deadline after it; a release is one `rel_invoke` per name before the names are
//! released together, one answer per name after. Name `i` of task `t` records as task
//! `t * 64 + i` (one open window per recorded task).
//!
//! `--tolerate-errors` makes a failed acquisition (a paused server) an outcome: recorded as
//! `acq_info` for every name (something may be left until its lease ends) and asked again.
//! Each hold lasts `--hold-ms`. Prints `DONE acquisitions=N` (sets held) and `STATS`.

use std::sync::atomic::AtomicU64;

use futures::future::join_all;
use slate_history::logged::{Held, Log};
use slate_redis::{HolderId, MultiLock, SingleLockGuard};

use super::*;

/// How many names a recorded task number leaves room for.
const NAMES_PER_TASK: u64 = 64;

enum Taker {
    Multi(MultiLock),
    /// The names in the caller's order, and the pause between two.
    CallerOrder(Vec<SingleLock>, Duration),
}

struct Mx {
    args: Args,
    rec: Recorder,
    taker: Taker,
    /// The names in the order they are recorded (the multi-lock's canonical order).
    names: Vec<String>,
    deadline: Instant,
    attempts: AtomicU64,
}

impl Mx {
    fn log(&self, task: u64, i: usize) -> Log<'_> {
        Log::new(&self.rec, &self.names[i], task * NAMES_PER_TASK + i as u64)
    }

    /// Takes every name: the guards in `names` order.
    async fn take(&self) -> slate_core::Result<Vec<SingleLockGuard>> {
        match &self.taker {
            Taker::Multi(m) => m.lock().await.map(slate_redis::MultiLockGuard::into_guards),
            Taker::CallerOrder(locks, gap) => {
                let holder = HolderId::new();
                let mut held = Vec::with_capacity(locks.len());
                for (i, l) in locks.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(*gap).await;
                    }
                    held.push(l.lock_as(holder).await?);
                }
                Ok(held)
            }
        }
    }
}

/// Opens the multi-lock (or its names) on `client` and runs `contend`.
pub(super) async fn run(
    args: Args,
    deadline: Instant,
    rec: Recorder,
    client: RedisClient,
) -> Res<()> {
    if args.mode != ecosphere::worker::Mode::Contend {
        return Err(format!(
            "--multi supports --mode contend, not {:?}",
            args.mode
        ));
    }
    let given: Vec<String> = args
        .multi
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect();
    let single = |name: &str| {
        let mut b = SingleLock::builder(&client, name).lease(args.lease);
        if let Some(d) = args.spin_wait {
            b = b.spin_wait(d);
        }
        if let Some(d) = args.renewal {
            b = b.renewal_period(d);
        }
        b.build().map_err(|e| format!("building lock {name}: {e}"))
    };
    let (taker, names) = if args.caller_order {
        let locks = given.iter().map(|n| single(n)).collect::<Res<Vec<_>>>()?;
        (Taker::CallerOrder(locks, args.gap), given)
    } else {
        let mut b = MultiLock::builder(&client, &given).lease(args.lease);
        if let Some(d) = args.spin_wait {
            b = b.spin_wait(d);
        }
        if let Some(d) = args.renewal {
            b = b.renewal_period(d);
        }
        let m = b
            .build()
            .map_err(|e| format!("building the multi-lock: {e}"))?;
        let names = m.locks().iter().map(|l| l.name().to_string()).collect();
        (Taker::Multi(m), names)
    };
    tokio::time::timeout(Duration::from_secs(5), client.ping())
        .await
        .map_err(|_| "PING of the lock server timed out".to_owned())?
        .map_err(|e| format!("PING of the lock server: {e}"))?;
    let mx = Arc::new(Mx {
        args,
        rec,
        taker,
        names,
        deadline,
        attempts: AtomicU64::new(0),
    });
    say("READY")?;
    wait_go(mx.args.go_file.as_ref(), deadline).await?;
    let result = contend(&mx).await;
    let s = client.stats();
    finish(s.renewals, s.subscriptions, s.local_waiters, &mx.rec)?;
    result
}

async fn contend(mx: &Arc<Mx>) -> Res<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..mx.args.tasks {
        let mx = Arc::clone(mx);
        tasks.spawn(async move { contend_task(&mx, task).await });
    }
    let (total, outcome) = joined(tasks).await;
    say(&format!("DONE acquisitions={total}"))?;
    outcome
}

async fn contend_task(mx: &Mx, task: u64) -> Res<u64> {
    let n = mx.names.len();
    let mut done = 0;
    while done < mx.args.iterations && !stop_requested(&mx.args) {
        let left = mx.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("max duration reached after {done} iterations"));
        }
        let attempts: Vec<u64> = (0..n)
            .map(|_| mx.attempts.fetch_add(1, Ordering::Relaxed))
            .collect();
        for (i, &attempt) in attempts.iter().enumerate() {
            mx.log(task, i)
                .record(EventKind::AcqInvoke {
                    attempt,
                    budget_ms: None,
                })
                .map_err(recording)?;
        }
        let taken = match tokio::time::timeout(left, mx.take()).await {
            Ok(r) => r,
            Err(_) => Err(MAX_DURATION),
        };
        let guards = match taken {
            Ok(g) => g,
            Err(e) => {
                for (i, &attempt) in attempts.iter().enumerate() {
                    mx.log(task, i)
                        .record(EventKind::AcqInfo {
                            attempt,
                            reason: e.to_string(),
                        })
                        .map_err(recording)?;
                }
                if mx.args.tolerate_errors && e.is_retryable() {
                    continue;
                }
                return Err(format!("acquisition failed: {e}"));
            }
        };
        let mut held: Vec<Held> = Vec::with_capacity(n);
        for (i, g) in guards.iter().enumerate() {
            held.push(
                mx.log(task, i)
                    .acquired(attempts[i], g)
                    .map_err(recording)?,
            );
        }
        // The critical section: `--hold-ms` with every name held.
        tokio::time::sleep(mx.args.hold).await;
        for (i, (h, g)) in held.iter().zip(&guards).enumerate() {
            mx.log(task, i).note_loss(h, g).map_err(recording)?;
        }
        for (i, h) in held.iter().enumerate() {
            mx.log(task, i).release_invoked(h).map_err(recording)?;
        }
        let lost: Vec<bool> = guards.iter().map(|g| g.lease().is_lost()).collect();
        let outcomes = join_all(guards.into_iter().map(SingleLockGuard::unlock)).await;
        for (i, (h, outcome)) in held.iter_mut().zip(outcomes).enumerate() {
            let expired = now_ns() >= h.deadline;
            let failed = outcome.as_ref().err().map(ToString::to_string);
            mx.log(task, i)
                .release_answered(h, outcome)
                .map_err(recording)?;
            if let Some(e) = failed
                && !(lost[i] || expired || mx.args.tolerate_errors)
            {
                return Err(format!("release of {} failed: {e}", mx.names[i]));
            }
        }
        done += 1;
    }
    Ok(done)
}
