//! The checks over the whole history: overlapping windows (exclusion, shared capacity),
//! activity outside a window, and fenced writes in token order.

use super::*;

impl<'h> Checker<'h> {
    /// I1: per lock, sort windows by start; a window starting before the latest end among
    /// earlier windows of *other* holders is a violation.
    /// Counts the windows and how they closed; answers, per lock, the windows that are not
    /// empty.
    pub(super) fn windows_per_lock(&mut self) -> Vec<Vec<usize>> {
        let mut per_lock: Vec<Vec<usize>> = vec![Vec::new(); self.lock_names.len()];
        for (w, win) in self.wins.iter().enumerate() {
            let (end, _, cause) = win.end();
            self.stats.windows_closed[match cause {
                Cause::Release => 0,
                Cause::Lost => 1,
                Cause::Deadline => 2,
                Cause::Kill => 3,
            }] += 1;
            if end > win.start {
                per_lock[win.lock].push(w);
            }
        }
        self.stats.windows = self.wins.len();
        self.stats.locks = per_lock.iter().filter(|v| !v.is_empty()).count();
        per_lock
    }

    pub(super) fn sweep(&mut self) {
        if let Some(capacity) = self.cfg.capacity {
            self.shared_sweep(capacity);
            return;
        }
        let mut per_lock = self.windows_per_lock();
        for ws in &mut per_lock {
            ws.sort_by_key(|&w| (self.wins[w].start, self.wins[w].start_idx));
            // best: latest-ending window; second: latest-ending of a holder other than best's.
            let mut best: Option<(u64, usize)> = None;
            let mut second: Option<(u64, usize)> = None;
            for &w in ws.iter() {
                let win = &self.wins[w];
                let other = match best {
                    Some((_, b)) if self.wins[b].holder != win.holder => best,
                    _ => second,
                };
                if let Some((end, o)) = other
                    && win.start < end
                {
                    let f = self.overlap_finding(o, w);
                    self.excl.add(|| f);
                }
                let (end, _, _) = win.end();
                match best {
                    None => best = Some((end, w)),
                    Some((bend, b)) => {
                        if self.wins[b].holder == win.holder {
                            if end > bend {
                                best = Some((end, w));
                            }
                        } else if end > bend {
                            second = best;
                            best = Some((end, w));
                        } else if second.is_none_or(|(send, _)| end > send) {
                            second = Some((end, w));
                        }
                    }
                }
            }
        }
    }

    /// I1 in shared mode: at every window start, the permits of the windows open (of every
    /// holder) must fit in `capacity`. The finding names the new window and the open window
    /// of another holder that takes the most permits.
    pub(super) fn shared_sweep(&mut self, capacity: u64) {
        for ws in self.windows_per_lock() {
            // Ends sort before starts at the same instant: touching windows do not overlap.
            let mut points: Vec<(u64, bool, usize)> = ws
                .iter()
                .flat_map(|&w| {
                    [
                        (self.wins[w].start, true, w),
                        (self.wins[w].end().0, false, w),
                    ]
                })
                .collect();
            points.sort_by_key(|&(t, start, w)| (t, start, self.wins[w].start_idx));
            let mut open: Vec<usize> = Vec::new();
            let mut used = 0u64;
            for &(_, start, w) in points.iter() {
                let permits = self.wins[w].permits;
                if !start {
                    open.retain(|&o| o != w);
                    used = used.saturating_sub(permits);
                    continue;
                }
                used = used.saturating_add(permits);
                if used > capacity {
                    let holder = self.wins[w].holder;
                    let other = open
                        .iter()
                        .copied()
                        .filter(|&o| self.wins[o].holder != holder)
                        .max_by_key(|&o| self.wins[o].permits);
                    if let Some(o) = other {
                        let mut f = self.overlap_finding(o, w);
                        f.message = format!("{} ({used} permits in use of {capacity})", f.message);
                        self.excl.add(|| f);
                    }
                }
                open.push(w);
            }
        }
    }

