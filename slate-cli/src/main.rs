//! The `slate` command: run a command under a distributed lock (`flock`, across machines),
//! inspect and clear locks, and a live demo that needs nothing but `redis-server`.
//!
//! ```text
//! slate run --lock NAME [--lock NAME]... [--redis URL]... [--lease 30s] [--wait 10s] [--on-lost kill|term|ignore]
//!           [--read | --write | --permits K --of N] -- CMD [ARGS]...
//! slate status NAME [NAME]... [--redis URL]... [--json]
//! slate unlock --force NAME [--redis URL]...
//!   (instead of --redis: --cluster URL... for a Redis Cluster, --sentinel URL...
//!    --master-name NAME for a Sentinel-managed master, or --zookeeper HOST:PORT[,...] for the
//!    ZooKeeper lock)
//! slate latch NAME set N | down | wait [--timeout D] | count [--redis URL] [--ttl 24h]
//! slate nodes adopt [--redis URL]...
//! slate completions bash|zsh|fish|elvish|powershell
//! slate man
//! slate demo [--duration 20s] [--workers 3] [--tasks 4]
//! ```
//!
//! One `--redis` makes a single lock; several make a combination lock over those masters, in
//! that order. `--cluster` (seed nodes) makes a single lock on a Redis Cluster; `--sentinel`
//! with `--master-name` a single lock on the master the Sentinels name, following failovers. Without `--redis`, `SLATE_REDIS_URL` is read (comma-separated). Exit codes: see
//! [`exit::TABLE`].

#![forbid(unsafe_code)]

mod demo;
mod doctor;
mod duration;
mod exit;
mod latch;
mod multi;
mod nodes;
mod probe;
mod run;
mod status;
mod target;
mod top;
mod tree;
mod zk;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration::WaitFor;
use crate::run::{OnLost, RunSpec};

const ABOUT: &str = "Slate: distributed locks on Redis.\n\n\
Run a command under a lock shared by every machine that can reach the same Redis (flock, across \
machines), look at a lock, clear a stuck one, or watch a live demo.\n\n\
Start here:  slate demo            (needs only redis-server on PATH)";

const REDIS_HELP: &str = "Redis master URL, redis://[user:password@]host:port[/db]. Once for a \
single lock; repeat (or separate with commas) for a combination lock over independent masters, \
in acquisition order. Default: $SLATE_REDIS_URL (comma-separated)";

