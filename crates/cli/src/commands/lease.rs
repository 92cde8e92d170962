//! `strata lease ...`: take, renew, release and list the leases that keep a sandbox awake.

use anyhow::Result;
use strata_api::Lease;
use strata_client::Client;

use crate::args::lease::{LeaseArgs, LeaseCmd, LeaseRef};
use crate::args::{JsonOutput, SandboxId};
use crate::output;

/// `strata lease ID --for DUR`, or one of its subcommands.
pub(super) async fn lease_cmd(c: &Client, a: LeaseArgs) -> Result<i32> {
    let print = |l: &Lease, json: bool| {
        if json {
            output::json(l);
        } else {
            println!("{}  {}", l.id, l.expires_at);
        }
    };
    match a.command {
        None => {
            let id = a.id.expect("clap requires the sandbox id");
            let duration = a.duration.expect("clap requires --for");
            print(&c.create_lease(&id, &duration).await?, a.json);
        }
        Some(LeaseCmd::Renew { lease: LeaseRef { sandbox: SandboxId { id }, lease }, duration, json }) => {
            print(&c.renew_lease(&id, &lease, &duration).await?, json)
        }
        Some(LeaseCmd::Release(LeaseRef { sandbox: SandboxId { id }, lease })) => {
            c.release_lease(&id, &lease).await?;
            println!("{lease}");
        }
        Some(LeaseCmd::Ls { sandbox: SandboxId { id }, out: JsonOutput { json } }) => {
            let list = c.list_leases(&id).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["LEASE", "EXPIRES", "CREATED"],
                    list.iter().map(|l| vec![l.id.clone(), l.expires_at.clone(), output::age(&l.created_at)]).collect(),
                );
            }
        }
    }
    Ok(0)
}
