//! `slate run` at an interactive terminal (issue 34): Ctrl-C, Ctrl-Z with `fg`, and a pager
//! after a pipe, typed into a real `bash` inside a private `tmux` server.
//!
//! `tmux` is required (Debian: `apt-get install tmux`): a missing binary fails the tests with
//! that hint, it never skips them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use slate_cli::local::LocalServer;

const PATIENCE: Duration = Duration::from_secs(20);

/// A private tmux server (its own socket) running one interactive `bash`.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start() -> Self {
        let socket = std::env::temp_dir().join(format!(
            "slate-tmux-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let tmux = Tmux { socket };
        let out = tmux
            .command(&[
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "50",
                "env",
                "PS1=$ ",
                "bash",
                "--norc",
                "--noprofile",
                "-i",
            ])
            .unwrap_or_else(|e| {
                panic!("cannot run tmux ({e}): install it (Debian: apt-get install tmux)")
            });
        assert!(out.status.success(), "tmux new-session: {out:?}");
        tmux.wait_for("the prompt", |s| s.lines().any(|l| l.trim_end() == "$"));
        tmux
    }

    fn command(&self, args: &[&str]) -> std::io::Result<Output> {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
    }

    /// Types `line` and Enter.
    fn type_line(&self, line: &str) {
        let out = self.command(&["send-keys", "-t", "0", "-l", line]).unwrap();
        assert!(out.status.success(), "{out:?}");
        self.key("Enter");
    }

    /// Presses one key (tmux's names: `C-c`, `C-z`, `q`, `Enter`).
    fn key(&self, key: &str) {
        let out = self.command(&["send-keys", "-t", "0", key]).unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    fn screen(&self) -> String {
        let out = self
            .command(&["capture-pane", "-p", "-t", "0", "-S", "-200"])
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits (bounded) until the screen satisfies `pred`; returns it.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "not within {PATIENCE:?}: {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.command(&["kill-server"]);
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn slate() -> &'static str {
    env!("CARGO_BIN_EXE_slate")
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

/// The number after `prefix` on the screen's last line that has it.
fn number_after(screen: &str, prefix: &str) -> Option<i32> {
    screen
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .and_then(|n| n.trim().parse().ok())
}

/// Ctrl-C reaches the command once (the terminal signals the whole job; `slate` sends it only
/// to what left the job's group), and `slate` ends with the command. The command counts the
/// SIGINTs it gets, and waits half a second after the first for a second one.
#[test]
fn ctrl_c_reaches_the_command_once() {
    let server = LocalServer::start().expect("redis-server");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} run --lock tty-int --redis {} -- sh -c 'n=0; trap \"n=\\$((n+1)); echo caught-\\$n\" INT; echo ready; while [ $n -lt 1 ]; do sleep 0.1; done; sleep 0.5; sleep 0.5; exit 3'; echo \"exit=$?\"",
        slate(),
        server.url()
    ));
    tmux.wait_for("the command running", |s| s.lines().any(|l| l == "ready"));
    tmux.key("C-c");
    let screen = tmux.wait_for("slate's exit", |s| number_after(s, "exit=").is_some());
    assert!(screen.lines().any(|l| l.ends_with("caught-1")), "{screen}");
    assert!(
        !screen.lines().any(|l| l.ends_with("caught-2")),
        "the command got the SIGINT twice:\n{screen}"
    );
    assert_eq!(number_after(&screen, "exit="), Some(3), "{screen}");
}

/// Ctrl-Z stops the job like any other: the shell gets its prompt back. A job stopped past
/// its lease holds nothing: its guardian kills it at the lease's end and another holder gets
/// the lock; `fg` then shows the loss (exit 76). Before, the terminal belonged to the
/// command's own group: Ctrl-Z stopped the command and its guardian while `slate` renewed the
/// lease for ever, and the shell waited.
#[test]
fn ctrl_z_stops_the_job_and_a_job_stopped_past_its_lease_loses_it() {
    let server = LocalServer::start().expect("redis-server");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} run --lock tty-stop --lease 2s --redis {} -- sh -c 'echo tree $$; sleep 60'; echo \"exit=$?\"",
        slate(),
        server.url()
    ));
    let screen = tmux.wait_for("the command running", |s| {
        number_after(s, "tree ").is_some()
    });
    let tree = number_after(&screen, "tree ").unwrap();
    tmux.key("C-z");
    tmux.wait_for("the job stopped", |s| s.contains("Stopped"));
    // Another holder gets the lock once the lease is over, and the stopped tree is gone.
    let second = Command::new(slate())
        .args([
            "run",
            "--lock",
            "tty-stop",
            "--wait",
            "15s",
            "--redis",
            &server.url(),
            "--",
            "echo",
            "second",
        ])
        .output()
        .unwrap();
    assert!(second.status.success(), "{second:?}");
    assert!(
        !alive(tree),
        "the stopped command still ran when another holder held the lock"
    );
    tmux.type_line("fg; echo \"after-fg=$?\"");
    let screen = tmux.wait_for("slate's exit", |s| number_after(s, "after-fg=").is_some());
    assert_eq!(number_after(&screen, "after-fg="), Some(76), "{screen}");
}

