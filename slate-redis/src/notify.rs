//! Unlock notification: one pub/sub connection per client, one subscription per lock name
//! while that lock has local waiters.
//!
//! A listener task owns the connection (redis-rs's async `PubSub`, split into sink and stream).
//! It subscribes and unsubscribes on request, calls the lock's release hook for every message,
//! and after the connection breaks reconnects with bounded backoff, resubscribes every wanted
//! channel in one command and wakes every such lock once (a release may have been missed while
//! it was down). While it is down, waiters are told notifications are off and wait on the
//! spin-wait timer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use slate_aqs::Notifications;
use tokio::sync::{mpsc, oneshot};

use crate::client::{RedisClient, lock};

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often an idle pub/sub connection is checked with a `PING` (a silently dead connection
/// would otherwise look subscribed forever).
const KEEPALIVE: Duration = Duration::from_secs(5);

/// What a release message wakes.
pub(crate) trait ReleaseTarget: Send + Sync {
    /// A release of this lock was published.
    fn released(&self);
    /// The id of this lock's local queue, as releases address it (see `scripts/release.lua`).
    fn queue_id(&self) -> &str;
}

struct Channel {
    target: Weak<dyn ReleaseTarget>,
    /// When the server confirmed the subscription on the current connection.
    confirmed_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    /// The wanted channels.
    channels: HashMap<Arc<[u8]>, Channel>,
    up: bool,
}

enum Command {
    Subscribe(Arc<[u8]>, oneshot::Sender<bool>),
    Unsubscribe(Arc<[u8]>),
}

/// The notification side of a client.
pub(crate) struct Notifier {
    client: Option<redis::Client>,
    command_timeout: Duration,
    connect_timeout: Duration,
    state: Arc<Mutex<State>>,
    tx: Mutex<Option<mpsc::UnboundedSender<Command>>>,
}

impl Notifier {
    pub(crate) fn new(
        client: Option<redis::Client>,
        command_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Notifier {
            client,
            command_timeout,
            connect_timeout,
            state: Arc::default(),
            tx: Mutex::new(None),
        }
    }

    /// Makes sure `channel` is subscribed, for a head that just got a busy answer from an
    /// attempt sent at `attempt_sent`.
    ///
    /// `Live` only when the subscription was confirmed before that attempt was sent (a release
    /// after it is then certain to be delivered); `Started` when it was confirmed later (the
    /// head retries once); `Off` when pub/sub is unavailable.
    ///
    /// Cancel safe: a dropped call leaves the channel wanted, and the listener confirms it in
    /// the background; `unsubscribe` removes it.
    pub(crate) async fn subscribe(
        &self,
        rc: &RedisClient,
        channel: &Arc<[u8]>,
        target: Weak<dyn ReleaseTarget>,
        attempt_sent: Option<Instant>,
    ) -> Notifications {
        if self.client.is_none() {
            return Notifications::Off;
        }
        let rx = {
            let mut st = lock(&self.state);
            let up = st.up;
            let entry = st.channels.entry(channel.clone()).or_insert(Channel {
                target,
                confirmed_at: None,
            });
            if let (Some(at), true) = (entry.confirmed_at, up) {
                return match attempt_sent {
                    Some(sent) if at <= sent => Notifications::Live,
                    _ => Notifications::Started,
                };
            }
            drop(st);
            let (tx, rx) = oneshot::channel();
            if !self.send(rc, Command::Subscribe(channel.clone(), tx)) {
                return Notifications::Off;
            }
            rx
        };
        let budget = self.command_timeout + self.connect_timeout;
        match tokio::time::timeout(budget, rx).await {
            Ok(Ok(true)) => Notifications::Started,
            _ => Notifications::Off,
        }
    }

    /// Drops the subscription of `channel` (its lock has no local waiters any more).
    pub(crate) fn unsubscribe(&self, rc: &RedisClient, channel: &Arc<[u8]>) {
        if self.client.is_none() {
            return;
        }
        if lock(&self.state).channels.remove(channel).is_some() {
            self.send(rc, Command::Unsubscribe(channel.clone()));
        }
    }

    /// (Wanted subscriptions, whether the connection is up.)
    pub(crate) fn stats(&self) -> (usize, bool) {
        let st = lock(&self.state);
        (st.channels.len(), st.up)
    }

    /// Stops the listener (the client is gone).
    pub(crate) fn close(&self) {
        lock(&self.tx).take();
    }

    /// Sends a command to the listener, starting it on first use.
    fn send(&self, rc: &RedisClient, cmd: Command) -> bool {
        let Some(client) = &self.client else {
            return false;
        };
        let mut tx = lock(&self.tx);
        if tx.as_ref().is_none_or(mpsc::UnboundedSender::is_closed) {
            let (sender, receiver) = mpsc::unbounded_channel();
            let listener = Listener {
                client: client.clone(),
                state: self.state.clone(),
                command_timeout: self.command_timeout,
                connect_timeout: self.connect_timeout,
                sink: None,
                refusal_reported: false,
            };
            rc.spawn(listener.run(receiver));
            *tx = Some(sender);
        }
        tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok())
    }
}

