//! The lease of a combination hold, aggregated from its nodes' leases.
//!
//! Each held node is renewed by its own client's renewal service and has its own lease. The
//! combination holds while at least *required* of them do, so its deadline is the
//! *required*-th latest node deadline among the nodes not lost, and it is lost as soon as fewer
//! than *required* node leases remain.

use std::time::Instant;

use futures::FutureExt;
use futures::future::select_all;
use slate_core::LossReason;
use slate_core::lease::{LeaseKeeper, LeaseWatch};

/// The combined deadline of `deadlines` for a quorum of `required`: the `required`-th latest.
/// `None` when fewer than `required` are given.
///
/// # Examples
///
/// ```
/// use slate_combination::lease::combined_deadline;
/// use std::time::{Duration, Instant};
///
/// let t = Instant::now();
/// let s = Duration::from_secs;
/// assert_eq!(combined_deadline(&[t + s(3), t + s(1), t + s(2)], 2), Some(t + s(2)));
/// assert_eq!(combined_deadline(&[t], 2), None);
/// ```
#[must_use]
pub fn combined_deadline(deadlines: &[Instant], required: usize) -> Option<Instant> {
    if required == 0 || deadlines.len() < required {
        return None;
    }
    let mut d = deadlines.to_vec();
    d.sort_unstable_by(|a, b| b.cmp(a));
    Some(d[required - 1])
}

/// Keeps `keeper` (the combination's lease) in step with the node leases (each with its node's
/// index) until it is lost or the task is aborted (at release). `entry_gone` is told once of
/// each node whose renewal found the entry gone: the node may have lost its data.
pub(crate) async fn aggregate(
    watches: Vec<(usize, LeaseWatch)>,
    required: usize,
    keeper: LeaseKeeper,
    mut entry_gone: impl FnMut(usize),
) {
    let (nodes, watches): (Vec<usize>, Vec<LeaseWatch>) = watches.into_iter().unzip();
    let mut watches: Vec<(LeaseWatch, bool)> = watches.into_iter().map(|w| (w, true)).collect();
    let mut told = vec![false; watches.len()];
    loop {
        for (i, (w, _)) in watches.iter().enumerate() {
            if !told[i] && w.loss_reason() == Some(LossReason::EntryGone) {
                told[i] = true;
                entry_gone(nodes[i]);
            }
        }
        let alive: Vec<&LeaseWatch> = watches
            .iter()
            .map(|(w, _)| w)
            .filter(|w| !w.is_lost())
            .collect();
        let deadlines: Vec<Instant> = alive.iter().map(|w| w.deadline()).collect();
        let Some(deadline) = combined_deadline(&deadlines, required) else {
            let capped = watches
                .iter()
                .any(|(w, _)| w.loss_reason() == Some(LossReason::MaxHoldReached));
            keeper.lose(if capped {
                LossReason::MaxHoldReached
            } else {
                LossReason::QuorumLost {
                    renewed: alive.len(),
                    required,
                }
            });
            return;
        };
        keeper.set_deadline(deadline);
        // Wake when a node lease changes, or when the earliest live node deadline passes (that
        // node then counts as lost).
        let next_expiry = deadlines.iter().min().copied().unwrap_or(deadline);
        let listening: Vec<usize> = (0..watches.len()).filter(|&i| watches[i].1).collect();
        let changed = {
            let mut futs: Vec<_> = watches
                .iter_mut()
                .filter(|(_, listen)| *listen)
                .map(|(w, _)| async move { w.changed().await }.boxed())
                .collect();
            let sleep = tokio::time::sleep_until(next_expiry.into());
            if futs.is_empty() {
                sleep.await;
                None
            } else {
                futs.push(sleep.boxed());
                let (_, i, _) = select_all(futs).await;
                listening.get(i).copied()
            }
        };
        if let Some(i) = changed {
            // A closed watch (the node's keeper is gone: its renewal ended) completes at
            // once for ever; from then on only its deadline matters, so stop listening to it.
            // (Comparing with the snapshot instead stopped listening to a live node whose
            // change landed between its last wake-up and the snapshot: the combined deadline
            // then passed unobserved while the quorum was renewed. Issue 35, found with
            // defect 18's final loss.)
            let (w, listen) = &mut watches[i];
            if w.is_closed() {
                *listen = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_core::lease;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[tokio::test]
    async fn quorum_deadline_follows_renewals_and_losses() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let nodes: Vec<_> = (1..=3).map(|i| lease::channel(now + s(10 + i))).collect();
        let (keeper, watch) = lease::channel(now + s(1));
        let watches = nodes.iter().map(|(_, w)| w.clone()).enumerate().collect();
        let gone = Arc::new(Mutex::new(Vec::new()));
        let told = gone.clone();
        let task = tokio::spawn(aggregate(watches, 2, keeper, move |i| {
            told.lock().unwrap().push(i)
        }));
        let wait_for = |want: Instant| {
            let mut w = watch.clone();
            async move {
                tokio::time::timeout(s(5), async {
                    while w.deadline() != want {
                        w.changed().await;
                    }
                })
                .await
                .expect("deadline reached")
            }
        };
        wait_for(now + s(12)).await;
        nodes[0].0.extend(now + s(20));
        wait_for(now + s(13)).await;
        nodes[2].0.lose(LossReason::EntryGone);
        wait_for(now + s(12)).await;
        assert!(!watch.is_lost());
        nodes[1].0.lose(LossReason::EntryGone);
        let reason = tokio::time::timeout(s(5), watch.lost())
            .await
            .expect("lost");
        assert_eq!(
            reason,
            LossReason::QuorumLost {
                renewed: 1,
                required: 2
            }
        );
        task.await.expect("aggregator ends after loss");
        // Each node whose entry was found gone is reported once, by its index.
        assert_eq!(*gone.lock().unwrap(), vec![2, 1]);
    }
}