/// A pager after a pipe stays in the foreground with `slate` (they are one job). Before,
/// `slate` gave the terminal to its command's own group while the command ran, and `less`,
/// reading the keyboard, was stopped (SIGTTIN).
#[test]
fn a_pager_after_a_pipe_keeps_the_terminal() {
    let server = LocalServer::start().expect("redis-server");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} run --lock tty-pager --redis {} -- sh -c 'seq 1 500; sleep 3' | less; echo \"exit=$?\"",
        slate(),
        server.url()
    ));
    tmux.wait_for("less showing the output", |s| {
        s.lines().any(|l| l.trim() == "40") && !s.contains("Stopped")
    });
    tmux.key("q");
    let screen = tmux.wait_for("the pipeline's exit", |s| {
        number_after(s, "exit=").is_some()
    });
    assert_eq!(number_after(&screen, "exit="), Some(0), "{screen}");
    assert!(!screen.contains("Stopped"), "{screen}");
}

/// The terminal's modes are put back after the command: one killed in no-echo mode (here by
/// the lease's end, the server hung) left the terminal so, and the shell, seeing `slate` exit
/// normally, kept them.
#[test]
fn the_terminal_modes_come_back_after_a_killed_command() {
    let mut server = LocalServer::start().expect("redis-server");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} run --lock tty-modes --lease 1s --redis {} -- sh -c 'stty -echo; echo ready; sleep 60'; echo \"exit=$?\"",
        slate(),
        server.url()
    ));
    tmux.wait_for("the command running", |s| s.lines().any(|l| l == "ready"));
    server.pause().expect("pause");
    let screen = tmux.wait_for("slate's exit", |s| number_after(s, "exit=").is_some());
    server.resume().expect("resume");
    assert_eq!(number_after(&screen, "exit="), Some(76), "{screen}");
    tmux.type_line("stty -a | tr ' ' '\\n' | grep -x -e echo -e -echo | sed 's/^/mode=/'");
    let screen = tmux.wait_for("stty's answer", |s| {
        s.lines().any(|l| l.starts_with("mode="))
    });
    assert!(screen.lines().any(|l| l == "mode=echo"), "{screen}");
}

/// Ctrl-C also reaches the parts of the command that left the job's process group (here GNU
/// `timeout`, which moves into a group of its own): `slate` passes the terminal's SIGINT on
/// to them. The second slice did not (it took every SIGINT at a terminal for one the whole
/// group had already received), and the job ignored Ctrl-C.
#[test]
fn ctrl_c_reaches_a_command_that_left_the_jobs_group() {
    let server = LocalServer::start().expect("redis-server");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} run --lock tty-timeout --redis {} -- timeout 60 sh -c 'trap \"echo caught; exit 5\" INT; echo ready; while :; do sleep 0.1; done'; echo \"exit=$?\"",
        slate(),
        server.url()
    ));
    tmux.wait_for("the command running", |s| s.lines().any(|l| l == "ready"));
    tmux.key("C-c");
    let screen = tmux.wait_for("slate's exit", |s| number_after(s, "exit=").is_some());
    assert!(screen.lines().any(|l| l.ends_with("caught")), "{screen}");
    assert_eq!(number_after(&screen, "exit="), Some(5), "{screen}");
}

/// Issue 32: `slate top`'s live view in a terminal: it shows the held lock with its waiting
/// process, follows it as it is released and taken again (refreshed each interval), and `q`
/// gives the terminal back with exit 0.
#[test]
fn top_shows_the_locks_live_and_q_quits() {
    let server = LocalServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let url = server.url();
    let hold = |name: &str| {
        std::process::Command::new(slate())
            .args([
                "run", "--lock", name, "--redis", &url, "--wait", "1m", "--", "sh", "-c",
            ])
            .arg(format!(
                "while [ ! -e {} ]; do sleep 0.05; done",
                stop.display()
            ))
            .spawn()
            .unwrap()
    };
    let mut holder = hold("tty-top");
    let tmux = Tmux::start();
    tmux.type_line(&format!(
        "{} top --redis {url} --interval 200ms; echo \"exit=$?\"",
        slate()
    ));
    let screen = tmux.wait_for("the held lock in the view", |s| {
        s.contains("slate top")
            && s.lines()
                .any(|l| l.contains("tty-top") && !l.contains("(free)"))
    });
    assert!(screen.contains("LEASE LEFT"), "{screen}");
    // A second job waits in the line: the view counts it.
    let mut waiter = hold("tty-top");
    tmux.wait_for("the waiting process", |s| {
        s.lines().find(|l| l.contains("tty-top")).is_some_and(|l| {
            // ... WAITING NODES │ (the table's right border last)
            let cells: Vec<&str> = l.split_whitespace().filter(|c| *c != "│").collect();
            cells.iter().rev().nth(1) == Some(&"1")
        })
    });
    std::fs::write(&stop, "").unwrap();
    assert!(holder.wait().unwrap().success());
    assert!(waiter.wait().unwrap().success());
    tmux.wait_for("the released lock gone from the view", |s| {
        !s.contains("tty-top")
    });
    tmux.key("q");
    let screen = tmux.wait_for("slate top's exit", |s| number_after(s, "exit=").is_some());
    assert_eq!(number_after(&screen, "exit="), Some(0), "{screen}");
}
