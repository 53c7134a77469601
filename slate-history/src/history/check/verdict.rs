//! The report: findings become failures, warnings or notes, each with its counterexample.

use super::*;

impl<'h> Checker<'h> {
    pub(super) fn finish(mut self) -> Report {
        // Counter.
        let counter_note;
        let counter_status = match &self.cfg.counter {
            None => {
                counter_note = String::new();
                Some(Status::Unchecked("no counter configured".into()))
            }
            Some(c) => {
                let (expected, source) = match c.expected {
                    CounterExpectation::Exact(v) => (v, "given"),
                    CounterExpectation::AckedIncrements
                    | CounterExpectation::AckedIncrementsLosingToLate { .. } => {
                        (self.acked_incr, "acked increments")
                    }
                    CounterExpectation::FirstLevelAcquisitions => (
                        u64::try_from(self.stats.first_level_acquisitions).unwrap_or(u64::MAX),
                        "first-level acquisitions",
                    ),
                };
                counter_note = format!("final {} vs {expected} {source}", c.final_value);
                let excused = matches!(
                    c.expected,
                    CounterExpectation::AckedIncrementsLosingToLate { .. }
                ) && c.final_value < expected
                    && expected - c.final_value <= self.late_incr;
                if excused {
                    let message = format!(
                        "counter is {} but {expected} was expected ({source}): {} lost update(s), \
                         within the {} increment(s) the late processes made past validity",
                        c.final_value,
                        expected - c.final_value,
                        self.late_incr
                    );
                    self.counter_warn = true;
                    self.counter.add(|| Finding {
                        message,
                        events: Vec::new(),
                        anchor: NO_EVENT,
                    });
                } else if c.final_value != expected {
                    let late = if matches!(
                        c.expected,
                        CounterExpectation::AckedIncrementsLosingToLate { .. }
                    ) {
                        format!(
                            "; the late processes made only {} increment(s) past validity",
                            self.late_incr
                        )
                    } else {
                        String::new()
                    };
                    let message = format!(
                        "counter is {} but {expected} was expected ({source}): {} lost \
                         update(s){late}",
                        c.final_value,
                        i128::from(expected) - i128::from(c.final_value)
                    );
                    self.counter.add(|| Finding {
                        message,
                        events: Vec::new(),
                        anchor: NO_EVENT,
                    });
                }
                None
            }
        };
        // Quiescence: final scan.
        if let Some(keys) = &self.cfg.final_keys
            && !keys.is_empty()
        {
            let message = format!("lock keys left after the scenario: {keys:?}");
            let last = self.ev.len().checked_sub(1).unwrap_or(NO_EVENT);
            self.quiet.add(|| Finding {
                message,
                events: Vec::new(),
                anchor: last,
            });
        }
        // Latency.
        let mut lat = std::mem::take(&mut self.latencies);
        lat.sort_unstable();
        if let Some(&max) = lat.last() {
            let rank = |p: usize| lat[(lat.len() * p).div_ceil(100).saturating_sub(1)];
            self.stats.acquire_latency = Latency {
                count: lat.len(),
                p50: Duration::from_nanos(rank(50)),
                p99: Duration::from_nanos(rank(99)),
                max: Duration::from_nanos(max),
            };
        }
        self.stats.holders = self.hs.iter().filter(|h| h.acquired).count();

        let acquisitions = self.stats.acquisitions;
        let mut checks = Vec::new();
        let none = |what: &str| Some(Status::Unchecked(what.to_owned()));
        let excl = std::mem::take(&mut self.excl);
        // A check compares holders: with fewer than two on every lock it has nothing to judge.
        let mut holders_per_lock: HashMap<usize, HashSet<usize>> = HashMap::new();
        for w in &self.wins {
            holders_per_lock.entry(w.lock).or_default().insert(w.holder);
        }
        let pairs = holders_per_lock.values().any(|h| h.len() >= 2);
        let two_grants = self.grants.iter().any(|g| g.len() >= 2);
        checks.push(self.result(
            CheckId::Exclusion,
            excl,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else if !pairs {
                none("fewer than two holders on every lock: no pair of windows to compare")
            } else {
                None
            },
            format!(
                "{} windows on {} locks",
                self.stats.windows, self.stats.locks
            ),
        ));
        let fenced = std::mem::take(&mut self.fenced);
        let fenced_note = format!(
            "{} accepted, {} rejected fenced writes",
            self.stats.fenced_accepted, self.stats.fenced_rejected
        );
        checks.push(self.result(
            CheckId::FencedOrder,
            fenced,
            false,
            if self.fenced_ops.is_empty() {
                none("no accepted fenced writes")
            } else {
                None
            },
            fenced_note,
        ));
        let tokens = std::mem::take(&mut self.tokens);
        checks.push(self.result(
            CheckId::Tokens,
            tokens,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else if !two_grants {
                none("fewer than two first-level acquisitions on every lock")
            } else {
                None
            },
            format!(
                "{} first-level acquisitions",
                self.stats.first_level_acquisitions
            ),
        ));
        let own = std::mem::take(&mut self.own);
        let mut own_res = self.result(
            CheckId::Ownership,
            own,
            false,
            if self.ownership_events == 0 {
                none("no release or renewal answers")
            } else {
                None
            },
            format!("{} releases", self.stats.releases),
        );
        if own_res.status == Status::Pass && self.own_warn.count > 0 {
            let warn = std::mem::take(&mut self.own_warn);
            own_res = self.result(CheckId::Ownership, warn, true, None, own_res.note);
        }
        checks.push(own_res);
        let reent = std::mem::take(&mut self.reent);
        let reent_note = format!(
            "{acquisitions} acquisitions, {} releases",
            self.stats.releases
        );
        let no_reentry = self.reentries == 0 && reent.count == 0;
        checks.push(self.result(
            CheckId::Reentry,
            reent,
            false,
            if no_reentry {
                none("no re-entrant acquisition or release")
            } else {
                None
            },
            reent_note,
        ));
        let valid = std::mem::take(&mut self.valid);
        let valid_note = if self.cfg.lease.is_some() {
            format!("min validity {:?}", self.cfg.min_validity)
        } else {
            "no lease given: upper bounds not checked".to_owned()
        };
        checks.push(self.result(
            CheckId::Validity,
            valid,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else {
                None
            },
            valid_note,
        ));
        let activity = std::mem::take(&mut self.activity);
        let expected_late = std::mem::take(&mut self.activity_expected);
        let n_ops = self.res_ops.len();
        let activity_note = match &self.cfg.expected_late {
            Some(x) => format!(
                "{n_ops} resource operations; {} past validity of processes {:?} expected (at \
                 most {}: {})",
                expected_late.count, x.procs, x.max_ops, x.reason
            ),
            None => format!("{n_ops} resource operations"),
        };
        let unchecked_ops = if n_ops == 0 {
            none("no res_op events")
        } else {
            None
        };
        let activity_res = if activity.count == 0 && expected_late.count > 0 {
            self.result(
                CheckId::Activity,
                expected_late,
                true,
                unchecked_ops,
                activity_note,
            )
        } else {
            self.result(
                CheckId::Activity,
                activity,
                false,
                unchecked_ops,
                activity_note,
            )
        };
        checks.push(activity_res);
        let counter = std::mem::take(&mut self.counter);
        checks.push(self.result(
            CheckId::Counter,
            counter,
            self.counter_warn,
            counter_status,
            counter_note,
        ));
        let quiet = std::mem::take(&mut self.quiet);
        let quiet_unchecked = self.cfg.quiescent_after.is_none()
            && self.cfg.final_keys.is_none()
            && self.observes == 0;
        let quiet_note = format!(
            "{} snapshots{}{}",
            self.observes,
            if self.cfg.quiescent_after.is_some() {
                ", quiescence window"
            } else {
                ""
            },
            if self.cfg.final_keys.is_some() {
                ", final key scan"
            } else {
                ""
            }
        );
        checks.push(self.result(
            CheckId::Quiescence,
            quiet,
            false,
            if quiet_unchecked {
                none("no observer snapshots or final key scan")
            } else {
                None
            },
            quiet_note,
        ));
        Report {
            checks,
            stats: self.stats,
            origin: self.origin,
        }
    }

