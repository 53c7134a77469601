//! Unlock notification: one pub/sub connection per client, one subscription per lock name
//! while that lock has local waiters.
//!
//! A listener task owns the connection (redis-rs's async `PubSub`, split into sink and stream).
//! It subscribes and unsubscribes on request, calls the lock's release hook for every message,
//! and after the connection breaks reconnects with bounded backoff, resubscribes every wanted
//! channel in one command and wakes every such lock once (a release may have been missed while
//! it was down). While it is down, waiters are told notifications are off and wait on the
//! spin-wait timer.
//!
//! Subscriptions never hold up messages: every `SUBSCRIBE`, `UNSUBSCRIBE` and keepalive `PING`
//! is an outstanding future polled beside the message stream, and the requests that arrived
//! together go out as one command. A channel whose lock's queue drained stays subscribed for a
//! linger period (1 s), so that a name contended on and off costs at most one `SUBSCRIBE` and
//! one `UNSUBSCRIBE` per period.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::{PubSubSink, PubSubStream};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{PushInfo, PushKind, RedisResult};
use slate_aqs::Notifications;
use tokio::sync::{mpsc, oneshot};

use crate::client::conn::slot_of;
use crate::client::{RedisClient, lock};

impl RedisClient {
    /// Subscribes `target` to the release messages of `channel` on this client's runtime (see
    /// [`Notifier::subscribe`]); [`Notifications::Off`] if that runtime is gone. What the
    /// single lock's and the node locks' `prepare_wait` run.
    pub(crate) fn subscribe_releases(
        &self,
        channel: Arc<[u8]>,
        target: Weak<dyn ReleaseTarget>,
        attempt_sent: Option<Instant>,
    ) -> impl Future<Output = Notifications> + Send + 'static + use<> {
        let client = self.clone();
        let run = self.on_runtime(async move {
            Ok(client
                .inner
                .notifier
                .subscribe(&client, &channel, target, attempt_sent)
                .await)
        });
        async move { run.await.unwrap_or(Notifications::Off) }
    }
}

/// Builds a cluster client whose connection delivers push messages on the given sender.
pub(crate) type ClusterBuild = dyn Fn(Option<mpsc::UnboundedSender<PushInfo>>) -> RedisResult<redis::cluster::ClusterClient>
    + Send
    + Sync;

/// Where the pub/sub connection goes.
#[derive(Clone)]
pub(crate) enum PubSubSource {
    /// One server (`SUBSCRIBE`).
    Server(Box<redis::Client>),
    /// The master the Sentinels name at connect time (`SUBSCRIBE`). After a failover the old
    /// connection breaks (or keeps receiving: a demoted master's replication stream carries the
    /// new master's publications), and the next connect asks the Sentinels again.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
    /// A cluster: sharded pub/sub (`SSUBSCRIBE`) on the node that owns each channel's slot,
    /// over RESP3 (redis-rs's cluster connection delivers the messages as pushes and
    /// resubscribes after reconnections and slot-map changes).
    Cluster(Arc<ClusterBuild>),
}

/// The sending half of the pub/sub connection.
#[derive(Clone)]
enum Sink {
    Server(PubSubSink),
    Cluster(ClusterConnection),
}

/// Groups channels by hash slot: a sharded (un)subscription names channels of one slot.
fn by_slot(channels: &[Arc<[u8]>]) -> Vec<Vec<&[u8]>> {
    let mut groups: HashMap<u16, Vec<&[u8]>> = HashMap::new();
    for c in channels {
        groups.entry(slot_of(c)).or_default().push(c);
    }
    groups.into_values().collect()
}

