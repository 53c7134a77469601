//! `slate latch NAME set N | down | wait [--timeout D] | count`: a countdown latch from the
//! shell ("start when the three loaders are done").

use std::time::Duration;

use slate_redis::{CountDownLatch, Error};

use crate::exit;
use crate::target::Servers;

/// What `slate latch` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    /// Set the count to N, only if the latch is open (exit 0 set, 1 already counting down).
    Set,
    /// Count down by one; print the count left (0: the latch opened).
    Down,
    /// Wait until the latch is open (exit 0 open, 75 still closed after --timeout).
    Wait,
    /// Print the count (0: open).
    Count,
}

/// One `slate latch` call.
#[derive(Debug)]
pub struct LatchSpec {
    /// The deployment.
    pub servers: Servers,
    /// The latch's name.
    pub name: String,
    /// Key prefix.
    pub prefix: String,
    /// What to do.
    pub action: Action,
    /// `set`'s count.
    pub count: Option<u32>,
    /// `wait`'s limit (none: for ever).
    pub timeout: Option<Duration>,
    /// The latch's TTL (`set`, `down`).
    pub ttl: Duration,
}

/// The exit code when the latch was already counting down (`set`).
pub const NOT_SET: u8 = exit::FAILED;

/// Checks the arguments that clap cannot: `set` needs N, the others take none; `--timeout`
/// goes with `wait`.
///
/// # Errors
///
/// A message for the user.
pub fn check(action: Action, count: Option<u32>, timeout: Option<Duration>) -> Result<(), String> {
    match (action, count) {
        (Action::Set, None) => {
            return Err("slate latch NAME set needs the count: slate latch NAME set 3".to_owned());
        }
        (Action::Down | Action::Wait | Action::Count, Some(n)) => {
            return Err(format!(
                "only set takes a count ({n} given): slate latch NAME set {n}"
            ));
        }
        _ => {}
    }
    if timeout.is_some() && action != Action::Wait {
        return Err("--timeout goes with wait: slate latch NAME wait --timeout 30s".to_owned());
    }
    Ok(())
}

/// Runs `slate latch` and returns the exit code.
pub async fn latch(spec: LatchSpec) -> u8 {
    let latch = match build(&spec) {
        Ok(l) => l,
        Err(e) => {
            return exit::of_error(&e);
        }
    };
    let done = match spec.action {
        Action::Set => {
            let n = spec.count.unwrap_or(0);
            latch.try_set_count(n).await.map(|set| {
                if set {
                    println!("{n}");
                    exit::OK
                } else {
                    eprintln!(
                        "slate: latch {} is already counting down (the count is set only when \
                         it is open); slate latch {} count shows what is left",
                        spec.name, spec.name
                    );
                    NOT_SET
                }
            })
        }
        Action::Down => latch.count_down().await.map(|left| {
            println!("{left}");
            exit::OK
        }),
        Action::Count => latch.count().await.map(|n| {
            println!("{n}");
            exit::OK
        }),
        Action::Wait => {
            // One read first: a server that cannot be reached at all is said so at once (the
            // wait itself rides out a server that stops answering later).
            if let Err(e) = latch.count().await {
                return exit::of_error(&e);
            }
            let waited = match spec.timeout {
                Some(t) => latch.wait_for(t).await,
                None => latch.wait().await,
            };
            match waited {
                Ok(()) => Ok(exit::OK),
                Err(e) if e.is_timeout() => {
                    eprintln!("slate: {e}");
                    Ok(exit::BUSY)
                }
                Err(e) => Err(e),
            }
        }
    };
    done.unwrap_or_else(|e| exit::of_error(&e))
}

fn build(spec: &LatchSpec) -> Result<CountDownLatch, Error> {
    let client = spec.servers.one_client("a latch")?;
    CountDownLatch::builder(&client, &spec.name)
        .key_prefix(&spec.prefix)
        .ttl(spec.ttl)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        assert!(check(Action::Set, None, None).is_err());
        assert!(check(Action::Set, Some(3), None).is_ok());
        assert!(check(Action::Down, Some(3), None).is_err());
        assert!(check(Action::Down, None, Some(Duration::from_secs(1))).is_err());
        assert!(check(Action::Wait, None, Some(Duration::from_secs(1))).is_ok());
    }
}