#[derive(Debug, Parser)]
#[command(name = "slate", version, about = ABOUT, after_help = exit::TABLE)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run CMD while holding a lock; release it when CMD exits (flock across machines).
    #[command(
        long_about = "Take the lock, run CMD while holding it (the lease is renewed in the \
background), release the lock when CMD exits and exit with CMD's exit code.\n\n\
SIGINT, SIGTERM and SIGHUP sent to slate are forwarded to CMD and its process group (a Ctrl-C \
at the terminal reaches CMD directly); slate waits for CMD to exit, then releases.\n\n\
CMD is started by a small guardian process, the parent (on Linux the subreaper) of its whole \
tree, whatever process groups or sessions it moves to. The guardian kills the whole tree when \
slate dies (SIGKILL included), when the lease is about to end without a renewal having reached \
it (slate stopped, hung or starved: it holds the lease deadline itself), and when CMD exits, \
before the lock is released: nothing of CMD runs once another holder can get the lock.\n\n\
CMD gets SLATE_LOCK, SLATE_FENCING_TOKEN (strictly increasing across holders: pass it to the \
storage you write to) and SLATE_HOLDER in its environment.\n\n\
With --lock given more than once, CMD runs while every name is held (all or nothing; names are \
taken in one canonical order, so jobs naming overlapping sets in any order never deadlock); it \
gets SLATE_LOCK=a,b and SLATE_FENCING_TOKENS=a=12,b=40 (each name's own token) instead of \
SLATE_FENCING_TOKEN.\n\n\
By default (or with --write) CMD runs alone. With --read it runs beside the other --read jobs \
of the name, never beside a writer; a writer waits for the readers inside to leave and keeps new \
ones out meanwhile. With --permits K --of N it takes K of the N permits of a semaphore named \
by --lock.\n\n\
Example, a cron job that must not overlap across machines:\n  \
*/5 * * * *  slate run --lock nightly-report --redis redis://redis.internal:6379 --wait 0s -- /usr/local/bin/report",
        after_help = exit::TABLE
    )]
    Run(RunArgs),
    /// Show a lock on every node: holder(s), reentry count, remaining TTL, fencing counter.
    #[command(
        after_help = "Exit codes: 0 every node answered, 69 some node did not (the \
table shows which), 2 usage error."
    )]
    Status(StatusArgs),
    /// Delete a lock whoever holds it (needs --force; unsafe while its holder still runs).
    #[command(
        after_help = "Exit codes: 0 deleted or nothing to delete, 2 without --force, \
69 Redis error."
    )]
    Unlock(UnlockArgs),
    /// A countdown latch: set it to N, count it down, or wait until it reaches zero.
    #[command(
        long_about = "A countdown latch shared by every machine that reaches the same Redis: \
`set N` starts a round (only when the latch is open), each `down` counts one, and every `wait` \
returns once the count is zero (woken by a message, not by polling).\n\n\
A `down` whose reply is lost is sent again and counts once. The latch's key expires after \
--ttl without a set or count-down (an expired latch reads as open).\n\n\
Example, start a job when three loaders are done:\n  \
slate latch loaders set 3\n  \
(each loader, when done)  slate latch loaders down\n  \
slate latch loaders wait --timeout 1h && run-report",
        after_help = "Exit codes: 0 done (set: the count was set; wait: the latch is open), \
1 set: the latch is already counting down (not set), 75 wait: still closed after --timeout, \
69 Redis unavailable, 2 usage error."
    )]
    Latch(LatchArgs),
    /// Check a deployment for what breaks or weakens a lock's guarantees.
    #[command(
        long_about = "Checks the servers a lock would use for what breaks or weakens its \
guarantees: the server and its version, maxmemory-policy (an eviction policy drops held locks), \
persistence (what a restart loses), replicas and their lag (what a failover loses), the cluster's \
state, the ACL user's permissions for every command Slate sends, the round trip and the server \
clock against the lease, and, for several --redis (a combination lock), servers listed twice or \
in one replica group. With --zookeeper: the session and the ensemble's size.\n\n\
Each finding is ok, advisory (a guarantee holds, with a cost or a window worth knowing) or \
UNSAFE (something can break a guarantee), with its consequence and its fix.",
        after_help = "Exit codes: 0 nothing can break a guarantee (advisories may remain), \
1 something can (an UNSAFE finding, including a server that cannot be reached), 2 usage error."
    )]
    Doctor(DoctorArgs),
    /// Watch the locks under a prefix: holder, token, lease left, waiting processes.
    #[command(
        long_about = "A live view of the locks held or waited for under the prefix, refreshed \
every --interval (q, Esc or Ctrl-C quits): single locks, read-write locks (their mode) and \
semaphores (their permits in use), each with its holder, fencing token, lease left and the \
processes waiting in its line. --once prints one snapshot as a table, --json as JSON.\n\n\
Names given are read directly; without names the locks are found with SCAN, at most \
--scan-limit keys examined per master and refresh, so a server with millions of keys is never \
walked whole. With --metrics URL (a process's Prometheus endpoint, e.g. slate run \
--metrics-addr), its acquisitions, busy answers, timeouts and wait times are shown too.",
        after_help = "Exit codes: 0, 69 no server could be read, 2 usage error (--zookeeper \
without names, no terminal without --once/--json)."
    )]
    Top(TopArgs),
    /// Manage the servers of a combination lock.
    #[command(subcommand)]
    Nodes(NodesCmd),
    /// Live demo: local Redis masters, workers contending on a single and a combination lock,
    /// a node killed and restarted, then a checked summary.
    #[command(
        after_help = "Needs redis-server on PATH (apt-get install -y redis-server), or \
see docker/compose.yml. Exit codes: 0 all checks passed, 1 the history checker found a \
violation, 69 no redis-server, 130 interrupted."
    )]
    Demo(demo::DemoArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(after_help = "Install, for example:\n  \
slate completions bash > /etc/bash_completion.d/slate\n  \
slate completions zsh > \"${fpath[1]}/_slate\"\n  \
slate completions fish > ~/.config/fish/completions/slate.fish")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff) to stdout: `slate man > slate.1` for slate(1), `slate man run >
    /// slate-run.1` for a subcommand's page (the main page refers to them as slate-run(1)...).
    Man {
        /// The subcommand whose page to print (default: the main page).
        #[arg(value_name = "SUBCOMMAND")]
        subcommand: Option<String>,
    },
    /// One worker process of the demo (internal).
    #[command(hide = true)]
    DemoWorker(demo::worker::WorkerArgs),
    /// The guardian of `slate run`'s command (internal): runs the command and kills its whole
    /// tree when the lease ends or `slate run` dies.
    #[command(hide = true, name = "guard")]
    Guard(tree::GuardArgs),
}

