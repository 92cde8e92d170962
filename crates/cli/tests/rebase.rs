//! Patching (issue 19, point 3): an image name keeps its versions, `strata
//! outdated` lists what sits on an older one, `strata rebase` moves a stopped
//! or standby sandbox onto the newer base (conflicts refused unless a side is
//! preferred; another OS family or machine refused), and `strata template
//! rebuild` reruns a built template's steps on a new base.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::TestDaemon;
use strata_api::ErrorCode;

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

fn api_err(err: strata_client::ClientError) -> (u16, strata_api::ApiErrorBody) {
    match err {
        strata_client::ClientError::Api { status, body } => (status, body),
        e => panic!("{e}"),
    }
}

/// A copy of the busybox rootfs directory at `dir/name` with `files` written into it.
fn rootfs(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let out = dir.join(name);
    let st = Command::new("cp").arg("-a").arg(common::images_dir().join("busybox-rootfs")).arg(&out).status().unwrap();
    assert!(st.success(), "cp -a of the busybox rootfs");
    for (rel, data) in files {
        let p = out.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // Replace symlinks (bin/sh -> busybox) rather than writing through them.
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, data).unwrap();
    }
    out
}

/// The first 64 bytes of a 64-bit little-endian ELF executable for `machine`.
fn elf_header(machine: u16) -> Vec<u8> {
    let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    h.resize(16, 0);
    h.extend_from_slice(&2u16.to_le_bytes()); // e_type: executable
    h.extend_from_slice(&machine.to_le_bytes());
    h.resize(64, 0);
    h
}

fn cat(d: &TestDaemon, id: &str, path: &str) -> String {
    d.cli_ok(&["exec", id, "--", "cat", path])
}

fn outdated_names(d: &TestDaemon) -> Vec<(String, String)> {
    let v = json(d, &["outdated", "--json"]);
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap().into(), e["name"].as_str().unwrap().into()))
        .collect()
}