impl Sink {
    /// Whether a failed (un)subscription means the connection itself is gone. A server's
    /// refusal (a channel the ACL user may not use) concerns only the
    /// channels asked for; on a cluster, a node that cannot be reached concerns only the
    /// channels of its slots (the cluster connection reconnects its nodes by itself, and the
    /// keepalive catches a connection that is gone as a whole).
    fn broken_by(&self, e: &redis::RedisError) -> bool {
        match self {
            Sink::Server(_) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
            }
            Sink::Cluster(_) => false,
        }
    }

    async fn subscribe(&mut self, channels: &[Arc<[u8]>]) -> RedisResult<()> {
        self.change(channels, true).await
    }

    async fn unsubscribe(&mut self, channels: &[Arc<[u8]>]) -> RedisResult<()> {
        self.change(channels, false).await
    }

    /// (Un)subscribes `channels`: one command on a server; on a cluster one sharded command
    /// per slot (each to the slot's node), all at once.
    async fn change(&mut self, channels: &[Arc<[u8]>], on: bool) -> RedisResult<()> {
        match self {
            Sink::Server(s) => {
                let args: Vec<&[u8]> = channels.iter().map(|c| &**c).collect();
                if on {
                    s.subscribe(args).await
                } else {
                    s.unsubscribe(args).await
                }
            }
            Sink::Cluster(c) => {
                let calls = by_slot(channels).into_iter().map(|group| {
                    let mut c = c.clone();
                    async move {
                        if on {
                            c.ssubscribe(group).await
                        } else {
                            c.sunsubscribe(group).await
                        }
                    }
                });
                futures::future::try_join_all(calls).await.map(drop)
            }
        }
    }

    async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Sink::Server(s) => s.ping::<redis::Value>().await.map(drop),
            Sink::Cluster(c) => redis::cmd("PING").query_async::<()>(c).await,
        }
    }
}

/// The receiving half of the pub/sub connection.
enum Stream {
    Server(PubSubStream),
    Cluster(mpsc::UnboundedReceiver<PushInfo>),
}

/// What the pub/sub connection delivered.
enum Event {
    /// A release message on a channel.
    Message { channel: Vec<u8>, payload: Vec<u8> },
    /// The whole connection is gone.
    Closed,
    /// (Cluster) one node's connection broke; redis-rs reconnects and resubscribes.
    NodeLost,
    /// (Cluster) a sharded subscription was confirmed (ours, or a resubscription).
    Confirmed(Vec<u8>),
    /// (Cluster) the server ended a sharded subscription (its slot moved to another node).
    Dropped(Vec<u8>),
    /// Nothing the listener acts on.
    Other,
}

impl Stream {
    async fn next(&mut self) -> Event {
        match self {
            Stream::Server(s) => match s.next().await {
                Some(msg) => match msg.get_channel::<Vec<u8>>() {
                    Ok(channel) => Event::Message {
                        channel,
                        payload: msg.get_payload_bytes().to_vec(),
                    },
                    Err(_) => Event::Other,
                },
                None => Event::Closed,
            },
            Stream::Cluster(rx) => {
                let Some(push) = rx.recv().await else {
                    return Event::Closed;
                };
                let bytes = |i: usize| {
                    push.data
                        .get(i)
                        .and_then(|v| redis::from_redis_value_ref::<Vec<u8>>(v).ok())
                };
                match push.kind {
                    PushKind::SMessage => match (bytes(0), bytes(1)) {
                        (Some(channel), Some(payload)) => Event::Message { channel, payload },
                        _ => Event::Other,
                    },
                    PushKind::Disconnection => Event::NodeLost,
                    PushKind::SSubscribe => bytes(0).map_or(Event::Other, Event::Confirmed),
                    PushKind::SUnsubscribe => bytes(0).map_or(Event::Other, Event::Dropped),
                    _ => Event::Other,
                }
            }
        }
    }
}

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
    client: Option<PubSubSource>,
    command_timeout: Duration,
    connect_timeout: Duration,
    state: Arc<Mutex<State>>,
    tx: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    /// (Cluster) the servers lack sharded pub/sub: notifications are off.
    unsupported: Arc<std::sync::atomic::AtomicBool>,
}

