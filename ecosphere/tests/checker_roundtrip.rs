//! Recorder → files → `History::load` → checker, with real threads and real timestamps.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ecosphere::clock::{now_ns, to_mono_ns};
use ecosphere::history::{
    CheckConfig, CheckId, CounterCheck, CounterExpectation, Event, EventKind, History,
    HistoryError, Recorder, Status,
};

const LEASE: Duration = Duration::from_secs(2);

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Shared state guarded by a real mutex: (fencing token counter, non-atomic counter).
type Guarded = Arc<Mutex<(u64, u64)>>;

fn worker(rec: Recorder, lock: Guarded, rounds: u64) -> Result<(), HistoryError> {
    let holder = format!("p{}", rec.proc());
    for round in 0..rounds {
        let attempt = round;
        let task = round;
        rec.record(
            task,
            "L",
            EventKind::AcqInvoke {
                attempt,
                budget_ms: None,
            },
        )?;
        let mut g = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = to_mono_ns(Instant::now() + LEASE);
        g.0 += 1;
        let token = g.0;
        rec.record(
            task,
            "L",
            EventKind::AcqOk {
                attempt,
                holder: holder.clone(),
                token,
                depth: 1,
                deadline,
                nodes: vec![],
                permits: None,
            },
        )?;
        // Non-atomic read-modify-write, as the scenario's counter does it.
        let v = g.1;
        thread::yield_now();
        g.1 = v + 1;
        let kind = EventKind::ResOp {
            holder: holder.clone(),
            token,
            op: "incr".into(),
            outcome: "ok".into(),
            invoked: None,
        };
        rec.record(task, "L", kind)?;
        rec.record(
            task,
            "L",
            EventKind::RelInvoke {
                holder: holder.clone(),
                depth_before: 1,
            },
        )?;
        drop(g);
        rec.record(
            task,
            "L",
            EventKind::RelOk {
                holder: holder.clone(),
                depth_after: 0,
            },
        )?;
    }
    Ok(())
}

#[test]
fn three_writers_merge_in_time_order_and_pass() -> TestResult {
    let dir = tempfile::tempdir()?;
    let lock: Guarded = Arc::new(Mutex::new((0, 0)));
    let rounds = 300;
    let handles: Vec<_> = (0..3u32)
        .map(|p| {
            let rec = Recorder::create(dir.path(), p);
            let lock = lock.clone();
            thread::spawn(move || worker(rec?, lock, rounds))
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "worker panicked")??;
    }
    let h = History::load(dir.path())?;
    assert_eq!(h.files().len(), 3);
    assert_eq!(h.len(), 3 * 300 * 5);
    assert_eq!(h.truncated_lines(), 0);
    let ev = h.events();
    assert!(ev.windows(2).all(|w| w[0].t <= w[1].t), "not sorted by t");
    // Each process's events keep their order (task = round number).
    for p in 0..3 {
        let tasks: Vec<u64> = ev.iter().filter(|e| e.proc == p).map(|e| e.task).collect();
        assert!(tasks.windows(2).all(|w| w[0] <= w[1]), "proc {p} reordered");
        assert_eq!(tasks.len(), 1500);
    }
    // The three writers really interleave.
    let switches = ev.windows(2).filter(|w| w[0].proc != w[1].proc).count();
    assert!(switches > 10, "{switches}");
    let final_value = lock.lock().map_err(|_| "poisoned")?.1;
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value,
            expected: CounterExpectation::AckedIncrements,
        }),
        strict_invoke_bound: false,
        ..CheckConfig::new(LEASE)
    };
    let report = h.check(&cfg);
    report.assert_ok();
    for id in [
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Counter,
        CheckId::Activity,
    ] {
        assert_eq!(report.status(id), &Status::Pass, "{report}");
    }
    assert_eq!(report.stats.windows, 900);
    Ok(())
}

