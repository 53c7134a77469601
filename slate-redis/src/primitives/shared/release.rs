//! How a shared-lock guard ends: the release of one read, write or permit level.

use super::*;

/// How a shared-lock guard ends: the lock's state and the guard's mode.
pub(crate) struct SharedRelease {
    pub(crate) state: Arc<SharedState>,
    write: bool,
}

impl SharedRelease {
    /// The hold `grant` gave `holder`, ended by a release in the grant's mode.
    pub(crate) fn held(
        state: &Arc<SharedState>,
        holder: HolderId,
        grant: &SharedGrant,
    ) -> Held<SharedRelease> {
        let watch = state.competitor().watch(grant);
        Held::new(
            Hold::new(holder, grant.token, grant.count, watch),
            SharedRelease {
                state: Arc::clone(state),
                write: grant.write,
            },
        )
    }
}

impl Release for SharedRelease {
    fn release(
        &mut self,
        hold: &Hold,
    ) -> impl std::future::Future<Output = Result<u32>> + Send + 'static + use<> {
        release(Arc::clone(&self.state), hold.holder(), self.write)
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        self.state.competitor().client.runtime()
    }

    fn label(&self) -> &str {
        &self.state.competitor().label
    }

    fn meter(&self) -> Option<&Meter> {
        Some(&self.state.competitor().meter)
    }
}

/// Releases one level of `holder` (`write` or shared): remotely, then locally whatever the
/// outcome; answers the levels the holder still holds in that mode locally.
pub(super) async fn release(state: Arc<SharedState>, holder: HolderId, write: bool) -> Result<u32> {
    let c = state.competitor();
    let span = tracing::debug_span!("release", lock = %c.label, %holder, write);
    async {
        // A reader through the process's shared read hold releases nothing in Redis until
        // its last level, and then only as the hold's last member. That release goes before
        // the local one, which wakes a writer queued here: it must find the hold gone.
        let remote = if write {
            holder
        } else {
            match c.leave(holder) {
                Left::NotJoined => holder,
                Left::Level => return Ok(state.sync.release_shared(holder)),
                Left::Last(last) => last,
            }
        };
        let renewal = &c.client.inner.renewal;
        let generation = renewal.begin_release(&c.keys.holders, remote);
        let result = c.release_remote(remote, write).await;
        if remote != holder {
            renewal.deregister(&c.keys.holders, remote);
        }
        let remaining = if write {
            state.sync.release(holder)
        } else {
            state.sync.release_shared(holder)
        };
        // After the local release, which deregisters a hold that ended: until then a renewal
        // answering 0 is this release's doing, not a loss (issue 35, defect 18). A reply of
        // 0 levels in this mode may leave levels of the other, so it does not free the hold.
        renewal.end_release(&c.keys.holders, remote, generation, false);
        match result {
            Ok(-1) => Err(Error::not_held(Arc::clone(&c.label), holder)),
            Ok(n) if n >= 0 => Ok(remaining),
            Ok(n) => Err(unexpected_reply(
                "shared release script",
                c.client.address(),
                n,
            )),
            Err(e) => {
                tracing::warn!(error = %e, "release failed; the hold ends with its lease");
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}
