//! Which Redis servers a command talks to, and the lock built on them: one URL gives a single
//! lock, several give a combination lock (in the order given, which is the acquisition order).

use std::time::Duration;

use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_core::{Error, LockName};
use slate_redis::{RedisClient, SingleLock};

/// The environment variable read when no `--redis` is given (comma-separated URLs).
pub const REDIS_ENV: &str = "SLATE_REDIS_URL";

/// The default quarantine of a restarted node (the library's default).
const DEFAULT_QUARANTINE: Duration = Duration::from_secs(30);

/// The URLs from `--redis` (each may hold several, comma-separated), or else from
/// `SLATE_REDIS_URL`.
///
/// # Errors
///
/// A message for the user when there is none.
pub fn resolve_urls(flags: &[String]) -> Result<Vec<String>, String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut urls: Vec<String> = flags.iter().flat_map(|f| split(f)).collect();
    if urls.is_empty()
        && let Ok(env) = std::env::var(REDIS_ENV)
    {
        urls = split(&env);
    }
    if urls.is_empty() {
        return Err(format!(
            "no Redis server given: pass --redis URL (once per node; several make a combination \
             lock) or set {REDIS_ENV} (comma-separated), e.g. --redis redis://127.0.0.1:6379"
        ));
    }
    Ok(urls)
}

/// A lock on one server or across several.
#[derive(Clone, Debug)]
pub enum Target {
    /// One URL.
    Single(SingleLock),
    /// Several URLs.
    Combination(CombinationLock),
}

impl Target {
    /// Builds the lock `name` on `urls` (call inside a tokio runtime).
    ///
    /// For a combination lock, the node set's quarantine of restarted servers is the library
    /// default (30 s) or the lease if that is longer (the library requires quarantine ≥ lease).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad URL, name, lease or prefix.
    pub fn build(
        urls: &[String],
        name: &str,
        prefix: &str,
        lease: Duration,
    ) -> Result<Self, Error> {
        match urls {
            [url] => {
                let client = RedisClient::open(url)?;
                let lock = SingleLock::builder(&client, name)
                    .lease(lease)
                    .key_prefix(prefix)
                    .build()?;
                Ok(Target::Single(lock))
            }
            _ => {
                let options = NodeSetOptions::default().quarantine(DEFAULT_QUARANTINE.max(lease));
                let nodes = NodeSet::connect(urls, options)?;
                let lock = CombinationLock::builder(&nodes, name)
                    .lease(lease)
                    .key_prefix(prefix)
                    .build()?;
                Ok(Target::Combination(lock))
            }
        }
    }
}

/// Validates a lock name the way the locks do (so that `status` refuses what `run` would).
///
/// # Errors
///
/// [`Error::InvalidInput`].
pub fn check_name(name: &str) -> Result<LockName, Error> {
    LockName::new(name)
}

/// The address of a URL without credentials (for messages), as the client reports it.
#[must_use]
pub fn display_address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    host.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_from_flags_split_on_commas() {
        let flags = vec![
            "redis://a:1,redis://b:2".to_owned(),
            "redis://c:3".to_owned(),
        ];
        assert_eq!(
            resolve_urls(&flags).expect("urls"),
            ["redis://a:1", "redis://b:2", "redis://c:3"]
        );
    }

    #[test]
    fn credentials_are_not_displayed() {
        assert_eq!(display_address("redis://u:secret@host:1/0"), "host:1/0");
        assert_eq!(display_address("redis://host:1"), "host:1");
    }
}
