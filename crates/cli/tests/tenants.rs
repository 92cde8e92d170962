//! Tenants and API tokens, over the TCP listener: two tenants cannot see or
//! touch each other's sandboxes, checkpoints or templates (another tenant's id
//! answers exactly like an unknown one), the operator sees both, revoked,
//! expired and wrong tokens are 401, token management is the operator's, and
//! the audit log names the tenant and token.

mod common;

use std::time::Duration;

use common::{rt, TestDaemon};
use strata_api::{
    CheckpointRequest, CreateSandboxRequest, CreateTemplateRequest, ErrorCode, ExecRequest, ForkRequest, Lifecycle,
    RestoreRequest,
};
use strata_client::{Client, ClientError, Endpoint};

fn daemon() -> (TestDaemon, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    (d, addr)
}

fn tcp(addr: &str, token: &str) -> Client {
    Client::new(Endpoint::Tcp { addr: addr.to_string(), token: Some(token.to_string()) })
}

/// `strata token create` (operator, over the socket): the secret.
fn token(d: &TestDaemon, name: &str, tenant: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["token", "create", "--name", name, "--tenant", tenant, "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&d.cli_ok(&args)).unwrap()
}

fn secret(v: &serde_json::Value) -> String {
    v["secret"].as_str().unwrap().to_string()
}

fn err<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, ErrorCode, String) {
    match r.unwrap_err() {
        ClientError::Api { status, body } => (status, body.code, body.message),
        e => panic!("expected an API error, got {e}"),
    }
}

/// Asserts that `other` (a call naming another tenant's `key`) failed exactly like
/// `unknown` (the same call naming `unknown_key`, which exists nowhere): same
/// status, code and message up to the key itself.
fn same_as_unknown<T: std::fmt::Debug, U: std::fmt::Debug>(
    what: &str,
    other: Result<T, ClientError>,
    key: &str,
    unknown: Result<U, ClientError>,
    unknown_key: &str,
) {
    let (s1, c1, m1) = err(other);
    let (s2, c2, m2) = err(unknown);
    assert_eq!(s1, 404, "{what}: {m1}");
    assert_eq!(
        (s1, c1, m1.replace(key, "KEY")),
        (s2, c2, m2.replace(unknown_key, "KEY")),
        "{what}: another tenant's id must look unknown"
    );
}

fn create(c: &Client, source: &str, name: &str) -> String {
    let req = CreateSandboxRequest {
        source: source.into(),
        name: Some(name.into()),
        lifecycle: Lifecycle::Persistent,
        ..Default::default()
    };
    rt().block_on(c.create_sandbox(&req)).unwrap().id
}

fn exec_out(c: &Client, id: &str, cmd: &[&str]) -> String {
    use base64::Engine;
    let r = rt()
        .block_on(c.exec(id, &ExecRequest { cmd: cmd.iter().map(|s| s.to_string()).collect(), ..Default::default() }))
        .unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(r.stdout_b64).unwrap()).unwrap()
}