#[derive(Debug, Subcommand)]
enum NodesCmd {
    /// Declare brand-new servers fresh, so that combination locks use them at once (by
    /// default a server without the node marker is not used until the quarantine, 30 s, has
    /// passed: a new server cannot be told from one that lost its data).
    #[command(
        after_help = "Only for brand-new servers: never run it while a lock on them may \
be held (a server that lost a held lock would be used at once). Exit codes: 0 every server \
marked, 69 some did not answer, 2 usage error."
    )]
    Adopt(AdoptArgs),
}

#[derive(Debug, Args)]
struct AdoptArgs {
    #[command(flatten)]
    common: Common,
    /// The quarantine of a server that restarted or lost its data, recorded on each server as
    /// the bound of every lease there: a combination lock with a longer lease is refused, and
    /// every process quarantines these servers at least this long. Use the longest lease of
    /// your combination locks (`slate run` quarantines for 30 s or its lease if longer).
    #[arg(long, default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    quarantine: Duration,
}

#[derive(Debug, Args)]
struct Common {
    #[arg(long = "redis", value_name = "URL", help = REDIS_HELP)]
    redis: Vec<String>,
    /// A seed node of a Redis Cluster (repeatable, or comma-separated): the lock lives on the
    /// shard that owns its name's slot.
    #[arg(long = "cluster", value_name = "URL", conflicts_with_all = ["redis", "sentinel"])]
    cluster: Vec<String>,
    /// A Sentinel (repeatable, or comma-separated) that names the master (with --master-name);
    /// the lock follows failovers.
    #[arg(long = "sentinel", value_name = "URL", conflicts_with = "redis")]
    sentinel: Vec<String>,
    /// The master's name as the Sentinels monitor it (with --sentinel).
    #[arg(long = "master-name", value_name = "NAME")]
    master_name: Option<String>,
    /// A ZooKeeper ensemble, host:port[,host:port...]\[/chroot\]: the lock is the ZooKeeper lock
    /// (the session is the lease; digest credentials from $SLATE_ZOOKEEPER_DIGEST=user:password).
    #[arg(
        long = "zookeeper",
        value_name = "SERVERS",
        conflicts_with_all = ["redis", "cluster", "sentinel", "master_name"]
    )]
    zookeeper: Option<String>,
    /// Key prefix of the lock's Redis keys; with --zookeeper, the lock root path (default
    /// /slate).
    #[arg(long, default_value = "slate:", value_name = "PREFIX")]
    prefix: String,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Lock name (any text; the same name on the same Redis is the same lock). Repeat it to
    /// hold several names as one (all or nothing, no deadlock whatever order other jobs name
    /// them in; one Redis deployment): CMD then gets SLATE_FENCING_TOKENS=a=12,b=40 instead of
    /// SLATE_FENCING_TOKEN.
    #[arg(long, value_name = "NAME", required = true)]
    lock: Vec<String>,
    #[command(flatten)]
    common: Common,
    /// Lease: how long the lock outlives slate if it dies (renewed every lease/2 while CMD runs).
    #[arg(long, default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    lease: Duration,
    /// How long to wait for the lock: a duration (0s: one attempt, no waiting) or `forever`.
    /// Not acquired in time: exit 75.
    #[arg(long, default_value = "10s", value_parser = duration::parse_wait, value_name = "DURATION")]
    wait: WaitFor,
    /// What to do with CMD if the lease is lost (Redis unreachable or the entry deleted while
    /// CMD runs): kill = SIGKILL now; term = SIGTERM, SIGKILL 5s later; ignore = warn only.
    /// With kill or term slate exits 76.
    #[arg(long, value_enum, default_value = "kill", value_name = "POLICY")]
    on_lost: OnLost,
    /// Print acquisition (with the fencing token) and release on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Serve this process's lock metrics for Prometheus at http://ADDR/metrics while the
    /// command runs (HOST:PORT, e.g. 127.0.0.1:9464 or localhost:9464; docs/OPERATIONS.md
    /// lists them).
    #[arg(long, value_name = "ADDR", value_parser = metrics_addr)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Take the lock to read: jobs run with --read on the same name run together, never
    /// beside a writer (a job without --read, or with --write). Needs one Redis deployment
    /// (one --redis, --cluster or --sentinel).
    #[arg(long, conflicts_with_all = ["write", "permits"])]
    read: bool,
    /// Take the lock to write, alone (the default): waits for the readers (--read) of the
    /// same name to leave, and keeps new ones out meanwhile.
    #[arg(long, conflicts_with = "permits")]
    write: bool,
    /// Take K permits of a semaphore of N (--of N) named by --lock: the jobs holding its
    /// permits never hold more than N together. Needs one Redis deployment.
    #[arg(long, value_name = "K", requires = "of", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// The semaphore's permits (with --permits). The first job to use the name stores it;
    /// an existing semaphore keeps the count it has (`slate status` shows it).
    #[arg(long, value_name = "N", requires = "permits", value_parser = clap::value_parser!(u32).range(1..))]
    of: Option<u32>,
    /// The command to run and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// Lock name; several names (the names of a multi-lock) are shown one after the other
    /// (with --json, as an array).
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    #[command(flatten)]
    common: Common,
    /// Print JSON (stable field names: lock, prefix, kind, quorum, held, holder, nodes[index,
    /// address, ok, error, holders[holder, count], ttl_ms, fence]).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct TopArgs {
    /// Only these lock names (no SCAN).
    #[arg(value_name = "NAME")]
    names: Vec<String>,
    #[command(flatten)]
    common: Common,
    /// Print one snapshot as a table and exit.
    #[arg(long)]
    once: bool,
    /// Print one snapshot as JSON and exit.
    #[arg(long)]
    json: bool,
    /// Keys SCAN examines per master and refresh, at most (1000 to 10000000).
    #[arg(long, default_value_t = 10_000, value_name = "KEYS",
          value_parser = clap::value_parser!(u64).range(1000..=10_000_000))]
    scan_limit: u64,
    /// Locks shown, at most (most waited-for first).
    #[arg(long, default_value_t = 30, value_name = "N")]
    limit: usize,
    /// A process's Prometheus endpoint (http://HOST:PORT/metrics): show its wait times.
    #[arg(long, value_name = "URL")]
    metrics: Option<String>,
    /// Refresh period of the live view (taken between 100ms and 1h).
    #[arg(long, default_value = "1s", value_parser = duration::parse, value_name = "DURATION")]
    interval: Duration,
}

