//! Shared mode (`--shared rw|sem`): a read-write lock or a semaphore of the library, in
//! `contend` and `hold`.
//!
//! Every hold's `acq_ok` carries its permits (a read 1, a write 2^30, a semaphore's `k`), so
//! that the checker (run with the capacity) can tell overlapping readers from an overlap that
//! breaks exclusion. Independently of the history, every hold adds its permits to the
//! counter `<counter-key>:inside` on the resource server (`INCRBY` after the grant, `DECRBY`
//! before the release) and the worker reports the highest value it read: it can only
//! under-count an overlap, so a value above the capacity is a real violation.
//!
//! - `contend`: `--tasks` × `--iterations` holds; on a read-write lock each one reads
//!   (`--read-percent`, a GET of the counter) or writes (GET then SET+1 of the counter, as the
//!   single lock's scenarios do); on a semaphore each takes `--permits`. Prints `DONE
//!   acquisitions=N writes=W max_inside=M max_shared=S` (S: the most permits seen in use
//!   by reads or permit holds at once).
//! - `hold`: takes the read or write lock (`--hold-as`) or `--permits` permits, prints
//!   `HOLDING <holder> <token>`, notes renewals every 50 ms for `--hold-ms` or until the lease
//!   is lost (`LOST <reason>`), then releases: `UNLOCK ok <n>`, `UNLOCK not_held` or `UNLOCK
//!   error <message>`.

use std::sync::atomic::AtomicU64;

use ecosphere::history::OP_INCR;
use ecosphere::worker::{HoldAs, Mode, SharedKind};
use slate_history::logged::{Held, Log, Released as Logged};

use super::*;
use crate::driver::Released;
use slate_redis::{LockGuard, RwLock, Semaphore, WRITE_PERMITS};

enum Prim {
    Rw(RwLock),
    Sem(Semaphore),
}

struct Sh {
    args: Args,
    rec: Recorder,
    prim: Prim,
    resource: Option<MultiplexedConnection>,
    deadline: Instant,
    attempts: AtomicU64,
    max_inside: AtomicU64,
    /// The highest value read below a write's permits: shared holds at once.
    max_shared: AtomicU64,
    writes: AtomicU64,
}

/// A held guard of any of the three kinds.
enum Guard {
    Read(slate_redis::RwLockReadGuard),
    Write(slate_redis::RwLockWriteGuard),
    Permit(slate_redis::SemaphorePermit),
}

impl Guard {
    fn permits(&self) -> u64 {
        match self {
            Guard::Read(g) => LockGuard::permits(g),
            Guard::Write(g) => LockGuard::permits(g),
            Guard::Permit(g) => LockGuard::permits(g),
        }
        .unwrap_or(WRITE_PERMITS)
    }

    fn lease(&self) -> &slate_redis::LeaseWatch {
        match self {
            Guard::Read(g) => g.lease(),
            Guard::Write(g) => g.lease(),
            Guard::Permit(g) => g.lease(),
        }
    }
}

impl Sh {
    fn log(&self, task: u64) -> Log<'_> {
        Log::new(&self.rec, &self.args.lock, task)
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn inside_key(&self) -> String {
        format!("{}:inside", self.args.counter_key)
    }

    /// Takes a hold (`write` on a read-write lock) bounded by the run's deadline, logged.
    async fn acquire(&self, task: u64, write: bool) -> Res<(Guard, Held)> {
        match &self.prim {
            Prim::Rw(l) if write => {
                let (g, h) = self.logged(task, l.write()).await?;
                Ok((Guard::Write(g), h))
            }
            Prim::Rw(l) => {
                let (g, h) = self.logged(task, l.read()).await?;
                Ok((Guard::Read(g), h))
            }
            Prim::Sem(s) => {
                let (g, h) = self.logged(task, s.acquire(self.args.permits)).await?;
                Ok((Guard::Permit(g), h))
            }
        }
    }