#[test]
fn tenants_cannot_see_or_touch_each_others_objects() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let acme = tcp(&addr, &secret(&token(&d, "ci", "acme", &[])));
    let globex = tcp(&addr, &secret(&token(&d, "ci", "globex", &[])));
    let rt = rt();

    // Each tenant creates from the shared image; acme also checkpoints and makes a template.
    let a = create(&acme, "busybox", "acme-box");
    let b = create(&globex, "busybox", "globex-box");
    assert_eq!(rt.block_on(acme.get_sandbox(&a)).unwrap().tenant, "acme");
    assert_eq!(rt.block_on(globex.get_sandbox(&b)).unwrap().tenant, "globex");
    exec_out(&acme, &a, &["sh", "-c", "echo acme-data > /root/f"]);
    let ca = rt
        .block_on(acme.checkpoint(&a, &CheckpointRequest { name: Some("acme-ckpt".into()), ..Default::default() }))
        .unwrap();
    assert_eq!(ca.tenant, "acme");
    let tmpl = rt
        .block_on(acme.create_template(&CreateTemplateRequest {
            name: "acme-tmpl".into(),
            from: ca.id.clone(),
            replace: false,
            accept_findings: true,
        }))
        .unwrap();
    assert_eq!(tmpl.tenant, "acme");

    // globex: every way of naming acme's sandbox answers like an unknown id.
    let nope = "0123456789abcdef";
    same_as_unknown("get by id", rt.block_on(globex.get_sandbox(&a)), &a, rt.block_on(globex.get_sandbox(nope)), nope);
    same_as_unknown(
        "get by name",
        rt.block_on(globex.get_sandbox("acme-box")),
        "acme-box",
        rt.block_on(globex.get_sandbox("no-such-box")),
        "no-such-box",
    );
    same_as_unknown(
        "get by prefix",
        rt.block_on(globex.get_sandbox(&a[..8])),
        &a[..8],
        rt.block_on(globex.get_sandbox(&nope[..8])),
        &nope[..8],
    );
    let ex = ExecRequest { cmd: vec!["cat".into(), "/root/f".into()], ..Default::default() };
    same_as_unknown("exec", rt.block_on(globex.exec(&a, &ex)), &a, rt.block_on(globex.exec(nope, &ex)), nope);
    same_as_unknown(
        "download",
        rt.block_on(globex.download(&a, "/root/f", false)),
        &a,
        rt.block_on(globex.download(nope, "/root/f", false)),
        nope,
    );
    same_as_unknown(
        "upload",
        rt.block_on(globex.upload(&a, "/root/g", "x".into(), None, false)),
        &a,
        rt.block_on(globex.upload(nope, "/root/g", "x".into(), None, false)),
        nope,
    );
    same_as_unknown("stop", rt.block_on(globex.stop_sandbox(&a)), &a, rt.block_on(globex.stop_sandbox(nope)), nope);
    same_as_unknown(
        "destroy",
        rt.block_on(globex.remove_sandbox(&a, true)),
        &a,
        rt.block_on(globex.remove_sandbox(nope, true)),
        nope,
    );
    same_as_unknown(
        "checkpoint",
        rt.block_on(globex.checkpoint(&a, &CheckpointRequest::default())),
        &a,
        rt.block_on(globex.checkpoint(nope, &CheckpointRequest::default())),
        nope,
    );
    same_as_unknown(
        "list its checkpoints",
        rt.block_on(globex.list_checkpoints(Some(&a))),
        &a,
        rt.block_on(globex.list_checkpoints(Some(nope))),
        nope,
    );
    same_as_unknown(
        "processes",
        rt.block_on(globex.list_processes(&a)),
        &a,
        rt.block_on(globex.list_processes(nope)),
        nope,
    );
    same_as_unknown(
        "leases",
        rt.block_on(globex.create_lease(&a, "1m")),
        &a,
        rt.block_on(globex.create_lease(nope, "1m")),
        nope,
    );
    same_as_unknown("lineage", rt.block_on(globex.lineage(&a)), &a, rt.block_on(globex.lineage(nope)), nope);
    same_as_unknown("scan", rt.block_on(globex.scan(&a)), &a, rt.block_on(globex.scan(nope)), nope);
    same_as_unknown("cost", rt.block_on(globex.cost(&a)), &a, rt.block_on(globex.cost(nope)), nope);
    // ... its checkpoint and template too, and nothing can be made from them.
    same_as_unknown(
        "get checkpoint",
        rt.block_on(globex.get_checkpoint(&ca.id)),
        &ca.id,
        rt.block_on(globex.get_checkpoint(nope)),
        nope,
    );
    same_as_unknown(
        "delete checkpoint",
        rt.block_on(globex.delete_checkpoint("acme-ckpt")),
        "acme-ckpt",
        rt.block_on(globex.delete_checkpoint("no-ckpt")),
        "no-ckpt",
    );
    let fork = |source: &str| ForkRequest {
        source: source.into(),
        count: 1,
        name_prefix: None,
        lifecycle: Lifecycle::Persistent,
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    };
    same_as_unknown(
        "fork a checkpoint",
        rt.block_on(globex.fork(&fork(&ca.id))),
        &ca.id,
        rt.block_on(globex.fork(&fork(nope))),
        nope,
    );
    same_as_unknown(
        "fork a sandbox",
        rt.block_on(globex.fork(&fork("acme-box"))),
        "acme-box",
        rt.block_on(globex.fork(&fork("no-box"))),
        "no-box",
    );
    let from = |s: &str| CreateSandboxRequest { source: s.into(), ..Default::default() };
    same_as_unknown(
        "create from template",
        rt.block_on(globex.create_sandbox(&from("acme-tmpl"))),
        "acme-tmpl",
        rt.block_on(globex.create_sandbox(&from("no-tmpl"))),
        "no-tmpl",
    );
    same_as_unknown(
        "create from checkpoint",
        rt.block_on(globex.create_sandbox(&from(&ca.id))),
        &ca.id,
        rt.block_on(globex.create_sandbox(&from(nope))),
        nope,
    );
    let tfrom = |s: &str| CreateTemplateRequest {
        name: "stolen".into(),
        from: s.into(),
        replace: false,
        accept_findings: true,
    };
    same_as_unknown(
        "template from checkpoint",
        rt.block_on(globex.create_template(&tfrom(&ca.id))),
        &ca.id,
        rt.block_on(globex.create_template(&tfrom(nope))),
        nope,
    );
    // Template names are daemon-wide: replacing another tenant's is refused, never re-pointed.
    let replace =
        CreateTemplateRequest { name: "acme-tmpl".into(), from: b.clone(), replace: true, accept_findings: true };
    assert_eq!(err(rt.block_on(globex.create_template(&replace))).1, ErrorCode::NameConflict);
    same_as_unknown(
        "delete template",
        rt.block_on(globex.delete_template("acme-tmpl")),
        "acme-tmpl",
        rt.block_on(globex.delete_template("no-tmpl")),
        "no-tmpl",
    );
    let restore = |c: &str| RestoreRequest { checkpoint: c.into(), keep_current: false, processes: None };
    same_as_unknown(
        "restore own sandbox to theirs",
        rt.block_on(globex.restore(&b, &restore(&ca.id))),
        &ca.id,
        rt.block_on(globex.restore(&b, &restore(nope))),
        nope,
    );
    same_as_unknown(
        "diff against theirs",
        rt.block_on(globex.diff(&b, Some(&ca.id))),
        &ca.id,
        rt.block_on(globex.diff(&b, Some(nope))),
        nope,
    );

    // Listings are filtered.
    let ids = |v: Vec<strata_api::Sandbox>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(ids(rt.block_on(globex.list_sandboxes()).unwrap()), vec![b.clone()]);
    assert_eq!(ids(rt.block_on(acme.list_sandboxes()).unwrap()), vec![a.clone()]);
    assert!(rt.block_on(globex.list_checkpoints(None)).unwrap().is_empty());
    assert_eq!(
        rt.block_on(acme.list_checkpoints(None)).unwrap().iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
        vec![ca.id.clone()]
    );
    assert!(rt.block_on(globex.list_templates()).unwrap().is_empty());
    assert_eq!(rt.block_on(acme.list_templates()).unwrap().len(), 1);
    let evs = rt.block_on(globex.events(None, 0)).unwrap();
    assert!(!evs.is_empty() && evs.iter().all(|e| e.sandbox_id == b), "globex sees only its own events: {evs:?}");
    assert!(rt.block_on(globex.events(Some(&a), 0)).unwrap().is_empty());
    let cost = rt.block_on(globex.cost_summary()).unwrap();
    assert_eq!(cost.sandboxes.iter().map(|r| r.sandbox_id.clone()).collect::<Vec<_>>(), vec![b.clone()]);
    let info = rt.block_on(globex.info()).unwrap();
    assert_eq!(info.sandboxes.values().sum::<u64>(), 1, "{info:?}");
    assert!(rt.block_on(globex.lineage(&b)).unwrap().nodes.iter().all(|n| n.id != a && n.id != ca.id));
    // Images are shared read-only.
    assert!(rt.block_on(globex.list_images()).unwrap().iter().any(|i| i.name == "busybox"));
    assert_eq!(err(rt.block_on(globex.remove_image("busybox"))).1, ErrorCode::Forbidden);

    // acme's objects are untouched by all that, and what acme makes from them stays acme's.
    assert_eq!(exec_out(&acme, &a, &["cat", "/root/f"]), "acme-data\n");
    let forked = rt.block_on(acme.fork(&fork(&ca.id))).unwrap();
    assert_eq!(rt.block_on(acme.get_sandbox(&forked.sandboxes[0])).unwrap().tenant, "acme");
    let from_tmpl = create(&acme, "acme-tmpl", "acme-from-tmpl");
    assert_eq!(exec_out(&acme, &from_tmpl, &["cat", "/root/f"]), "acme-data\n");

    // A destroyed sandbox of another tenant is 404 too (its owner gets the 409 with state destroyed).
    let gone = create(&acme, "busybox", "acme-gone");
    rt.block_on(acme.remove_sandbox(&gone, true)).unwrap();
    assert_eq!(err(rt.block_on(acme.start_sandbox(&gone))).1, ErrorCode::InvalidState);
    same_as_unknown(
        "a destroyed one",
        rt.block_on(globex.start_sandbox(&gone)),
        &gone,
        rt.block_on(globex.start_sandbox(nope)),
        nope,
    );

    // The operator sees both tenants, and can act as one of them.
    let all = rt.block_on(d.client().list_sandboxes()).unwrap();
    assert!(
        all.iter().any(|s| s.id == a && s.tenant == "acme") && all.iter().any(|s| s.id == b && s.tenant == "globex")
    );
    assert_eq!(rt.block_on(d.client().get_checkpoint(&ca.id)).unwrap().tenant, "acme");
    let ps: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["ps", "--json", "--as-tenant", "globex"])).unwrap();
    assert_eq!(ps.iter().map(|s| s["id"].as_str().unwrap()).collect::<Vec<_>>(), vec![b.as_str()]);
    let made = d.cli_ok(&["create", "busybox", "--as-tenant", "globex"]).trim().to_string();
    assert_eq!(rt.block_on(globex.get_sandbox(&made)).unwrap().tenant, "globex");
    let mine = d.create(&[]);
    assert_eq!(
        rt.block_on(d.client().get_sandbox(&mine)).unwrap().tenant,
        "default",
        "the operator creates in `default`"
    );
    assert_eq!(err(rt.block_on(acme.get_sandbox(&mine))).1, ErrorCode::SandboxNotFound);

    // The CLI in TCP mode takes the token from the environment.
    let cli_token = secret(&token(&d, "cli", "acme", &[]));
    let out = std::process::Command::new(common::strata_bin())
        .args(["ps", "--json"])
        .env("STRATA_HOST", &addr)
        .env("STRATA_TOKEN", &cli_token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let ps: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(ps.iter().all(|s| s["tenant"] == "acme") && ps.iter().any(|s| s["id"] == a.as_str()), "{ps:?}");
}

