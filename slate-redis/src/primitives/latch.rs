//! The countdown latch: wait, across processes, until `n` things have happened.
//!
//! Redis data (every key of one latch shares the name's cluster hash slot):
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `<prefix>{<name>}:latch` | hash | `n` the count, `g` the round (the id of the request that set it); deleted when the count reaches zero; TTL = the latch's TTL, renewed by every count-down |
//! | `<prefix>{<name>}:latch:r:<request>` | string | a set's or count-down's answer, so that the same request sent again answers it again and changes nothing; TTL = the retry window (2 × command timeout) |
//! | `<prefix>{<name>}:latch:open` | channel | one message each time the latch opens |
//!
//! See `scripts/latch_set.lua` and `scripts/latch_down.lua`.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_aqs::Notifications;
use slate_core::metrics::{LatchSet, LatchWait, Meter};
use slate_core::registry::Registered;
use slate_core::{BackendKind, Error, HolderId, LockName, LockOptionsBuilder, Result, TimeoutKind};
use tokio::sync::Notify;

use crate::RedisClient;
use crate::client::lock;
use crate::primitives::lock::ClientSource;
use crate::scripts::keys::Keys;
use crate::scripts::{call, lease_ms, request};
use crate::services::notify::ReleaseTarget;

const MAX_COUNT: u32 = CountDownLatch::MAX_COUNT;

/// The longest TTL a latch takes (as the locks' durations): a larger one would overflow the
/// server's expiry and leave a script half done.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a set's or count-down's answer is kept for its resends: twice the command
/// timeout (the window in which the client sends it again), and at least an hour (or the
/// latch's TTL if shorter), so that a copy that reaches a stalled server long after it was
/// sent still finds its record and counts nothing.
fn record_window_ms(command_timeout: Duration, ttl: Duration) -> u64 {
    request::record_ttl_ms(command_timeout).max(lease_ms(ttl.min(Duration::from_secs(3600))))
}

/// How long a waiter whose notifications are live goes without looking at the count: the
/// spin wait that catches a message lost with a broken pub/sub connection (the connection's
/// own reconnection wakes every waiter as well).
const LIVE_RECHECK: Duration = Duration::from_secs(1);

/// A countdown latch shared by every process: waiters wait until the count, set by
/// [`try_set_count`](Self::try_set_count), has been counted down to zero by
/// [`count_down`](Self::count_down) ("start when the three loaders are done").
///
/// ## Behaviour
///
/// - **Set only when open**: [`try_set_count(n)`](Self::try_set_count) sets the count when it
///   is zero (no latch), and answers `false` without touching it otherwise (as Redisson's
///   `trySetCount`). A latch can be used again once it opened.
/// - **Counted once**: a count-down sent again after its reply was lost (a broken connection,
///   a server that did not answer in time) is recognized by its request's record and never
///   counts twice, also when the latch opened and was set again in between (within the retry
///   window, twice the client's command timeout); a set sent again answers what it first did.
/// - **No opening missed**: a waiter returns once the round it waited for has opened, even
///   when the latch was set again before it looked (each round has an id). A waiter whose
///   first reads fail (a server that does not answer) learns its round only from its first
///   answer: a round that opened and was set again before then is not seen.
/// - **Waiting without polling**: [`wait`](Self::wait) subscribes to the latch's channel and
///   is woken by the message the count-down that opens the latch publishes; a message lost
///   with a broken pub/sub connection is caught by a check of the count every second (every
///   spin wait, 50 ms by default, while the pub/sub connection is down). A waiter rides out a
///   server that does not answer (paused, restarting) until its own deadline.
/// - **TTL**: the latch's key expires when nobody set or counted it down for the TTL (a day by
///   default, [`CountDownLatchBuilder::ttl`]), so an abandoned latch goes away. An expired
///   latch reads as open: choose a TTL longer than anyone waits.
/// - No count-down is lost to a crash, but nothing counts down for a crashed process either:
///   a waiter that must not wait for ever uses [`wait_for`](Self::wait_for).
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{CountDownLatch, RedisClient};
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let loaders = CountDownLatch::builder(&client, "loaders").build()?;
/// loaders.try_set_count(3).await?;
/// // ... each of three loaders, in any process, calls `loaders.count_down()` when done ...
/// loaders.wait().await?; // returns once all three have
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    state: Arc<LatchState>,
    ttl: Duration,
    spin_wait: Duration,
}

