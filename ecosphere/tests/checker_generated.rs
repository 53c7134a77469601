//! The checker against generated histories: a seeded simulation of workers, a lock server
//! with leases, pauses, kills, lost replies and an observer produces legal histories, which
//! must always pass; shifting one acquisition into another holder's window must fail I1.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ecosphere::history::{
    CheckConfig, CheckId, CounterCheck, CounterExpectation, Event, EventKind, History, Status,
};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const LEASE: u64 = 50 * MS;
const HARNESS: u32 = 1000;
const OBSERVER: u32 = 1001;

/// splitmix64: small, seedable, good enough for schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Debug)]
struct Entry {
    holder: String,
    depth: u32,
    token: u64,
    expiry: u64,
}

#[derive(Default)]
struct Server {
    entry: Option<Entry>,
    next_token: u64,
}

impl Server {
    fn live(&self, now: u64) -> Option<&Entry> {
        self.entry.as_ref().filter(|e| e.expiry > now)
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Acquire (first level or re-entrant); `result` once the server executed it.
    Acq {
        attempt: u64,
        send: u64,
        retry: bool,
        result: Option<Option<(u32, u64)>>,
    },
    Renew {
        send: u64,
        result: Option<bool>,
    },
    Release {
        before: u32,
        result: Option<Option<u32>>,
    },
}

#[derive(Clone, Debug)]
struct Held {
    depth: u32,
    token: u64,
    deadline: u64,
}

struct Proc {
    id: u32,
    alive: bool,
    asleep_until: u64,
    lock: usize,
    holder: String,
    n_holders: u64,
    held: Option<Held>,
    op: Option<Op>,
}

struct Sim {
    rng: Rng,
    now: u64,
    ev: Vec<Event>,
    servers: Vec<Server>,
    procs: Vec<Proc>,
    attempts: u64,
    counter: u64,
    locks: Vec<String>,
    always_restart: bool,
}

impl Sim {
    fn new(seed: u64, n_procs: u32, n_locks: usize) -> Sim {
        let procs = (0..n_procs)
            .map(|id| Proc {
                id,
                alive: true,
                asleep_until: 0,
                lock: 0,
                holder: format!("p{id}h0"),
                n_holders: 0,
                held: None,
                op: None,
            })
            .collect();
        Sim {
            rng: Rng(seed),
            now: 1_000_000 * MS,
            ev: Vec::new(),
            servers: (0..n_locks)
                .map(|_| Server {
                    entry: None,
                    next_token: 1,
                })
                .collect(),
            procs,
            attempts: 0,
            counter: 0,
            locks: (0..n_locks).map(|l| format!("lock{l}")).collect(),
            always_restart: false,
        }
    }

    fn emit(&mut self, proc: u32, lock: usize, kind: EventKind) {
        let lock = self.locks[lock].clone();
        self.ev.push(Event::new(self.now, proc, 0, lock, kind));
    }

    fn new_holder(&mut self, p: usize) {
        let pr = &mut self.procs[p];
        pr.n_holders += 1;
        pr.holder = format!("p{}h{}", pr.id, pr.n_holders);
    }

    fn observe(&mut self, lock: usize) {
        let now = self.now;
        let (fields, pttl) = match self.servers[lock].live(now) {
            Some(e) => {
                let ms = i64::try_from((e.expiry - now) / MS).unwrap_or(i64::MAX);
                (BTreeMap::from([(e.holder.clone(), u64::from(e.depth))]), ms)
            }
            None => (BTreeMap::new(), -2),
        };
        let kind = EventKind::Observe {
            node: 0,
            fields,
            pttl_ms: pttl,
            run_id: "r".into(),
        };
        self.emit(OBSERVER, lock, kind);
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.now += US + self.rng.below(1500 * US);
            if self.rng.chance(3) {
                let l = self.rng.below(self.locks.len() as u64) as usize;
                self.observe(l);
                continue;
            }
            let p = self.rng.below(self.procs.len() as u64) as usize;
            if !self.procs[p].alive || self.procs[p].asleep_until > self.now {
                continue;
            }
            self.step(p);
        }
    }