#[test]
fn revoked_expired_and_wrong_tokens_are_refused() {
    require_host!();
    let (d, addr) = daemon();
    let rt = rt();
    let t = token(&d, "ci", "acme", &[]);
    let s = secret(&t);
    assert!(s.starts_with("strata_") && s.len() > 60, "{s}");
    let c = tcp(&addr, &s);
    rt.block_on(c.list_sandboxes()).unwrap();

    // The secret is never listed, and the listing shows use.
    let ls = d.cli_ok(&["token", "ls", "--json"]);
    assert!(!ls.contains(&s), "token ls must not show secrets");
    let listed: Vec<strata_api::TokenInfo> = serde_json::from_str(&ls).unwrap();
    assert_eq!((listed.len(), listed[0].name.as_str(), listed[0].tenant.as_str()), (1, "ci", "acme"));
    assert!(listed[0].last_used_at.is_some());
    assert!(
        !std::fs::read(d.state("metadata.db")).unwrap().windows(s.len()).any(|w| w == s.as_bytes()),
        "only a hash of the secret is stored"
    );

    // Names are unique among a tenant's live tokens.
    assert!(!d.cli(&["token", "create", "--name", "ci", "--tenant", "acme"]).status.success());
    token(&d, "ci", "globex", &[]);
    let bad = d.cli(&["token", "create", "--name", "x", "--expires", "soon"]);
    assert!(!bad.status.success() && common::stderr(&bad).contains("expires"), "{}", common::stderr(&bad));
    let bad = d.cli(&["token", "create", "--name", "x", "--tenant", "no/slash"]);
    assert!(!bad.status.success() && common::stderr(&bad).contains("tenant"), "{}", common::stderr(&bad));

    // A wrong token and no token: 401.
    assert_eq!(err(rt.block_on(tcp(&addr, "strata_wrong").list_sandboxes())).0, 401);
    let anon = Client::new(Endpoint::Tcp { addr: addr.clone(), token: None });
    assert_eq!(err(rt.block_on(anon.list_sandboxes())).1, ErrorCode::Unauthorized);

    // A tenant token may not manage tokens, nor reach operator-only routes, nor act as another tenant.
    for (status, code, _) in [
        err(rt.block_on(c.list_tokens(None, false))),
        err(rt.block_on(c.revoke_token("ci", None))),
        err(rt.block_on(c.metrics())),
        err(rt.block_on(c.gc())),
    ] {
        assert_eq!((status, code), (403, ErrorCode::Forbidden));
    }
    let as_other = tcp(&addr, &s).with_tenant(Some("globex".into()));
    assert_eq!(err(rt.block_on(as_other.list_sandboxes())).1, ErrorCode::Forbidden);
    rt.block_on(tcp(&addr, &s).with_tenant(Some("acme".into())).list_sandboxes()).unwrap();

    // A name used in two tenants needs the tenant (or the id) to revoke.
    let ambiguous = d.cli(&["token", "revoke", "ci"]);
    assert!(
        !ambiguous.status.success() && common::stderr(&ambiguous).contains("tenant"),
        "{}",
        common::stderr(&ambiguous)
    );
    // Revoked: refused from the next request on; the name is free again.
    d.cli_ok(&["token", "revoke", "ci", "--tenant", "acme"]);
    let (status, code, msg) = err(rt.block_on(c.list_sandboxes()));
    assert_eq!((status, code), (401, ErrorCode::Unauthorized), "{msg}");
    assert!(msg.contains("revoked"), "{msg}");
    let all: Vec<strata_api::TokenInfo> =
        serde_json::from_str(&d.cli_ok(&["token", "ls", "--all", "--json", "--tenant", "acme"])).unwrap();
    assert!(all.iter().any(|x| x.id == t["id"].as_str().unwrap() && x.revoked_at.is_some()));
    assert!(serde_json::from_str::<Vec<strata_api::TokenInfo>>(
        &d.cli_ok(&["token", "ls", "--json", "--tenant", "acme"])
    )
    .unwrap()
    .is_empty());
    token(&d, "ci", "acme", &[]);
    assert!(d.cli(&["token", "revoke", "no-such-token"]).status.code() != Some(0));

    // Expired: refused once its lifetime is over.
    let short = tcp(&addr, &secret(&token(&d, "short", "acme", &["--expires", "4s"])));
    // The daemon stamped the token before this point: 4.2 s from here is past its expiry.
    let made = std::time::Instant::now();
    rt.block_on(short.list_sandboxes()).unwrap();
    std::thread::sleep(Duration::from_millis(4200).saturating_sub(made.elapsed()));
    let (status, _, msg) = err(rt.block_on(short.list_sandboxes()));
    assert_eq!(status, 401);
    assert!(msg.contains("expired"), "{msg}");

    // The operator's own token still works over TCP and sees everything.
    let op = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    assert_eq!(rt.block_on(tcp(&addr, &op).list_tokens(None, true)).unwrap().len(), 4);
}