#[derive(Debug, Args)]
struct DoctorArgs {
    #[command(flatten)]
    common: Common,
    /// The lease the locks use: round trips and the session timeout are judged against it.
    #[arg(long, default_value = "30s", value_parser = duration::parse, value_name = "DURATION")]
    lease: Duration,
    /// Print the findings as a JSON array (check, server, severity, finding, consequence, fix).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct LatchArgs {
    /// Latch name.
    #[arg(value_name = "NAME")]
    name: String,
    /// What to do.
    #[arg(value_enum, value_name = "ACTION")]
    action: latch::Action,
    /// The count (set only).
    #[arg(value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(slate_redis::CountDownLatch::MAX_COUNT)))]
    count: Option<u32>,
    #[command(flatten)]
    common: Common,
    /// How long wait waits (default: until the latch opens). Still closed: exit 75.
    #[arg(long, value_parser = duration::parse, value_name = "DURATION")]
    timeout: Option<Duration>,
    /// How long the latch outlives its last set or count-down.
    #[arg(long, default_value = "24h", value_parser = duration::parse, value_name = "DURATION")]
    ttl: Duration,
}

#[derive(Debug, Args)]
struct UnlockArgs {
    /// Lock name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    common: Common,
    /// Confirm: delete the lock even though its holder may still be running.
    #[arg(long)]
    force: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime, u8> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("slate: cannot start the async runtime: {e}");
            exit::INTERNAL
        })
}

fn servers(common: &Common) -> Result<target::Servers, u8> {
    if let Some(zk) = &common.zookeeper {
        return Ok(target::Servers::ZooKeeper(zk.clone()));
    }
    target::Servers::resolve(
        &common.redis,
        &common.cluster,
        &common.sentinel,
        common.master_name.as_deref(),
    )
    .map_err(|msg| {
        eprintln!("slate: {msg}");
        exit::USAGE
    })
}

fn urls(common: &Common) -> Result<Vec<String>, u8> {
    match servers(common)? {
        target::Servers::Masters(urls) => Ok(urls),
        _ => {
            eprintln!(
                "slate: nodes adopt is for the servers of a combination lock (--redis, once per \
                 master); a cluster or a Sentinel group needs no adoption"
            );
            Err(exit::USAGE)
        }
    }
}

