//! The local queued synchronizer (`slate-aqs`) against `tokio::sync::Mutex`, no Redis.
//!
//! - `aqs_uncontended`: one task, acquire + release in a loop. `synchronizer_noop` drives a
//!   competitor that grants at once and keeps no state (the synchronizer's own cost);
//!   `synchronizer_memory` drives the in-memory remote of `slate_aqs::testing` (what the
//!   tests use); `tokio_mutex` is the yardstick.
//! - `aqs_handoff`: two tasks on a two-worker runtime, each looping acquire → yield →
//!   release, so the lock passes from one to the other; time per acquisition.
//! - `aqs_drain`: N tasks parked behind a holder; time from the holder's release until all N
//!   have acquired and released in turn (linear in N is the goal).
//! - Memory per parked waiter is printed once (not a criterion measurement): the acquire
//!   future's size plus its queue slot, and the resident-memory growth per parked task
//!   (tokio's task included) with 10,000 tasks parked.
//!
//! `cargo bench -p benches --bench aqs -- --warm-up-time 1 --measurement-time 3`

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use slate_aqs::testing::{self, MemoryCompetitor, MemoryRemote};
use slate_aqs::{Attempt, Competitor, Synchronizer};
use slate_core::{HolderId, Result, Wait};

const SPIN: Duration = Duration::from_millis(50);

/// Grants every attempt at once and keeps no remote state.
struct Noop;

impl Competitor for Noop {
    type Grant = ();

    fn attempt(
        &self,
        _holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<()>>> + Send + 'static {
        std::future::ready(Ok(Attempt::Acquired(())))
    }

    fn abandon(&self, _holder: HolderId, _grant: ()) {}
}

fn memory_sync() -> Arc<Synchronizer<MemoryCompetitor>> {
    Arc::new(Synchronizer::new(
        "bench",
        MemoryCompetitor::new(MemoryRemote::new()),
        SPIN,
    ))
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn uncontended(c: &mut Criterion) {
    let rt = current_thread();
    let mut group = c.benchmark_group("aqs_uncontended");

    let mutex = tokio::sync::Mutex::new(0u64);
    group.bench_function("tokio_mutex", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut guard = mutex.lock().await;
                    *guard += 1;
                    drop(black_box(guard));
                }
                start.elapsed()
            })
        });
    });

    let noop = Synchronizer::new("bench", Noop, SPIN);
    let holder = HolderId::new();
    group.bench_function("synchronizer_noop", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let grant: () = noop.acquire(holder, Wait::Forever).await.unwrap();
                    black_box(&grant);
                    noop.release(holder);
                }
                start.elapsed()
            })
        });
    });

    let sync = memory_sync();
    group.bench_function("synchronizer_memory", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(sync.acquire(holder, Wait::Forever).await.unwrap());
                    testing::release(&sync, holder).unwrap();
                }
                start.elapsed()
            })
        });
    });
    group.finish();
}

fn handoff(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("aqs_handoff");

    group.bench_function("tokio_mutex", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mutex = Arc::new(tokio::sync::Mutex::new(0u64));
                let start = Instant::now();
                let tasks: Vec<_> = (0..2)
                    .map(|_| {
                        let mutex = mutex.clone();
                        tokio::spawn(async move {
                            for _ in 0..iters.div_ceil(2) {
                                let mut guard = mutex.lock().await;
                                tokio::task::yield_now().await;
                                *guard += 1;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            })
        });
    });

    group.bench_function("synchronizer_memory", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let sync = memory_sync();
                let start = Instant::now();
                let tasks: Vec<_> = (0..2)
                    .map(|_| {
                        let sync = sync.clone();
                        tokio::spawn(async move {
                            let me = HolderId::new();
                            for _ in 0..iters.div_ceil(2) {
                                sync.acquire(me, Wait::Forever).await.unwrap();
                                tokio::task::yield_now().await;
                                testing::release(&sync, me).unwrap();
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            })
        });
    });
    group.finish();
}

/// Parks `n` tasks behind a holder, then times the drain.
fn drain_once(rt: &tokio::runtime::Runtime, n: usize) -> Duration {
    rt.block_on(async {
        let sync = memory_sync();
        let holder = HolderId::new();
        sync.acquire(holder, Wait::Forever).await.unwrap();
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let sync = sync.clone();
                tokio::spawn(async move {
                    let me = HolderId::new();
                    sync.acquire(me, Wait::Forever).await.unwrap();
                    testing::release(&sync, me).unwrap();
                })
            })
            .collect();
        while sync.waiters() < n {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        testing::release(&sync, holder).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = start.elapsed();
        assert_eq!(sync.waiters(), 0);
        elapsed
    })
}