    async fn logged<G: LockGuard>(
        &self,
        task: u64,
        call: impl std::future::Future<Output = slate_redis::Result<G>>,
    ) -> Res<(G, Held)> {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
        let remaining = self.remaining();
        let bounded = async {
            tokio::time::timeout(remaining, call)
                .await
                .unwrap_or(Err(MAX_DURATION))
        };
        self.log(task)
            .acquire(attempt, bounded)
            .await
            .map_err(recording)?
            .map_err(|e| format!("acquire failed: {e}"))
    }

    /// `INCRBY inside permits` (tracking the highest value), the resource operation, and
    /// `renew_ok` if the deadline moved.
    async fn inside(&self, task: u64, held: &mut Held, guard: &Guard, write: bool) -> Res<()> {
        let Some(mut conn) = self.resource.clone() else {
            return Ok(());
        };
        let p = guard.permits();
        let v: u64 = conn
            .incr(self.inside_key(), p)
            .await
            .map_err(|e| format!("INCRBY inside: {e}"))?;
        self.max_inside.fetch_max(v, Ordering::SeqCst);
        if v < WRITE_PERMITS {
            self.max_shared.fetch_max(v, Ordering::SeqCst);
        }
        let (op, outcome) = if write {
            let counted = counter_incr(conn.clone(), &self.args.counter_key).await;
            self.writes.fetch_add(1, Ordering::Relaxed);
            (OP_INCR.to_owned(), incr_outcome(&counted))
        } else {
            let v: Option<u64> = conn
                .get(&self.args.counter_key)
                .await
                .map_err(|e| format!("GET counter: {e}"))?;
            ("u_read".to_owned(), v.unwrap_or(0).to_string())
        };
        self.note(task, held, guard)?;
        self.log(task)
            .record(EventKind::ResOp {
                holder: held.holder.clone(),
                token: held.token,
                op,
                outcome,
                invoked: None,
            })
            .map_err(recording)?;
        let _: i64 = conn
            .decr(self.inside_key(), p)
            .await
            .map_err(|e| format!("DECRBY inside: {e}"))?;
        Ok(())
    }

    fn note(&self, task: u64, held: &mut Held, guard: &Guard) -> Res<()> {
        let log = self.log(task);
        match guard {
            Guard::Read(g) => log.note_renewal(held, g),
            Guard::Write(g) => log.note_renewal(held, g),
            Guard::Permit(g) => log.note_renewal(held, g),
        }
        .map_err(recording)
    }

    async fn release(&self, task: u64, held: &mut Held, guard: Guard) -> Res<Released> {
        let log = self.log(task);
        let budget = self.remaining();
        let released = match guard {
            Guard::Read(g) => log.release(held, g, budget).await,
            Guard::Write(g) => log.release(held, g, budget).await,
            Guard::Permit(g) => log.release(held, g, budget).await,
        }
        .map_err(recording)?;
        Ok(match released {
            Logged::Done(n) => Released::Ok(n),
            Logged::NotHeld => Released::NotHeld,
            Logged::Failed(e) => Released::Error(e.to_string()),
            Logged::TimedOut => Released::Error("max duration reached during unlock".to_owned()),
        })
    }

    /// Whether the next hold of `task` writes (a read-write lock's `--read-percent`).
    fn writes_next(&self, rng: &mut u64) -> bool {
        if !matches!(self.prim, Prim::Rw(_)) {
            return false;
        }
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % 100 >= self.args.read_percent
    }
}

