//! The per-event state machine: each acquisition, renewal, release, kill and resource
//! operation moves its holder's state and opens or closes validity windows.

use super::*;

impl<'h> Checker<'h> {
    pub(super) fn kill(&mut self, t: u64, proc: u32, idx: usize) {
        // Its pending acquisitions will never complete.
        let waiting = &mut self.waiting;
        self.pending.retain(|&(p, lock, _), _| {
            if p == proc {
                waiting[lock] -= 1;
            }
            p != proc
        });
        let Some(hs) = self.by_proc.get(&proc) else {
            return;
        };
        for h in hs.clone() {
            if self.hs[h].open.is_some() {
                // Win::end runs a killed holder's window to its deadline.
                self.close(h, t, idx, Cause::Kill);
            }
            let s = &mut self.hs[h];
            if s.depth > 0 || !s.certain {
                s.released_at = Some(t);
            }
            s.depth = 0;
            s.certain = false;
        }
    }

    pub(super) fn event(&mut self, i: usize, e: &'h Event) {
        let lock = self.lock_id(&e.lock);
        match &e.kind {
            EventKind::AcqInvoke { attempt, .. } => {
                if self.max_acked[lock] != [None, None] {
                    self.acked_at_invoke
                        .insert((e.proc, lock, *attempt), self.max_acked[lock]);
                }
                if self.pending.insert((e.proc, lock, *attempt), i).is_none() {
                    self.waiting[lock] += 1;
                    self.stats.max_waiters = self.stats.max_waiters.max(self.waiting[lock]);
                }
                if let Some(&h) = self.task_holder.get(&(e.proc, e.task, lock)) {
                    self.hs[h].last_acq_activity = e.t;
                }
            }
            EventKind::AcqOk {
                attempt,
                holder,
                token,
                depth,
                deadline,
                permits,
                ..
            } => {
                let grant = (*token, *depth, *deadline, *permits);
                self.acq_ok(i, e, lock, *attempt, holder, grant);
            }
            EventKind::AcqFail { attempt, .. } | EventKind::AcqInfo { attempt, .. } => {
                if self.pending.remove(&(e.proc, lock, *attempt)).is_some() {
                    self.waiting[lock] -= 1;
                }
                if matches!(e.kind, EventKind::AcqInfo { .. }) {
                    self.stats.ghosts += 1;
                    self.ghosts.insert((e.proc, e.task, lock));
                } else {
                    self.stats.acq_failures += 1;
                }
            }
            EventKind::RenewOk { holder, deadline } => {
                self.renew_ok(i, e, lock, holder, *deadline);
            }
            EventKind::RenewFail { holder, .. } => {
                let h = self.holder_id(lock, holder, i);
                self.hs[h].last_idx = i;
            }
            EventKind::Lost { holder, .. } => {
                self.stats.losses += 1;
                let h = self.holder_id(lock, holder, i);
                self.close(h, e.t, i, Cause::Lost);
                let s = &mut self.hs[h];
                s.certain = false;
                s.released_at = Some(e.t);
                s.last_idx = i;
            }
            EventKind::RelInvoke {
                holder,
                depth_before,
            } => {
                self.rel_invoke(i, e, lock, holder, *depth_before);
            }
            EventKind::RelOk {
                holder,
                depth_after,
            } => {
                self.rel_ok(i, e, lock, holder, *depth_after);
            }
            EventKind::RelFail {
                holder, not_held, ..
            } => {
                self.rel_fail(i, e, lock, holder, *not_held);
            }
            EventKind::RelInfo { holder, .. } => {
                // A release at depth 1 was closed by its rel_invoke. If the window is still
                // open (a deeper release, or no rel_invoke), close it where holding was last
                // confirmed unless the holder certainly keeps an outer level.
                let h = self.holder_id(lock, holder, i);
                let (depth, certain) = (self.hs[h].depth, self.hs[h].certain);
                if depth <= 1 || !certain {
                    self.close_late(h, i);
                }
                let s = &mut self.hs[h];
                s.certain = false;
                s.last_idx = i;
            }
            EventKind::ResOp { op, outcome, .. } => {
                self.res_ops.push(i);
                if op == OP_INCR && outcome == OUTCOME_OK {
                    self.acked_incr += 1;
                }
                if op == OP_FENCED_WRITE {
                    match FencedOutcome::parse(outcome) {
                        Some(FencedOutcome::Accepted { seq }) => {
                            self.stats.fenced_accepted += 1;
                            self.fenced_ops.push((lock, seq, i));
                        }
                        Some(FencedOutcome::Rejected { .. }) => self.stats.fenced_rejected += 1,
                        _ => {}
                    }
                }
            }
            EventKind::Nemesis { .. } => {}
            EventKind::Observe {
                node,
                fields,
                pttl_ms,
                ..
            } => {
                self.observe(i, e, lock, *node, fields, *pttl_ms);
            }
        }
    }