#[test]
fn audit_records_tenant_and_token() {
    require_host!();
    let (d, addr) = daemon();
    let rt = rt();
    let t = token(&d, "deploy", "acme", &[]);
    let id = t["id"].as_str().unwrap().to_string();
    let acme = tcp(&addr, &secret(&t));
    let globex = tcp(&addr, &secret(&token(&d, "deploy", "globex", &[])));
    assert_eq!(err(rt.block_on(acme.remove_sandbox("nothing-here", true))).1, ErrorCode::SandboxNotFound);
    assert_eq!(err(rt.block_on(globex.remove_sandbox("elsewhere", true))).1, ErrorCode::SandboxNotFound);

    let log = rt.block_on(d.client().audit(None)).unwrap();
    let e = log.iter().find(|e| e.target.as_deref() == Some("nothing-here")).expect("entry");
    assert_eq!(
        (e.actor.as_str(), e.tenant.as_deref(), e.status),
        (format!("token:{id}:deploy").as_str(), Some("acme"), 404)
    );
    let created = log.iter().filter(|e| e.route == "/v1/tokens" && e.method == "POST").count();
    assert_eq!(created, 2, "token creation is audited");
    // A tenant reads its own tenant's entries only.
    let mine = rt.block_on(acme.audit(None)).unwrap();
    assert!(!mine.is_empty() && mine.iter().all(|e| e.tenant.as_deref() == Some("acme")), "{mine:?}");
    assert!(mine.iter().all(|e| e.target.as_deref() != Some("elsewhere")));
    assert_eq!(err(rt.block_on(acme.audit_verify())).1, ErrorCode::Forbidden);
    let v = rt.block_on(d.client().audit_verify()).unwrap();
    assert!(v.ok, "{v:?}");
}

