//! [`SharedStatus`]: a shared lock's holders as the server sees them.

use super::*;

/// What a shared lock's holders hold, as the server sees it: the operator's view of a
/// [`RwLock`](crate::RwLock) or a [`Semaphore`](crate::Semaphore).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
/// let status = lock.status().await?;
/// println!("{:?}: {} readers", status.mode(), status.readers());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedStatus {
    /// Permits in use (a read-write lock: one per reader, 2^30 for a writer).
    pub in_use: u64,
    /// A semaphore's capacity (`None` for a read-write lock, or a semaphore never used).
    pub capacity: Option<u64>,
    /// Every holder, soonest lease end first.
    pub holders: Vec<SharedHolder>,
}

/// One holder in a [`SharedStatus`].
///
/// # Examples
///
/// ```
/// use slate_redis::SharedHolder;
/// use std::time::Duration;
/// let h = SharedHolder { holder: "h".into(), permits: 1, reads: 1, writes: 0, token: 7, lease_left: Duration::from_secs(3) };
/// assert!(!h.writes());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedHolder {
    /// The holder id, as the client wrote it.
    pub holder: String,
    /// The permits it holds.
    pub permits: u64,
    /// Its read levels (a semaphore holder: 1).
    pub reads: u32,
    /// Its write levels.
    pub writes: u32,
    /// Its fencing token.
    pub token: u64,
    /// What is left of its lease.
    pub lease_left: Duration,
}

impl SharedHolder {
    /// Whether it holds the write lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_redis::SharedHolder;
    /// # use std::time::Duration;
    /// let h = SharedHolder { holder: "h".into(), permits: 1 << 30, reads: 0, writes: 1, token: 7, lease_left: Duration::ZERO };
    /// assert!(h.writes());
    /// ```
    #[must_use]
    pub fn writes(&self) -> bool {
        self.writes > 0
    }
}

/// How a read-write lock is held.
///
/// # Examples
///
/// ```
/// assert_ne!(slate_redis::SharedMode::Free, slate_redis::SharedMode::Read);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedMode {
    /// Nobody holds it.
    Free,
    /// Readers (or permit holders) hold it.
    Read,
    /// A writer holds it (possibly reading under its write).
    Write,
}

impl SharedStatus {
    /// How it is held.
    ///
    /// # Examples
    ///
    /// ```
    /// let s = slate_redis::SharedStatus { in_use: 0, capacity: None, holders: vec![] };
    /// assert_eq!(s.mode(), slate_redis::SharedMode::Free);
    /// ```
    #[must_use]
    pub fn mode(&self) -> SharedMode {
        if self.holders.iter().any(SharedHolder::writes) {
            SharedMode::Write
        } else if self.holders.is_empty() {
            SharedMode::Free
        } else {
            SharedMode::Read
        }
    }

    /// How many holders read (or hold permits) without writing.
    ///
    /// # Examples
    ///
    /// ```
    /// let s = slate_redis::SharedStatus { in_use: 0, capacity: None, holders: vec![] };
    /// assert_eq!(s.readers(), 0);
    /// ```
    #[must_use]
    pub fn readers(&self) -> usize {
        self.holders.iter().filter(|h| !h.writes()).count()
    }
}

pub(super) fn parse_status(v: &redis::Value) -> Option<SharedStatus> {
    use redis::Value;
    let int = |v: &Value| match v {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    let Value::Array(top) = v else { return None };
    let [in_use, capacity, Value::Array(holders)] = top.as_slice() else {
        return None;
    };
    let mut out = Vec::with_capacity(holders.len());
    for h in holders {
        let Value::Array(f) = h else { return None };
        let [Value::BulkString(id), permits, reads, writes, token, left] = f.as_slice() else {
            return None;
        };
        out.push(SharedHolder {
            holder: String::from_utf8_lossy(id).into_owned(),
            permits: u64::try_from(int(permits)?).ok()?,
            reads: u32::try_from(int(reads)?).ok()?,
            writes: u32::try_from(int(writes)?).ok()?,
            token: u64::try_from(int(token)?).ok()?,
            lease_left: Duration::from_millis(u64::try_from(int(left)?.max(0)).ok()?),
        });
    }
    Some(SharedStatus {
        in_use: u64::try_from(int(in_use)?).ok()?,
        capacity: u64::try_from(int(capacity)?).ok(),
        holders: out,
    })
}