/// Builds a [`CountDownLatch`] (see [`CountDownLatch::builder`]).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let latch = slate_redis::CountDownLatch::builder(&client, "loaders")
///     .ttl(std::time::Duration::from_secs(3600))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct CountDownLatchBuilder {
    source: ClientSource,
    name: Result<LockName>,
    ttl: Duration,
    options: LockOptionsBuilder,
}

impl CountDownLatchBuilder {
    /// How long the latch outlives its last set or count-down, a second to 365 days (default
    /// [`CountDownLatch::DEFAULT_TTL`], a day): an abandoned latch goes away after it, and then reads as open.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders")
    ///     .ttl(std::time::Duration::from_secs(600))
    ///     .build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The prefix of the latch's Redis keys (default `slate:`; no braces).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders")
    ///     .key_prefix("billing:")
    ///     .build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options = self.options.key_prefix(prefix);
        self
    }

    /// How often a waiter checks the count while the client's pub/sub connection is down
    /// (default 50 ms, at least 1 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders")
    ///     .spin_wait(std::time::Duration::from_millis(200))
    ///     .build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn spin_wait(mut self, every: Duration) -> Self {
        self.options = self.options.spin_wait(every);
        self
    }

    /// Builds the latch (nothing is sent to Redis).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or prefix, a spin wait under 1 ms, or a TTL
    /// under a second.
    pub fn build(self) -> Result<CountDownLatch> {
        let name = self.name?;
        let options = self.options.build()?;
        if self.ttl < Duration::from_secs(1) || self.ttl > MAX_TTL {
            return Err(Error::invalid_input(
                "latch TTL",
                format!("{:?}", self.ttl),
                "use a TTL between a second and 365 days, longer than anyone waits for the \
                 latch",
            ));
        }
        let client = self.source.0;
        let keys = LatchKeys::new(options.key_prefix(), &name);
        let state = client
            .inner
            .locks
            .get_or_create(keys.latch.clone(), &name, (), |()| {
                Arc::new(LatchState {
                    meter: client.lock_meter("latch", &name),
                    client: client.clone(),
                    label: Arc::from(name.to_string()),
                    name: name.clone(),
                    keys,
                    waiters: Mutex::new(0),
                    opened: Notify::new(),
                })
            })?;
        Ok(CountDownLatch {
            state,
            ttl: self.ttl,
            spin_wait: options.spin_wait(),
        })
    }
}

/// The keys of one latch.
#[derive(Debug)]
struct LatchKeys {
    latch: Arc<[u8]>,
    channel: Arc<[u8]>,
}

impl LatchKeys {
    fn new(prefix: &str, name: &LockName) -> Self {
        // The lock's key rule (a non-empty hash tag for every name), with the latch's suffixes.
        let base = Keys::new(prefix, name).lock;
        let with = |suffix: &[u8]| -> Arc<[u8]> {
            let mut k = base.to_vec();
            k.extend_from_slice(suffix);
            Arc::from(k)
        };
        LatchKeys {
            latch: with(b":latch"),
            channel: with(b":latch:open"),
        }
    }

    /// The record of request `request`: `<prefix>{<name>}:latch:r:<request>`.
    fn record(&self, request: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.latch.len() + 3 + request.len());
        k.extend_from_slice(&self.latch);
        k.extend_from_slice(b":r:");
        k.extend_from_slice(request.as_bytes());
        k
    }
}

