//! A randomized nemesis for the single lock's request protocol (issue 30's lean scripts), at
//! the script level: two holders acquire, re-enter and release one lock while the schedule
//! loses replies (the request ran, the client sends it again), stalls first sends (the client
//! sends again; the stalled copy arrives later, at a random step), and times requests out (the
//! client gives up and undoes the acquire by its id, the first send having run or not).
//!
//! Half the cases give each holder a process of its own with a queue id, so that busy answers
//! queue it, releases hand the turn on (reserved 20 ms) and the hold's books of who waits
//! (field `w`) are kept; the other half name no queue.
//!
//! The clients follow the library's rules (`primitives/lock/competitor.rs`, `request.rs`): a
//! first send answered "overtaken" (`-7`) is sent again under a fresh id; a resend answered
//! so is an error (it may have run), after which an acquire is undone by its id and a release
//! counts as done locally; a resent release answered "not held" counts as released (the lease
//! is long).
//!
//! After every step, with every request answered or stalled:
//! - **exclusion**: the lock hash names at most one holder, and a holder that believes it
//!   holds is that one, with at least the levels it believes (exactly as many unless a resend
//!   was answered "overtaken", the documented case where a level may be left to its lease);
//! - **no hold nobody knows of**: a holder that believes it holds nothing has no field (same
//!   exception);
//! - **fencing**: every fresh grant's token is above every token granted before.
//!
//! Proptest shrinks a failing schedule to a short one; `PROPTEST_CASES` raises the count (4,000
//! cases pass in about 30 s). It catches, within a second, a release script without the
//! "overtaken" rule (a stale release copy takes a level of a newer hold) and an acquire script
//! whose refused resend leaves no cancel mark (the stalled first send grants later): both
//! were tried by editing the scripts when the test was written (their shrunk schedules are in
//! `protocol_nemesis.proptest-regressions`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use proptest::prelude::*;

/// The lease (ms): long enough that nothing expires within a case.
const LEASE_MS: &str = "60000";
/// How long a request record is kept (ms): longer than a case.
const RECORD_MS: &str = "60000";
/// What a first send answered "overtaken" is sent again under a fresh id, at most (the
/// library's `OVERTAKEN_RESENDS`).
const OVERTAKEN_RESENDS: u32 = 3;
const OVERTAKEN: i64 = -7;

/// What happens to one request on its way.
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Sent, run, answered.
    Answered,
    /// Run, but the reply was lost: the client sends it again (a resend).
    ReplyLost,
    /// The first send stalls on its way: the client sends it again (a resend); the stalled
    /// copy arrives later.
    Stalled,
    /// (Acquire) no reply in time: the client undoes it by its id; the first send ran before
    /// the undo.
    TimedOutRan,
    /// (Acquire) no reply in time, the first send stalled: the undo goes first, the copy
    /// arrives later.
    TimedOutStalled,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Holder `h` acquires (a re-entry when it believes it holds).
    Acquire(usize, Fate),
    /// Holder `h` releases one level (nothing when it believes it holds none).
    Release(usize, Fate),
    /// The `k`-th stalled copy (modulo how many there are) arrives now.
    Deliver(usize),
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => Just(Fate::Answered),
        2 => Just(Fate::ReplyLost),
        2 => Just(Fate::Stalled),
        1 => Just(Fate::TimedOutRan),
        1 => Just(Fate::TimedOutStalled),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2usize, fate()).prop_map(|(h, f)| Step::Acquire(h, f)),
        4 => (0..2usize, fate()).prop_map(|(h, f)| Step::Release(h, f)),
        2 => (0..8usize).prop_map(Step::Deliver),
    ]
}

/// A request as it goes to the server.
#[derive(Clone, Debug)]
enum Request {
    Acquire {
        holder: usize,
        id: u64,
        reentry: bool,
        resent: bool,
    },
    Release {
        holder: usize,
        id: u64,
        undo: Option<u64>,
        resent: bool,
    },
}

struct World<'a> {
    server: &'a slate_harness::server::RedisServer,
    con: redis::Connection,
    name: String,
    next_id: &'a AtomicU64,
    /// Levels each holder believes it holds.
    believed: [u32; 2],
    /// Holders for which a resend was answered "overtaken" (a level may be left to its lease).
    drift: [bool; 2],
    /// First sends stalled on their way.
    stalled: Vec<Request>,
    /// The highest fencing token granted so far.
    top_token: i64,
    /// Each holder is its own process with a queue id (the fair turn and the books of who
    /// waits, field `w`, come into play), or no holder names one.
    turns: bool,
    log: Vec<String>,
}

fn holder_id(h: usize) -> &'static str {
    ["holder-a", "holder-b"][h]
}

