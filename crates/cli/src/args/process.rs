//! Commands run in a sandbox: `exec` (and the process flags `run` shares) and
//! `proc ls|logs|kill|wait` for background processes.

use clap::{Args, Subcommand};

use super::{JsonOutput, SandboxId};

/// How a command runs: environment, directory, user, timeout, stdin (`exec` and `run`).
#[derive(Debug, Args, Clone)]
pub struct ProcOpts {
    /// Environment for this command (repeatable).
    #[arg(short, long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory.
    #[arg(short = 'w', long)]
    pub cwd: Option<String>,
    /// User (name, uid, name:group or uid:gid).
    #[arg(short, long)]
    pub user: Option<String>,
    /// Kill the command after this long (e.g. 30s).
    #[arg(long)]
    pub timeout: Option<String>,
    /// Pass stdin through.
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a pseudo-terminal inside the sandbox (stdin passed
    /// through; on a terminal here, in raw mode and with its size followed).
    #[arg(short, long)]
    pub tty: bool,
}

/// `strata exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub sandbox: SandboxId,
    #[command(flatten)]
    pub opts: ProcOpts,
    /// Start in the background and print the process id.
    #[arg(short, long)]
    pub detach: bool,
    /// Command and arguments.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProcCmd {
    /// List processes started through strata.
    Ls {
        /// Sandbox.
        id: String,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Print a process's buffered output (and follow it with -f).
    Logs {
        #[command(flatten)]
        process: ProcessRef,
        /// Follow until it exits.
        #[arg(short, long)]
        follow: bool,
    },
    /// Send a signal.
    Kill {
        #[command(flatten)]
        process: ProcessRef,
        /// Signal name or number.
        #[arg(short, long, default_value = "TERM")]
        signal: String,
    },
    /// Wait for a process to exit; exits with its status.
    Wait {
        #[command(flatten)]
        process: ProcessRef,
        /// Give up after this long.
        #[arg(long)]
        timeout: Option<String>,
    },
    /// Attach to the terminal of a process started with -t (detach: end
    /// this command; the process runs on).
    Attach {
        #[command(flatten)]
        process: ProcessRef,
        /// Replay its buffered output first.
        #[arg(long)]
        replay: bool,
    },
}

/// One process of one sandbox: the positional `ID PID`.
#[derive(Debug, Args)]
pub struct ProcessRef {
    /// Sandbox.
    pub id: String,
    /// Process id.
    pub pid: u64,
}