#[test]
fn pipelines_builds_and_host_paths_follow_the_tenant() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let rt = rt();
    let acme_secret = secret(&token(&d, "ci", "acme", &[]));
    let acme = tcp(&addr, &acme_secret);
    let globex = tcp(&addr, &secret(&token(&d, "ci", "globex", &[])));

    // A pipeline run through the CLI's TCP mode belongs to the token's tenant, and
    // so does everything its (background) driver makes.
    let spec = common::write_file(d.dir.path(), "p.toml", b"name = \"t\"\n\n[[stage]]\nname = \"setup\"\nsource = \"image:busybox\"\nlifecycle = \"persistent\"\ncommands = [\"echo hi > /root/x\"]\n\n[[stage]]\nname = \"use\"\nsource = \"stage:setup\"\nlifecycle = \"ephemeral\"\ncommands = [\"grep -qx hi /root/x\"]\n");
    let out = std::process::Command::new(common::strata_bin())
        .args(["pipeline", "run", spec.to_str().unwrap(), "--json"])
        .env("STRATA_HOST", &addr)
        .env("STRATA_TOKEN", &acme_secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    let last: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["run"]["state"].as_str(), last["run"]["tenant"].as_str()),
        (Some("succeeded"), Some("acme")),
        "{last}"
    );
    let run = last["run"]["id"].as_str().unwrap().to_string();
    let nope = "0123456789abcdef";
    same_as_unknown("pipeline", rt.block_on(globex.pipeline(&run)), &run, rt.block_on(globex.pipeline(nope)), nope);
    same_as_unknown(
        "pipeline resume",
        rt.block_on(globex.resume_pipeline(&run)),
        &run,
        rt.block_on(globex.resume_pipeline(nope)),
        nope,
    );
    assert!(rt.block_on(globex.list_pipelines()).unwrap().is_empty());
    assert_eq!(rt.block_on(acme.list_pipelines()).unwrap().len(), 1);
    let all = rt.block_on(d.client().list_sandboxes()).unwrap();
    assert!(!all.is_empty() && all.iter().all(|s| s.tenant == "acme"), "{all:?}");
    assert!(rt.block_on(d.client().list_checkpoints(None)).unwrap().iter().all(|c| c.tenant == "acme"));

    // Template builds run as their caller; the step cache is per tenant.
    let build = |c: &Client, name: &str| {
        let mut evs = rt
            .block_on(c.build_template(&strata_api::BuildTemplateRequest {
                name: name.into(),
                file: "FROM busybox\nRUN echo built > /b\n".into(),
                context: None,
                no_cache: false,
                accept_findings: true,
                start_cmd: None,
                ready_cmd: None,
            }))
            .unwrap();
        let mut all = Vec::new();
        while let Some(ev) = rt.block_on(evs.next()).unwrap() {
            all.push(serde_json::to_value(&ev).unwrap());
        }
        all
    };
    let evs = build(&acme, "acme-built");
    assert!(evs.iter().any(|e| e["type"] == "done"), "{evs:?}");
    let evs = build(&globex, "globex-built");
    assert!(evs.iter().any(|e| e["type"] == "done"), "{evs:?}");
    assert!(
        evs.iter()
            .filter(|e| e["type"] == "step" && e["instruction"].as_str().unwrap_or("").starts_with("RUN"))
            .all(|e| e["cached"] == false),
        "globex must not reuse acme's cached steps: {evs:?}"
    );
    let names = |c: &Client| {
        rt.block_on(c.list_templates()).unwrap().into_iter().map(|t| (t.name, t.tenant)).collect::<Vec<_>>()
    };
    assert_eq!(names(&acme), vec![("acme-built".to_string(), "acme".to_string())]);
    assert_eq!(names(&globex), vec![("globex-built".to_string(), "globex".to_string())]);

    // Reading files on the daemon's host is the operator's: secret host_file and build COPY.
    let host_secret = strata_api::SecretSpec {
        name: "S".into(),
        value_b64: None,
        host_file: Some("/etc/hostname".into()),
        env: false,
    };
    let req = CreateSandboxRequest {
        source: "busybox".into(),
        name: Some("stealer".into()),
        secrets: vec![host_secret],
        ..Default::default()
    };
    assert_eq!(err(rt.block_on(acme.create_sandbox(&req))).1, ErrorCode::Forbidden);
    assert_eq!(err(rt.block_on(acme.get_sandbox("stealer"))).1, ErrorCode::SandboxNotFound, "nothing was created");
    let copy = strata_api::BuildTemplateRequest {
        name: "copier".into(),
        file: "FROM busybox\nCOPY hostname /x\n".into(),
        context: Some("/etc".into()),
        no_cache: false,
        accept_findings: true,
        start_cmd: None,
        ready_cmd: None,
    };
    let mut evs = rt.block_on(acme.build_template(&copy)).unwrap();
    let mut failed = None;
    while let Some(ev) = rt.block_on(evs.next()).unwrap() {
        if let strata_api::BuildEvent::Failed { error, .. } = ev {
            failed = Some(error.code);
        }
    }
    assert_eq!(failed, Some(ErrorCode::Forbidden));
}