impl World<'_> {
    fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// The holder's process's queue id ('': no turn).
    fn queue_id(&self, h: usize) -> &'static str {
        if self.turns {
            ["proc-a", "proc-b"][h]
        } else {
            ""
        }
    }

    /// Runs `req` on the server and returns its reply.
    fn run(&mut self, req: &Request) -> Vec<i64> {
        let how = |holder: usize, reentry: bool, resent: bool| Direct {
            queue: self.queue_id(holder),
            tenure: 2,
            lease_ms: LEASE_MS,
            record_ms: RECORD_MS,
            reentry,
            resent,
        };
        let reply = match *req {
            Request::Acquire {
                holder,
                id,
                reentry,
                resent,
            } => {
                let how = how(holder, reentry, resent);
                let id = id.to_string();
                acquire_direct(&mut self.con, &self.name, holder_id(holder), &id, &how)
            }
            Request::Release {
                holder,
                id,
                undo,
                resent,
            } => {
                let how = how(holder, false, resent);
                let (id, undo) = (id.to_string(), undo.map(|u| u.to_string()));
                let ids = (id.as_str(), undo.as_deref().unwrap_or(""));
                vec![release_direct(
                    self.server,
                    &self.name,
                    holder_id(holder),
                    ids,
                    &how,
                )]
            }
        };
        self.log.push(format!("{req:?} -> {reply:?}"));
        reply
    }

    /// Sends `req` as its fate says; `None`: no reply reached the client (timed out).
    fn send(&mut self, req: Request, fate: Fate) -> (Option<Vec<i64>>, bool) {
        let resend = |r: &Request| match r.clone() {
            Request::Acquire {
                holder,
                id,
                reentry,
                ..
            } => Request::Acquire {
                holder,
                id,
                reentry,
                resent: true,
            },
            Request::Release {
                holder, id, undo, ..
            } => Request::Release {
                holder,
                id,
                undo,
                resent: true,
            },
        };
        match fate {
            Fate::Answered => (Some(self.run(&req)), false),
            Fate::ReplyLost => {
                let _lost = self.run(&req);
                let again = resend(&req);
                (Some(self.run(&again)), true)
            }
            Fate::Stalled => {
                self.stalled.push(req.clone());
                let again = resend(&req);
                (Some(self.run(&again)), true)
            }
            Fate::TimedOutRan => {
                let _lost = self.run(&req);
                (None, false)
            }
            Fate::TimedOutStalled => {
                self.stalled.push(req);
                (None, false)
            }
        }
    }

    fn acquire(&mut self, h: usize, fate: Fate) {
        let reentry = self.believed[h] > 0;
        // Releases time out to no undo in the library (the level ends with its lease); only
        // acquires take the timed-out fates.
        let mut fate = fate;
        let mut overtaken = 0;
        loop {
            let id = self.fresh_id();
            let req = Request::Acquire {
                holder: h,
                id,
                reentry,
                resent: false,
            };
            let (reply, resent) = self.send(req, fate);
            let Some(reply) = reply else {
                self.undo(h, id);
                return;
            };
            match reply.as_slice() {
                [1, token] => {
                    assert!(!reentry, "a re-entry granted a fresh hold: {:?}", self.log);
                    assert!(
                        *token > self.top_token,
                        "token {token} after {}: {:#?}",
                        self.top_token,
                        self.log
                    );
                    self.top_token = *token;
                    self.believed[h] = 1;
                }
                [2, _, _] if !reentry => {
                    // Only a level left behind after an "overtaken" resend (the documented
                    // limit) makes a first acquisition re-enter: the client holds one level.
                    assert!(
                        self.drift[h],
                        "a first acquisition re-entered: {:#?}",
                        self.log
                    );
                    self.believed[h] = 1;
                }
                [2, _, count] => {
                    self.believed[h] += 1;
                    assert_eq!(i64::from(self.believed[h]), *count, "{:#?}", self.log);
                }
                [0, _] | [-3] => {}
                [-4] => {
                    panic!("a re-entry found its hold gone: {:#?}", self.log);
                }
                [OVERTAKEN] if !resent && overtaken < OVERTAKEN_RESENDS => {
                    overtaken += 1;
                    fate = Fate::Answered;
                    continue;
                }
                [OVERTAKEN] if resent => {
                    // May have run: an error; the acquire is undone by its id.
                    self.drift[h] = true;
                    self.undo(h, id);
                }
                [OVERTAKEN] => {}
                other => panic!("unexpected acquire reply {other:?}: {:#?}", self.log),
            }
            return;
        }
    }

    fn undo(&mut self, h: usize, acquire: u64) {
        let req = Request::Release {
            holder: h,
            id: self.fresh_id(),
            undo: Some(acquire),
            resent: false,
        };
        let _ = self.run(&req);
    }

    fn release(&mut self, h: usize, fate: Fate) {
        if self.believed[h] == 0 {
            return;
        }
        let fate = match fate {
            Fate::TimedOutRan | Fate::TimedOutStalled => Fate::Answered,
            f => f,
        };
        let mut fate = fate;
        let mut overtaken = 0;
        loop {
            let req = Request::Release {
                holder: h,
                id: self.fresh_id(),
                undo: None,
                resent: false,
            };
            let (reply, resent) = self.send(req, fate);
            let n = reply.expect("releases are answered")[0];
            match n {
                OVERTAKEN if !resent && overtaken < OVERTAKEN_RESENDS => {
                    overtaken += 1;
                    fate = Fate::Answered;
                    continue;
                }
                OVERTAKEN if resent => self.drift[h] = true,
                -1 if resent => {}
                n if n >= 0 => {
                    let left = i64::from(self.believed[h] - 1);
                    assert!(
                        n == left || (self.drift[h] && n > left),
                        "{n} levels left after a release, {left} believed: {:#?}",
                        self.log
                    );
                }
                other => panic!("unexpected release reply {other}: {:#?}", self.log),
            }
            // Whatever the answer, the level is gone locally (the library's guard).
            self.believed[h] -= 1;
            return;
        }
    }

    fn deliver(&mut self, k: usize) {
        if self.stalled.is_empty() {
            return;
        }
        let req = self.stalled.remove(k % self.stalled.len());
        // Nobody awaits its reply (a replay may repeat a grant's answer): it must change
        // nothing a client believes, which `check` decides.
        let _ = self.run(&req);
    }

    /// The invariants (module docs).
    fn check(&mut self) {
        let fields: BTreeMap<String, i64> = {
            let v: Vec<String> = redis::from_redis_value(
                self.server
                    .command(&["HGETALL", &format!("slate:{{{}}}", self.name)])
                    .unwrap(),
            )
            .unwrap();
            v.chunks(2)
                .filter(|kv| !["t", "r", "w"].contains(&kv[0].as_str()))
                .map(|kv| (kv[0].clone(), kv[1].parse().unwrap()))
                .collect()
        };
        assert!(
            fields.len() <= 1,
            "two holders: {fields:?}: {:#?}",
            self.log
        );
        for h in 0..2 {
            let on_server = fields.get(holder_id(h)).copied().unwrap_or(0);
            let believed = i64::from(self.believed[h]);
            if self.drift[h] {
                assert!(
                    on_server >= believed,
                    "holder {h} believes {believed} levels, the server has {on_server}: {:#?}",
                    self.log
                );
            } else {
                assert_eq!(
                    on_server, believed,
                    "holder {h}'s levels (server, believed): {fields:?}: {:#?}",
                    self.log
                );
            }
        }
    }
}