impl Notifier {
    pub(crate) fn new(
        client: Option<PubSubSource>,
        command_timeout: Duration,
        connect_timeout: Duration,
        unsupported: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        Notifier {
            unsupported,
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
        if self.client.is_none() || self.unsupported.load(std::sync::atomic::Ordering::Relaxed) {
            return Notifications::Off;
        }
        let rx = {
            let mut st = lock(&self.state);
            let up = st.up;
            // A lock dropped and built again under the same name finds the old entry while it
            // lingers: the new lock takes it over.
            let entry = st
                .channels
                .entry(channel.clone())
                .and_modify(|c| {
                    if c.target.strong_count() == 0 {
                        c.target = target.clone();
                    }
                })
                .or_insert(Channel {
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
                generation: 0,
                subscribed: HashSet::new(),
                inflight: HashMap::new(),
                lingering: HashMap::new(),
                lost: HashSet::new(),
                refusal_reported: false,
                one_by_one: Vec::new(),
            };
            rc.spawn(listener.run(receiver));
            *tx = Some(sender);
        }
        tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok())
    }
}

/// What an outstanding (un)subscription, ping or keepalive answered.
enum Outcome {
    /// A `SUBSCRIBE` of `channels` was confirmed (or failed).
    Subscribed {
        channels: Vec<Arc<[u8]>>,
        replies: Vec<oneshot::Sender<bool>>,
        result: redis::RedisResult<()>,
    },
    /// (Cluster) a `SUNSUBSCRIBE` of `channels` answered (`ok`) or failed.
    Unsubscribed { channels: Vec<Arc<[u8]>>, ok: bool },
    /// An `UNSUBSCRIBE` (or a keepalive `PING`) answered.
    Done(bool),
}

type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, Outcome)> + Send>>;

/// How long a channel stays subscribed after its lock's queue drained. A name contended on
/// and off (waiters come and go) then costs one `SUBSCRIBE` and one `UNSUBSCRIBE` per linger
/// period at most, instead of a pair per wait.
const LINGER: Duration = Duration::from_secs(1);

struct Listener {
    client: PubSubSource,
    state: Arc<Mutex<State>>,
    command_timeout: Duration,
    connect_timeout: Duration,
    sink: Option<Sink>,
    /// Bumped on every new connection; outcomes of an older one are ignored.
    generation: u64,
    /// Channels the server confirmed we are subscribed to.
    subscribed: HashSet<Arc<[u8]>>,
    /// Channels whose `SUBSCRIBE` is on its way, with the requests that arrived meanwhile (the
    /// request that sent it is answered by its own outcome).
    inflight: HashMap<Arc<[u8]>, Vec<oneshot::Sender<bool>>>,
    /// Subscribed channels no longer wanted, and when to unsubscribe them.
    lingering: HashMap<Arc<[u8]>, Instant>,
    /// (Cluster) channels whose node connection broke, until a resubscription is confirmed.
    lost: HashSet<Arc<[u8]>>,
    /// Whether a refused subscription was already reported (once per listener).
    refusal_reported: bool,
    /// Channels the connection's first `SUBSCRIBE` was refused for: each is asked alone next,
    /// so that one refused channel does not keep the others unsubscribed.
    one_by_one: Vec<Arc<[u8]>>,
}

impl Listener {
    /// Reports a failed SUBSCRIBE: a refusal (ACL) once, at WARN, since waiters then silently
    /// fall back to the spin wait; anything else at debug (the connection is retried).
    fn subscribe_failed(&mut self, e: &redis::RedisError) {
        if crate::client::error::kind_of(e) == slate_core::BackendKind::Permission {
            if !self.refusal_reported {
                self.refusal_reported = true;
                tracing::warn!(error = %e,
                    "SUBSCRIBE to the lock's release channel was refused (a permission error): \
                     waiters are not woken by releases and fall back to the spin wait; grant \
                     the ACL user +subscribe +unsubscribe and the channels (e.g. &slate:*)");
            }
        } else {
            tracing::debug!(error = %e, "SUBSCRIBE failed");
        }
    }