#[test]
fn a_shared_recorder_keeps_its_file_in_time_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rec = Recorder::create_buffered(dir.path(), 9)?;
    let handles: Vec<_> = (0..4u64)
        .map(|task| {
            let rec = rec.clone();
            thread::spawn(move || -> Result<(), HistoryError> {
                for attempt in 0..500 {
                    rec.record(
                        task,
                        "L",
                        EventKind::AcqInvoke {
                            attempt,
                            budget_ms: Some(0),
                        },
                    )?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "writer panicked")??;
    }
    drop(rec); // flushes the buffer
    let text = std::fs::read_to_string(dir.path().join("proc-9.jsonl"))?;
    let ts: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<Event>(l).map(|e| e.t))
        .collect::<Result<_, _>>()?;
    assert_eq!(ts.len(), 2000);
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    Ok(())
}

#[test]
fn every_event_kind_round_trips() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rec = Recorder::create(dir.path(), 1)?;
    let kinds = vec![
        EventKind::AcqInvoke {
            attempt: 1,
            budget_ms: Some(250),
        },
        EventKind::AcqOk {
            attempt: 1,
            holder: "h\"quoted\"".into(),
            token: u64::MAX,
            depth: 1,
            deadline: 5,
            nodes: vec![0, 2],
            permits: None,
        },
        EventKind::AcqFail {
            attempt: 2,
            reason: "busy".into(),
        },
        EventKind::AcqInfo {
            attempt: 3,
            reason: "timeout".into(),
        },
        EventKind::RenewOk {
            holder: "h".into(),
            deadline: 7,
        },
        EventKind::RenewFail {
            holder: "h".into(),
            reason: "io".into(),
        },
        EventKind::Lost {
            holder: "h".into(),
            reason: "expired".into(),
        },
        EventKind::RelInvoke {
            holder: "h".into(),
            depth_before: 2,
        },
        EventKind::RelOk {
            holder: "h".into(),
            depth_after: 1,
        },
        EventKind::RelFail {
            holder: "h".into(),
            reason: "not held".into(),
            not_held: true,
        },
        EventKind::RelInfo {
            holder: "h".into(),
            reason: "io".into(),
        },
        EventKind::ResOp {
            holder: "h".into(),
            token: 3,
            op: "f_write".into(),
            outcome: "rejected".into(),
            invoked: None,
        },
        EventKind::kill_worker(4),
        EventKind::Observe {
            node: 2,
            fields: [("h".to_owned(), 2u64)].into_iter().collect(),
            pttl_ms: -2,
            run_id: "abc".into(),
        },
    ];
    for k in &kinds {
        rec.record(7, "lock \u{1F512} name", k.clone())?;
    }
    let h = History::load(dir.path())?;
    let back: Vec<EventKind> = h.events().iter().map(|e| e.kind.clone()).collect();
    assert_eq!(back, kinds);
    assert!(
        h.events()
            .iter()
            .all(|e| e.proc == 1 && e.task == 7 && e.lock == "lock \u{1F512} name")
    );
    Ok(())
}

#[test]
fn load_skips_a_cut_short_last_line_and_rejects_garbage() -> TestResult {
    let dir = tempfile::tempdir()?;
    let rec = Recorder::create(dir.path(), 0)?;
    rec.record(
        0,
        "L",
        EventKind::AcqInvoke {
            attempt: 0,
            budget_ms: None,
        },
    )?;
    rec.record(
        0,
        "L",
        EventKind::AcqInvoke {
            attempt: 1,
            budget_ms: None,
        },
    )?;
    // A process killed in the middle of a write.
    std::fs::write(dir.path().join("proc-1.jsonl"), "{\"t\":1,\"proc\":1,\"ta")?;
    std::fs::write(dir.path().join("notes.txt"), "not a history file")?;
    let h = History::load(dir.path())?;
    assert_eq!((h.len(), h.truncated_lines(), h.files().len()), (2, 1, 2));
    // A bad line followed by more lines is an error naming file and line.
    std::fs::write(
        dir.path().join("proc-2.jsonl"),
        "{\"oops\":1}\n\n{\"t\":1}\n",
    )?;
    match History::load(dir.path()) {
        Err(HistoryError::Parse { path, line, .. }) => {
            assert!(path.ends_with("proc-2.jsonl"));
            assert_eq!(line, 1);
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn ties_break_by_file_then_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let line = |proc: u32, attempt: u64| {
        serde_json::to_string(&Event::new(
            100,
            proc,
            0,
            "L",
            EventKind::AcqInvoke {
                attempt,
                budget_ms: None,
            },
        ))
    };
    std::fs::write(
        dir.path().join("b.jsonl"),
        format!("{}\n{}\n", line(2, 0)?, line(2, 1)?),
    )?;
    std::fs::write(
        dir.path().join("a.jsonl"),
        format!("{}\n{}\n", line(1, 0)?, line(1, 1)?),
    )?;
    let h = History::load(dir.path())?;
    let order: Vec<(u32, u64)> = h
        .events()
        .iter()
        .map(|e| match e.kind {
            EventKind::AcqInvoke { attempt, .. } => (e.proc, attempt),
            _ => (u32::MAX, 0),
        })
        .collect();
    assert_eq!(order, vec![(1, 0), (1, 1), (2, 0), (2, 1)]);
    Ok(())
}

#[test]
fn loading_100k_events_is_quick() -> TestResult {
    let dir = tempfile::tempdir()?;
    for p in 0..4u32 {
        let rec = Recorder::create_buffered(dir.path(), p)?;
        for i in 0..25_000u64 {
            let kind = EventKind::AcqOk {
                attempt: i,
                holder: format!("p{p}"),
                token: i,
                depth: 1,
                deadline: now_ns() + 1_000_000_000,
                nodes: vec![],
                permits: None,
            };
            rec.record(i, "L", kind)?;
        }
        rec.flush()?;
    }
    let start = Instant::now();
    let h = History::load(dir.path())?;
    let took = start.elapsed();
    println!("loaded {} events in {took:?}", h.len());
    assert_eq!(h.len(), 100_000);
    assert!(took < Duration::from_secs(20), "{took:?}");
    Ok(())
}
