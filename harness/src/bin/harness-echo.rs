//! `harness-echo`: a tiny worker for the harness's own tests.
//!
//! Usage: `harness-echo [WORD | --stderr TEXT | --env NAME | --sleep-ms N | --exit CODE]...`
//!
//! Arguments are handled in order: a WORD is printed on its own stdout line, `--stderr TEXT`
//! writes TEXT as a line to stderr, `--env NAME` prints `NAME=VALUE` (empty if unset),
//! `--sleep-ms N` sleeps N milliseconds, `--exit CODE` sets the exit code used at the end
//! (default 0). Stdout is flushed after every line, so a reader sees each line at once.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut code: u8 = 0;
    let mut stdout = std::io::stdout();
    while let Some(arg) = args.next() {
        let result = match arg.as_str() {
            "--stderr" => {
                let text = args.next().unwrap_or_default();
                writeln!(std::io::stderr(), "{text}")
            }
            "--env" => {
                let name = args.next().unwrap_or_default();
                let value = std::env::var(&name).unwrap_or_default();
                writeln!(stdout, "{name}={value}").and_then(|()| stdout.flush())
            }
            "--sleep-ms" => {
                let ms = args.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                std::thread::sleep(Duration::from_millis(ms));
                Ok(())
            }
            "--exit" => {
                code = args.next().and_then(|n| n.parse().ok()).unwrap_or(1);
                Ok(())
            }
            word => writeln!(stdout, "{word}").and_then(|()| stdout.flush()),
        };
        if result.is_err() {
            return ExitCode::from(101);
        }
    }
    ExitCode::from(code)
}
