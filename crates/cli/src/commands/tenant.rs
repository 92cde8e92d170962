//! Multi-tenancy: `token create|ls|revoke` and `tenant quota show|set|reset`,
//! `tenant usage`.

use anyhow::{anyhow, Result};
use strata_client::Client;

use crate::args::tenant::{QuotaCmd, TenantCmd, TenantName, TokenCmd};
use crate::args::JsonOutput;
use crate::output;

/// `strata token ...`.
pub(super) async fn token_cmd(c: &Client, cmd: TokenCmd) -> Result<i32> {
    match cmd {
        TokenCmd::Create { name, tenant, expires, e2b, json } => {
            let t = c.create_token(&strata_api::CreateTokenRequest { name, tenant, expires, e2b }).await?;
            if json {
                output::json(&t);
            } else {
                println!("{}", t.secret);
                eprintln!(
                    "token {} ({}) for tenant {:?}{}: the secret above is shown only now",
                    t.token.id,
                    t.token.name,
                    t.token.tenant,
                    t.token.expires_at.as_deref().map(|e| format!(", expires {e}")).unwrap_or_default()
                );
            }
            Ok(0)
        }
        TokenCmd::Ls { tenant, all, out: JsonOutput { json } } => {
            let list = c.list_tokens(tenant.as_deref(), all).await?;
            if json {
                output::json(&list);
            } else {
                output::table(&["ID", "NAME", "TENANT", "CREATED", "LAST USED", "STATUS"], token_rows(&list));
            }
            Ok(0)
        }
        TokenCmd::Revoke { id, tenant, out: JsonOutput { json } } => {
            let t = c.revoke_token(&id, tenant.as_deref()).await?;
            if json {
                output::json(&t);
            } else {
                println!("revoked token {} ({}) of tenant {:?}", t.id, t.name, t.tenant);
            }
            Ok(0)
        }
    }
}

fn token_rows(list: &[strata_api::TokenInfo]) -> Vec<Vec<String>> {
    let status = |t: &strata_api::TokenInfo| match (&t.revoked_at, &t.expires_at) {
        (Some(r), _) => format!("revoked {r}"),
        (None, Some(e)) if humantime::parse_rfc3339_weak(e).is_ok_and(|e| e <= std::time::SystemTime::now()) => {
            format!("expired {e}")
        }
        (None, Some(e)) => format!("expires {e}"),
        (None, None) => "active".into(),
    };
    list.iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.name.clone(),
                t.tenant.clone(),
                t.created_at.clone(),
                t.last_used_at.clone().unwrap_or_else(|| "-".into()),
                status(t),
            ]
        })
        .collect()
}

/// `strata tenant ...` (`cli_tenant`: the global --as-tenant).
pub(super) async fn tenant_cmd(c: &Client, cli_tenant: Option<&str>, cmd: TenantCmd) -> Result<i32> {
    match cmd {
        TenantCmd::Quota(QuotaCmd::Show { tenant: TenantName { tenant }, out: JsonOutput { json } }) => {
            let q = c.tenant_quota(&tenant).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Quota(QuotaCmd::Set {
            tenant: TenantName { tenant },
            sandboxes,
            memory,
            disk,
            forks_per_minute,
            json,
        }) => {
            let mut o = c.tenant_quota(&tenant).await?.overrides;
            for (flag, given, slot, bytes) in [
                ("sandboxes", sandboxes, &mut o.sandboxes, false),
                ("memory", memory, &mut o.memory_bytes, true),
                ("disk", disk, &mut o.disk_bytes, true),
                ("forks-per-minute", forks_per_minute, &mut o.forks_per_minute, false),
            ] {
                if let Some(v) = given {
                    *slot = quota_value(flag, &v, bytes)?;
                }
            }
            let q = c.set_tenant_quota(&tenant, &o).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Quota(QuotaCmd::Reset { tenant: TenantName { tenant }, json }) => {
            let q = c.reset_tenant_quota(&tenant).await?;
            if json {
                output::json(&q)
            } else {
                print_quota(&q)
            }
        }
        TenantCmd::Usage { tenant, out: JsonOutput { json } } => {
            let tenant = tenant
                .or_else(|| cli_tenant.map(str::to_string))
                .ok_or_else(|| anyhow!("name the tenant: strata tenant usage TENANT (or --as-tenant TENANT)"))?;
            let u = c.tenant_usage(&tenant).await?;
            if json {
                output::json(&u);
            } else {
                let row = |name: &str, q: &strata_api::QuotaUsage, bytes: bool| {
                    vec![
                        name.to_string(),
                        if bytes { output::size(q.used) } else { q.used.to_string() },
                        quota_cell(q.limit, bytes),
                    ]
                };
                println!("tenant {}", u.tenant);
                output::table(
                    &["QUOTA", "USED", "LIMIT"],
                    vec![
                        row("sandboxes", &u.sandboxes, false),
                        row("memory", &u.memory_bytes, true),
                        row("disk", &u.disk_bytes, true),
                        row("forks-per-minute", &u.forks_per_minute, false),
                    ],
                );
            }
        }
    }
    Ok(0)
}

/// A quota value of `strata tenant quota set`: `None` drops the override (`default`).
fn quota_value(flag: &str, v: &str, bytes: bool) -> Result<Option<strata_api::QuotaValue>> {
    use strata_api::QuotaValue;
    Ok(match v.trim() {
        "default" => None,
        "unlimited" | "none" => Some(QuotaValue::Unlimited),
        n if bytes => Some(QuotaValue::Limit(
            strata_core::units::parse_size(n).map_err(|e| anyhow!("--{flag}: {e}, `unlimited` or `default`"))?,
        )),
        n => Some(QuotaValue::Limit(
            n.parse().map_err(|_| anyhow!("--{flag}: {n:?} is not a count, `unlimited` or `default`"))?,
        )),
    })
}

fn quota_cell(v: Option<u64>, bytes: bool) -> String {
    match v {
        None => "unlimited".into(),
        Some(n) if bytes => output::size(n),
        Some(n) => n.to_string(),
    }
}

fn print_quota(q: &strata_api::TenantQuota) {
    let o = &q.overrides;
    let over =
        |v: Option<strata_api::QuotaValue>, bytes: bool| v.map_or("-".to_string(), |v| quota_cell(v.limit(), bytes));
    let (e, d) = (&q.effective, &q.defaults);
    println!(
        "tenant {}{}",
        q.tenant,
        q.updated_at.as_deref().map(|t| format!(" (override set {t})")).unwrap_or_else(|| " (daemon defaults)".into())
    );
    output::table(
        &["QUOTA", "LIMIT", "OVERRIDE", "DEFAULT"],
        vec![
            vec![
                "sandboxes".into(),
                quota_cell(e.sandboxes, false),
                over(o.sandboxes, false),
                quota_cell(d.sandboxes, false),
            ],
            vec![
                "memory".into(),
                quota_cell(e.memory_bytes, true),
                over(o.memory_bytes, true),
                quota_cell(d.memory_bytes, true),
            ],
            vec![
                "disk".into(),
                quota_cell(e.disk_bytes, true),
                over(o.disk_bytes, true),
                quota_cell(d.disk_bytes, true),
            ],
            vec![
                "forks-per-minute".into(),
                quota_cell(e.forks_per_minute, false),
                over(o.forks_per_minute, false),
                quota_cell(d.forks_per_minute, false),
            ],
        ],
    );
}