fn tokio_drain_once(rt: &tokio::runtime::Runtime, n: usize) -> Duration {
    rt.block_on(async {
        let mutex = Arc::new(tokio::sync::Mutex::new(0u64));
        let guard = mutex.clone().lock_owned().await;
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let mutex = mutex.clone();
                tokio::spawn(async move {
                    *mutex.lock().await += 1;
                })
            })
            .collect();
        // Let every task reach the mutex's queue.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        drop(guard);
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

fn drain(c: &mut Criterion) {
    let rt = current_thread();
    let mut group = c.benchmark_group("aqs_drain");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        group.bench_with_input(BenchmarkId::new("synchronizer_memory", n), &n, |b, &n| {
            b.iter_custom(|iters| (0..iters).map(|_| drain_once(&rt, n)).sum());
        });
        group.bench_with_input(BenchmarkId::new("tokio_mutex", n), &n, |b, &n| {
            b.iter_custom(|iters| (0..iters).map(|_| tokio_drain_once(&rt, n)).sum());
        });
    }
    group.finish();
}

/// Resident set size in bytes (Linux), if readable.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn memory(_c: &mut Criterion) {
    const N: usize = 10_000;
    let sync = memory_sync();
    let future_bytes = std::mem::size_of_val(&sync.acquire(HolderId::new(), Wait::Forever));
    let slot = Synchronizer::<MemoryCompetitor>::queue_slot_bytes();
    let deadline = Synchronizer::<MemoryCompetitor>::deadline_bytes();
    eprintln!(
        "aqs_memory: acquire future {future_bytes} B + queue slot {slot} B = {} B per parked \
         waiter; a waiter with a deadline adds {deadline} B on the shared timer's heap = {} B \
         (only a head waiting out a retry delay boxes a tokio Sleep, {} B, of its own)",
        future_bytes + slot,
        future_bytes + slot + deadline,
        std::mem::size_of::<tokio::time::Sleep>(),
    );

    // Resident growth of three populations of N parked tasks, all kept alive until the end
    // so that no population reuses memory another one freed: tasks parked on nothing (tokio's
    // own cost per task), tasks parked in `acquire` without and with a deadline.
    let rt = current_thread();
    rt.block_on(async {
        let sync = memory_sync();
        let holder = HolderId::new();
        sync.acquire(holder, Wait::Forever).await.unwrap();
        let (tx, _) = tokio::sync::broadcast::channel::<()>(1);
        let mut tasks = Vec::with_capacity(3 * N);
        let mut growth = Vec::new();
        for population in 0..3 {
            let before = rss();
            for _ in 0..N {
                tasks.push(if population == 0 {
                    // A future of its own (small) type: tokio's cost per parked task.
                    let mut stop = tx.subscribe();
                    tokio::spawn(async move {
                        let _ = stop.recv().await;
                    })
                } else {
                    let sync = sync.clone();
                    let wait = if population == 1 {
                        Wait::Forever
                    } else {
                        Wait::for_duration(Duration::from_secs(3600))
                    };
                    tokio::spawn(async move {
                        let me = HolderId::new();
                        sync.acquire(me, wait).await.unwrap();
                        testing::release(&sync, me).unwrap();
                    })
                });
            }
            // Every new task runs to its park point.
            tokio::task::yield_now().await;
            while sync.waiters() < N * population {
                tokio::task::yield_now().await;
            }
            growth.push(
                before
                    .zip(rss())
                    .map(|(b, a)| a.saturating_sub(b) as f64 / N as f64),
            );
        }
        match growth[..] {
            [Some(base), Some(forever), Some(deadline)] => eprintln!(
                "aqs_memory: resident growth per parked task ({N} tasks each): a tokio task \
                 parked on a broadcast receiver {base:.0} B; a task parked in acquire without \
                 deadline {forever:.0} B (+{:.0} B), with deadline {deadline:.0} B (+{:.0} B)",
                forever - base,
                deadline - base,
            ),
            _ => eprintln!("aqs_memory: /proc/self/statm not readable"),
        }
        let _ = tx.send(());
        testing::release(&sync, holder).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
    });
}

criterion_group!(benches, memory, uncontended, handoff, drain);
criterion_main!(benches);