    fn step(&mut self, p: usize) {
        let now = self.now;
        let id = self.procs[p].id;
        let lock = self.procs[p].lock;
        let holder = self.procs[p].holder.clone();
        // Rare faults: a kill (the worker is restarted later under the same `proc`, with
        // fresh holder ids, or stays dead), a long pause (SIGSTOP-like; may outlast the lease).
        if self.rng.chance(1) && self.rng.chance(20) {
            self.emit(HARNESS, lock, EventKind::kill_worker(id));
            let restart = self.always_restart || self.rng.chance(80);
            let pr = &mut self.procs[p];
            pr.alive = restart;
            pr.asleep_until = now + LEASE / 2;
            pr.held = None;
            pr.op = None;
            self.new_holder(p);
            return;
        }
        if self.rng.chance(2) {
            self.procs[p].asleep_until = now + self.rng.below(3 * LEASE);
            return;
        }
        match self.procs[p].op.clone() {
            Some(op) => self.advance(p, op),
            None => match self.procs[p].held.clone() {
                None => {
                    // Start a first-level acquisition on a random lock.
                    let lock = self.rng.below(self.locks.len() as u64) as usize;
                    self.procs[p].lock = lock;
                    self.attempts += 1;
                    let attempt = self.attempts;
                    let try_once = self.rng.chance(30);
                    let budget_ms = if try_once { Some(0) } else { None };
                    self.emit(id, lock, EventKind::AcqInvoke { attempt, budget_ms });
                    self.procs[p].op = Some(Op::Acq {
                        attempt,
                        send: now,
                        retry: !try_once,
                        result: None,
                    });
                }
                Some(h) if now >= h.deadline => {
                    // The library tells the application the lease ran out.
                    let kind = EventKind::Lost {
                        holder: holder.clone(),
                        reason: "expired".into(),
                    };
                    self.emit(id, lock, kind);
                    self.procs[p].held = None;
                    if self.rng.chance(50) {
                        self.new_holder(p);
                    }
                }
                Some(h) => {
                    let r = self.rng.below(100);
                    if r < 35 {
                        self.counter += 1;
                        let kind = EventKind::ResOp {
                            holder,
                            token: h.token,
                            op: "incr".into(),
                            outcome: "ok".into(),
                            invoked: None,
                        };
                        self.emit(id, lock, kind);
                    } else if r < 50 && h.depth < 3 {
                        self.attempts += 1;
                        let attempt = self.attempts;
                        self.emit(
                            id,
                            lock,
                            EventKind::AcqInvoke {
                                attempt,
                                budget_ms: Some(0),
                            },
                        );
                        self.procs[p].op = Some(Op::Acq {
                            attempt,
                            send: now,
                            retry: false,
                            result: None,
                        });
                    } else if r < 70 {
                        self.procs[p].op = Some(Op::Renew {
                            send: now,
                            result: None,
                        });
                    } else {
                        let kind = EventKind::RelInvoke {
                            holder,
                            depth_before: h.depth,
                        };
                        self.emit(id, lock, kind);
                        self.procs[p].op = Some(Op::Release {
                            before: h.depth,
                            result: None,
                        });
                    }
                }
            },
        }
    }