    pub(super) fn result(
        &self,
        id: CheckId,
        tally: Tally,
        warn_only: bool,
        unchecked: Option<Status>,
        note: String,
    ) -> CheckResult {
        let status = match (tally.first, unchecked) {
            (Some(f), _) => {
                let cx = Box::new(self.counterexample(f));
                if warn_only {
                    Status::Warn(cx)
                } else {
                    Status::Fail(cx)
                }
            }
            (None, Some(u)) => u,
            (None, None) => Status::Pass,
        };
        CheckResult {
            id,
            status,
            violations: tally.count,
            note,
        }
    }

    pub(super) fn counterexample(&self, f: Finding) -> Counterexample {
        let pick = |i: usize| (i, self.ev[i].clone());
        let events = f
            .events
            .iter()
            .copied()
            .filter(|&i| i < self.ev.len())
            .map(pick)
            .collect();
        let context = if f.anchor < self.ev.len() {
            let n = self.cfg.context_events;
            let lo = f.anchor.saturating_sub(n / 2);
            let hi = (lo + n + 1).min(self.ev.len());
            let lo = hi.saturating_sub(n + 1).min(lo);
            (lo..hi).map(pick).collect()
        } else {
            Vec::new()
        };
        Counterexample {
            message: f.message,
            events,
            context,
        }
    }
}
