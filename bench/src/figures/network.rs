//! Figure 8: what egress networking costs. A sandbox with `network: egress`
//! (veth pair, addresses, one nftables transaction, its own DNS rules) against
//! one with `network: none` (loopback only): create + first exec + destroy,
//! and exec into a running sandbox of each kind.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use strata_api::{CreateSandboxRequest, NetworkMode, NetworkSpec};
use strata_client::Client;

use super::{check_echo, create_req, echo_req};
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};
use crate::Bench;

/// Most the egress plumbing may add to a create + first exec (p50).
const SETUP_TARGET_MS: f64 = 30.0;

fn egress_req(image: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        network: Some(NetworkSpec {
            mode: NetworkMode::Egress,
            allow: vec!["198.51.100.0/24:443".into(), "pypi.org".into(), "*.pythonhosted.org:443".into()],
            deny: vec![],
        }),
        ..create_req(image)
    }
}

/// create -> exec `echo hi` -> destroy(force): (create + first exec, destroy).
async fn cycle(c: &Client, req: &CreateSandboxRequest) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    let sb = c.create_sandbox(req).await.context("create sandbox")?;
    let r = c.exec(&sb.id, &echo_req()).await;
    let t1 = Instant::now();
    let rm = c.remove_sandbox(&sb.id, true).await;
    let t2 = Instant::now();
    check_echo(&r.context("exec in new sandbox")?)?;
    rm.context("remove sandbox")?;
    Ok((t1 - t0, t2 - t1))
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let (none, egress) = (create_req(&cfg.image), egress_req(&cfg.image));
    for _ in 0..cfg.warmup {
        cycle(&c, &none).await?;
        cycle(&c, &egress).await?;
    }
    let n = cfg.runs.min(100);
    let (mut sn, mut se, mut dn, mut de) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        // Alternating order, so machine noise hits both alike.
        for k in 0..2 {
            if (i + k) % 2 == 0 {
                let (s, d) = cycle(&c, &none).await?;
                sn.push(s);
                dn.push(d);
            } else {
                let (s, d) = cycle(&c, &egress).await?;
                se.push(s);
                de.push(d);
            }
        }
    }
    let (ssn, sse, sdn, sde) = (summarize(&sn), summarize(&se), summarize(&dn), summarize(&de));

    // exec into one running sandbox of each kind.
    let a = c.create_sandbox(&none).await.context("create none sandbox")?;
    let e = c.create_sandbox(&egress).await.context("create egress sandbox")?;
    let measured = async {
        let (mut xn, mut xe) = (vec![], vec![]);
        for i in 0..cfg.runs {
            for k in 0..2 {
                let id = if (i + k) % 2 == 0 { &a.id } else { &e.id };
                let t = Instant::now();
                let r = c.exec(id, &echo_req()).await.context("exec")?;
                let el = t.elapsed();
                check_echo(&r)?;
                if id == &a.id {
                    xn.push(el)
                } else {
                    xe.push(el)
                }
            }
        }
        anyhow::Ok((xn, xe))
    }
    .await;
    let _ = c.remove_sandbox(&a.id, true).await;
    let _ = c.remove_sandbox(&e.id, true).await;
    let (xn, xe) = measured?;
    let (sxn, sxe) = (summarize(&xn), summarize(&xe));

    let added = sse.p50.as_secs_f64() * 1000.0 - ssn.p50.as_secs_f64() * 1000.0;
    b.report.rows.push(Row::new(
        format!("create + first exec, --network egress vs none, p50 (n={n})"),
        ms(sse.p50),
        format!("{} (none)", ms(ssn.p50)),
        format!("{} (+{added:.1} ms)", ratio(sse.p50.as_secs_f64(), ssn.p50.as_secs_f64())),
        format!("<= +{SETUP_TARGET_MS:.0} ms"),
        Verdict::of(added <= SETUP_TARGET_MS),
    ));
    b.report.rows.push(Row::new(
        format!("exec `echo hi` into running sandbox, egress vs none, p50 (n={})", cfg.runs),
        ms(sxe.p50),
        format!("{} (none)", ms(sxn.p50)),
        ratio(sxe.p50.as_secs_f64(), sxn.p50.as_secs_f64()),
        "<= 1.1x",
        Verdict::of(sxe.p50.as_secs_f64() <= sxn.p50.as_secs_f64() * 1.1),
    ));
    b.report.rows.push(Row::new(
        format!("destroy, egress vs none, p50 (n={n})"),
        ms(sde.p50),
        format!("{} (none)", ms(sdn.p50)),
        ratio(sde.p50.as_secs_f64(), sdn.p50.as_secs_f64()),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "8. network: egress vs none".into(),
        format!(
            "{n} cycles each (alternating) of create -> exec `echo hi` -> destroy(force) through the typed client, \
             with `network: none` (loopback only, the default) and with `network: egress` and three allow rules \
             (a CIDR with a port, a name, a wildcard name): the difference is the per-sandbox network setup — \
             a network namespace kept by a bind mount, a veth pair and its addresses (two `ip -batch` runs), and \
             one `nft -f` transaction with the sandbox's chains and sets — and its teardown at destroy. Then \
             {r} `exec` calls of `echo hi` into one running sandbox of each kind, alternating. {w} warm-up cycles of each first.",
            r = cfg.runs,
            w = cfg.warmup
        ),
        vec![
            format!("{:<32} {}", "create+exec, none", ssn.line()),
            format!("{:<32} {}", "create+exec, egress", sse.line()),
            format!("{:<32} {}", "destroy, none", sdn.line()),
            format!("{:<32} {}", "destroy, egress", sde.line()),
            format!("{:<32} {}", "exec into running, none", sxn.line()),
            format!("{:<32} {}", "exec into running, egress", sxe.line()),
        ],
    ));
    Ok(())
}