    /// `grant`: (token, depth, deadline, permits) of the `acq_ok`.
    pub(super) fn acq_ok(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        attempt: u64,
        holder: &'h str,
        grant: (u64, u32, u64, Option<u64>),
    ) {
        let (token, depth, deadline, permits) = grant;
        self.stats.acquisitions += 1;
        let acked_before = self.acked_at_invoke.remove(&(e.proc, lock, attempt));
        let invoke = self.pending.remove(&(e.proc, lock, attempt));
        if invoke.is_some() {
            self.waiting[lock] -= 1;
        }
        if let Some(inv) = invoke {
            self.latencies.push(e.t.saturating_sub(self.ev[inv].t));
        }
        // Validity accounting.
        if let Some(lease) = self.cfg.lease {
            let single = invoke.is_some_and(|inv| {
                self.cfg.strict_invoke_bound
                    || matches!(
                        self.ev[inv].kind,
                        EventKind::AcqInvoke {
                            budget_ms: Some(0),
                            ..
                        }
                    )
            });
            let (from, what, from_idx) = match invoke {
                Some(inv) if single => (self.ev[inv].t, "acq_invoke", inv),
                _ if !self.cfg.reply_delay.is_zero() => (
                    e.t.saturating_sub(dur_ns(self.cfg.reply_delay)),
                    "acq_ok.t − reply delay",
                    i,
                ),
                _ => (e.t, "acq_ok", i),
            };
            let bound = from
                .saturating_add(dur_ns(lease))
                .saturating_add(dur_ns(self.cfg.deadline_tolerance));
            if deadline > bound {
                let msg = format!(
                    "holder {holder:?}: acq_ok deadline {} is {} beyond {what}.t + lease ({} + {:?}, \
                     tolerance {:?})",
                    self.rel(deadline),
                    ms(deadline - bound),
                    self.rel(from),
                    lease,
                    self.cfg.deadline_tolerance
                );
                let mut events = vec![i];
                if from_idx != i {
                    events.insert(0, from_idx);
                }
                self.valid.add(|| Finding {
                    message: msg,
                    events,
                    anchor: i,
                });
            }
        }
        let min_v = dur_ns(self.cfg.min_validity);
        if deadline < e.t.saturating_add(min_v) {
            let left = deadline.saturating_sub(e.t);
            let msg = format!(
                "holder {holder:?}: acquired with {} of validity left (deadline {}), minimum {:?}",
                if deadline >= e.t {
                    ms(left)
                } else {
                    format!("-{}", ms(e.t - deadline))
                },
                self.rel(deadline),
                self.cfg.min_validity
            );
            self.valid.add(|| Finding {
                message: msg,
                events: vec![i],
                anchor: i,
            });
        }

        *self.stats.acquisitions_per_proc.entry(e.proc).or_default() += 1;
        if depth > 1 {
            self.reentries += 1;
        } else {
            let excludes = match (self.cfg.capacity, permits) {
                (Some(c), Some(p)) => p >= c,
                _ => true,
            };
            self.grants[lock].push((e.t, token, excludes));
        }
        let h = self.holder_id(lock, holder, i);
        let ghost = self.ghosts.remove(&(e.proc, e.task, lock));
        let (prev_depth, certain, prev_token, prev_idx, prev_deadline) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.token, s.last_idx, s.deadline)
        };
        // A re-entrant call that reaches the server after the entry expired creates a fresh
        // entry (depth 1, new token): legitimate once the holder's deadline has passed.
        let recreated = depth == 1 && prev_depth >= 1 && e.t >= prev_deadline;
        // I6: depth goes up by exactly one.
        if certain && depth != prev_depth.saturating_add(1) && !ghost && !recreated {
            let msg = format!(
                "holder {holder:?}: acq_ok reports depth {depth} but the holder had depth \
                 {prev_depth} (expected {})",
                prev_depth.saturating_add(1)
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.reent.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        }
        // I3: tokens.
        if let (true, Some(capacity)) = (depth <= 1, self.cfg.capacity) {
            // Shared mode: a writer above every token acknowledged before this call was
            // invoked, anyone else above every such writer's.
            self.stats.first_level_acquisitions += 1;
            let writer = permits.is_none_or(|p| p >= capacity);
            let bound = acked_before.and_then(|[all, writes]| if writer { all } else { writes });
            if let Some((prev, pidx)) = bound
                && token <= prev
            {
                let msg = format!(
                    "lock {:?}: holder {holder:?} ({}) acquired with token {token}, not greater \
                     than token {prev} of a {} acknowledged before this acquisition was invoked",
                    self.lock_names[lock],
                    if writer { "a writer" } else { "a reader" },
                    if writer { "hold" } else { "writer" }
                );
                self.tokens.add(|| Finding {
                    message: msg,
                    events: vec![pidx, i],
                    anchor: i,
                });
            }
            let max = &mut self.max_acked[lock];
            for (slot, counts) in max.iter_mut().zip([true, writer]) {
                if counts && slot.is_none_or(|(m, _)| token > m) {
                    *slot = Some((token, i));
                }
            }
        } else if depth <= 1 {
            self.stats.first_level_acquisitions += 1;
            if let Some((prev, pidx)) = self.last_first_level[lock]
                && token <= prev
            {
                if self.cfg.allow_token_reset {
                    self.stats.token_resets += 1;
                } else {
                    let msg = format!(
                        "lock {:?}: holder {holder:?} acquired with token {token}, not greater \
                         than token {prev} of the previous first-level acquisition",
                        self.lock_names[lock]
                    );
                    self.tokens.add(|| Finding {
                        message: msg,
                        events: vec![pidx, i],
                        anchor: i,
                    });
                }
            }
            self.last_first_level[lock] = Some((token, i));
        } else if (prev_depth >= 1 || !certain)
            && let Some(prev) = prev_token
            && prev != token
        {
            let msg = format!(
                "holder {holder:?}: re-entrant acquisition (depth {depth}) returned token {token}, \
                 the holder's token is {prev}"
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.tokens.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        }

        let s = &mut self.hs[h];
        let fresh = depth <= 1;
        s.depth = depth;
        s.certain = true;
        s.token = Some(token);
        // A re-entry reports the hold's deadline as its guard read it, possibly before a
        // renewal already logged: the window keeps the latest.
        s.deadline = if fresh {
            deadline
        } else {
            s.deadline.max(deadline)
        };
        s.acquired = true;
        s.last_idx = i;
        s.last_confirm_t = e.t;
        s.released_at = None;
        s.last_acq_activity = e.t;
        if depth <= 1 {
            // A fresh entry: the previous one is gone, its window ends by its own deadline.
            s.open = None;
        }
        match s.open {
            Some(w) => {
                let w = &mut self.wins[w];
                if deadline > w.deadline {
                    w.deadline = deadline;
                    w.deadline_idx = i;
                }
            }
            None => {
                let w = self.wins.len();
                s.open = Some(w);
                s.windows.push(w);
                self.wins.push(Win {
                    lock,
                    holder: h,
                    start: e.t,
                    start_idx: i,
                    deadline,
                    deadline_idx: i,
                    close: None,
                    permits: permits.unwrap_or(1),
                });
            }
        }
    }

    pub(super) fn renew_ok(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        holder: &'h str,
        deadline: u64,
    ) {
        self.ownership_events += 1;
        if let Some(lease) = self.cfg.lease {
            let delay = dur_ns(self.cfg.reply_delay);
            let bound =
                e.t.saturating_sub(delay)
                    .saturating_add(dur_ns(lease))
                    .saturating_add(dur_ns(self.cfg.deadline_tolerance));
            if deadline > bound {
                let msg = format!(
                    "holder {holder:?}: renew_ok deadline {} is {} beyond renew_ok.t{} + lease",
                    self.rel(deadline),
                    ms(deadline - bound),
                    if delay > 0 {
                        format!(" − reply delay {:?}", self.cfg.reply_delay)
                    } else {
                        String::new()
                    }
                );
                self.valid.add(|| Finding {
                    message: msg,
                    events: vec![i],
                    anchor: i,
                });
            }
        }
        let h = self.holder_id(lock, holder, i);
        let s = &self.hs[h];
        if s.certain && s.depth == 0 {
            let msg = format!(
                "holder {holder:?}: renew_ok while not holding (renewal outlived release or \
                 acquisition; a reply reordered against the release is possible, so this is a \
                 warning)"
            );
            let events = if s.last_idx == i {
                vec![i]
            } else {
                vec![s.last_idx, i]
            };
            self.own_warn.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
            self.hs[h].last_idx = i;
            return;
        }
        let s = &mut self.hs[h];
        s.deadline = moved_deadline(s.deadline, deadline, e.t);
        s.last_idx = i;
        s.last_confirm_t = e.t;
        if let Some(w) = s.open {
            let w = &mut self.wins[w];
            let moved = moved_deadline(w.deadline, deadline, e.t);
            if moved != w.deadline {
                w.deadline = moved;
                w.deadline_idx = i;
            }
        }
    }

    pub(super) fn rel_invoke(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        holder: &'h str,
        before: u32,
    ) {
        let h = self.holder_id(lock, holder, i);
        let (depth, certain, prev_idx) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx)
        };
        if certain && depth > 0 && before != depth {
            let msg = format!(
                "holder {holder:?}: rel_invoke says depth_before {before}, the history gives \
                 depth {depth}"
            );
            self.reent.add(|| Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            });
        }
        if before <= 1 || (certain && depth <= 1) {
            self.close(h, e.t, i, Cause::Release);
        }
        self.hs[h].last_idx = i;
        self.hs[h].last_rel_invoke = Some((e.t, i));
    }

    pub(super) fn rel_ok(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        holder: &'h str,
        after: u32,
    ) {
        self.stats.releases += 1;
        self.ownership_events += 1;
        if after > 0 {
            self.reentries += 1;
        }
        let h = self.holder_id(lock, holder, i);
        let (depth, certain, prev_idx) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx)
        };
        if certain && depth == 0 {
            let msg = format!(
                "holder {holder:?} does not hold lock {:?}, yet its release succeeded \
                 (depth_after {after})",
                self.lock_names[lock]
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.own.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        } else if certain && after != depth - 1 {
            let msg = format!(
                "holder {holder:?}: one release took depth from {depth} to {after} (expected {})",
                depth - 1
            );
            self.reent.add(|| Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            });
        }
        if after == 0 && self.hs[h].open.is_some() {
            // No rel_invoke at depth 1 closed the window (rel_ok.t is after the server-side
            // delete, so it cannot be the end).
            self.close_late(h, i);
        }
        let s = &mut self.hs[h];
        if after == 0 && (s.depth > 0 || !s.certain) {
            s.released_at = Some(e.t);
        }
        s.depth = after;
        s.certain = true;
        s.last_idx = i;
    }

    pub(super) fn rel_fail(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        holder: &'h str,
        not_held: bool,
    ) {
        let h = self.holder_id(lock, holder, i);
        if !not_held {
            self.hs[h].last_idx = i;
            return;
        }
        self.ownership_events += 1;
        let (depth, certain, prev_idx, deadline) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx, s.deadline)
        };
        if certain && depth > 0 && e.t < deadline {
            let msg = format!(
                "holder {holder:?} (depth {depth}, lease valid until {}) was answered \"not held\" \
                 at {}: its entry vanished inside its lease",
                self.rel(deadline),
                self.rel(e.t)
            );
            let f = || Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            };
            if self.cfg.allow_token_reset {
                self.own_warn.add(f);
            } else {
                self.own.add(f);
            }
        }
        self.close_late(h, i);
        let s = &mut self.hs[h];
        if s.depth > 0 || !s.certain {
            s.released_at = Some(e.t);
        }
        s.depth = 0;
        s.certain = true;
        s.last_idx = i;
    }

    pub(super) fn observe(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        node: usize,
        fields: &'h std::collections::BTreeMap<String, u64>,
        pttl_ms: i64,
    ) {
        self.observes += 1;
        let present = !fields.is_empty() || pttl_ms >= -1;
        if present && self.cfg.quiescent_after.is_some_and(|q| e.t >= q) {
            let msg = format!(
                "lock {:?} node {node}: key still present at {} (fields {fields:?}, pttl {pttl_ms} \
                 ms) after quiescence began",
                self.lock_names[lock],
                self.rel(e.t)
            );
            self.quiet.add(|| Finding {
                message: msg,
                events: vec![i],
                anchor: i,
            });
        }
        // Zombie renewal: the TTL of a field whose holder has stopped holding jumps up.
        if let Some(prev) = self.last_observe.insert((lock, node), i)
            && let EventKind::Observe {
                fields: pf,
                pttl_ms: pp,
                ..
            } = &self.ev[prev].kind
            && *pp >= 0
            && pttl_ms >= 0
        {
            let tol = i64::try_from(self.cfg.ttl_bump_tolerance.as_millis()).unwrap_or(i64::MAX);
            if pttl_ms > pp.saturating_add(tol) {
                let t1 = self.ev[prev].t;
                for field in fields.keys() {
                    if !pf.contains_key(field) {
                        continue;
                    }
                    let Some(&h) = self.holder_ids.get(&(lock, field.as_str())) else {
                        continue;
                    };
                    let s = &self.hs[h];
                    if let Some(r) = s.released_at
                        && r.saturating_add(dur_ns(self.cfg.zombie_grace)) <= t1
                        && r < t1
                        && s.last_acq_activity < r
                    {
                        let msg = format!(
                            "lock {:?} node {node}: TTL of holder {field:?} rose from {pp} ms to \
                             {pttl_ms} ms after the holder stopped holding at {} (zombie renewal)",
                            self.lock_names[lock],
                            self.rel(r)
                        );
                        let events = vec![s.last_idx, prev, i];
                        self.quiet.add(|| Finding {
                            message: msg,
                            events,
                            anchor: i,
                        });
                    }
                }
            }
        }
    }
}
