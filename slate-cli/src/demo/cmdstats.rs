//! Lock commands the clients sent, from `INFO commandstats` deltas (adapted from the contention
//! runner in `benches/src/contention/mod.rs`).

use std::collections::BTreeMap;

/// Commands the locks only ever issue inside their Lua scripts; Redis counts script-internal
/// calls in `INFO commandstats` too, so these are left out to get what the clients sent.
pub const SCRIPT_ONLY: &[&str] = &[
    "get", "del", "exists", "hexists", "hincrby", "hset", "hget", "hdel", "hlen", "hgetall",
    "pexpire", "expire", "pttl", "ttl", "incr", "incrby", "publish",
];

/// Commands the demo itself (and the harness) sends to the nodes, and connection setup.
pub const NOT_LOCK: &[&str] = &["info", "config", "flushall", "flushdb", "client"];

/// Parses `INFO commandstats` into command → calls.
#[must_use]
pub fn parse(info: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.trim().parse().ok());
        if let Some(calls) = calls {
            out.insert(name.to_ascii_lowercase(), calls);
        }
    }
    out
}

/// Lock commands in a commandstats map (a delta).
#[must_use]
pub fn lock_commands(stats: &BTreeMap<String, u64>) -> u64 {
    stats
        .iter()
        .filter(|(name, _)| {
            let base = name.split('|').next().unwrap_or(name);
            !SCRIPT_ONLY.contains(&base) && !NOT_LOCK.contains(&base)
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
