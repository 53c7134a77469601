//! Lock commands the clients sent, from `INFO commandstats` deltas (used by the contention
//! runner in `benches` and by `slate demo`).
//!
//! Redis counts the commands a Lua script runs in `INFO commandstats` too; [`SCRIPT_ONLY`]
//! lists those the Slate scripts (and the compared libraries' scripts) run, which no client
//! sends directly to a lock node, so that what is left is what clients sent.

use std::collections::BTreeMap;

/// Commands the locks only ever issue inside their Lua scripts (`SET` is not among them: the
/// `rslock` crate and the naive spin lock send it themselves).
pub const SCRIPT_ONLY: &[&str] = &[
    "get", "del", "exists", "hexists", "hincrby", "hset", "hget", "hdel", "hlen", "hgetall",
    "hmget", "pexpire", "expire", "pttl", "ttl", "incr", "incrby", "publish", "spublish", "time",
    "zadd", "zrem", "zrange",
];

/// Commands a measuring program itself sends to the nodes, and connection setup.
pub const NOT_LOCK: &[&str] = &["info", "config", "flushall", "flushdb", "client"];

/// Parses `INFO commandstats` into command → calls.
///
/// # Examples
///
/// ```
/// let m = slate_history::commandstats::parse("cmdstat_evalsha:calls=3,usec=9\r\n");
/// assert_eq!(m["evalsha"], 3);
/// ```
#[must_use]
pub fn parse(info: &str) -> BTreeMap<String, u64> {
    parse_field(info, "calls=")
}

/// Parses `INFO commandstats` into command → microseconds spent in it. A script's own entry
/// (`evalsha`) includes the commands it ran, which are also counted under their own names.
///
/// # Examples
///
/// ```
/// let m = slate_history::commandstats::parse_usec("cmdstat_evalsha:calls=3,usec=9\r\n");
/// assert_eq!(m["evalsha"], 9);
/// ```
#[must_use]
pub fn parse_usec(info: &str) -> BTreeMap<String, u64> {
    parse_field(info, "usec=")
}

fn parse_field(info: &str, field: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let value = fields
            .split(',')
            .find_map(|f| f.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok());
        if let Some(value) = value {
            out.insert(name.to_ascii_lowercase(), value);
        }
    }
    out
}

/// Lock commands in a commandstats map (a delta): everything but [`SCRIPT_ONLY`] and
/// [`NOT_LOCK`].
#[must_use]
pub fn lock_commands(stats: &BTreeMap<String, u64>) -> u64 {
    lock_commands_except(stats, &[])
}

/// Commands Slate's own locks run only inside their scripts beyond [`SCRIPT_ONLY`]: `SET` (the
/// request records). Slate sends `SET` itself only to write a node marker, once per server.
pub const SLATE_SCRIPT_ONLY: &[&str] = &["set"];

/// Slate's lock commands in a commandstats delta of Slate's locks alone: [`lock_commands`]
/// without [`SLATE_SCRIPT_ONLY`].
///
/// # Examples
///
/// ```
/// let m = slate_history::commandstats::parse("cmdstat_evalsha:calls=2\r\ncmdstat_set:calls=2\r\n");
/// assert_eq!(slate_history::commandstats::slate_lock_commands(&m), 2);
/// assert_eq!(slate_history::commandstats::lock_commands(&m), 4);
/// ```
#[must_use]
pub fn slate_lock_commands(stats: &BTreeMap<String, u64>) -> u64 {
    lock_commands_except(stats, SLATE_SCRIPT_ONLY)
}

fn lock_commands_except(stats: &BTreeMap<String, u64>, also_internal: &[&str]) -> u64 {
    stats
        .iter()
        .filter(|(name, _)| {
            let base = name.split('|').next().unwrap_or(name);
            !SCRIPT_ONLY.contains(&base)
                && !NOT_LOCK.contains(&base)
                && !also_internal.contains(&base)
        })
        .map(|(_, calls)| calls)
        .sum()
}

/// `after − before`, per command (a restarted server starts from zero: pass its state at the
/// restart as `before`).
#[must_use]
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// Adds `more` into `acc`.
pub fn add(acc: &mut BTreeMap<String, u64>, more: &BTreeMap<String, u64>) {
    for (k, v) in more {
        *acc.entry(k.clone()).or_insert(0) += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_filters() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5\r\n\
                    cmdstat_hincrby:calls=10,usec=1\r\ncmdstat_info:calls=2,usec=1\r\n\
                    cmdstat_client|setinfo:calls=4,usec=1\r\ncmdstat_ping:calls=1,usec=1\r\n";
        let m = parse(info);
        assert_eq!(m.get("evalsha"), Some(&10));
        assert_eq!(lock_commands(&m), 11);
        let mut before = BTreeMap::new();
        before.insert("evalsha".to_owned(), 4);
        assert_eq!(delta(&before, &m).get("evalsha"), Some(&6));
    }
}
