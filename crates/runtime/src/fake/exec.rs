//! The harmless host command [`super::FakeRuntime`]'s `exec_command` returns:
//! `/bin/sh` writing what a scripted [`FakeExec`] says, with the report lines
//! ([`ExecReport`]) the real exec helper writes on `STRATA_REPORT_FD`.

use std::process::Command;

use crate::spec::ExecReport;

/// How a process run through the fake ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeExit {
    /// It exits with this code.
    Exited(i32),
    /// A signal ends it.
    Signaled(i32),
    /// It never starts (no `ns_pid` line; a `spawn_error` line instead).
    SpawnError(String),
}

/// What one process "run" through [`super::FakeRuntime`] does: nothing runs
/// but `/bin/sh`, which writes `stdout` and `stderr`, copies its stdin to its
/// stdout when `echo_stdin` (returning at end of input), and reports `exit`.
/// Each stream holds at most 32 KiB (it travels as one argument).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeExec {
    /// Written to stdout first.
    pub stdout: Vec<u8>,
    /// Written to stderr.
    pub stderr: Vec<u8>,
    /// Then copy stdin to stdout until it closes.
    pub echo_stdin: bool,
    /// How it ends.
    pub exit: FakeExit,
}

impl Default for FakeExec {
    fn default() -> Self {
        FakeExec::exited(0)
    }
}

impl FakeExec {
    /// Exits with `code`, writing nothing.
    pub fn exited(code: i32) -> Self {
        FakeExec { stdout: Vec::new(), stderr: Vec::new(), echo_stdin: false, exit: FakeExit::Exited(code) }
    }

    /// Killed by `signal`, writing nothing.
    pub fn signaled(signal: i32) -> Self {
        FakeExec { exit: FakeExit::Signaled(signal), ..FakeExec::exited(0) }
    }

    /// Fails to start with `message`.
    pub fn spawn_error(message: impl Into<String>) -> Self {
        FakeExec { exit: FakeExit::SpawnError(message.into()), ..FakeExec::exited(0) }
    }

    /// Also writes `data` to stdout.
    pub fn with_stdout(mut self, data: impl AsRef<[u8]>) -> Self {
        self.stdout.extend_from_slice(data.as_ref());
        self
    }

    /// Also writes `data` to stderr.
    pub fn with_stderr(mut self, data: impl AsRef<[u8]>) -> Self {
        self.stderr.extend_from_slice(data.as_ref());
        self
    }

    /// Copies stdin to stdout (after `stdout`) until stdin closes.
    pub fn echoing_stdin(mut self) -> Self {
        self.echo_stdin = true;
        self
    }
}

/// The script: `$1` the `ns_pid` report line (empty: none), `$2` and `$3`
/// stdout and stderr as printf formats, `$4` `1` to copy stdin, `$5` the last
/// report line, `$6` the helper's own exit status. Reports go to the
/// descriptor named in `STRATA_REPORT_FD`, when the caller set it, reopened
/// through `/proc/self/fd` (dash's `>&N` takes one digit only).
const SCRIPT: &str = r#"report() { if [ -n "${STRATA_REPORT_FD:-}" ] && [ -n "$1" ]; then printf '%s\n' "$1" >>"/proc/self/fd/$STRATA_REPORT_FD"; fi; }
report "$1"
printf "$2"
printf "$3" >&2
if [ "$4" = 1 ]; then cat; fi
report "$5"
exit "$6""#;

/// `data` as a printf format that prints exactly it (every byte an octal
/// escape: no `%` or `\` is interpreted, NUL bytes included).
fn printf_format(data: &[u8]) -> String {
    data.iter().map(|b| format!("\\{b:03o}")).collect()
}

fn line(r: &ExecReport) -> String {
    serde_json::to_string(r).expect("ExecReport serializes")
}

/// The command for one fake process whose pid inside is `ns_pid`.
pub(super) fn command(ns_pid: i32, exec: &FakeExec) -> Command {
    let (first, last, status) = match &exec.exit {
        FakeExit::Exited(code) => {
            (line(&ExecReport::NsPid { pid: ns_pid }), line(&ExecReport::Exited { code: *code }), 0)
        }
        FakeExit::Signaled(signal) => {
            (line(&ExecReport::NsPid { pid: ns_pid }), line(&ExecReport::Signaled { signal: *signal }), 0)
        }
        FakeExit::SpawnError(message) => {
            (String::new(), line(&ExecReport::SpawnError { message: message.clone() }), 127)
        }
    };
    let mut cmd = Command::new("/bin/sh");
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .arg("-c")
        .arg(SCRIPT)
        .arg("strata-fake-exec")
        .arg(first)
        .arg(printf_format(&exec.stdout))
        .arg(printf_format(&exec.stderr))
        .arg(if exec.echo_stdin { "1" } else { "0" })
        .arg(last)
        .arg(status.to_string());
    cmd
}