/// Routes that name two objects (a sandbox and one of its leases, previews or
/// processes) look the second up *within* the first: tenant A, through its own
/// sandbox, cannot reach tenant B's lease, preview or process, gets exactly the
/// answer an unknown id gets, and B's objects are untouched afterwards. The
/// operator naming the wrong sandbox gets the same 404 and changes nothing.
#[test]
fn two_id_routes_look_the_second_object_up_within_the_first() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let acme = tcp(&addr, &secret(&token(&d, "ci", "acme", &[])));
    let globex = tcp(&addr, &secret(&token(&d, "ci", "globex", &[])));
    let op = d.client();
    let rt = rt();
    let a = create(&acme, "busybox", "acme-own");
    let b = create(&globex, "busybox", "globex-own");
    let nope = "0123456789abcdef";

    // globex's objects under its sandbox.
    let lease = rt.block_on(globex.create_lease(&b, "1h")).unwrap();
    let preview = rt
        .block_on(
            globex.create_preview(
                &b,
                &strata_api::CreatePreviewRequest { port: Some(8080), public: false, ttl_secs: None },
            ),
        )
        .unwrap()
        .preview;
    let sleeper = ExecRequest { cmd: vec!["sleep".into(), "600".into()], keep_stdin_open: true, ..Default::default() };
    // Process ids count per sandbox: globex's second process has an id acme's sandbox never had.
    rt.block_on(globex.exec(&b, &ExecRequest { cmd: vec!["true".into()], ..Default::default() })).unwrap();
    let proc_b = rt.block_on(globex.start_process(&b, &sleeper)).unwrap();
    assert!(rt.block_on(acme.list_processes(&a)).unwrap().is_empty());
    let other_pid = 999;
    for (who, c) in [("acme", &acme), ("operator", &op)] {
        // Leases: release and renew by (sandbox, lease), never by lease id alone.
        same_as_unknown(
            &format!("{who}: release globex's lease through acme's sandbox"),
            rt.block_on(c.release_lease(&a, &lease.id)),
            &lease.id,
            rt.block_on(c.release_lease(&a, nope)),
            nope,
        );
        same_as_unknown(
            &format!("{who}: renew globex's lease through acme's sandbox"),
            rt.block_on(c.renew_lease(&a, &lease.id, "5h")),
            &lease.id,
            rt.block_on(c.renew_lease(&a, nope, "5h")),
            nope,
        );
        // Previews: revoke by (sandbox, preview).
        same_as_unknown(
            &format!("{who}: revoke globex's preview through acme's sandbox"),
            rt.block_on(c.revoke_preview(&a, &preview.id)),
            &preview.id,
            rt.block_on(c.revoke_preview(&a, nope)),
            nope,
        );
    }
    // Processes: acme's sandbox has no process with globex's process id.
    let pid = proc_b.id;
    let what = |w: &str| format!("acme: {w} of globex's process through acme's sandbox");
    let (s1, c1, m1) = err(rt.block_on(acme.get_process(&a, pid)));
    let (s2, c2, m2) = err(rt.block_on(acme.get_process(&a, other_pid)));
    assert_eq!(
        (s1, c1, m1.replace(&format!("process {pid} "), "process PID ")),
        (s2, c2, m2.replace(&format!("process {other_pid} "), "process PID ")),
        "{}",
        what("get")
    );
    assert_eq!(s1, 404);
    for (w, r) in [
        ("signal", err(rt.block_on(acme.signal(&a, pid, "KILL")))),
        (
            "stdin",
            err(rt.block_on(acme.write_stdin(
                &a,
                pid,
                &strata_api::StdinRequest { data_b64: String::new(), close: true },
            ))),
        ),
        ("wait", err(rt.block_on(acme.wait(&a, pid, Some("1s"))))),
        ("logs", err(rt.block_on(acme.logs(&a, pid, 0, false)).map(|_| ()))),
    ] {
        assert_eq!((r.0, r.1), (404, ErrorCode::ProcessNotFound), "{}: {}", what(w), r.2);
    }
    // Through globex's sandbox named by acme: the sandbox itself is unknown to acme.
    same_as_unknown(
        "release through globex's sandbox",
        rt.block_on(acme.release_lease(&b, &lease.id)),
        &b,
        rt.block_on(acme.release_lease(nope, &lease.id)),
        nope,
    );

    // globex's lease, preview and process are exactly as they were.
    let leases = rt.block_on(globex.list_leases(&b)).unwrap();
    assert_eq!(
        leases.iter().map(|l| (&l.id, &l.expires_at)).collect::<Vec<_>>(),
        vec![(&lease.id, &lease.expires_at)],
        "globex's lease is still held, unrenewed"
    );
    let previews = rt.block_on(globex.list_previews(&b, true)).unwrap();
    assert!(
        previews.iter().any(|p| p.id == preview.id && p.revoked_at.is_none()),
        "globex's preview is not revoked: {previews:?}"
    );
    let p = rt.block_on(globex.get_process(&b, proc_b.id)).unwrap();
    assert_eq!(p.status, strata_api::ProcessStatus::Running, "{p:?}");
    // ... and still globex's to use.
    rt.block_on(globex.release_lease(&b, &lease.id)).unwrap();
    rt.block_on(globex.revoke_preview(&b, &preview.id)).unwrap();
    rt.block_on(globex.write_stdin(&b, proc_b.id, &strata_api::StdinRequest { data_b64: String::new(), close: true }))
        .unwrap();
}

/// The error of a create that must be refused because its name looks like an id.
fn refused_name<T: std::fmt::Debug>(what: &str, r: Result<T, ClientError>, name: &str) {
    let (status, code, msg) = err(r);
    assert_eq!((status, code), (400, ErrorCode::BadRequest), "{what}: {msg}");
    assert!(msg.contains(name) && msg.contains("hex"), "{what}: the message names the name and the rule: {msg}");
}