    pub(super) fn overlap_finding(&self, a: usize, b: usize) -> Finding {
        let (wa, wb) = (&self.wins[a], &self.wins[b]);
        let (ea, ea_idx, ca) = wa.end();
        let (eb, eb_idx, cb) = wb.end();
        let (ha, hb) = (&self.hs[wa.holder], &self.hs[wb.holder]);
        let message = format!(
            "lock {:?}: holder {:?} (proc {}) window [{}, {}] (ended by {}) overlaps holder {:?} \
             (proc {}) window [{}, {}] (ended by {}) by {}",
            self.lock_names[wa.lock],
            ha.name,
            ha.proc,
            self.rel(wa.start),
            self.rel(ea),
            ca.as_str(),
            hb.name,
            hb.proc,
            self.rel(wb.start),
            self.rel(eb),
            cb.as_str(),
            ms(ea.min(eb) - wb.start)
        );
        let mut events = vec![
            wa.start_idx,
            wa.deadline_idx,
            ea_idx,
            wb.start_idx,
            wb.deadline_idx,
            eb_idx,
        ];
        if let Some((_, i, _)) = wa.close {
            events.push(i);
        }
        if let Some((_, i, _)) = wb.close {
            events.push(i);
        }
        events.retain(|&i| i != NO_EVENT);
        events.sort_unstable();
        events.dedup();
        Finding {
            message,
            events,
            anchor: wb.start_idx,
        }
    }

    /// Resource operations must fall inside their holder's window.
    pub(super) fn activity_check(&mut self) {
        let ops = std::mem::take(&mut self.res_ops);
        for &i in &ops {
            let e = &self.ev[i];
            let EventKind::ResOp {
                holder, op, token, ..
            } = &e.kind
            else {
                continue;
            };
            let Some(&lock) = self.locks.get(e.lock.as_str()) else {
                continue;
            };
            let h = self.holder_ids.get(&(lock, holder.as_str())).copied();
            let wins: &[usize] = h.map_or(&[], |h| &self.hs[h].windows);
            let k = wins.partition_point(|&w| self.wins[w].start <= e.t);
            let inside = k > 0 && {
                let (end, _, _) = self.wins[wins[k - 1]].end();
                e.t <= end
            };
            if inside {
                continue;
            }
            self.stats.activity_past_validity += 1;
            if let (Some(c), true) = (&self.cfg.counter, op == OP_INCR)
                && let CounterExpectation::AckedIncrementsLosingToLate { procs } = &c.expected
                && procs.contains(&e.proc)
                && matches!(&e.kind, EventKind::ResOp { outcome, .. } if outcome == OUTCOME_OK)
            {
                self.late_incr += 1;
            }
            let expected = self
                .cfg
                .expected_late
                .as_ref()
                .is_some_and(|x| x.procs.contains(&e.proc));
            let (message, events) = if k > 0 {
                let w = &self.wins[wins[k - 1]];
                let (end, end_idx, cause) = w.end();
                let mut ev = vec![w.start_idx, end_idx, i];
                ev.retain(|&x| x != NO_EVENT);
                ev.dedup();
                (
                    format!(
                        "holder {holder:?}: {op} (token {token}) at {} is {} past its window \
                         [{}, {}] (ended by {})",
                        self.rel(e.t),
                        ms(e.t - end),
                        self.rel(w.start),
                        self.rel(end),
                        cause.as_str()
                    ),
                    ev,
                )
            } else {
                (
                    format!(
                        "holder {holder:?}: {op} (token {token}) at {} without any validity window",
                        self.rel(e.t)
                    ),
                    vec![i],
                )
            };
            let tally = if expected {
                &mut self.activity_expected
            } else {
                &mut self.activity
            };
            tally.add(|| Finding {
                message,
                events,
                anchor: i,
            });
        }
        self.res_ops = ops;
        // More late operations than the scenario said it expects: all of them fail.
        if let Some(x) = &self.cfg.expected_late
            && self.activity_expected.count > x.max_ops
        {
            let extra = std::mem::take(&mut self.activity_expected);
            if let Some(mut f) = extra.first {
                f.message = format!(
                    "{} operations past validity of processes {:?}, at most {} expected ({}); \
                     first: {}",
                    extra.count, x.procs, x.max_ops, x.reason, f.message
                );
                self.activity.count += extra.count;
                if self.activity.first.is_none() {
                    self.activity.first = Some(f);
                }
            }
        }
    }