/// What every handle of one latch in one client shares: its local waiters and their wake-up.
struct LatchState {
    client: RedisClient,
    name: LockName,
    label: Arc<str>,
    keys: LatchKeys,
    /// Tasks of this process in `wait`: the channel is subscribed while there are any. Changed
    /// together with the subscription, so that the last waiter's unsubscription cannot come
    /// after a new waiter's subscription.
    waiters: Mutex<usize>,
    /// Woken by each message on the channel, and by the pub/sub connection's reconnection.
    opened: Notify,
    /// The latch's metrics (`primitive = latch`).
    meter: Meter,
}

impl Registered for LatchState {
    type Settings = ();

    fn settings(&self) {}

    fn waiters(&self) -> usize {
        *lock(&self.waiters)
    }
}

impl ReleaseTarget for LatchState {
    fn released(&self) {
        self.opened.notify_waiters();
    }

    fn queue_id(&self) -> &str {
        // The latch's messages are addressed to everyone (an empty message).
        ""
    }
}

/// A task in `wait`: counted while it lives; the last one to leave unsubscribes.
struct Waiting<'a>(&'a LatchState);

impl<'a> Waiting<'a> {
    fn new(state: &'a LatchState) -> Self {
        *lock(&state.waiters) += 1;
        state.meter.latch_waiting(true);
        Waiting(state)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.meter.latch_waiting(false);
        let mut n = lock(&self.0.waiters);
        *n -= 1;
        if *n == 0 {
            self.0
                .client
                .inner
                .notifier
                .unsubscribe(&self.0.client, &self.0.keys.channel);
        }
    }
}

fn check_count(n: u32) -> Result<()> {
    if n == 0 || n > MAX_COUNT {
        return Err(Error::invalid_input(
            "latch count",
            n.to_string(),
            format!("set a count between 1 and {MAX_COUNT} (a latch at zero is open)"),
        ));
    }
    Ok(())
}

impl CountDownLatch {
    /// The largest count a latch takes.
    pub const MAX_COUNT: u32 = 1 << 30;

    /// The TTL of a latch unless the builder sets another: a day.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);