struct Listener {
    client: redis::Client,
    state: Arc<Mutex<State>>,
    command_timeout: Duration,
    connect_timeout: Duration,
    sink: Option<PubSubSink>,
    /// Whether a refused subscription was already reported (once per listener).
    refusal_reported: bool,
}

impl Listener {
    /// Reports a failed SUBSCRIBE: a refusal (ACL) once, at WARN, since waiters then silently
    /// fall back to the spin wait; anything else at debug (the connection is retried).
    fn subscribe_failed(&mut self, e: &redis::RedisError) {
        if crate::error::kind_of(e) == slate_core::BackendKind::Permission {
            if !self.refusal_reported {
                self.refusal_reported = true;
                tracing::warn!(error = %e,
                    "SUBSCRIBE to the lock's release channel was refused (a permission error): \
                     waiters are not woken by releases and fall back to the spin wait; grant \
                     the ACL user +subscribe +unsubscribe and the channels (e.g. &slate:*)");
            }
        } else {
            tracing::debug!(error = %e, "SUBSCRIBE failed; reconnecting");
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut stream: Option<PubSubStream> = None;
        let mut backoff = BACKOFF_MIN;
        let mut retry_at: Option<Instant> = None;
        loop {
            let wanted = !lock(&self.state).channels.is_empty();
            if stream.is_none() && wanted && retry_at.is_none_or(|t| Instant::now() >= t) {
                match self.connect().await {
                    Some(s) => {
                        stream = Some(s);
                        backoff = BACKOFF_MIN;
                        retry_at = None;
                    }
                    None => {
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
            }
            let retry = async {
                match retry_at {
                    Some(t) if wanted => tokio::time::sleep_until(t.into()).await,
                    _ => std::future::pending().await,
                }
            };
            let connected = stream.is_some();
            let next_msg = async {
                match stream.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    None => return,
                    Some(Command::Subscribe(channel, reply)) => {
                        if stream.is_none() && retry_at.is_none_or(|t| Instant::now() >= t) {
                            if let Some(s) = self.connect().await {
                                stream = Some(s);
                                backoff = BACKOFF_MIN;
                                retry_at = None;
                            } else {
                                retry_at = Some(Instant::now() + backoff);
                                backoff = (backoff * 2).min(BACKOFF_MAX);
                            }
                        }
                        let ok = match stream {
                            Some(_) => match self.subscribe_one(&channel).await {
                                Some(confirmed) => confirmed,
                                None => {
                                    stream = None;
                                    self.down();
                                    retry_at = Some(Instant::now() + backoff);
                                    false
                                }
                            },
                            None => false,
                        };
                        let _ = reply.send(ok);
                    }
                    Some(Command::Unsubscribe(channel)) => {
                        if stream.is_some() && !self.unsubscribe_one(&channel).await {
                            stream = None;
                            self.down();
                        }
                    }
                },
                msg = next_msg => match msg {
                    Some(msg) => self.dispatch(&msg),
                    None => {
                        tracing::warn!("pub/sub connection lost; waiters fall back to the spin wait");
                        stream = None;
                        self.down();
                    }
                },
                () = retry => {}
                () = tokio::time::sleep(KEEPALIVE), if connected => {
                    if !self.ping().await {
                        tracing::warn!("pub/sub connection does not answer; reconnecting");
                        stream = None;
                        self.down();
                    }
                }
            }
        }
    }

    /// Opens the connection and subscribes every wanted channel in one command; on success
    /// wakes every such lock once.
    async fn connect(&mut self) -> Option<PubSubStream> {
        let pubsub = match tokio::time::timeout(
            self.connect_timeout,
            self.client.get_async_pubsub(),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "pub/sub connect failed");
                return None;
            }
            Err(_) => {
                tracing::debug!("pub/sub connect timed out");
                return None;
            }
        };
        let (mut sink, stream) = pubsub.split();
        let channels: Vec<Arc<[u8]>> = lock(&self.state).channels.keys().cloned().collect();
        if !channels.is_empty() {
            let args: Vec<&[u8]> = channels.iter().map(|c| &**c).collect();
            match tokio::time::timeout(self.command_timeout, sink.subscribe(args)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.subscribe_failed(&e);
                    return None;
                }
                Err(_) => return None,
            }
        }
        let now = Instant::now();
        let targets: Vec<Weak<dyn ReleaseTarget>> = {
            let mut st = lock(&self.state);
            st.up = true;
            st.channels
                .iter_mut()
                .filter(|(name, _)| channels.contains(name))
                .map(|(_, ch)| {
                    ch.confirmed_at = Some(now);
                    ch.target.clone()
                })
                .collect()
        };
        tracing::debug!(channels = channels.len(), "pub/sub connected");
        self.sink = Some(sink);
        for t in targets.iter().filter_map(Weak::upgrade) {
            t.released();
        }
        Some(stream)
    }

    /// `Some(true)`: confirmed; `Some(false)`: no longer wanted (nothing sent); `None`: the
    /// connection failed.
    async fn subscribe_one(&mut self, channel: &Arc<[u8]>) -> Option<bool> {
        let sink = self.sink.as_mut()?;
        if !lock(&self.state).channels.contains_key(channel) {
            return Some(false);
        }
        match tokio::time::timeout(self.command_timeout, sink.subscribe(&**channel)).await {
            Ok(Ok(())) => {
                let mut st = lock(&self.state);
                if let Some(ch) = st.channels.get_mut(channel) {
                    ch.confirmed_at = Some(Instant::now());
                }
                Some(true)
            }
            Ok(Err(e)) => {
                self.subscribe_failed(&e);
                None
            }
            Err(_) => None,
        }
    }

    async fn unsubscribe_one(&mut self, channel: &Arc<[u8]>) -> bool {
        let Some(sink) = self.sink.as_mut() else {
            return true;
        };
        if lock(&self.state).channels.contains_key(channel) {
            // Wanted again meanwhile.
            return true;
        }
        matches!(
            tokio::time::timeout(self.command_timeout, sink.unsubscribe(&**channel)).await,
            Ok(Ok(()))
        )
    }

    async fn ping(&mut self) -> bool {
        let Some(sink) = self.sink.as_mut() else {
            return false;
        };
        matches!(
            tokio::time::timeout(self.command_timeout, sink.ping::<redis::Value>()).await,
            Ok(Ok(_))
        )
    }

    fn down(&mut self) {
        self.sink = None;
        let mut st = lock(&self.state);
        st.up = false;
        for ch in st.channels.values_mut() {
            ch.confirmed_at = None;
        }
    }

    fn dispatch(&self, msg: &redis::Msg) {
        let Ok(channel) = msg.get_channel::<Vec<u8>>() else {
            return;
        };
        // A release addresses the local queue whose turn comes next (or nobody in particular
        // with an empty message): the heads of other queues stay parked instead of all retrying.
        let to = msg.get_payload_bytes();
        let target = lock(&self.state)
            .channels
            .get(channel.as_slice())
            .and_then(|ch| ch.target.upgrade());
        if let Some(t) = target
            && (to.is_empty() || to == t.queue_id().as_bytes())
        {
            tracing::trace!("release notification");
            t.released();
        }
    }
}