    /// I2: a fenced write that the resource accepted although a newer grant had been
    /// acknowledged before the write was sent (a stale token got through: the resource's check
    /// or the lock's token order is broken, or an old holder acted after the lock moved on and
    /// before the new holder's first write); two holders' accepted writes with one token
    /// (exclusive locks: tokens are per hold); and, per lock, accepted tokens going down in
    /// the resource's accept order.
    pub(super) fn fenced_check(&mut self) {
        let mut ops = std::mem::take(&mut self.fenced_ops);
        ops.sort_by_key(|&(lock, seq, i)| (lock, seq, i));
        // Per lock, the highest excluding grant token acknowledged up to each grant.
        let prefix: Vec<Vec<(u64, u64)>> = self
            .grants
            .iter()
            .map(|g| {
                let mut best = 0u64;
                g.iter()
                    .filter(|&&(_, _, excludes)| excludes)
                    .map(|&(t, token, _)| {
                        best = best.max(token);
                        (t, best)
                    })
                    .collect()
            })
            .collect();
        let mut token_holder: HashMap<(usize, u64), usize> = HashMap::new();
        // (lock, highest token so far, its event)
        let mut max: Option<(usize, u64, usize)> = None;
        for &(lock, seq, i) in &ops {
            let EventKind::ResOp {
                holder,
                token,
                invoked,
                ..
            } = &self.ev[i].kind
            else {
                continue;
            };
            if let Some(sent) = *invoked {
                let g = &prefix[lock];
                let k = g.partition_point(|&(t, _)| t < sent);
                if k > 0 && g[k - 1].1 > *token {
                    let newer = g[k - 1].1;
                    let message = format!(
                        "lock {:?}: the fenced resource accepted token {token} of holder \
                         {holder:?} (accept #{seq}, sent at {}), though token {newer} had been \
                         granted and acknowledged before it was sent",
                        self.lock_names[lock],
                        self.rel(sent),
                    );
                    self.fenced.add(|| Finding {
                        message,
                        events: vec![i],
                        anchor: i,
                    });
                }
            }
            if self.cfg.capacity.is_none() {
                match token_holder.entry((lock, *token)) {
                    Entry::Vacant(v) => {
                        v.insert(i);
                    }
                    Entry::Occupied(o) => {
                        let j = *o.get();
                        if self.ev[j].kind.holder() != Some(holder.as_str()) {
                            let message = format!(
                                "lock {:?}: the fenced resource accepted token {token} from two \
                                 holders, {:?} and {holder:?}",
                                self.lock_names[lock],
                                self.ev[j].kind.holder().unwrap_or("?"),
                            );
                            self.fenced.add(|| Finding {
                                message,
                                events: vec![j.min(i), j.max(i)],
                                anchor: i,
                            });
                        }
                    }
                }
            }
            match max {
                Some((l, m, mi)) if l == lock && *token < m => {
                    let (ph, pseq) = match &self.ev[mi].kind {
                        EventKind::ResOp {
                            holder, outcome, ..
                        } => (
                            holder.as_str(),
                            match FencedOutcome::parse(outcome) {
                                Some(FencedOutcome::Accepted { seq }) => seq,
                                _ => 0,
                            },
                        ),
                        _ => ("?", 0),
                    };
                    let message = format!(
                        "lock {:?}: the fenced resource accepted token {token} of holder \
                         {holder:?} (accept #{seq}, at {}) after token {m} of holder {ph:?} \
                         (accept #{pseq}, at {})",
                        self.lock_names[lock],
                        self.rel(self.ev[i].t),
                        self.rel(self.ev[mi].t)
                    );
                    self.fenced.add(|| Finding {
                        message,
                        events: vec![mi.min(i), mi.max(i)],
                        anchor: i,
                    });
                }
                Some((l, m, _)) if l == lock && *token == m => {}
                _ => max = Some((lock, *token, i)),
            }
        }
        self.fenced_ops = ops;
    }
}