    /// Starts building the latch `name` on `client`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn builder(
        client: impl Into<ClientSource>,
        name: impl AsRef<[u8]>,
    ) -> CountDownLatchBuilder {
        CountDownLatchBuilder {
            source: client.into(),
            name: LockName::new(name),
            ttl: Self::DEFAULT_TTL,
            options: LockOptionsBuilder::default(),
        }
    }

    /// The latch's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// assert_eq!(latch.name().to_string(), "loaders");
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        &self.state.name
    }

    /// The latch's hash key in Redis (`<prefix>{<name>}:latch`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// assert_eq!(latch.key(), b"slate:{loaders}:latch");
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    #[must_use]
    pub fn key(&self) -> &[u8] {
        &self.state.keys.latch
    }

    /// Sets the count to `count` if the latch is open (count zero); answers whether it did.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// if !latch.try_set_count(3).await? {
    ///     println!("a round is already counting down: {} left", latch.count().await?);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a count of 0 or above
    /// [`MAX_COUNT`](Self::MAX_COUNT); backend failures.
    /// After a failure the count may or may not have been set ([`count`](Self::count) tells).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have set the count.
    pub async fn try_set_count(&self, count: u32) -> Result<bool> {
        check_count(count)?;
        let request = HolderId::new().to_string();
        let st = &self.state;
        let record = st.keys.record(&request);
        let call = call::LatchSet {
            latch: &st.keys.latch,
            record: &record,
            count: u64::from(count),
            ttl_ms: lease_ms(self.ttl),
            request: &request,
            window_ms: record_window_ms(st.client.command_timeout(), self.ttl),
        };
        let set: Result<i64> = self
            .resending("latch set script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await;
        st.meter.latch_set(match set {
            Ok(1) => LatchSet::Set,
            Ok(_) => LatchSet::Refused,
            Err(_) => LatchSet::Error,
        });
        Ok(set? == 1)
    }

    /// Counts the latch down by one and answers the count left (0: the latch is open, and its
    /// waiters were told). On an open latch it does nothing and answers 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// let left = latch.count_down().await?;
    /// println!("{left} loaders to go");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures, once the request was sent again within twice the command timeout
    /// (each send carries one request id: however many of them ran, the latch counted one).
    /// After a failure the count-down may or may not have counted. A latch key holding a
    /// count no latch sets (another program's data, or damaged) is a
    /// [`BackendKind::Response`] error, not an opening.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may or may not have counted (once at most).
    pub async fn count_down(&self) -> Result<u32> {
        let request = HolderId::new().to_string();
        let st = &self.state;
        let record = st.keys.record(&request);
        let call = call::LatchDown {
            latch: &st.keys.latch,
            record: &record,
            channel: &st.keys.channel,
            ttl_ms: lease_ms(self.ttl),
            window_ms: record_window_ms(st.client.command_timeout(), self.ttl),
            publish: st.client.publish_arg(),
        };
        let left: Result<i64> = self
            .resending("latch count-down script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await;
        st.meter.latch_counted_down(left.is_ok());
        let left = left?;
        // A count outside 0..=MAX_COUNT was not set by a latch (another program's data, or
        // damaged): not "open".
        match u32::try_from(left) {
            Ok(n) if n <= MAX_COUNT => Ok(n),
            _ => Err(crate::client::unexpected_reply(
                "latch count-down script (the latch's count is not one a latch sets)",
                st.client.address(),
                left,
            )),
        }
    }

    /// The count now (0: open, or no latch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// println!("{} left", latch.count().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn count(&self) -> Result<u32> {
        Ok(self.read().await?.0)
    }

    /// The count and the round (none: open).
    async fn read(&self) -> Result<(u32, Option<String>)> {
        let key = &self.state.keys.latch;
        let (n, round): (Option<u32>, Option<String>) = self
            .state
            .client
            .exec("latch count", |mut c| async move {
                redis::cmd("HMGET")
                    .arg(&**key)
                    .arg("n")
                    .arg("g")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok((n.unwrap_or(0), round))
    }

    /// Waits until the latch is open (count zero).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// latch.wait().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Failures that waiting longer cannot cure (authentication, permissions, a bad server
    /// reply). A server that does not answer is waited out.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future stops waiting (the channel is unsubscribed after the
    /// last local waiter left).
    pub async fn wait(&self) -> Result<()> {
        self.wait_until(None).await
    }

    /// Waits until the latch is open, at most `within` (a `within` too long to add to the
    /// clock waits for ever).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let latch = slate_redis::CountDownLatch::builder(&client, "loaders").build()?;
    /// match latch.wait_for(std::time::Duration::from_secs(30)).await {
    ///     Ok(()) => println!("all loaders done"),
    ///     Err(e) if e.is_timeout() => println!("still {} to go", latch.count().await?),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] (kind [`TimeoutKind::Wait`]) when the latch is still closed after
    /// `within` (or the server could not tell); otherwise as [`wait`](Self::wait).
    ///
    /// # Cancel safety
    ///
    /// As [`wait`](Self::wait).
    pub async fn wait_for(&self, within: Duration) -> Result<()> {
        // A wait too long to add to the clock is a wait for ever.
        self.wait_until(Instant::now().checked_add(within)).await
    }

    /// Waits until the latch is open or `deadline` passes, and records how the wait ended.
    async fn wait_until(&self, deadline: Option<Instant>) -> Result<()> {
        let start = Instant::now();
        let waited = self.wait_open(start, deadline).await;
        let outcome = match &waited {
            Ok(()) => LatchWait::Opened,
            Err(e) if e.is_timeout() => LatchWait::TimedOut,
            Err(_) => LatchWait::Error,
        };
        self.state.meter.latch_waited(outcome, start.elapsed());
        waited
    }

    async fn wait_open(&self, start: Instant, deadline: Option<Instant>) -> Result<()> {
        let st = &*self.state;
        let _waiting = Waiting::new(st);
        let target: std::sync::Weak<dyn ReleaseTarget> = Arc::downgrade(&self.state) as _;
        let timed_out = || {
            Error::timeout(
                Arc::clone(&st.label),
                TimeoutKind::Wait,
                deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(start)),
                start.elapsed(),
            )
        };
        let mut notifications = Notifications::Off;
        // The round this waiter waits for: a later read that finds another round (or none)
        // means that one opened, even if it was set again before this waiter looked.
        let mut waiting_for: Option<String> = None;
        loop {
            // Armed before the read, so that a message after it is not missed.
            let opened = st.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            let sent = Instant::now();
            let read = match deadline {
                None => self.read().await,
                Some(d) => tokio::time::timeout_at(d.into(), self.read())
                    .await
                    .map_err(|_| timed_out())?,
            };
            let closed = match read {
                Ok((0, _)) => return Ok(()),
                Ok((_, round)) => {
                    if waiting_for.is_some() && round != waiting_for {
                        return Ok(());
                    }
                    waiting_for = waiting_for.or(round);
                    true
                }
                Err(e) if e.is_retryable() => {
                    tracing::debug!(latch = %st.label, error = %e, "latch count unavailable; waiting on");
                    false
                }
                Err(e) => return Err(e),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out());
            }
            if notifications != Notifications::Live {
                let subscribe = st.client.subscribe_releases(
                    st.keys.channel.clone(),
                    target.clone(),
                    Some(sent),
                );
                notifications = match deadline {
                    None => subscribe.await,
                    Some(d) => tokio::time::timeout_at(d.into(), subscribe)
                        .await
                        .map_err(|_| timed_out())?,
                };
                if notifications == Notifications::Started && closed {
                    // Confirmed after the read: a message may have come before it. Read again.
                    continue;
                }
            }
            let pause = match (notifications, closed) {
                (Notifications::Live, true) => LIVE_RECHECK,
                _ => self.spin_wait,
            };
            let wake = deadline.map_or(Instant::now() + pause, |d| d.min(Instant::now() + pause));
            tokio::select! {
                () = opened => {}
                () = tokio::time::sleep_until(wake.into()) => {
                    // A pub/sub connection that broke meanwhile reports Off on the next
                    // subscription: ask again.
                    notifications = Notifications::Off;
                }
            }
        }
    }

    /// Sends `f` until it answers, for an idempotent request: a broken connection is handled
    /// by the client (`exec`), a timeout by one more send with the same request within twice
    /// the command timeout (the retry window the scripts keep their records for).
    async fn resending<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T>
    where
        F: Fn(crate::client::conn::Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let client = &self.state.client;
        let start = Instant::now();
        loop {
            match client.exec(what, &f).await {
                Err(e)
                    if e.backend_kind() == Some(BackendKind::Timeout)
                        && start.elapsed() < client.command_timeout() * 2 =>
                {
                    tracing::debug!(latch = %self.state.label, error = %e, "{what}: no reply in time; sending the same request again");
                }
                r => return r,
            }
        }
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("name", &self.state.label)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_name_slot() {
        let k = LatchKeys::new("p:", &LockName::new("a").unwrap());
        assert_eq!(&*k.latch, b"p:{a}:latch");
        assert_eq!(k.record("7"), b"p:{a}:latch:r:7");
        assert_eq!(&*k.channel, b"p:{a}:latch:open");
    }

    #[test]
    fn counts_are_checked() {
        assert!(check_count(0).is_err_and(|e| e.is_invalid_input()));
        assert!(check_count(MAX_COUNT + 1).is_err_and(|e| e.is_invalid_input()));
        assert!(check_count(1).is_ok());
    }
}