    /// Second step of an operation: the server executes it; third: the reply arrives.
    fn advance(&mut self, p: usize, op: Op) {
        let now = self.now;
        let id = self.procs[p].id;
        let lock = self.procs[p].lock;
        let holder = self.procs[p].holder.clone();
        let srv = &mut self.servers[lock];
        match op {
            Op::Acq {
                attempt,
                send,
                retry,
                result: None,
            } => {
                let res = match srv.live(now).cloned() {
                    None => {
                        let token = srv.next_token;
                        srv.next_token += 1;
                        let e = Entry {
                            holder: holder.clone(),
                            depth: 1,
                            token,
                            expiry: now + LEASE,
                        };
                        srv.entry = Some(e);
                        Some((1, token))
                    }
                    Some(e) if e.holder == holder => {
                        let depth = e.depth + 1;
                        srv.entry = Some(Entry {
                            depth,
                            expiry: now + LEASE,
                            ..e.clone()
                        });
                        Some((depth, e.token))
                    }
                    Some(_) => None,
                };
                self.procs[p].op = Some(Op::Acq {
                    attempt,
                    send,
                    retry,
                    result: Some(res),
                });
            }
            Op::Acq {
                attempt,
                send,
                retry,
                result: Some(res),
            } => {
                self.procs[p].op = None;
                let deadline = send + LEASE;
                match res {
                    Some((depth, token)) if now < deadline && !self.rng.chance(3) => {
                        let kind = EventKind::AcqOk {
                            attempt,
                            holder,
                            token,
                            depth,
                            deadline,
                            nodes: vec![],
                            permits: None,
                        };
                        self.emit(id, lock, kind);
                        self.procs[p].held = Some(Held {
                            depth,
                            token,
                            deadline,
                        });
                    }
                    Some(_) => {
                        // Reply lost or too late: indeterminate; the entry is a ghost.
                        let kind = EventKind::AcqInfo {
                            attempt,
                            reason: "timeout".into(),
                        };
                        self.emit(id, lock, kind);
                        if self.procs[p].held.is_some() {
                            let kind = EventKind::Lost {
                                holder,
                                reason: "io".into(),
                            };
                            self.emit(id, lock, kind);
                            self.procs[p].held = None;
                        }
                        self.new_holder(p);
                    }
                    None if retry && self.procs[p].held.is_none() => {
                        // A waiting call tries again later (new send time, no new invoke).
                        self.procs[p].op = Some(Op::Acq {
                            attempt,
                            send: now,
                            retry,
                            result: None,
                        });
                    }
                    None => {
                        let kind = EventKind::AcqFail {
                            attempt,
                            reason: "busy".into(),
                        };
                        self.emit(id, lock, kind);
                    }
                }
            }
            Op::Renew { send, result: None } => {
                let ok = match srv.entry.as_mut() {
                    Some(e) if e.holder == holder && e.expiry > now => {
                        e.expiry = now + LEASE;
                        true
                    }
                    _ => false,
                };
                self.procs[p].op = Some(Op::Renew {
                    send,
                    result: Some(ok),
                });
            }
            Op::Renew {
                send,
                result: Some(ok),
            } => {
                self.procs[p].op = None;
                if ok {
                    let deadline = send + LEASE;
                    if let Some(h) = self.procs[p].held.as_mut() {
                        h.deadline = deadline;
                    }
                    self.emit(id, lock, EventKind::RenewOk { holder, deadline });
                } else {
                    self.emit(
                        id,
                        lock,
                        EventKind::RenewFail {
                            holder,
                            reason: "gone".into(),
                        },
                    );
                }
            }
            Op::Release {
                before,
                result: None,
            } => {
                let res = match srv.entry.as_mut() {
                    Some(e) if e.holder == holder && e.expiry > now => {
                        e.depth -= 1;
                        e.expiry = now + LEASE;
                        let after = e.depth;
                        if after == 0 {
                            srv.entry = None;
                        }
                        Some(after)
                    }
                    _ => None,
                };
                self.procs[p].op = Some(Op::Release {
                    before,
                    result: Some(res),
                });
            }
            Op::Release {
                before: _,
                result: Some(res),
            } => {
                self.procs[p].op = None;
                if self.rng.chance(3) {
                    let kind = EventKind::RelInfo {
                        holder,
                        reason: "io".into(),
                    };
                    self.emit(id, lock, kind);
                    self.procs[p].held = None;
                    self.new_holder(p);
                    return;
                }
                match res {
                    Some(after) => {
                        self.emit(
                            id,
                            lock,
                            EventKind::RelOk {
                                holder,
                                depth_after: after,
                            },
                        );
                        if after == 0 {
                            self.procs[p].held = None;
                            if self.rng.chance(50) {
                                self.new_holder(p);
                            }
                        } else if let Some(h) = self.procs[p].held.as_mut() {
                            h.depth = after;
                        }
                    }
                    None => {
                        let kind = EventKind::RelFail {
                            holder,
                            reason: "not held".into(),
                            not_held: true,
                        };
                        self.emit(id, lock, kind);
                        self.procs[p].held = None;
                        self.new_holder(p);
                    }
                }
            }
        }
    }

    /// Stops everything, waits out the lease and takes final snapshots.
    fn finish(&mut self) -> CheckConfig {
        self.now += 2 * LEASE;
        let quiet = self.now;
        for l in 0..self.locks.len() {
            self.now += US;
            self.observe(l);
        }
        CheckConfig {
            counter: Some(CounterCheck {
                final_value: self.counter,
                expected: CounterExpectation::AckedIncrements,
            }),
            quiescent_after: Some(quiet),
            ..CheckConfig::new(Duration::from_nanos(LEASE))
        }
    }
}

fn generate(seed: u64, steps: usize) -> (Vec<Event>, CheckConfig) {
    generate_with(seed, steps, false)
}

fn generate_with(seed: u64, steps: usize, always_restart: bool) -> (Vec<Event>, CheckConfig) {
    let mut rng = Rng(seed ^ 0x5EED);
    let n_procs = 2 + rng.below(4) as u32;
    let n_locks = 1 + rng.below(2) as usize;
    let mut sim = Sim::new(seed, n_procs, n_locks);
    sim.always_restart = always_restart;
    sim.run(steps);
    let cfg = sim.finish();
    (sim.ev, cfg)
}

/// Moves the acquisition of a fresh holder into the window of the previous first-level holder
/// of the same lock. Returns `None` when the history has no such pair.
fn shift_into_previous_window(ev: &[Event], pick: u64) -> Option<Vec<Event>> {
    let mut last_first: BTreeMap<&str, usize> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut candidates = Vec::new();
    for (i, e) in ev.iter().enumerate() {
        if let EventKind::AcqOk { holder, depth, .. } = &e.kind {
            let fresh = seen.insert((e.lock.as_str(), holder.as_str()));
            if *depth == 1 {
                if let Some(&a) = last_first.get(e.lock.as_str())
                    && fresh
                    && ev[a].kind.holder() != Some(holder.as_str())
                {
                    candidates.push((a, i));
                }
                last_first.insert(e.lock.as_str(), i);
            }
        }
    }
    if candidates.is_empty() {
        return None;
    }
    let (a, b) = candidates[(pick % candidates.len() as u64) as usize];
    let mut out = ev.to_vec();
    out[b].t = ev[a].t + 1;
    Some(out)
}