#[test]
fn an_image_name_keeps_versions_and_sandboxes_and_templates_move_onto_the_newest() {
    require_host!();
    let d = TestDaemon::start();
    let tmp = tempfile::tempdir().unwrap();
    let rt = common::rt();
    let c = d.client();

    // Version 1 of `bb`, a template built on it, and sandboxes made from it.
    let v1 = rootfs(tmp.path(), "v1", &[("etc/motd", b"v1\n"), ("etc/app.conf", b"base-v1\n")]);
    d.cli_ok(&["image", "import", v1.to_str().unwrap(), "--name", "bb"]);
    let img1 = json(&d, &["image", "inspect", "bb", "--json"]);
    assert_eq!(img1["version"], 1);
    assert_eq!(
        img1["platform"]["architecture"],
        std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64")
    );
    assert_eq!(img1["platform"]["family"], "strata-busybox", "from its /etc/os-release: {img1}");
    let v1_id = img1["id"].as_str().unwrap().to_string();

    let recipe = tmp.path().join("Buildfile");
    std::fs::write(&recipe, "FROM bb\nRUN echo built > /hello\n").unwrap();
    d.cli_ok(&["template", "build", "tb", "-f", recipe.to_str().unwrap()]);
    let t = rt.block_on(c.list_templates()).unwrap().into_iter().find(|t| t.name == "tb").unwrap();
    assert_eq!(t.built_from.as_deref(), Some("bb"));

    let kept = d.cli_ok(&["create", "bb", "--name", "kept"]).trim().to_string();
    d.cli_ok(&[
        "exec",
        &kept,
        "--",
        "sh",
        "-c",
        "echo mine > /etc/app.conf && mkdir -p /work && echo keep > /work/notes",
    ]);
    d.cli_ok(&["stop", &kept]);
    let based = d.cli_ok(&["create", "bb", "--name", "based"]).trim().to_string();
    d.cli_ok(&["exec", &based, "--", "sh", "-c", "echo mine > /etc/app.conf && echo flat > /etc/conf.d"]);
    let running = d.cli_ok(&["create", "bb", "--name", "running"]).trim().to_string();
    assert!(outdated_names(&d).is_empty(), "nothing is outdated while bb has one version");

    // Without --replace a second import of the name is refused; with it, version 2 keeps version 1.
    let v2 = rootfs(
        tmp.path(),
        "v2",
        &[("etc/motd", b"v2\n"), ("etc/app.conf", b"base-v2\n"), ("etc/patched", b"yes\n"), ("etc/conf.d/x", b"x\n")],
    );
    let out = d.cli(&["image", "import", v2.to_str().unwrap(), "--name", "bb"]);
    assert!(!out.status.success() && common::stderr(&out).contains("replace"), "{}", common::stderr(&out));
    d.cli_ok(&["image", "import", v2.to_str().unwrap(), "--name", "bb", "--replace"]);
    let img2 = json(&d, &["image", "inspect", "bb", "--json"]);
    assert_eq!((img2["version"].as_u64(), img2["previous"].as_str()), (Some(2), Some(v1_id.as_str())), "{img2}");
    let versions = json(&d, &["image", "versions", "bb", "--json"]);
    let listed: Vec<u64> = versions.as_array().unwrap().iter().map(|i| i["version"].as_u64().unwrap()).collect();
    assert_eq!(listed, [2, 1], "newest first: {versions}");
    assert_eq!(json(&d, &["image", "inspect", &v1_id, "--json"])["version"], 1, "an id names its own version");
    assert_eq!(json(&d, &["image", "ls", "--json"]).as_array().unwrap().len(), 1, "ls shows the newest only");
    assert_eq!(json(&d, &["image", "ls", "--all", "--json"]).as_array().unwrap().len(), 2);

    // What is behind: the three sandboxes, the template (and its checkpoint), each with how to move it.
    let out = json(&d, &["outdated", "--json"]);
    let names = outdated_names(&d);
    for (kind, name) in [("sandbox", "kept"), ("sandbox", "based"), ("sandbox", "running"), ("template", "tb")] {
        assert!(names.contains(&(kind.into(), name.into())), "{kind} {name} in {out}");
    }
    let tb = out.as_array().unwrap().iter().find(|e| e["name"] == "tb").unwrap();
    assert_eq!((tb["version"].as_u64(), tb["newest_version"].as_u64()), (Some(1), Some(2)));
    assert_eq!(tb["how"], "strata template rebuild tb --base bb");
    let acc = rt.block_on(c.accumulation(&kept)).unwrap();
    assert_eq!((acc.image.as_deref(), acc.newer_image.as_deref()), (Some("bb@1"), Some("bb@2")), "{acc:?}");

    // A check of the template says so too; quarantining on it stops new sandboxes from it.
    let out = d.cli(&["template", "check", "tb", "--json"]);
    assert_eq!(out.status.code(), Some(2), "findings give exit status 2: {}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "image.outdated").unwrap();
    assert!(f["reason"].as_str().unwrap().contains("strata template rebuild tb --base bb"), "{r}");
    assert_eq!(
        (r["image"].as_str(), r["newer_image"].as_str(), r["action"].as_str()),
        (Some("bb@1"), Some("bb@2"), Some("on_findings record: recorded"))
    );
    let patch = strata_api::TemplatePolicyPatch { check_every: None, on_findings: Some(strata_api::OnFindings::Stop) };
    let (status, body) = api_err(rt.block_on(c.set_template_policy("tb", &patch)).unwrap_err());
    assert_eq!((status, body.code), (400, ErrorCode::BadRequest), "{}", body.message);
    d.cli_ok(&["template", "update", "tb", "--check-every", "24h", "--on-findings", "quarantine"]);
    let r = rt.block_on(c.check_template("tb")).unwrap();
    assert_eq!(r.action, "on_findings quarantine: its checkpoint quarantined");
    let out = d.cli(&["create", "tb"]);
    assert!(!out.status.success() && common::stderr(&out).contains("quarantined"), "{}", common::stderr(&out));
    d.cli_ok(&["quarantine", "lift", &r.checkpoint, "--reason", "outdated, rebuilt below"]);
    let out = d.cli(&["template", "check", "nope"]);
    assert!(!out.status.success() && common::stderr(&out).contains("not_found"), "{}", common::stderr(&out));

    // A running sandbox: 409 with its state.
    let (status, body) = api_err(
        rt.block_on(c.rebase(&running, &strata_api::RebaseRequest { onto: "bb".into(), prefer: None })).unwrap_err(),
    );
    assert_eq!(
        (status, body.code, body.current_state),
        (409, ErrorCode::InvalidState, Some(strata_api::SandboxState::Running))
    );

    // A path changed in the sandbox and between the bases: refused, listed.
    let (status, body) = api_err(
        rt.block_on(c.rebase(&kept, &strata_api::RebaseRequest { onto: "bb".into(), prefer: None })).unwrap_err(),
    );
    assert_eq!((status, body.code), (409, ErrorCode::RebaseConflicts), "{}", body.message);
    let paths: Vec<&str> = body.conflicts.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(paths, ["/etc/app.conf"], "only the path both sides changed: {}", body.message);
    assert_eq!((body.conflicts[0].sandbox.as_str(), body.conflicts[0].base.as_str()), ("modified", "modified"));
    let out = d.cli(&["rebase", &kept, "--onto", "bb"]);
    assert!(!out.status.success() && common::stderr(&out).contains("/etc/app.conf"), "{}", common::stderr(&out));
    assert_eq!(json(&d, &["inspect", &kept, "--json"])["image_id"], v1_id.as_str(), "a refused rebase changes nothing");

    // --prefer sandbox: the sandbox's file wins, the rest of the new base shows through.
    let r = json(&d, &["rebase", &kept, "--onto", "bb", "--prefer", "sandbox", "--json"]);
    assert_eq!(r["state_before"], "stopped");
    let found: Vec<&str> =
        r["scan"]["findings"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(found, ["/etc/app.conf"], "the result is scanned (a changed /etc file is a finding): {r}");
    // The base: motd, app.conf, patched, conf.d and conf.d/x; the sandbox's layer: etc, etc/app.conf,
    // work, work/notes (and what the runtime made).
    assert_eq!(r["base_changes"].as_u64(), Some(5), "{r}");
    assert!(r["sandbox_paths"].as_u64().unwrap() >= 4, "{r}");
    assert!(r["note"].as_str().unwrap().contains("processes"), "{r}");
    assert_eq!(json(&d, &["inspect", &kept, "--json"])["state"], "stopped");
    d.cli_ok(&["start", &kept]);
    assert_eq!(cat(&d, &kept, "/etc/app.conf"), "mine\n");
    assert_eq!(cat(&d, &kept, "/work/notes"), "keep\n");
    assert_eq!((cat(&d, &kept, "/etc/motd"), cat(&d, &kept, "/etc/patched")), ("v2\n".into(), "yes\n".into()));
    assert!(d.cli_ok(&["events", &kept]).contains("rebase"), "the rebase is an event");
    let (status, body) = api_err(
        rt.block_on(c.rebase(&kept, &strata_api::RebaseRequest { onto: "bb".into(), prefer: None })).unwrap_err(),
    );
    assert_eq!(status, 409, "{}", body.message); // running again

    // --prefer base from standby: the base's file wins, processes do not come back.
    d.cli_ok(&["standby", &based]);
    // Where the new base has a directory and the sandbox a file, the base cannot win: refused
    // before anything changes.
    let out = d.cli(&["rebase", &based, "--onto", "bb", "--prefer", "base"]);
    let err = common::stderr(&out);
    assert!(!out.status.success() && err.contains("rebase_conflicts") && err.contains("/etc/conf.d"), "{err}");
    assert_eq!(json(&d, &["inspect", &based, "--json"])["state"], "standby", "a refused rebase changes nothing");
    d.cli_ok(&["exec", &based, "--", "rm", "/etc/conf.d"]); // resumes it
    d.cli_ok(&["standby", &based]);
    let r = json(&d, &["rebase", &based, "--onto", "bb", "--prefer", "base", "--json"]);
    assert_eq!(r["state_before"], "standby");
    assert_eq!(json(&d, &["inspect", &based, "--json"])["state"], "stopped", "a rebased standby sandbox is stopped");
    d.cli_ok(&["start", &based]);
    assert_eq!(cat(&d, &based, "/etc/app.conf"), "base-v2\n");
    let behind: Vec<(String, String)> = outdated_names(&d);
    assert!(!behind.iter().any(|(_, n)| n == "kept" || n == "based"), "rebased sandboxes are current: {behind:?}");

    // Another OS family, another machine: 400 with the reason.
    d.cli_ok(&["stop", &kept]);
    let deb = rootfs(tmp.path(), "deb", &[("etc/os-release", b"ID=debian\nVERSION_ID=\"12\"\n")]);
    d.cli_ok(&["image", "import", deb.to_str().unwrap(), "--name", "deb"]);
    let out = d.cli(&["rebase", &kept, "--onto", "deb"]);
    let err = common::stderr(&out);
    assert!(!out.status.success() && err.contains("bad_request") && err.contains("family"), "{err}");
    let arm = rootfs(tmp.path(), "arm", &[("bin/sh", &elf_header(183))]);
    d.cli_ok(&["image", "import", arm.to_str().unwrap(), "--name", "armbb"]);
    assert_eq!(json(&d, &["image", "inspect", "armbb", "--json"])["platform"]["architecture"], "arm64");
    let out = d.cli(&["rebase", &kept, "--onto", "armbb"]);
    let err = common::stderr(&out);
    assert!(!out.status.success() && err.contains("bad_request") && err.contains("arm64"), "{err}");
    let out = d.cli(&["rebase", &kept, "--onto", "no-such-image"]);
    assert!(!out.status.success() && common::stderr(&out).contains("not_found"), "{}", common::stderr(&out));

    // A built template reruns its steps on the new base.
    let out = d.cli_ok(&["template", "rebuild", "tb", "--base", "bb", "--json"]);
    assert!(out.lines().any(|l| l.contains("\"done\"") || l.contains("Done")), "{out}");
    let from_tb = d.cli_ok(&["create", "tb"]).trim().to_string();
    assert_eq!((cat(&d, &from_tb, "/hello"), cat(&d, &from_tb, "/etc/motd")), ("built\n".into(), "v2\n".into()));
    assert!(!outdated_names(&d).iter().any(|(_, n)| n == "tb"), "the rebuilt template is current");
    let t = rt.block_on(c.list_templates()).unwrap().into_iter().find(|t| t.name == "tb").unwrap();
    assert_eq!((t.check_every.as_deref(), t.on_findings), (Some("24h"), strata_api::OnFindings::Quarantine), "kept");
    assert!(t.last_check.is_none(), "the last check was of the old content");
    let r = rt.block_on(c.check_template("tb")).unwrap();
    assert!(r.findings.is_empty() && r.action == "none", "{r:?}");
    // A promoted template has no steps to run again.
    d.cli_ok(&["template", "create", "promoted", "--from", &from_tb]);
    let out = d.cli(&["template", "rebuild", "promoted"]);
    assert!(!out.status.success() && common::stderr(&out).contains("invalid_state"), "{}", common::stderr(&out));
    let out = d.cli(&["template", "rebuild", "no-such-template"]);
    assert!(!out.status.success() && common::stderr(&out).contains("not_found"), "{}", common::stderr(&out));

    // Version 1 stays while something is on it; then it can go by its id, and version 2 stays.
    let out = d.cli(&["image", "rm", &v1_id]);
    assert!(!out.status.success() && common::stderr(&out).contains("in_use"), "{}", common::stderr(&out));
    d.cli_ok(&["rm", "-f", &running]);
    d.cli_ok(&["image", "rm", &v1_id]);
    let versions = json(&d, &["image", "versions", "bb", "--json"]);
    assert_eq!(versions.as_array().unwrap().len(), 1, "{versions}");
    assert_eq!(versions[0]["version"], 2);
}

#[test]
fn a_stopped_microvm_moves_onto_the_newer_base_through_its_guest() {
    require_microvm!();
    let d = TestDaemon::start();
    let tmp = tempfile::tempdir().unwrap();
    let rt = common::rt();
    let c = d.client();
    let v1 = rootfs(tmp.path(), "v1", &[("etc/app.conf", b"base-v1\n"), ("etc/retired", b"v1 only\n")]);
    d.cli_ok(&["image", "import", v1.to_str().unwrap(), "--name", "vb"]);
    let v1_id = json(&d, &["image", "inspect", "vb", "--json"])["id"].as_str().unwrap().to_string();
    let id = d.cli_ok(&["create", "vb", "--isolation", "microvm", "--network", "none"]).trim().to_string();
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo mine > /etc/app.conf && echo mine > /etc/retired && mkdir -p /work && echo keep > /work/notes",
    ]);
    let v2 = rootfs(tmp.path(), "v2", &[("etc/app.conf", b"base-v2\n"), ("etc/patched", b"yes\n")]);
    d.cli_ok(&["image", "import", v2.to_str().unwrap(), "--name", "vb", "--replace"]);
    let rebase = |prefer| rt.block_on(c.rebase(&id, &strata_api::RebaseRequest { onto: "vb".into(), prefer }));

    // In standby its disk belongs to the saved VM: refused with the way out.
    d.cli_ok(&["standby", &id]);
    let (status, body) = api_err(rebase(None).unwrap_err());
    assert_eq!((status, body.current_state), (409, Some(strata_api::SandboxState::Standby)), "{}", body.message);
    assert!(body.message.contains("stop it first"), "{}", body.message);
    d.cli_ok(&["stop", &id]);

    // Stopped: its layer is read through a guest; the paths both sides changed are refused, listed.
    let (status, body) = api_err(rebase(None).unwrap_err());
    assert_eq!((status, body.code), (409, ErrorCode::RebaseConflicts), "{}", body.message);
    let paths: Vec<&str> = body.conflicts.iter().map(|x| x.path.as_str()).collect();
    assert_eq!(paths, ["/etc/app.conf", "/etc/retired"], "{}", body.message);
    assert_eq!(json(&d, &["inspect", &id, "--json"])["image_id"], v1_id.as_str(), "a refused rebase changes nothing");

    // Prefer base: the guest takes the new base's version of each (and removes
    // what the new base no longer has); the rest of the sandbox's layer stays.
    let r = rebase(Some(strata_api::Prefer::Base)).unwrap();
    assert_eq!((r.state_before, r.conflicts.len()), (strata_api::SandboxState::Stopped, 2), "{r:?}");
    assert!(r.scan.findings.iter().all(|f| f.path != "/etc/app.conf"), "the base's version is no finding: {r:?}");
    let info = json(&d, &["inspect", &id, "--json"]);
    assert_eq!((info["runtime"].as_str(), info["state"].as_str()), (Some("microvm"), Some("stopped")), "{info}");
    assert_ne!(info["image_id"], v1_id.as_str(), "{info}");
    d.cli_ok(&["start", &id]);
    let seen = d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "cat /etc/app.conf /etc/patched /work/notes; test -e /etc/retired || echo retired gone",
    ]);
    assert_eq!(seen, "base-v2\nyes\nkeep\nretired gone\n");
    d.cli_ok(&["rm", "-f", &id]);
}