    /// The listener's loop. It never waits for a (un)subscription inline: every command to
    /// the server is an outstanding future polled beside the message stream, so release
    /// messages are dispatched while subscriptions are on their way. Requests that arrive
    /// together are sent as one `SUBSCRIBE` (one round trip for many names).
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut stream: Option<Stream> = None;
        let mut pending: FuturesUnordered<Pending> = FuturesUnordered::new();
        let mut backoff = BACKOFF_MIN;
        let mut retry_at: Option<Instant> = None;
        // Subscribe requests waiting for a connection, by channel.
        let mut waiting: Vec<(Arc<[u8]>, oneshot::Sender<bool>)> = Vec::new();
        // When the connection is checked next: KEEPALIVE after the last sign of life from the
        // server (connection, a message, a confirmation, a PING sent). Local requests do not
        // move it, so that waiters coming and going cannot keep a half-open connection
        // reported live for ever (issue 35, defect 17).
        let mut ping_at = Instant::now() + KEEPALIVE;
        loop {
            let wanted = !lock(&self.state).channels.is_empty();
            if stream.is_none() && wanted && retry_at.is_none_or(|t| Instant::now() >= t) {
                match self.connect().await {
                    Some(s) => {
                        stream = Some(s);
                        backoff = BACKOFF_MIN;
                        retry_at = None;
                        ping_at = Instant::now() + KEEPALIVE;
                    }
                    None => {
                        retry_at = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                // Channels refused in the first SUBSCRIBE are asked one by one; whoever
                // waits for one of them learns that subscription's outcome.
                for channel in std::mem::take(&mut self.one_by_one) {
                    if lock(&self.state).channels.contains_key(&channel)
                        && !self.inflight.contains_key(&channel)
                    {
                        self.inflight.insert(channel.clone(), Vec::new());
                        if let Some(fut) = self.subscribe_outstanding(vec![channel], Vec::new()) {
                            pending.push(fut);
                        }
                    }
                }
                // Whoever waited for this connection learns whether its channel is subscribed.
                for (channel, reply) in waiting.drain(..) {
                    if let Some(w) = self.inflight.get_mut(&channel) {
                        w.push(reply);
                    } else {
                        let _ = reply.send(stream.is_some() && self.subscribed.contains(&channel));
                    }
                }
            }
            let connected = stream.is_some();
            let retry = async {
                match retry_at {
                    Some(t) if wanted && !connected => {
                        tokio::time::sleep_until(t.into()).await;
                    }
                    _ => std::future::pending().await,
                }
            };
            let unlinger_at = self.lingering.values().min().copied();
            let unlinger = async {
                match unlinger_at {
                    Some(t) if connected => tokio::time::sleep_until(t.into()).await,
                    _ => std::future::pending().await,
                }
            };
            let next_msg = async {
                match stream.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending::<Event>().await,
                }
            };
            let outcome = async {
                if pending.is_empty() {
                    std::future::pending().await
                } else {
                    pending.next().await
                }
            };
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(first) = cmd else { return };
                    // Everything already queued goes into the same round trip.
                    let mut batch = vec![first];
                    while let Ok(more) = rx.try_recv() {
                        batch.push(more);
                    }
                    if stream.is_none() {
                        // The next turn of the loop connects and subscribes every wanted
                        // channel in one command; replies wait for that.
                        for cmd in batch {
                            if let Command::Subscribe(channel, reply) = cmd {
                                if retry_at.is_some_and(|t| Instant::now() < t) {
                                    let _ = reply.send(false);
                                } else {
                                    waiting.push((channel, reply));
                                }
                            }
                        }
                        retry_at = retry_at.filter(|t| Instant::now() < *t);
                        continue;
                    }
                    if let Some(fut) = self.apply(batch) {
                        pending.push(fut);
                    }
                }
                event = next_msg => match event {
                    Event::Message { channel, payload } => {
                        ping_at = Instant::now() + KEEPALIVE;
                        self.dispatch(&channel, &payload);
                    }
                    Event::Closed => {
                        tracing::warn!("pub/sub connection lost; waiters fall back to the spin wait");
                        stream = None;
                        self.down();
                    }
                    Event::NodeLost => self.node_lost(),
                    Event::Confirmed(channel) => {
                        ping_at = Instant::now() + KEEPALIVE;
                        self.resubscribed(&channel);
                    }
                    Event::Dropped(channel) => {
                        if let Some(fut) = self.dropped(&channel) {
                            pending.push(fut);
                        }
                    }
                    Event::Other => {}
                },
                Some((generation, outcome)) = outcome => {
                    if generation == self.generation && !self.finish(outcome, &mut pending) {
                        stream = None;
                        self.down();
                        retry_at = Some(Instant::now() + backoff);
                    }
                }
                () = unlinger => {
                    if let Some(fut) = self.unsubscribe_lingering() {
                        pending.push(fut);
                    }
                }
                () = retry => {}
                () = tokio::time::sleep_until(ping_at.into()), if connected => {
                    ping_at = Instant::now() + KEEPALIVE;
                    if let Some(fut) = self.ping() {
                        pending.push(fut);
                    }
                }
            }
        }
    }

    /// Applies a batch of requests on a live connection: channels wanted again while still
    /// subscribed are confirmed at once; the others are subscribed in one command (returned);
    /// unsubscriptions start their linger.
    fn apply(&mut self, batch: Vec<Command>) -> Option<Pending> {
        let now = Instant::now();
        let mut to_subscribe: Vec<Arc<[u8]>> = Vec::new();
        let mut replies = Vec::new();
        for cmd in batch {
            match cmd {
                Command::Subscribe(channel, reply) => {
                    let wanted = lock(&self.state).channels.contains_key(&channel);
                    if !wanted {
                        let _ = reply.send(false);
                    } else if self.subscribed.contains(&channel) {
                        // Subscribed all along (it was lingering): a release published from
                        // now on is delivered. Confirmed "now", not at the original time:
                        // messages of the lingering period were not dispatched.
                        self.lingering.remove(&channel);
                        self.confirm(&channel, now);
                        let _ = reply.send(true);
                    } else if let Some(waiting) = self.inflight.get_mut(&channel) {
                        waiting.push(reply);
                    } else {
                        // Its subscription goes out now: no unsubscription may follow it
                        // while it is on its way (the outcome lingers it if unwanted by then).
                        self.lingering.remove(&channel);
                        self.inflight.insert(channel.clone(), Vec::new());
                        to_subscribe.push(channel);
                        replies.push(reply);
                    }
                }
                Command::Unsubscribe(channel) => {
                    if lock(&self.state).channels.contains_key(&channel) {
                        continue;
                    }
                    // (Cluster) a channel lost with its node stays in the cluster
                    // connection's subscriptions, which it restores on reconnection: it is
                    // unsubscribed like any other (issue 35, defect 17: `lost` grew for ever).
                    // It stays in `lost` (not confirmed) until unsubscribed: wanted again
                    // meanwhile, it is subscribed again for real.
                    if self.subscribed.contains(&channel) || self.lost.contains(&channel) {
                        self.lingering.insert(channel, now + LINGER);
                    }
                }
            }
        }
        if to_subscribe.is_empty() {
            return None;
        }
        self.subscribe_outstanding(to_subscribe, replies)
    }

    /// One (sharded) subscription of `channels`, already marked in flight, as an outstanding
    /// future; `replies` learn its outcome.
    fn subscribe_outstanding(
        &mut self,
        channels: Vec<Arc<[u8]>>,
        replies: Vec<oneshot::Sender<bool>>,
    ) -> Option<Pending> {
        let Some(mut sink) = self.sink.clone() else {
            // Not reached: requests are applied on a live connection only.
            for c in &channels {
                self.inflight.remove(c);
            }
            return None;
        };
        let (generation, budget) = (self.generation, self.command_timeout);
        Some(Box::pin(async move {
            let result = match tokio::time::timeout(budget, sink.subscribe(&channels)).await {
                Ok(r) => r,
                Err(_) => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "SUBSCRIBE timed out",
                ))),
            };
            (
                generation,
                Outcome::Subscribed {
                    channels,
                    replies,
                    result,
                },
            )
        }))
    }

    fn confirm(&self, channel: &Arc<[u8]>, at: Instant) {
        if let Some(ch) = lock(&self.state).channels.get_mut(channel) {
            ch.confirmed_at = Some(at);
        }
    }

    /// Applies an outcome of the current connection; `false`: the connection failed. A
    /// subscription the server refused (or, on a cluster, one whose node is out of reach)
    /// fails only its channels: several channels refused together are asked again one by one
    /// (outstanding futures pushed to `pending`), since one refused channel refuses the whole
    /// command.
    fn finish(&mut self, outcome: Outcome, pending: &mut FuturesUnordered<Pending>) -> bool {
        match outcome {
            Outcome::Subscribed {
                channels,
                replies,
                result,
            } => {
                let ok = match result {
                    Ok(()) => true,
                    Err(e) => {
                        self.subscribe_failed(&e);
                        if self.sink.as_ref().is_none_or(|s| s.broken_by(&e)) {
                            // The connection failed: `down` answers everyone.
                            for reply in replies {
                                let _ = reply.send(false);
                            }
                            return false;
                        }
                        if channels.len() > 1 {
                            self.one_by_one_again(channels, replies, pending);
                            return true;
                        }
                        false
                    }
                };
                let now = Instant::now();
                let mut replies = replies;
                for channel in channels {
                    replies.extend(self.inflight.remove(&channel).unwrap_or_default());
                    if !ok {
                        continue;
                    }
                    self.lost.remove(&channel);
                    self.confirm(&channel, now);
                    if !lock(&self.state).channels.contains_key(&channel) {
                        // Unwanted while the SUBSCRIBE was on its way.
                        self.lingering.insert(channel.clone(), now + LINGER);
                    }
                    self.subscribed.insert(channel);
                }
                for reply in replies {
                    let _ = reply.send(ok);
                }
                // A refused channel stays wanted: its waiters use the spin wait, and their
                // next wait asks for it again. The connection serves the others.
                true
            }
            Outcome::Unsubscribed { channels, ok } => {
                if !ok {
                    self.unsubscribe_failed(channels);
                }
                true
            }
            Outcome::Done(ok) => {
                if !ok {
                    tracing::warn!("pub/sub connection does not answer; reconnecting");
                }
                ok
            }
        }
    }

    /// Subscribes each of `channels` (refused together) alone; `replies` (one per channel, in
    /// order, when the batch came from requests) wait for their own channel's outcome.
    fn one_by_one_again(
        &mut self,
        channels: Vec<Arc<[u8]>>,
        replies: Vec<oneshot::Sender<bool>>,
        pending: &mut FuturesUnordered<Pending>,
    ) {
        let paired = replies.len() == channels.len();
        let mut replies = replies.into_iter();
        for channel in channels {
            let mut waiting = self.inflight.remove(&channel).unwrap_or_default();
            if paired && let Some(reply) = replies.next() {
                waiting.push(reply);
            }
            self.inflight.insert(channel.clone(), waiting);
            if let Some(fut) = self.subscribe_outstanding(vec![channel], Vec::new()) {
                pending.push(fut);
            }
        }
        for reply in replies {
            let _ = reply.send(false);
        }
    }

    /// One `UNSUBSCRIBE` for every lingering channel whose time came and that is still not
    /// wanted.
    fn unsubscribe_lingering(&mut self) -> Option<Pending> {
        let now = Instant::now();
        let due: Vec<Arc<[u8]>> = self
            .lingering
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(c, _)| c.clone())
            .collect();
        // A channel whose subscription is on its way is left alone: an unsubscription sent
        // behind it could be answered after it, and the channel counted as confirmed while
        // the server no longer has it (review finding); the subscription's outcome lingers
        // it again if nobody wants it by then.
        let st = lock(&self.state);
        let gone: Vec<Arc<[u8]>> = due
            .into_iter()
            .filter(|c| !st.channels.contains_key(c) && !self.inflight.contains_key(c))
            .collect();
        drop(st);
        self.lingering.retain(|_, at| *at > now);
        if gone.is_empty() {
            return None;
        }
        for c in &gone {
            self.subscribed.remove(c);
            self.lost.remove(c);
        }
        let mut sink = self.sink.clone()?;
        let cluster = matches!(sink, Sink::Cluster(_));
        let (generation, budget) = (self.generation, self.command_timeout);
        Some(Box::pin(async move {
            let ok = matches!(
                tokio::time::timeout(budget, sink.unsubscribe(&gone)).await,
                Ok(Ok(()))
            );
            let outcome = if cluster {
                // A failed unsubscription concerns its node only (like a subscription).
                Outcome::Unsubscribed { channels: gone, ok }
            } else {
                Outcome::Done(ok)
            };
            (generation, outcome)
        }))
    }

    /// (Cluster) an unsubscription failed (its node is out of reach): redis-rs still counts
    /// the channels as subscribed and restores them when it reconnects to the node, so each
    /// one still unwanted is kept as lost and tried again after the linger. Forgotten, it
    /// stayed subscribed on the server for the client's life.
    fn unsubscribe_failed(&mut self, channels: Vec<Arc<[u8]>>) {
        tracing::debug!(
            channels = channels.len(),
            "a sharded unsubscription failed; trying again"
        );
        for channel in channels {
            self.unsubscribe_later(channel);
        }
    }

    /// (Cluster) `channel` may be subscribed on the server without our counting it (redis-rs
    /// keeps it, and restores it on reconnection): unless it is wanted, subscribed or on its
    /// way again, it is kept as lost and unsubscribed after the linger.
    fn unsubscribe_later(&mut self, channel: Arc<[u8]>) {
        let known = self.subscribed.contains(&channel) || self.inflight.contains_key(&channel);
        if known || lock(&self.state).channels.contains_key(&channel) {
            return;
        }
        self.lost.insert(channel.clone());
        self.lingering.insert(channel, Instant::now() + LINGER);
    }

    /// A keepalive `PING` (a silently dead connection would otherwise look subscribed).
    fn ping(&mut self) -> Option<Pending> {
        let mut sink = self.sink.clone()?;
        let (generation, budget) = (self.generation, self.command_timeout);
        Some(Box::pin(async move {
            let ok = matches!(tokio::time::timeout(budget, sink.ping()).await, Ok(Ok(())));
            (generation, Outcome::Done(ok))
        }))
    }

    /// Opens the connection and subscribes every wanted channel in one command; on success
    /// wakes every such lock once.
    async fn connect(&mut self) -> Option<Stream> {
        let opened = tokio::time::timeout(self.connect_timeout, open(&self.client)).await;
        let (mut sink, stream) = match opened {
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
        let mut channels: Vec<Arc<[u8]>> = lock(&self.state).channels.keys().cloned().collect();
        if !channels.is_empty() {
            match tokio::time::timeout(self.command_timeout, sink.subscribe(&channels)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.subscribe_failed(&e);
                    if sink.broken_by(&e) {
                        return None;
                    }
                    // Refused (or a cluster node out of reach): the connection is good; each
                    // channel is asked alone once it is up.
                    self.one_by_one = std::mem::take(&mut channels);
                }
                Err(_) => return None,
            }
        }
        let now = Instant::now();
        // Every wanted lock is woken once (a release may have passed while the connection was
        // down), the ones asked one by one too; only the subscribed ones count as confirmed,
        // and no confirmation from an earlier connection survives.
        let asked: HashSet<&Arc<[u8]>> = channels.iter().chain(&self.one_by_one).collect();
        let targets: Vec<Weak<dyn ReleaseTarget>> = {
            let mut st = lock(&self.state);
            st.up = true;
            st.channels
                .iter_mut()
                .filter(|(name, _)| asked.contains(name))
                .map(|(name, ch)| {
                    ch.confirmed_at = channels.contains(name).then_some(now);
                    ch.target.clone()
                })
                .collect()
        };
        drop(asked);
        tracing::debug!(channels = channels.len(), "pub/sub connected");
        self.generation += 1;
        self.subscribed = channels.into_iter().collect();
        self.lingering.clear();
        self.lost.clear();
        for (_, waiting) in self.inflight.drain() {
            for reply in waiting {
                let _ = reply.send(false);
            }
        }
        self.sink = Some(sink);
        for t in targets.iter().filter_map(Weak::upgrade) {
            t.released();
        }
        Some(stream)
    }

    fn down(&mut self) {
        self.sink = None;
        self.subscribed.clear();
        self.lingering.clear();
        self.lost.clear();
        for (_, waiting) in self.inflight.drain() {
            for reply in waiting {
                let _ = reply.send(false);
            }
        }
        let mut st = lock(&self.state);
        st.up = false;
        for ch in st.channels.values_mut() {
            ch.confirmed_at = None;
        }
    }

    /// (Cluster) a node's connection broke: a release published on it meanwhile is not
    /// delivered, so every subscribed channel counts as unconfirmed (its waiters retry once and
    /// wait on the spin timer until a resubscription is confirmed), and the next wait
    /// subscribes it again.
    fn node_lost(&mut self) {
        tracing::debug!("a cluster node's pub/sub connection broke; resubscribing");
        let lost: Vec<Arc<[u8]>> = self.subscribed.drain().collect();
        let mut targets: Vec<Weak<dyn ReleaseTarget>> = Vec::new();
        {
            let mut st = lock(&self.state);
            for c in &lost {
                if let Some(ch) = st.channels.get_mut(c) {
                    ch.confirmed_at = None;
                    targets.push(ch.target.clone());
                }
            }
        }
        self.lost.extend(lost);
        for t in targets.iter().filter_map(Weak::upgrade) {
            t.released();
        }
    }

    /// (Cluster) a sharded subscription was confirmed. For a channel lost with its node, this
    /// is redis-rs's resubscription: confirmed from now on, and its waiters retry once (a
    /// release may have passed while it was down).
    ///
    /// A confirmation of a channel that nobody wants and that is not counted as subscribed is
    /// also redis-rs restoring it from its own record: its reconnection to a node raced our
    /// unsubscription, which the server answered first. It is unsubscribed after the linger,
    /// like any other; left alone, it stayed on the server for the client's life.
    fn resubscribed(&mut self, channel: &[u8]) {
        let Some(channel) = self.lost.take(channel) else {
            self.unsubscribe_later(Arc::from(channel));
            return;
        };
        let target = {
            let mut st = lock(&self.state);
            st.channels.get_mut(&channel).map(|ch| {
                ch.confirmed_at = Some(Instant::now());
                ch.target.clone()
            })
        };
        self.subscribed.insert(channel.clone());
        match target {
            Some(t) => {
                if let Some(t) = t.upgrade() {
                    t.released();
                }
            }
            // No longer wanted: unsubscribed after the linger, like any other.
            None => {
                self.lingering.insert(channel, Instant::now() + LINGER);
            }
        }
    }

    /// (Cluster) the server ended a subscription we did not end (its slot moved): it is
    /// unconfirmed, its waiters retry once, and it is subscribed again (on the slot's new
    /// owner) when still wanted.
    fn dropped(&mut self, channel: &[u8]) -> Option<Pending> {
        let channel = self.subscribed.take(channel)?;
        tracing::debug!("the server ended a sharded subscription (slot moved); resubscribing");
        let target = {
            let mut st = lock(&self.state);
            st.channels.get_mut(&channel).map(|ch| {
                ch.confirmed_at = None;
                ch.target.clone()
            })
        };
        self.lingering.remove(&channel);
        let target = target?;
        if let Some(t) = target.upgrade() {
            t.released();
        }
        if self.inflight.contains_key(&channel) {
            return None;
        }
        self.inflight.insert(channel.clone(), Vec::new());
        self.subscribe_outstanding(vec![channel], Vec::new())
    }

    fn dispatch(&self, channel: &[u8], to: &[u8]) {
        // A release addresses the local queue whose turn comes next (or nobody in particular
        // with an empty message): the heads of other queues stay parked instead of all retrying.
        let target = lock(&self.state)
            .channels
            .get(channel)
            .and_then(|ch| ch.target.upgrade());
        if let Some(t) = target
            && (to.is_empty() || to == t.queue_id().as_bytes())
        {
            tracing::trace!("release notification");
            t.released();
        }
    }
}

/// Opens a pub/sub connection to `source`.
async fn open(source: &PubSubSource) -> RedisResult<(Sink, Stream)> {
    match source {
        PubSubSource::Server(client) => {
            let (sink, stream) = client.get_async_pubsub().await?.split();
            Ok((Sink::Server(sink), Stream::Server(stream)))
        }
        PubSubSource::Sentinel(sentinel) => {
            let master = sentinel.lock().await.async_get_client().await?;
            let (sink, stream) = master.get_async_pubsub().await?.split();
            Ok((Sink::Server(sink), Stream::Server(stream)))
        }
        PubSubSource::Cluster(build) => {
            let (tx, rx) = mpsc::unbounded_channel();
            let conn = build(Some(tx))?.get_async_connection().await?;
            Ok((Sink::Cluster(conn), Stream::Cluster(rx)))
        }
    }
}
