//! `strata network show|set`, and the network request of new sandboxes built from the
//! `--network` / `--allow-*` flags.

use anyhow::{bail, Result};
use strata_client::Client;

use crate::args::network::{NetworkArgs, NetworkCmd, NetworkModeArg};
use crate::args::{JsonOutput, SandboxId};
use crate::output;

/// `strata network ...`.
pub(super) async fn network_cmd(c: &Client, cmd: NetworkCmd) -> Result<i32> {
    match cmd {
        NetworkCmd::Show { sandbox: SandboxId { id }, out: JsonOutput { json } } => {
            let n = c.get_network(&id).await?;
            if json {
                output::json(&n);
            } else {
                print_network(&n);
            }
            Ok(0)
        }
        NetworkCmd::Set { sandbox: SandboxId { id }, network, out: JsonOutput { json } } => {
            let Some(spec) = network_spec(&network) else {
                bail!(
                    "nothing to set: give --network none|egress and/or --allow-host / --allow-cidr / --deny-cidr rules"
                );
            };
            let n = c.set_network(&id, &spec).await?;
            if json {
                output::json(&n);
            } else {
                print_network(&n);
            }
            Ok(0)
        }
    }
}

/// The network of `--network`/`--allow-*` (None when no flag is given).
pub(super) fn network_spec(a: &NetworkArgs) -> Option<strata_api::NetworkSpec> {
    let allow: Vec<String> = a.allow_host.iter().chain(&a.allow_cidr).cloned().collect();
    let deny = a.deny_cidr.clone();
    let mode = match a.network {
        Some(NetworkModeArg::Egress) => strata_api::NetworkMode::Egress,
        Some(NetworkModeArg::None) => strata_api::NetworkMode::None,
        None if !allow.is_empty() || !deny.is_empty() => strata_api::NetworkMode::Egress,
        None => return None,
    };
    Some(strata_api::NetworkSpec { mode, allow, deny })
}

fn print_network(n: &strata_api::NetworkInfo) {
    let fc = |c: &strata_api::FlowCounter| format!("{} packets, {} bytes", c.packets, c.bytes);
    let mut rows = vec![
        ("mode", n.spec.mode.as_str().to_string()),
        ("allow", if n.spec.allow.is_empty() { "-".into() } else { n.spec.allow.join(" ") }),
    ];
    if !n.spec.deny.is_empty() {
        rows.push(("deny", n.spec.deny.join(" ")));
    }
    if let (Some(a), Some(g)) = (&n.address, &n.gateway) {
        rows.push(("address", format!("{a} (gateway and DNS {g}){}", if n.attached { "" } else { ", not attached" })));
        rows.push(("allowed", fc(&n.allowed)));
        rows.push(("denied", fc(&n.denied)));
        rows.push(("received", fc(&n.received)));
        rows.push(("dns", format!("{} answered, {} refused", n.dns_answered, n.dns_refused)));
        if !n.recent_denied.is_empty() {
            rows.push(("recently denied", n.recent_denied.join(", ")));
        }
    }
    for (k, v) in rows {
        println!("{k:<16} {v}");
    }
}
