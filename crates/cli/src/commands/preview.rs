//! `strata preview ...`: open, list and revoke preview URLs of sandbox ports.

use anyhow::Result;
use strata_client::Client;

use crate::args::preview::PreviewCmd;
use crate::args::{JsonOutput, SandboxId};
use crate::output;

fn preview_rows(list: &[strata_api::Preview]) -> Vec<Vec<String>> {
    let status = |p: &strata_api::Preview| match &p.revoked_at {
        Some(r) => format!("revoked {r}"),
        None if humantime::parse_rfc3339_weak(&p.expires_at).is_ok_and(|e| e <= std::time::SystemTime::now()) => {
            format!("expired {}", p.expires_at)
        }
        None => format!("expires {}", p.expires_at),
    };
    list.iter()
        .map(|p| {
            vec![
                p.id.clone(),
                p.port.map_or_else(|| "all".into(), |p| p.to_string()),
                if p.public { "public".into() } else { "token".into() },
                status(p),
                p.url_path.clone(),
                p.url_host.clone(),
            ]
        })
        .collect()
}

/// `strata preview ...`.
pub(super) async fn preview_cmd(c: &Client, cmd: PreviewCmd) -> Result<i32> {
    match cmd {
        PreviewCmd::Create { sandbox: SandboxId { id }, port, public, ttl, json } => {
            let port = match port.as_str() {
                "all" | "*" => None,
                p => Some(
                    p.parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| anyhow::anyhow!("invalid port {p:?}: 1-65535, or `all`"))?,
                ),
            };
            let ttl_secs = match ttl {
                Some(t) => {
                    Some(strata_core::units::parse_duration(&t).map_err(|e| anyhow::anyhow!("--ttl: {e}"))?.as_secs())
                }
                None => None,
            };
            let p = c.create_preview(&id, &strata_api::CreatePreviewRequest { port, public, ttl_secs }).await?;
            if json {
                output::json(&p);
            } else {
                println!("{}", p.signed_url);
                eprintln!(
                    "preview {} of sandbox {} ({}, expires {}); token (shown only now): {}\nhost-based: {}",
                    p.preview.id,
                    p.preview.sandbox_id,
                    if p.preview.public { "public" } else { "token required" },
                    p.preview.expires_at,
                    p.token,
                    p.preview.url_host
                );
            }
            Ok(0)
        }
        PreviewCmd::Ls { sandbox: SandboxId { id }, all, out: JsonOutput { json } } => {
            let list = c.list_previews(&id, all).await?;
            if json {
                output::json(&list);
            } else {
                output::table(&["ID", "PORT", "ACCESS", "STATUS", "URL", "HOST URL"], preview_rows(&list));
            }
            Ok(0)
        }
        PreviewCmd::Revoke { sandbox: SandboxId { id }, preview, out: JsonOutput { json } } => {
            let p = c.revoke_preview(&id, &preview).await?;
            if json {
                output::json(&p);
            } else {
                println!("revoked preview {} of sandbox {}", p.id, p.sandbox_id);
            }
            Ok(0)
        }
    }
}