pub(super) async fn run(
    args: Args,
    deadline: Instant,
    rec: Recorder,
    client: RedisClient,
) -> Res<()> {
    let lease = args.lease;
    let spin = args.spin_wait;
    let prim = match args.shared {
        Some(SharedKind::Sem) => {
            let mut b = Semaphore::builder(&client, &args.lock, args.capacity).lease(lease);
            if let Some(d) = spin {
                b = b.spin_wait(d);
            }
            Prim::Sem(
                b.build()
                    .map_err(|e| format!("building the semaphore: {e}"))?,
            )
        }
        _ => {
            let mut b = RwLock::builder(&client, &args.lock).lease(lease);
            if let Some(d) = spin {
                b = b.spin_wait(d);
            }
            Prim::Rw(b.build().map_err(|e| format!("building the lock: {e}"))?)
        }
    };
    let resource = match &args.resource_url {
        Some(url) => Some(connect(url).await?),
        None => None,
    };
    tokio::time::timeout(Duration::from_secs(5), client.ping())
        .await
        .map_err(|_| "PING of the lock server timed out".to_owned())?
        .map_err(|e| format!("PING of the lock server: {e}"))?;
    let sh = Arc::new(Sh {
        args,
        rec,
        prim,
        resource,
        deadline,
        attempts: AtomicU64::new(0),
        max_inside: AtomicU64::new(0),
        max_shared: AtomicU64::new(0),
        writes: AtomicU64::new(0),
    });
    say("READY")?;
    if let Some(go) = &sh.args.go_file {
        while !go.exists() {
            if Instant::now() >= deadline {
                return Err(format!("{} did not appear in time", go.display()));
            }
            tokio::time::sleep(GO_POLL).await;
        }
        say("GO")?;
    }
    let result = match sh.args.mode {
        Mode::Contend => contend(&sh).await,
        Mode::Hold => hold(&sh).await,
        other => Err(format!(
            "shared mode supports --mode contend and hold, not {other:?}"
        )),
    };
    let s = client.stats();
    super::finish(s.renewals, s.subscriptions, s.local_waiters, &sh.rec)?;
    result
}

async fn contend(sh: &Arc<Sh>) -> Res<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..sh.args.tasks {
        let sh = Arc::clone(sh);
        tasks.spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (u64::from(sh.args.proc) << 32) ^ task;
            let mut done = 0;
            for _ in 0..sh.args.iterations {
                if super::stop_requested(&sh.args) {
                    break;
                }
                let write = sh.writes_next(&mut rng);
                let (guard, mut held) = match sh.acquire(task, write).await {
                    Ok(acquired) => acquired,
                    // A paused or unreachable server: the failure is in the history
                    // (`acq_info`); the next iteration tries again.
                    Err(e) if sh.args.tolerate_errors && sh.remaining() > TICK => {
                        eprintln!("slate-worker {}: {e}; going on", sh.args.proc);
                        tokio::time::sleep(TICK).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let op = sh.inside(task, &mut held, &guard, write).await;
                let released = sh.release(task, &mut held, guard).await?;
                op?;
                done += 1;
                match released {
                    Released::Ok(_) => {}
                    // The lease ended while held (a loss, recorded): nothing to release.
                    Released::NotHeld if sh.args.tolerate_errors => {}
                    Released::Error(e) if sh.args.tolerate_errors => {
                        eprintln!("slate-worker {}: release: {e}; going on", sh.args.proc);
                    }
                    other => return Err(format!("release: {}", other.line())),
                }
            }
            Ok::<u64, String>(done)
        });
    }
    let (total, outcome) = crate::joined(tasks).await;
    say(&format!(
        "DONE acquisitions={total} writes={} max_inside={} max_shared={}",
        sh.writes.load(Ordering::Relaxed),
        sh.max_inside.load(Ordering::SeqCst),
        sh.max_shared.load(Ordering::SeqCst)
    ))?;
    outcome
}

async fn hold(sh: &Arc<Sh>) -> Res<()> {
    let write = sh.args.hold_as == HoldAs::Write && matches!(sh.prim, Prim::Rw(_));
    let (guard, mut held) = match sh.acquire(0, write).await {
        Ok(acquired) => acquired,
        Err(e) => {
            say(&format!("ACQUIRE error {}", e.replace('\n', " ")))?;
            return Ok(());
        }
    };
    say(&format!("HOLDING {} {}", held.holder, held.token))?;
    let until = Instant::now() + sh.args.hold;
    while Instant::now() < until && sh.remaining() > TICK {
        if let Some(reason) = guard.lease().loss_reason() {
            sh.log(0)
                .record(EventKind::Lost {
                    holder: held.holder.clone(),
                    reason: reason.to_string(),
                })
                .map_err(recording)?;
            say(&format!("LOST {}", reason_code(reason)))?;
            break;
        }
        sh.note(0, &mut held, &guard)?;
        tokio::time::sleep(TICK).await;
    }
    let released = sh.release(0, &mut held, guard).await?;
    say(&format!("UNLOCK {}", released.line()))
}