/// Names never shadow ids: a name of 4+ hex digits and nothing else could be read as an
/// id or an id prefix, so it is refused for every kind of object; the
/// squatting attack of the issue (a tenant naming its sandbox after another
/// tenant's id prefix) is refused, and the owner and the operator still
/// resolve that prefix to the owner's sandbox.
#[test]
fn names_that_could_be_read_as_ids_are_refused() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let acme = tcp(&addr, &secret(&token(&d, "ci", "acme", &[])));
    let globex = tcp(&addr, &secret(&token(&d, "ci", "globex", &[])));
    let rt = rt();
    let g = create(&globex, "busybox", "globex-box");
    let a = create(&acme, "busybox", "acme-box");

    // The squatter: acme names a sandbox after globex's id prefix.
    let squat = CreateSandboxRequest { source: "busybox".into(), name: Some(g[..8].to_string()), ..Default::default() };
    refused_name("sandbox named after another tenant's id prefix", rt.block_on(acme.create_sandbox(&squat)), &g[..8]);
    assert_eq!(rt.block_on(globex.get_sandbox(&g[..8])).unwrap().id, g, "globex still resolves its prefix");
    let inspected: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &g[..8], "--json"])).unwrap();
    assert_eq!(inspected["id"], g.as_str(), "the operator's inspect resolves globex's prefix to globex's sandbox");
    assert_eq!(rt.block_on(acme.list_sandboxes()).unwrap().len(), 1, "nothing was created");

    // Every kind of object with a user-chosen name, upper- or lower-case hex, short or long.
    for name in ["deadbeef", "ABCDEF12", &a[..], "1234"] {
        let req = CreateSandboxRequest { source: "busybox".into(), name: Some(name.to_string()), ..Default::default() };
        refused_name("sandbox", rt.block_on(acme.create_sandbox(&req)), name);
    }
    refused_name(
        "checkpoint",
        rt.block_on(acme.checkpoint(&a, &CheckpointRequest { name: Some("cafe0123".into()), ..Default::default() })),
        "cafe0123",
    );
    let ck = rt
        .block_on(acme.checkpoint(&a, &CheckpointRequest { name: Some("acme-ck".into()), ..Default::default() }))
        .unwrap();
    refused_name(
        "template",
        rt.block_on(acme.create_template(&CreateTemplateRequest {
            name: "beef".into(),
            from: ck.id.clone(),
            replace: false,
            accept_findings: true,
        })),
        "beef",
    );
    let build = strata_api::BuildTemplateRequest {
        name: "f00d".into(),
        file: "FROM busybox\n".into(),
        context: None,
        no_cache: false,
        accept_findings: true,
        start_cmd: None,
        ready_cmd: None,
    };
    match rt.block_on(acme.build_template(&build)) {
        Err(e) => refused_name("template build", Err::<(), _>(e), "f00d"),
        Ok(mut evs) => {
            let mut failed = None;
            while let Some(ev) = rt.block_on(evs.next()).unwrap() {
                if let strata_api::BuildEvent::Failed { error, .. } = ev {
                    failed = Some(error);
                }
            }
            let e = failed.expect("the build fails");
            assert!(
                e.code == ErrorCode::BadRequest && e.message.contains("f00d") && e.message.contains("hex"),
                "template build: {e:?}"
            );
        }
    }
    let fork = ForkRequest {
        source: ck.id.clone(),
        count: 1,
        name_prefix: None,
        lifecycle: Lifecycle::Persistent,
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    };
    let fanout = strata_api::FanoutRequest {
        source: ck.id.clone(),
        plan: strata_api::FanoutPlan { run: Some("true".into()), count: Some(1), ..Default::default() },
        promote_as: Some("0ddba11".into()),
        name_prefix: None,
        lifecycle: Lifecycle::Ephemeral,
        ttl: None,
        limits: None,
    };
    refused_name("fan-out promote_as", rt.block_on(acme.fanout(&fanout)), "0ddba11");
    let spec = "name = \"abc123\"\n\n[[stage]]\nname = \"one\"\nsource = \"image:busybox\"\nlifecycle = \"ephemeral\"\ncommands = [\"true\"]\n";
    refused_name(
        "pipeline run",
        rt.block_on(acme.run_pipeline(&strata_api::RunPipelineRequest { toml: Some(spec.into()), spec: None })),
        "abc123",
    );
    // The operator's objects too: tokens and images.
    let op = d.client();
    refused_name(
        "token",
        rt.block_on(op.create_token(&strata_api::CreateTokenRequest {
            name: "c0ffee".into(),
            tenant: Some("acme".into()),
            expires: None,
            e2b: false,
        })),
        "c0ffee",
    );
    let imgs = common::images_dir();
    let import = strata_api::ImportImageRequest {
        source: imgs.join("busybox-rootfs.tar").display().to_string(),
        name: "facade42".into(),
        trusted: false,
        replace: false,
    };
    refused_name("image", rt.block_on(op.import_image(&import)), "facade42");
    // Names with any other character are fine, and nothing above was created.
    let forked = rt.block_on(acme.fork(&fork)).unwrap();
    assert_eq!(forked.sandboxes.len(), 1);
    let ok =
        CreateSandboxRequest { source: "busybox".into(), name: Some(format!("{}-x", &g[..8])), ..Default::default() };
    rt.block_on(acme.create_sandbox(&ok)).unwrap();
    assert_eq!(
        rt.block_on(acme.list_checkpoints(None)).unwrap().iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
        vec!["acme-ck".to_string()],
        "no refused checkpoint was made"
    );
    assert!(rt.block_on(acme.list_templates()).unwrap().is_empty());
    assert!(rt.block_on(acme.list_pipelines()).unwrap().is_empty());
    assert!(rt.block_on(op.list_images()).unwrap().iter().all(|i| i.name != "facade42"));
}

