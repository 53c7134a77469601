//! The side-by-side contention runner. See `docs/BENCHMARKS.md`.
//!
//! ```text
//! cargo run --release -p benches --bin contention -- --shapes 4x8 --duration 5 --repeat 5
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use benches::contention::runner::{self, Plan};
use benches::contention::{Impl, Shape, WorkerArgs, run_worker};
use clap::{Parser, Subcommand};
use ecosphere::server::ServerKind;

#[derive(Parser)]
#[command(about = "Slate and its peers side by side: P processes x T tasks on one lock")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Implementations, interleaved in this order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "slate,slate-comb-3,slate-comb-3p,rslock-1,rslock-3,spin"
    )]
    impls: Vec<Impl>,
    /// Shapes as PROCSxTASKS.
    #[arg(long, value_delimiter = ',', default_value = "1x32,4x8,4x64")]
    shapes: Vec<Shape>,
    /// Lock names the tasks take in turn (1: everyone on one lock; e.g. 1000: the many-locks
    /// workload, where the server's capacity across locks is what is measured).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    locks: u64,
    /// Seconds of load per run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Repetitions of the interleaved sequence.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Write every run and the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Servers to run the lock nodes on, interleaved (`redis`, `valkey`; each found as
    /// `redis-server` / `valkey-server` on PATH, or SLATE_REDIS_SERVER when it is that kind).
    #[arg(long, value_delimiter = ',', default_value = "redis", value_parser = parse_server)]
    servers: Vec<ServerKind>,
    /// Percent of the critical sections that only read (GET); the others write (GET, SET).
    /// `slate-rw` shares the reads; every other implementation takes its lock for both.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_percent: u8,
    /// Names each acquisition takes together (lock i and the ones after it: overlapping sets,
    /// with --locks above it), for slate-multi, slate-ordered, redis-lock and redisson.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    set_size: u64,
    /// Keep the CPUs out of their idle states for the whole run (a PM QoS request: 0 µs
    /// written to /dev/cpu_dma_latency and held; needs root). On a virtual machine a CPU that
    /// idles between messages costs every round trip its wake-up (on the 2-vCPU machine of
    /// docs/BENCHMARKS.md a lone GET takes 57 µs idle and 12.5 µs held awake), so without it
    /// a latency-bound shape is fastest for whichever implementation keeps the CPUs busiest.
    #[arg(long)]
    no_cpu_idle: bool,
}

/// The PM QoS request of `--no-cpu-idle`: in force while the file stays open.
fn hold_cpus_awake() -> Result<std::fs::File, String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .map_err(|e| {
            format!(
                "--no-cpu-idle needs to write /dev/cpu_dma_latency ({e}); run as root, or leave \
                 the flag out"
            )
        })?;
    f.write_all(&0i32.to_ne_bytes())
        .map_err(|e| format!("--no-cpu-idle: writing /dev/cpu_dma_latency: {e}"))?;
    Ok(f)
}

fn parse_server(s: &str) -> Result<ServerKind, String> {
    ServerKind::parse(s).map_err(|e| e.to_string())
}

#[derive(Subcommand)]
enum Command {
    /// (internal) One worker process.
    #[command(hide = true)]
    Worker {
        #[arg(long = "impl")]
        implementation: Impl,
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        #[arg(long)]
        resource: String,
        #[arg(long)]
        tasks: usize,
        #[arg(long)]
        duration_ms: u64,
        #[arg(long)]
        start_at_ns: u64,
        #[arg(long, default_value_t = 1)]
        locks: usize,
        #[arg(long, default_value_t = 0)]
        read_percent: u8,
        #[arg(long, default_value_t = 1)]
        set_size: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Worker {
            implementation,
            nodes,
            resource,
            tasks,
            duration_ms,
            start_at_ns,
            locks,
            read_percent,
            set_size,
        }) => {
            let args = WorkerArgs {
                implementation,
                nodes,
                resource,
                tasks,
                duration: Duration::from_millis(duration_ms),
                start_at_ns,
                locks,
                read_percent,
                set_size,
            };
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("worker: runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(run_worker(args)) {
                Ok(report) => match serde_json::to_string(&report) {
                    Ok(json) => {
                        println!("REPORT {json}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("worker: {e}");
                        ExitCode::FAILURE
                    }
                },
                Err(e) => {
                    eprintln!("worker: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            if !(0.5..=600.0).contains(&cli.duration) || !(1..=50).contains(&cli.repeat) {
                eprintln!("contention: --duration must be 0.5..=600 s and --repeat 1..=50");
                return ExitCode::from(2);
            }
            let _awake = if cli.no_cpu_idle {
                match hold_cpus_awake() {
                    Ok(f) => Some(f),
                    Err(e) => {
                        eprintln!("contention: {e}");
                        return ExitCode::from(2);
                    }
                }
            } else {
                None
            };
            let worker_exe = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("contention: cannot find this program's path: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let plan = Plan {
                impls: cli.impls,
                shapes: cli.shapes,
                duration: Duration::from_secs_f64(cli.duration),
                repeat: cli.repeat,
                worker_exe,
                progress: !cli.quiet,
                locks: usize::try_from(cli.locks).unwrap_or(1),
                servers: cli.servers,
                read_percent: cli.read_percent,
                set_size: usize::try_from(cli.set_size).unwrap_or(1),
            };
            let results = match runner::run_plan(&plan) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("contention: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let rows = runner::summary(&results);
            println!("{}", runner::markdown(&rows));
            if let Some(path) = cli.json {
                let doc = serde_json::json!({
                    "summary": rows,
                    "runs": results,
                    "cpu_idle_states": if cli.no_cpu_idle { "held off" } else { "allowed" },
                });
                if let Err(e) = std::fs::write(&path, format!("{doc:#}")) {
                    eprintln!("contention: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            let violated = results.iter().filter(|r| !r.mutex_ok).count();
            if violated > 0 {
                eprintln!("contention: {violated} run(s) violated mutual exclusion");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
    }
}
