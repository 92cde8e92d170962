//! Running a parsed command line: [`run`] sends each [`Command`] to the code of its
//! group (one file per group, the same names as under `args/`) and turns errors into
//! exit codes. The helpers several groups use (`kv`, `each`, `print_error`) live here.

mod checkpoint;
mod cost;
mod daemon;
mod files;
mod image;
mod lease;
mod network;
mod pipeline;
mod preview;
mod process;
mod sandbox;
mod security;
mod template;
mod tenant;

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use strata_client::{Client, Endpoint};

use crate::args::{Cli, Command};

/// Runs the command line; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            print_error(&e);
            // A distinct code for scripts: the request waits for a human (`strata approvals`).
            match e.downcast_ref::<strata_client::ClientError>() {
                Some(strata_client::ClientError::Api { body, .. })
                    if body.code == strata_api::ErrorCode::ApprovalRequired =>
                {
                    3
                }
                _ => 1,
            }
        }
    }
}

async fn dispatch(cli: Cli) -> Result<i32> {
    let c = client(&cli);
    match cli.command {
        Command::Daemon(a) => daemon::daemon(cli.socket, a).await,
        Command::Doctor(a) => daemon::doctor(&c, a).await,
        Command::Pool(a) => daemon::pool(&c, a).await,
        Command::Image(cmd) => image::image(&c, cmd).await,
        Command::Token(cmd) => tenant::token_cmd(&c, cmd).await,
        Command::Tenant(cmd) => tenant::tenant_cmd(&c, cli.as_tenant.as_deref(), cmd).await,
        Command::Approvals(cmd) => security::approvals_cmd(&c, cmd).await,
        Command::Pipeline(cmd) => pipeline::pipeline(&c, cmd).await,
        Command::Create(a) => sandbox::create(&c, a).await,
        Command::Run(a) => sandbox::run_oneshot(&c, a).await,
        Command::Ps(a) => sandbox::ps(&c, a).await,
        Command::Inspect(a) => sandbox::inspect(&c, a).await,
        Command::Update(a) => sandbox::update(&c, a).await,
        Command::Network(cmd) => network::network_cmd(&c, cmd).await,
        Command::Preview(cmd) => preview::preview_cmd(&c, cmd).await,
        Command::Lease(a) => lease::lease_cmd(&c, a).await,
        Command::Stop(a) => sandbox::stop(&c, a).await,
        Command::Pause(a) => sandbox::pause(&c, a).await,
        Command::Unpause(a) => sandbox::unpause(&c, a).await,
        Command::Standby(a) => sandbox::standby(&c, a).await,
        Command::Resume(a) => sandbox::resume(&c, a).await,
        Command::Archive(a) => sandbox::archive(&c, a).await,
        Command::Start(a) => sandbox::start(&c, a).await,
        Command::Rm(a) => sandbox::rm(&c, a).await,
        Command::Exec(a) => process::exec_cmd(&c, a).await,
        Command::Checkpoint(a) => checkpoint::checkpoint_cmd(&c, a).await,
        Command::Gc(a) => checkpoint::gc(&c, a).await,
        Command::Cost(a) => cost::cost(&c, a).await,
        Command::Advise(a) => pipeline::advise(&c, a).await,
        Command::Lineage(a) => checkpoint::lineage(&c, a).await,
        Command::Template(cmd) => template::template_cmd(&c, cmd).await,
        Command::Restore(a) => checkpoint::restore(&c, a).await,
        Command::Fork(a) => pipeline::fork(&c, a).await,
        Command::Scan(a) => security::scan(&c, a).await,
        Command::Check(a) => security::check(&c, a).await,
        Command::Outdated(a) => image::outdated(&c, a).await,
        Command::Rebase(a) => image::rebase(&c, a).await,
        Command::Quarantine(cmd) => security::quarantine_cmd(&c, cmd).await,
        Command::Audit(a) => security::audit(&c, a).await,
        Command::Diff(a) => files::diff(&c, a).await,
        Command::Export(a) => files::export(&c, a).await,
        Command::Proc(cmd) => process::proc_cmd(&c, cmd).await,
        Command::Cp(a) => files::cp(&c, &a.src, &a.dst).await,
        Command::Fs(cmd) => files::fs_cmd(&c, cmd).await,
        Command::Events(a) => sandbox::events(&c, a).await,
        Command::Mcp => daemon::mcp(c).await,
        Command::Openapi => daemon::openapi(),
    }
}

fn client(cli: &Cli) -> Client {
    let c = match &cli.host {
        Some(h) => Client::new(Endpoint::Tcp { addr: h.clone(), token: cli.token.clone() }),
        None => Client::unix(&cli.socket),
    };
    c.with_tenant(cli.as_tenant.clone()).with_approval(cli.approval.clone())
}

/// Prints an error with its whole cause chain.
fn print_error(e: &anyhow::Error) {
    let mut msg = format!("error: {e}");
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.ends_with(&c) {
            msg.push_str(&format!(": {c}"));
        }
    }
    eprintln!("{msg}");
}
/// Parses repeated `K=V` values (`what` names the flag in errors).
fn kv(items: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| anyhow!("{what} {s:?} must be K=V"))
        })
        .collect()
}

/// Applies `f` to each id, printing the ids that succeeded and every error; fails if any failed.
async fn each<F, Fut>(ids: Vec<String>, f: F) -> Result<i32>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, strata_client::ClientError>>,
{
    let mut failed = 0;
    for id in ids {
        match f(id.clone()).await {
            Ok(id) => println!("{id}"),
            Err(e) => {
                print_error(&anyhow::Error::new(e).context(format!("sandbox {id}")));
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
