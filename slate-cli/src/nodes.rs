//! `slate nodes adopt`: declare brand-new servers fresh, so that a combination lock uses them
//! at once instead of after the restart quarantine.

use std::time::Duration;

use slate_combination::{NodeSet, NodeSetOptions};

use crate::exit;

/// The safety note printed with every adoption (the library's `adopt_fresh_servers` says the
/// same).
pub const SAFETY: &str = "slate: note: adopt only brand-new servers. A server that restarted \
without its data while a lock on it was held would be used at once, and two holders could \
overlap; never adopt while a lock on these servers may be held.";

/// How long each server has to answer.
const NODE_TIME: Duration = Duration::from_millis(500);

/// `slate nodes adopt`: marks every reachable server, recording `quarantine` as the bound of
/// every lease there; exit 0 when all were marked, 69 when some could not be reached, 2 for
/// bad input (one URL, a server listed twice, a zero quarantine).
pub async fn adopt(urls: &[String], prefix: &str, quarantine: Duration) -> u8 {
    if urls.len() < 2 {
        eprintln!(
            "slate: nodes adopt is for the servers of a combination lock (two or more --redis); \
             a single lock has no quarantine"
        );
        return exit::USAGE;
    }
    let nodes = match NodeSetOptions::builder()
        .node_operation_time(NODE_TIME)
        .quarantine(quarantine)
        .build()
        .and_then(|options| NodeSet::connect(urls, options))
    {
        Ok(n) => n,
        Err(e) => {
            eprintln!("slate: {e}");
            return exit::USAGE;
        }
    };
    if let Err(e) = nodes.check_distinct_servers().await {
        eprintln!("slate: {e}");
        return exit::USAGE;
    }
    let marked = match nodes.adopt_fresh_servers(prefix).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("slate: {e}");
            return exit::USAGE;
        }
    };
    println!(
        "marked {marked} of {} servers as fresh: combination locks use them at once, with leases \
         of at most {quarantine:?}",
        nodes.len()
    );
    eprintln!("{SAFETY}");
    if marked == nodes.len() {
        exit::OK
    } else {
        eprintln!(
            "slate: {} server(s) did not answer within {NODE_TIME:?}; run it again once they are up",
            nodes.len() - marked
        );
        exit::REDIS
    }
}