/// Copies sandbox `from`'s row (and its usage record) as a stopped sandbox
/// with `id`, `name` and `tenant`, as a database from before the name rule
/// could hold.
fn insert_legacy_sandbox(db: &rusqlite::Connection, from: &str, id: &str, name: &str, tenant: &str) {
    db.execute_batch("DROP TABLE IF EXISTS temp.copy; DROP TABLE IF EXISTS temp.ucopy;").unwrap();
    db.execute("CREATE TEMP TABLE copy AS SELECT * FROM sandboxes WHERE id = ?1", [from]).unwrap();
    // (A copy holds no user-namespace range: each range is one sandbox's.)
    db.execute("UPDATE temp.copy SET id = ?1, name = ?2, tenant = ?3, state = 'stopped', init_pid = NULL, init_start_time = NULL, userns_base = NULL", [id, name, tenant]).unwrap();
    db.execute("INSERT INTO sandboxes SELECT * FROM temp.copy", []).unwrap();
    db.execute("CREATE TEMP TABLE ucopy AS SELECT * FROM usage WHERE sandbox_id = ?1", [from]).unwrap();
    db.execute("UPDATE temp.ucopy SET sandbox_id = ?1, name = ?2, tenant = ?3", [id, name, tenant]).unwrap();
    db.execute("INSERT INTO usage SELECT * FROM temp.ucopy", []).unwrap();
}

/// Resolution is exact: a full id resolves to that id, then an exact name,
/// then an id prefix unique among the caller's own objects. Records from
/// before the name rule (a hex name squatting another tenant's prefix, an id
/// sharing a prefix with another tenant's) neither break nor reveal the other
/// tenant's prefixes, still resolve by id, and are listed by `strata doctor`.
#[test]
fn id_prefixes_resolve_among_the_callers_own_objects() {
    require_host!();
    let (d, addr) = daemon();
    d.import_busybox();
    let acme_secret = secret(&token(&d, "ci", "acme", &[]));
    let globex_secret = secret(&token(&d, "ci", "globex", &[]));
    let rt = rt();
    let g = create(&tcp(&addr, &globex_secret), "busybox", "globex-box");
    let a = create(&tcp(&addr, &acme_secret), "busybox", "acme-box");
    rt.block_on(tcp(&addr, &acme_secret).stop_sandbox(&a)).unwrap();

    // Legacy rows of acme (written straight into the metadata database, as a
    // daemon from before the name rule could have): one named after globex's
    // 8-character prefix, one whose id shares globex's first 6 characters.
    let squatter = format!("{}{}", &a[..8], "00000000");
    let twin = format!("{}{}", &g[..6], if &g[6..] == "0000000000" { "1111111111" } else { "0000000000" });
    {
        let db = rusqlite::Connection::open(d.state("metadata.db")).unwrap();
        db.busy_timeout(Duration::from_secs(5)).unwrap();
        insert_legacy_sandbox(&db, &a, &squatter, &g[..8], "acme");
        insert_legacy_sandbox(&db, &a, &twin, "acme-twin", "acme");
    }
    let acme = tcp(&addr, &acme_secret);
    let globex = tcp(&addr, &globex_secret);
    let op = d.client();

    // globex: its 8- and 6-character prefixes are its own sandbox, whatever acme holds.
    for p in [&g[..8], &g[..6], &g[..4]] {
        assert_eq!(rt.block_on(globex.get_sandbox(p)).unwrap().id, g, "globex's prefix {p}");
        let exec = rt.block_on(globex.exec(p, &ExecRequest { cmd: vec!["hostname".into()], ..Default::default() }));
        assert!(exec.is_ok(), "globex can use its prefix {p}: {exec:?}");
        assert_eq!(rt.block_on(globex.cost(p)).unwrap().sandbox_id, g, "cost of {p}");
        let evs = rt.block_on(globex.events(Some(p), 0)).unwrap();
        assert!(!evs.is_empty() && evs.iter().all(|e| e.sandbox_id == g), "events of {p}: {evs:?}");
    }
    // acme: its legacy name still resolves to its own record, ids resolve exactly,
    // and the prefix it shares with globex is its own twin for acme.
    assert_eq!(rt.block_on(acme.get_sandbox(&g[..8])).unwrap().id, squatter);
    assert_eq!(rt.block_on(acme.get_sandbox(&squatter)).unwrap().id, squatter, "a full id resolves to that id");
    assert_eq!(rt.block_on(acme.get_sandbox(&g[..6])).unwrap().id, twin);
    let nope = "0123456789abcdef";
    same_as_unknown(
        "globex's full id for acme",
        rt.block_on(acme.get_sandbox(&g)),
        &g,
        rt.block_on(acme.get_sandbox(nope)),
        nope,
    );
    // The operator sees all: full ids exactly, the legacy name by its name, an
    // ambiguous prefix is unknown.
    assert_eq!(rt.block_on(op.get_sandbox(&g)).unwrap().id, g);
    assert_eq!(rt.block_on(op.get_sandbox(&squatter)).unwrap().id, squatter);
    assert_eq!(rt.block_on(op.get_sandbox(&g[..8])).unwrap().id, squatter, "exact name before prefix");
    assert_eq!(err(rt.block_on(op.get_sandbox(&g[..6]))).1, ErrorCode::SandboxNotFound, "ambiguous among all tenants");
    // The check lists the legacy name, with its tenant and id (never the default names, which are ids).
    let doctor: serde_json::Value = serde_json::from_str(&d.cli_ok(&["doctor", "--json"])).unwrap();
    let listed = doctor["names_like_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("doctor lists names that look like ids: {doctor}"));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed[0]["kind"].as_str(),
            listed[0]["id"].as_str(),
            listed[0]["name"].as_str(),
            listed[0]["tenant"].as_str()
        ),
        (Some("sandbox"), Some(squatter.as_str()), Some(&g[..8]), Some("acme"))
    );
    assert!(d.log().contains(&g[..8]), "the daemon warns about it at start or on the check");
}
