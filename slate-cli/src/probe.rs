//! Direct connections to the servers of a deployment, for the commands that look at the
//! servers themselves rather than through a lock (`slate doctor`, `slate top`): a connection
//! with a budget, a cluster's masters, a Sentinel group's master, and URLs rewritten for them.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// Budget of one server's connection and of each of its commands.
pub const BUDGET: Duration = Duration::from_secs(3);

/// A connection to `url` within [`BUDGET`] (each command too).
pub async fn connect(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| format!("bad URL: {e}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(BUDGET))
        .set_response_timeout(Some(BUDGET));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())
}

/// The masters a cluster node knows (`CLUSTER NODES`, failed ones left out), as URLs with
/// `seed`'s scheme and credentials.
pub async fn cluster_masters(
    conn: &mut MultiplexedConnection,
    seed: &str,
) -> Result<Vec<String>, String> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 3 || !f[2].contains("master") || f[2].contains("fail") {
                return None;
            }
            let addr = f[1].split('@').next().unwrap_or(f[1]);
            let (host, port) = addr.rsplit_once(':')?;
            Some(with_host(seed, host, port))
        })
        .collect())
}

/// The address a Sentinel gives for the master `name` (`None`: it knows no such master), as
/// a URL with the Sentinel URL's scheme and credentials.
pub async fn sentinel_master(
    conn: &mut MultiplexedConnection,
    sentinel: &str,
    name: &str,
) -> Result<Option<String>, String> {
    let r: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(name)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.map(|(host, port)| with_host(sentinel, &host, &port)))
}

/// `url` with its host and port replaced (keeping scheme, credentials and database).
pub fn with_host(url: &str, host: &str, port: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let (creds, after) = match rest.rsplit_once('@') {
        Some((c, a)) => (format!("{c}@"), a),
        None => (String::new(), rest),
    };
    let path = after.find('/').map_or("", |i| &after[i..]);
    format!("{scheme}://{creds}{host}:{port}{path}")
}

/// `url` without its password.
pub fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((creds, after)) => {
                let user = creds.split(':').next().unwrap_or("");
                format!("{scheme}://{user}@{after}")
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_their_scheme_credentials_and_database() {
        assert_eq!(
            with_host("rediss://u:p@s:26379/2", "10.0.0.1", "6380"),
            "rediss://u:p@10.0.0.1:6380/2"
        );
        assert_eq!(with_host("redis://s:1", "h", "2"), "redis://h:2");
        assert_eq!(redact("redis://u:secret@h:1"), "redis://u@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
