//! `strata`: the daemon and the CLI in one binary.
//!
//! `strata _init`, `strata _restore`, `strata _restore_hook` and `strata
//! _runsc_keep` are internal helpers run by the daemon (sandbox setup, CRIU
//! restore and its action script, the parent of a gVisor sandbox; the exec helpers are `strata-init _enter` and
//! `_runsc_exec`); they are dispatched before any runtime or thread starts,
//! because they unshare, setns and reap.

mod args;
mod commands;
mod exec;
mod output;
mod transfer;

use clap::Parser;

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("_init") => strata_runtime::namespace::init::main(),
        Some("_restore") => strata_runtime::namespace::restore::main(),
        Some("_restore_hook") => strata_runtime::namespace::restore::hook_main(),
        Some("_runsc_keep") => strata_runtime::gvisor::keeper::main(),
        Some("_vm_keep") => strata_runtime::microvm::keeper::main(),
        _ => {}
    }
    let cli = args::Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if matches!(cli.command, args::Command::Daemon(_)) { 2 } else { 1 })
        // Tokio's default of 2 MiB is thin for the daemon's deepest handler futures in
        // debug builds (one overflowed it: E2B's Filesystem/Stat on a microVM); the
        // stacks are reserved, not resident, until used.
        .thread_stack_size(8 << 20)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(commands::run(cli));
    std::process::exit(code)
}