#[test]
fn legal_histories_pass_and_shifted_acquisitions_fail() {
    let mut mutated = 0;
    let mut events = 0;
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    for seed in 0..300u64 {
        let (ev, cfg) = generate(seed, 1500);
        events += ev.len();
        for e in &ev {
            *kinds.entry(e.kind.name()).or_default() += 1;
        }
        let report = History::from_events(ev.clone()).check(&cfg);
        if !report.is_ok() {
            panic!("seed {seed}: legal history rejected\n{report}");
        }
        assert_eq!(
            report.status(CheckId::Exclusion),
            &Status::Pass,
            "seed {seed}\n{report}"
        );
        if let Some(bad) = shift_into_previous_window(&ev, seed) {
            mutated += 1;
            let r = History::from_events(bad).check(&cfg);
            assert!(
                matches!(r.status(CheckId::Exclusion), Status::Fail(_)),
                "seed {seed}: shifted acquisition not caught\n{r}"
            );
        }
    }
    println!("{events} events, {mutated} mutated histories, kinds {kinds:?}");
    assert!(mutated >= 250, "too few mutations: {mutated}");
    // The generator must exercise every kind of event the checker handles.
    for k in [
        "acq_invoke",
        "acq_ok",
        "acq_fail",
        "acq_info",
        "renew_ok",
        "renew_fail",
        "lost",
        "rel_invoke",
        "rel_ok",
        "rel_fail",
        "rel_info",
        "res_op",
        "nemesis",
        "observe",
    ] {
        assert!(
            kinds.get(k).copied().unwrap_or(0) > 0,
            "generator never produced {k}"
        );
    }
}

#[test]
fn a_late_release_mutation_fails() {
    // Delay one first-level holder's rel_invoke past the next holder's acquisition, and extend
    // its lease with a renewal so the deadline does not close the window first.
    let mut caught = 0;
    for seed in 0..100u64 {
        let (mut ev, cfg) = generate(seed, 1500);
        // Find: holder A rel_invoke at depth 1, then the next first-level acq_ok by B != A on
        // the same lock.
        let mut found = None;
        'outer: for (i, e) in ev.iter().enumerate() {
            if let EventKind::RelInvoke {
                holder: a,
                depth_before: 1,
            } = &e.kind
            {
                for (j, f) in ev.iter().enumerate().skip(i + 1) {
                    if f.lock == e.lock
                        && let EventKind::AcqOk {
                            holder: b,
                            depth: 1,
                            ..
                        } = &f.kind
                    {
                        if b != a {
                            found = Some((i, j));
                        }
                        break 'outer;
                    }
                }
            }
        }
        let Some((i, j)) = found else { continue };
        let tb = ev[j].t;
        let (proc, lock) = (ev[i].proc, ev[i].lock.clone());
        let Some(holder) = ev[i].kind.holder().map(str::to_owned) else {
            continue;
        };
        let t_renew = ev[i].t;
        if tb + 10 >= t_renew + LEASE {
            continue;
        }
        // The release's outcome moves along with it.
        let outcome = (i + 1..ev.len()).find(|&k| {
            ev[k].proc == proc
                && ev[k].lock == lock
                && matches!(
                    ev[k].kind,
                    EventKind::RelOk { .. } | EventKind::RelFail { .. } | EventKind::RelInfo { .. }
                )
        });
        ev[i].t = tb + 1;
        if let Some(k) = outcome {
            ev[k].t = ev[k].t.max(tb + 2);
        }
        let renew = EventKind::RenewOk {
            holder,
            deadline: t_renew + LEASE,
        };
        ev.push(Event::new(t_renew, proc, 0, lock, renew));
        let r = History::from_events(ev).check(&cfg);
        assert!(
            matches!(r.status(CheckId::Exclusion), Status::Fail(_)),
            "seed {seed}\n{r}"
        );
        caught += 1;
    }
    assert!(caught > 50, "{caught}");
}

#[test]
fn large_history_is_checked_fast() {
    let (ev, cfg) = generate_with(7, 600_000, true);
    let n = ev.len();
    let h = History::from_events(ev);
    let start = Instant::now();
    let report = h.check(&cfg);
    let took = start.elapsed();
    println!("checked {n} events in {took:?}\n{report}");
    report.assert_ok();
    assert!(n >= 100_000, "only {n} events");
    // Generous bound (debug build, shared CI machine); release builds take a few tens of ms.
    assert!(took < Duration::from_secs(10), "{took:?}");
}