/// The random schedules, on one server for all the cases (started here, so that it stops
/// with the test: a server kept in a `static` was never stopped, and outlived every run).
#[test]
fn random_schedules_keep_exclusion_levels_and_tokens() {
    static CASE: AtomicU64 = AtomicU64::new(0);
    static IDS: AtomicU64 = AtomicU64::new(1_000);
    let server = server();
    let config = ProptestConfig {
        // The regressions file beside this one, as `proptest!` keeps it.
        source_file: Some(file!()),
        test_name: Some(concat!(
            module_path!(),
            "::random_schedules_keep_exclusion_levels_and_tokens"
        )),
        ..ProptestConfig::with_cases(300)
    };
    let strategy = (any::<bool>(), prop::collection::vec(step(), 1..40));
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let outcome = runner.run(&strategy, |(turns, steps)| {
        let server = &server;
        let mut world = World {
            server,
            con: server.connection().unwrap(),
            name: format!("nemesis-{}", CASE.fetch_add(1, Ordering::SeqCst)),
            next_id: &IDS,
            believed: [0, 0],
            drift: [false, false],
            stalled: Vec::new(),
            top_token: 0,
            turns,
            log: Vec::new(),
        };
        for s in &steps {
            world.log.push(format!("step {s:?}"));
            match *s {
                Step::Acquire(h, f) => world.acquire(h, f),
                Step::Release(h, f) => world.release(h, f),
                Step::Deliver(k) => world.deliver(k),
            }
            world.check();
        }
        // Every stalled copy arrives in the end; then every holder lets go.
        while !world.stalled.is_empty() {
            world.deliver(0);
            world.check();
        }
        for h in 0..2 {
            while world.believed[h] > 0 {
                world.release(h, Fate::Answered);
                world.check();
            }
        }
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