fn dispatch(cli: Cli) -> Result<u8, u8> {
    match cli.command {
        Cmd::DemoWorker(args) => Ok(demo::worker::main(args)),
        Cmd::Guard(args) => Ok(tree::guard(&args)),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            // The public commands only (some generators list hidden ones too).
            let top = Cli::command();
            let mut public = clap::Command::new("slate")
                .about(top.get_about().cloned().unwrap_or_default())
                .subcommands(top.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut public, "slate", &mut script);
            print_generated("the completion script", &script)
        }
        Cmd::Man { subcommand } => {
            use clap::CommandFactory;
            let top = Cli::command();
            let cmd = match &subcommand {
                None => top,
                Some(name) => {
                    let found = top
                        .get_subcommands()
                        .find(|c| c.get_name() == name && !c.is_hide_set())
                        .cloned();
                    let Some(sub) = found else {
                        let names: Vec<&str> = top
                            .get_subcommands()
                            .filter(|c| !c.is_hide_set())
                            .map(clap::Command::get_name)
                            .collect();
                        eprintln!(
                            "slate: no subcommand {name:?}; pages exist for: {}",
                            names.join(", ")
                        );
                        return Err(exit::USAGE);
                    };
                    let full = format!("slate-{name}");
                    sub.name(full.clone())
                        .bin_name(full)
                        .version(env!("CARGO_PKG_VERSION"))
                }
            };
            let mut page = Vec::new();
            let rendered = clap_mangen::Man::new(cmd).render(&mut page);
            match rendered {
                Ok(()) => print_generated("the manual page", &page),
                Err(e) => {
                    eprintln!("slate: cannot render the manual page: {e}");
                    Err(exit::INTERNAL)
                }
            }
        }
        Cmd::Demo(args) => {
            let rt = runtime()?;
            let code = demo::demo(args, &rt);
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Run(args) => {
            let spec = RunSpec {
                servers: servers(&args.common)?,
                name: args.lock.join("+"),
                names: args.lock,
                prefix: args.common.prefix,
                lease: args.lease,
                wait: args.wait,
                on_lost: args.on_lost,
                verbose: args.verbose,
                mode: match (args.read, args.permits.zip(args.of)) {
                    (true, _) => run::Mode::Read,
                    (false, Some((permits, of))) => run::Mode::Permits { permits, of },
                    (false, None) => run::Mode::Write,
                },
                command: args.command,
            };
            let rt = runtime()?;
            if let Some(addr) = args.metrics_addr {
                // Installed before any lock exists (the locks resolve their handles at their
                // first event), on this runtime.
                let installed = rt.block_on(async {
                    metrics_exporter_prometheus::PrometheusBuilder::new()
                        .with_http_listener(addr)
                        .install()
                });
                if let Err(e) = installed {
                    eprintln!(
                        "slate: cannot serve metrics on {addr}: {e}; give --metrics-addr a free \
                         local address and port (e.g. 127.0.0.1:9464)"
                    );
                    return Err(exit::USAGE);
                }
            }
            let code = rt.block_on(run::run(spec));
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Latch(args) => {
            if let Err(msg) = latch::check(args.action, args.count, args.timeout) {
                eprintln!("slate: {msg}");
                return Err(exit::USAGE);
            }
            let spec = latch::LatchSpec {
                servers: servers(&args.common)?,
                name: args.name,
                prefix: args.common.prefix,
                action: args.action,
                count: args.count,
                timeout: args.timeout,
                ttl: args.ttl,
            };
            let rt = runtime()?;
            let code = rt.block_on(latch::latch(spec));
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Top(args) => {
            let spec = top::TopSpec {
                servers: servers(&args.common)?,
                prefix: args.common.prefix,
                names: args.names,
                scan_limit: args.scan_limit,
                limit: args.limit,
                once: args.once,
                json: args.json,
                metrics: args.metrics,
                interval: args
                    .interval
                    .clamp(Duration::from_millis(100), Duration::from_secs(3600)),
            };
            let rt = runtime()?;
            let code = rt.block_on(top::top(spec));
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Doctor(args) => {
            let spec = doctor::DoctorSpec {
                servers: servers(&args.common)?,
                prefix: args.common.prefix,
                lease: args.lease,
                json: args.json,
            };
            let rt = runtime()?;
            let code = rt.block_on(doctor::doctor(spec));
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Nodes(NodesCmd::Adopt(args)) => {
            let urls = urls(&args.common)?;
            let rt = runtime()?;
            let code = rt.block_on(nodes::adopt(&urls, &args.common.prefix, args.quarantine));
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Status(args) => {
            let servers = servers(&args.common)?;
            let rt = runtime()?;
            let code = match (&servers, args.names.as_slice()) {
                (target::Servers::ZooKeeper(zk), [name]) => {
                    rt.block_on(zk::status(zk, name, &args.common.prefix, args.json))
                }
                (target::Servers::ZooKeeper(_), _) => {
                    eprintln!("slate: status shows one ZooKeeper lock at a time");
                    exit::USAGE
                }
                _ => rt.block_on(status::status(
                    &servers,
                    &args.names,
                    &args.common.prefix,
                    args.json,
                )),
            };
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
        Cmd::Unlock(args) => {
            if !args.force {
                eprintln!("{}", status::refuse_message(&args.name));
                return Err(exit::USAGE);
            }
            let servers = servers(&args.common)?;
            let rt = runtime()?;
            let code = match &servers {
                target::Servers::ZooKeeper(zk) => {
                    rt.block_on(zk::unlock(zk, &args.name, &args.common.prefix))
                }
                _ => rt.block_on(status::unlock(&servers, &args.name, &args.common.prefix)),
            };
            rt.shutdown_timeout(Duration::from_millis(200));
            Ok(code)
        }
    }
}

/// `--metrics-addr`: HOST:PORT, the host an address or a name (its first address), the port
/// not 0 (a port the system picks would be one no scraper knows).
fn metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let addr = match text.parse::<std::net::SocketAddr>() {
        Ok(a) => a,
        Err(_) => text
            .to_socket_addrs()
            .map_err(|e| format!("{e}; use HOST:PORT, e.g. 127.0.0.1:9464"))?
            .next()
            .ok_or_else(|| {
                format!("{text} names no address; use HOST:PORT, e.g. 127.0.0.1:9464")
            })?,
    };
    if addr.port() == 0 {
        return Err(
            "give a port (e.g. 127.0.0.1:9464): port 0 would be one the system picks, \
                    which no scraper could find"
                .to_owned(),
        );
    }
    Ok(addr)
}

/// Writes generated text to stdout; a reader that stops early (`| head`) is not an error.
fn print_generated(what: &str, bytes: &[u8]) -> Result<u8, u8> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => Ok(exit::OK),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(exit::OK),
        Err(e) => {
            eprintln!("slate: cannot write {what}: {e}");
            Err(exit::INTERNAL)
        }
    }
}

/// Parses the arguments; every argument error prints the message and the usage of the
/// (sub)command, and exits 2.
fn parse_cli() -> Result<Cli, u8> {
    use clap::CommandFactory;
    use clap::error::ErrorKind;
    let err = match Cli::try_parse() {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        err.exit();
    }
    let rendered = err.render().to_string();
    if rendered.contains("Usage:") {
        eprint!("{rendered}");
    } else {
        let mut cmd = Cli::command();
        cmd.build();
        let sub = std::env::args().nth(1);
        let usage = match sub.as_deref().and_then(|s| cmd.find_subcommand_mut(s)) {
            Some(sc) => sc.render_usage(),
            None => cmd.render_usage(),
        };
        let (message, more) = rendered
            .split_once("\n\nFor more information")
            .map_or((rendered.as_str(), None), |(m, r)| (m, Some(r)));
        eprintln!("{message}\n\n{usage}");
        if let Some(more) = more {
            eprint!("\nFor more information{more}");
        }
    }
    Err(exit::USAGE)
}

fn main() -> ExitCode {
    let code = parse_cli().and_then(dispatch).unwrap_or_else(|code| code);
    if let Some(sig) = run::die_of() {
        // Everything is released: end the way the signal would have ended us (the exit code
        // below only if the re-raise fails).
        let _ = signal_hook::low_level::emulate_default_handler(sig as i32);
    }
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_double_dash() {
        let cli = Cli::try_parse_from([
            "slate",
            "run",
            "--lock",
            "l",
            "--redis",
            "redis://x:1",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .expect("parses");
        let Cmd::Run(args) = cli.command else {
            panic!("not run");
        };
        assert_eq!(args.command, ["sh", "-c", "exit 7"]);
        assert_eq!(args.lock, ["l"]);
        assert_eq!(args.lease, Duration::from_secs(30));
        assert_eq!(args.wait, WaitFor::Upto(Duration::from_secs(10)));
        assert_eq!(args.on_lost, OnLost::Kill);
    }
}
