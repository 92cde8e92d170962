//! Checkpoints, forks, restores, diffs and exports.

mod common;

use common::TestDaemon;
use strata_api::{ErrorCode, ForkRequest};

fn json(d: &TestDaemon, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(args)).unwrap()
}

#[test]
fn checkpoints_are_incremental_and_forks_share_layers_with_fresh_identities() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    d.create(&["--name", "dev"]);
    d.cli_ok(&["exec", "dev", "--", "sh", "-c", "mkdir /work && echo v1 > /work/a && echo b > /work/b && rm /bin/vi"]);
    let c1 = json(&d, &["checkpoint", "dev", "--name", "c1", "--json"]);
    assert!(c1["parent"].is_null());
    assert_eq!(c1["layers"].as_array().unwrap().len(), 2, "image layer + checkpoint layer");
    // Identity files managed by strata never show up as changes.
    let diff = d.cli_ok(&["diff", "dev"]);
    assert_eq!(diff, "", "nothing changed since c1");
    d.cli_ok(&["exec", "dev", "--", "sh", "-c", "echo v2 > /work/a; rm /work/b; echo n > /root/n"]);
    let changes: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["diff", "dev", "--json"])).unwrap();
    let summary: Vec<(String, String)> = changes
        .iter()
        .map(|c| (c["path"].as_str().unwrap().to_string(), c["change"].as_str().unwrap().to_string()))
        .collect();
    // /work/a existed at c1 (in the writable layer only): a modification.
    assert_eq!(
        summary,
        [
            ("/root/n".to_string(), "added".to_string()),
            ("/work/a".into(), "modified".into()),
            ("/work/b".into(), "deleted".into())
        ]
    );
    let c2 = json(&d, &["checkpoint", "dev", "--name", "c2", "--json"]);
    assert_eq!(c2["parent"], c1["id"]);
    assert_eq!(c2["changed_paths"], 3);
    assert!(c2["layer_size"].as_u64().unwrap() < 100, "only the changed bytes: {c2}");

    // Fork 3 from c2: each child sees c2's state, shares its layers, has its own identity.
    let ids: Vec<String> = d.cli_ok(&["fork", "c2", "--count", "3"]).lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 3);
    let mut machine_ids = std::collections::HashSet::new();
    for (i, id) in ids.iter().enumerate() {
        let out = d.cli_ok(&["exec", id, "--", "sh", "-c", "cat /work/a; test ! -e /work/b && test ! -e /bin/vi && echo gone; cat /run/strata/generation; echo $STRATA_FORK_GENERATION; hostname; cat /etc/machine-id"]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(&lines[..4], ["v2", "gone", "1", "1"], "{out}");
        assert_eq!(lines[4], format!("dev-{}", i + 1));
        machine_ids.insert(lines[5].to_string());
        let info = json(&d, &["inspect", id, "--json"]);
        assert_eq!(info["base_checkpoint"], c2["id"]);
        assert_eq!(info["fork_generation"], 1);
    }
    machine_ids.insert(d.cli_ok(&["exec", "dev", "--", "cat", "/etc/machine-id"]).trim().to_string());
    assert_eq!(machine_ids.len(), 4, "every sandbox has its own machine-id");
    // Children write privately.
    d.cli_ok(&["exec", &ids[0], "--", "sh", "-c", "echo mine > /work/a"]);
    assert_eq!(d.cli_ok(&["exec", &ids[1], "--", "cat", "/work/a"]), "v2\n");
    assert_eq!(d.cli_ok(&["exec", "dev", "--", "cat", "/work/a"]), "v2\n");
    // No layer was copied for the forks: the store holds image + c1 + c2 layers only.
    assert_eq!(std::fs::read_dir(d.state("layers/sha256")).unwrap().count(), 3);

    // A child's next checkpoint continues the lineage.
    let c3 = json(&d, &["checkpoint", &ids[0], "--json"]);
    assert_eq!(c3["parent"], c2["id"]);
    assert_eq!(c3["layers"].as_array().unwrap().len(), 4);
    // Create from a checkpoint by name.
    let from_c1 = d.cli_ok(&["create", "c1"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &from_c1, "--", "cat", "/work/a", "/work/b"]), "v1\nb\n");
}

#[test]
fn restore_rolls_back_in_place_and_can_keep_the_current_state() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    d.create(&["--name", "r"]);
    d.cli_ok(&["exec", "r", "--", "sh", "-c", "echo good > /root/state"]);
    d.cli_ok(&["checkpoint", "r", "--name", "good"]);
    d.cli_ok(&["exec", "r", "--", "sh", "-c", "echo broken > /root/state; touch /root/junk"]);
    let out = d.cli(&["restore", "r", "--to", "good", "--keep-current", "--json"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = r["kept"]["name"].as_str().unwrap().to_string();
    assert_eq!(r["sandbox"]["state"], "running");
    assert_eq!(d.cli_ok(&["exec", "r", "--", "sh", "-c", "cat /root/state; ls /root"]), "good\nstate\n");
    // The discarded state is still reachable through the kept checkpoint.
    let other = d.cli_ok(&["create", &kept]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &other, "--", "cat", "/root/state"]), "broken\n");
    // Restore without keeping on a stopped sandbox leaves it stopped.
    d.cli_ok(&["stop", "r"]);
    d.cli_ok(&["restore", "r", "--to", "good"]);
    assert_eq!(json(&d, &["inspect", "r", "--json"])["state"], "stopped");
    let events = d.cli_ok(&["events", "r", "--json"]);
    assert!(events.contains("\"reason\":\"restore\"") && events.contains("\"reason\":\"checkpoint\""), "{events}");
}

#[test]
fn export_writes_exactly_the_change_set_with_deletions() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /out && echo result > /out/r.txt && rm /bin/vi && ln -s r.txt /out/link",
    ]);
    let work = tempfile::tempdir().unwrap();
    let tar_path = work.path().join("changes.tar");
    d.cli_ok(&["export", &id, "-o", tar_path.to_str().unwrap()]);
    let mut ar = tar::Archive::new(std::fs::File::open(&tar_path).unwrap());
    let mut names = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().display().to_string();
        if p == "out/r.txt" {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut e, &mut s).unwrap();
            assert_eq!(s, "result\n");
        }
        names.push(p);
    }
    assert_eq!(
        names,
        ["bin/", "bin/.wh.vi", "out/", "out/link", "out/r.txt"],
        "deletions appear as whiteouts; identity files are not exported"
    );
}

#[test]
fn tmp_is_part_of_the_filesystem_unless_asked_to_be_scratch() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // By default /tmp is a directory of the writable layer, as in Docker and E2B:
    // diffs, checkpoints, forks, templates and exports have it.
    let id = d.create(&[]);
    assert_eq!(json(&d, &["inspect", &id, "--json"])["tmp"], "disk");
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "mkdir /tmp/work && echo built > /tmp/work/out"]);
    assert!(d.cli_ok(&["diff", &id]).contains("/tmp/work/out"));
    let tar = d.dir.path().join("export.tar");
    d.cli_ok(&["export", &id, "-o", tar.to_str().unwrap()]);
    let listing = std::process::Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    assert!(String::from_utf8_lossy(&listing.stdout).contains("tmp/work/out"));
    let ck = json(&d, &["checkpoint", &id, "--json"]);
    assert_eq!(ck["tmp"], "disk", "{ck}");
    let ck = ck["id"].as_str().unwrap();
    let child = d.cli_ok(&["fork", ck, "-n", "1"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &child, "--", "cat", "/tmp/work/out"]), "built\n");
    d.cli_ok(&["template", "create", "with-tmp", "--from", ck]);
    let from_template = d.cli_ok(&["create", "with-tmp"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &from_template, "--", "cat", "/tmp/work/out"]), "built\n");

    // --tmp tmpfs: scratch space, never kept; what is made from its checkpoints inherits it
    // unless asked otherwise (nothing of it is there to inherit).
    let scratch = d.create(&["--tmp", "tmpfs"]);
    assert_eq!(json(&d, &["inspect", &scratch, "--json"])["tmp"], "tmpfs");
    d.cli_ok(&["exec", &scratch, "--", "sh", "-c", "echo gone > /tmp/s && echo kept > /root/k"]);
    let diff = d.cli_ok(&["diff", &scratch]);
    assert!(diff.contains("/root/k") && !diff.contains("/tmp/s"), "{diff}");
    let sck = json(&d, &["checkpoint", &scratch, "--json"]);
    assert_eq!(sck["tmp"], "tmpfs", "{sck}");
    let sck = sck["id"].as_str().unwrap();
    let child = d.cli_ok(&["fork", sck, "-n", "1"]).trim().to_string();
    assert_eq!(json(&d, &["inspect", &child, "--json"])["tmp"], "tmpfs");
    assert_eq!(d.cli_ok(&["exec", &child, "--", "ls", "/tmp"]), "");
    assert_eq!(d.cli_ok(&["exec", &child, "--", "cat", "/root/k"]), "kept\n");
    let on_disk = d.cli_ok(&["create", sck, "--tmp", "disk"]).trim().to_string();
    assert_eq!(json(&d, &["inspect", &on_disk, "--json"])["tmp"], "disk");
    d.cli_ok(&["stop", &scratch]);
    d.cli_ok(&["start", &scratch]);
    assert_eq!(d.cli_ok(&["exec", &scratch, "--", "ls", "/tmp"]), "", "emptied at every cold start");
    let out = d.cli(&["create", "busybox", "--tmp", "ram"]);
    assert!(!out.status.success() && common::stderr(&out).contains("ram"), "{}", common::stderr(&out));
}

#[test]
fn a_checkpoint_in_use_is_retired_on_request_and_goes_when_unused() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo v1 > /root/v"]);
    let ck = d.cli_ok(&["checkpoint", &id, "--name", "old"]).trim().to_string();
    let child = d.cli_ok(&["fork", "old", "-n", "1"]).trim().to_string();
    // Plain rm refuses (409, naming the dependents); --when-unused retires it.
    let out = d.cli(&["checkpoint", "rm", "old"]);
    assert!(!out.status.success() && common::stderr(&out).contains(&child), "{}", common::stderr(&out));
    let out = d.cli_ok(&["checkpoint", "rm", "--when-unused", "old"]);
    assert!(out.contains("retired") && out.contains(&child), "{out}");
    // Gone as a source at once: create, fork, restore and template all say 404.
    for args in [
        vec!["create", "old"],
        vec!["fork", "old", "-n", "1"],
        vec!["restore", id.as_str(), "--to", "old"],
        vec!["template", "create", "t", "--from", "old"],
    ] {
        let out = d.cli(&args);
        let err = common::stderr(&out);
        assert!(!out.status.success() && err.contains("was deleted") && err.contains("404"), "{args:?}: {err}");
    }
    // What was made from it runs on; once nothing needs it, the GC frees it.
    assert_eq!(d.cli_ok(&["exec", &child, "--", "cat", "/root/v"]), "v1\n");
    d.cli_ok(&["gc"]);
    assert_eq!(json(&d, &["checkpoint", "inspect", &ck, "--json"])["id"], ck.as_str(), "still needed");
    d.cli_ok(&["rm", "-f", &child, &id]);
    d.cli_ok(&["gc"]);
    let out = d.cli(&["checkpoint", "inspect", &ck]);
    assert!(!out.status.success() && common::stderr(&out).contains("404"), "{}", common::stderr(&out));
    // Unused: deleted at once.
    let other = d.create(&[]);
    let ck2 = d.cli_ok(&["checkpoint", &other]).trim().to_string();
    d.cli_ok(&["rm", "-f", &other]);
    assert_eq!(d.cli_ok(&["checkpoint", "rm", "--when-unused", &ck2]).trim(), ck2);
}

#[test]
fn bad_checkpoint_and_fork_requests() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let c = d.client();
    let rt = common::rt();
    let e = rt.block_on(c.checkpoint("nope", &Default::default())).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::SandboxNotFound));
    let fork = |source: &str, count: u32| ForkRequest {
        source: source.into(),
        count,
        name_prefix: None,
        lifecycle: Default::default(),
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    };
    assert_eq!(rt.block_on(c.fork(&fork("nope", 1))).unwrap_err().code(), Some(ErrorCode::SandboxNotFound));
    assert_eq!(rt.block_on(c.fork(&fork(&id, 0))).unwrap_err().code(), Some(ErrorCode::BadRequest));
    assert_eq!(rt.block_on(c.fork(&fork(&id, 10_000))).unwrap_err().code(), Some(ErrorCode::BadRequest));
    assert_eq!(rt.block_on(c.get_checkpoint("nope")).unwrap_err().code(), Some(ErrorCode::CheckpointNotFound));
    // A sandbox that is not running or stopped cannot be checkpointed: 409 with its state.
    let victim = d.create(&[]);
    let pid = serde_json::from_str::<serde_json::Value>(&d.cli_ok(&["inspect", &victim, "--json"])).unwrap()
        ["init_pid"]
        .as_i64()
        .unwrap();
    // SAFETY: killing a sandbox init we created.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(common::wait_until(10, || serde_json::from_str::<serde_json::Value>(
        &d.cli_ok(&["inspect", &victim, "--json"])
    )
    .unwrap()["state"]
        == "lost"));
    match rt.block_on(c.checkpoint(&victim, &Default::default())).unwrap_err() {
        strata_client::ClientError::Api { status, body } => {
            assert_eq!(status, 409);
            assert_eq!(body.current_state, Some(strata_api::SandboxState::Lost));
        }
        other => panic!("{other}"),
    }
    // A checkpoint something still builds on cannot be deleted: 409 naming the dependents.
    let ck = d.cli_ok(&["checkpoint", &id]).trim().to_string();
    let child = d.cli_ok(&["fork", &ck, "-n", "1"]).trim().to_string();
    match rt.block_on(c.delete_checkpoint(&ck)).unwrap_err() {
        strata_client::ClientError::Api { status, body } => {
            assert_eq!(status, 409);
            assert!(body.dependents.iter().any(|x| x.contains(&child)), "{:?}", body.dependents);
        }
        other => panic!("{other}"),
    }
    // Once nothing needs it, it goes, and so does its layer.
    d.cli_ok(&["rm", "-f", &child, &id]);
    let layers_before = std::fs::read_dir(d.state("layers/sha256")).unwrap().count();
    d.cli_ok(&["checkpoint", "rm", &ck]);
    assert_eq!(std::fs::read_dir(d.state("layers/sha256")).unwrap().count(), layers_before - 1);
    let e = rt.block_on(c.diff(&victim, Some("nope"))).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::CheckpointNotFound));
}

#[test]
fn a_full_disk_during_checkpoint_fails_cleanly_and_the_sandbox_keeps_running() {
    require_host!();
    let d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", "checkpoint-write")]);
    d.import_busybox();
    let id = d.create(&[]);
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo data > /root/f"]);
    let layers = std::fs::read_dir(d.state("layers/sha256")).unwrap().count();
    let out = d.cli(&["checkpoint", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(common::stderr(&out).contains("No space left on device"), "{}", common::stderr(&out));
    // No partial checkpoint, no stray layer, and the sandbox is running and thawed.
    assert_eq!(d.cli_ok(&["checkpoint", "ls", "--json"]).trim(), "[]");
    assert_eq!(std::fs::read_dir(d.state("layers/sha256")).unwrap().count(), layers);
    assert_eq!(std::fs::read_dir(d.state("layers/staging")).unwrap().count(), 0);
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/root/f"]), "data\n");
    let state = ["/sys/fs/cgroup/freezer/strata", "/sys/fs/cgroup/strata"]
        .iter()
        .find_map(|r| std::fs::read_to_string(format!("{r}/{id}/freezer.state")).ok());
    if let Some(s) = state {
        assert_eq!(s.trim(), "THAWED");
    }
}

#[test]
fn retention_gc_and_lineage() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let x = d.create(&["--name", "x"]);
    d.cli_ok(&["exec", "x", "--", "sh", "-c", "head -c 100000 /dev/urandom > /big"]);
    let expiring = json(&d, &["checkpoint", "x", "--name", "short", "--ttl", "1s", "--json"]);
    assert!(expiring["expires_at"].is_string());
    let y = d.create(&["--name", "y"]);
    d.cli_ok(&["exec", "y", "--", "sh", "-c", "echo keep > /k"]);
    d.cli_ok(&["checkpoint", "y", "--name", "kept", "--ttl", "1s", "--pin"]);
    d.cli_ok(&["fork", "kept", "-n", "1"]);
    // Lineage of y: image -> y -> kept -> y-1.
    let l = json(&d, &["lineage", "y", "--json"]);
    let kinds: Vec<(String, String)> = l["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["kind"].as_str().unwrap().to_string(), n["name"].as_str().unwrap().to_string()))
        .collect();
    for want in [("image", "busybox"), ("sandbox", "y"), ("checkpoint", "kept"), ("sandbox", "y-1")] {
        assert!(kinds.contains(&(want.0.to_string(), want.1.to_string())), "{want:?} in {kinds:?}");
    }
    let fork_node = l["nodes"].as_array().unwrap().iter().find(|n| n["name"] == "y-1").unwrap();
    assert_eq!(fork_node["parent"], json(&d, &["checkpoint", "inspect", "kept", "--json"])["id"]);
    assert!(d.cli_ok(&["lineage", "y"]).contains("<=="));
    // After a restore the sandbox hangs below a checkpoint taken from it: still a tree.
    let c_y2 = d.cli_ok(&["checkpoint", "y", "--name", "y2"]).trim().to_string();
    d.cli_ok(&["restore", "y", "--to", &c_y2]);
    let l = json(&d, &["lineage", "y", "--json"]);
    let n = l["nodes"].as_array().unwrap();
    let ids: std::collections::HashSet<&str> = n.iter().map(|x| x["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), n.len(), "each node once");
    assert_eq!(n.iter().find(|x| x["name"] == "y").unwrap()["parent"], c_y2.as_str());
    // While x lives its checkpoint is its head: not collected even when expired.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let r = json(&d, &["gc", "--json"]);
    assert!(r["checkpoints_expired"].as_array().unwrap().is_empty(), "{r}");
    d.cli_ok(&["rm", "-f", &x]);
    let r = json(&d, &["gc", "--json"]);
    assert_eq!(r["checkpoints_expired"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["layers_removed"], 1);
    assert!(r["bytes_freed"].as_u64().unwrap() >= 100_000, "{r}");
    let left: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["checkpoint", "ls", "--json"])).unwrap();
    let names: Vec<&str> = left.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["kept", "y2"], "the expired one went; the pinned one and the one without retention stay");
    let _ = y;
}

#[test]
fn deep_chains_are_flattened_transparently() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    d.create(&["--name", "deep"]);
    d.cli_ok(&["exec", "deep", "--", "sh", "-c", "mkdir /work && echo first > /work/a && echo doomed > /work/b"]);
    let mut last = String::new();
    for i in 0..28 {
        let script = match i {
            5 => "rm /work/b; echo 5 > /work/n".to_string(),
            9 => "rm -rf /work && mkdir /work && echo replaced > /work/a".to_string(),
            _ => format!("echo {i} > /work/n"),
        };
        d.cli_ok(&["exec", "deep", "--", "sh", "-c", &script]);
        last = d.cli_ok(&["checkpoint", "deep"]).trim().to_string();
    }
    let ck = json(&d, &["checkpoint", "inspect", &last, "--json"]);
    let chain = ck["layers"].as_array().unwrap().len();
    assert!(chain > 24, "a chain deeper than the flattening threshold: {chain}");
    let kids: Vec<String> = d.cli_ok(&["fork", &last, "-n", "2"]).lines().map(str::to_string).collect();
    for k in &kids {
        assert_eq!(d.cli_ok(&["exec", k, "--", "sh", "-c", "cat /work/a /work/n; ls /work"]), "replaced\n27\na\nn\n");
    }
    // Ids users see are unchanged; the flattened tree is shared by both children.
    let inspect = json(&d, &["inspect", &kids[0], "--json"]);
    assert_eq!(inspect["base_checkpoint"], last.as_str());
    assert_eq!(std::fs::read_dir(d.state("layers/squashed")).unwrap().count(), 1);
    // The original sandbox keeps working on its own mount, and a stop/start of a child reuses the flattened tree.
    d.cli_ok(&["stop", &kids[1]]);
    d.cli_ok(&["start", &kids[1]]);
    assert_eq!(d.cli_ok(&["exec", &kids[1], "--", "cat", "/work/a"]), "replaced\n");
    // When no sandbox mounts it any more, GC removes it.
    d.cli_ok(&["rm", "-f", &kids[0], &kids[1]]);
    d.cli_ok(&["gc"]);
    assert_eq!(std::fs::read_dir(d.state("layers/squashed")).unwrap().count(), 0);
}

#[test]
fn diff_and_export_against_an_older_checkpoint() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    d.create(&["--name", "h"]);
    d.cli_ok(&["exec", "h", "--", "sh", "-c", "mkdir /w && echo 1 > /w/a && echo keep > /w/k"]);
    let c1 = d.cli_ok(&["checkpoint", "h", "--name", "h1"]).trim().to_string();
    d.cli_ok(&["exec", "h", "--", "sh", "-c", "rm /w/a && echo 2 > /w/b && rm -rf /usr/sbin"]);
    d.cli_ok(&["checkpoint", "h", "--name", "h2"]);
    d.cli_ok(&["exec", "h", "--", "sh", "-c", "echo 3 > /w/b && echo new > /w/c"]);
    // Against the last checkpoint: only what changed since h2.
    let since_h2: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["diff", "h", "--json"])).unwrap();
    let paths: Vec<(&str, &str)> =
        since_h2.iter().map(|c| (c["path"].as_str().unwrap(), c["change"].as_str().unwrap())).collect();
    assert_eq!(paths, [("/w/b", "modified"), ("/w/c", "added")], "/w/b existed at h2");
    // Against h1: everything since h1, deletions at their topmost path.
    let since_h1: Vec<serde_json::Value> =
        serde_json::from_str(&d.cli_ok(&["diff", "h", "--against", &c1, "--json"])).unwrap();
    let paths: Vec<(&str, &str)> =
        since_h1.iter().map(|c| (c["path"].as_str().unwrap(), c["change"].as_str().unwrap())).collect();
    assert!(paths.contains(&("/w/a", "deleted")), "{paths:?}");
    assert!(paths.contains(&("/w/b", "added")) && paths.contains(&("/w/c", "added")), "{paths:?}");
    assert!(!paths.iter().any(|(p, _)| *p == "/w/k"), "unchanged since h1: {paths:?}");
    let usr: Vec<_> = paths.iter().filter(|(p, _)| p.starts_with("/usr/sbin")).collect();
    assert_eq!(usr, [&("/usr/sbin", "deleted")], "only the topmost deleted path");
    // The export of the same change set applies on top of h1 to give the current view.
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("since-h1.tar");
    d.cli_ok(&["export", "h", "--against", "h1", "-o", out.to_str().unwrap()]);
    let mut ar = tar::Archive::new(std::fs::File::open(&out).unwrap());
    let names: Vec<String> = ar.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
    for want in ["w/.wh.a", "w/b", "w/c", "usr/.wh.sbin"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    assert!(!names.iter().any(|n| n == "w/k"), "{names:?}");
}

#[test]
fn daemon_crashes_mid_checkpoint_leave_no_checkpoint_and_a_running_sandbox() {
    require_host!();
    for point in ["checkpoint-write:crash", "checkpoint-layer:crash"] {
        let mut d = TestDaemon::start_with_env(&[("STRATA_FAILPOINTS", point)]);
        d.import_busybox();
        let id = d.create(&[]);
        d.cli_ok(&[
            "exec",
            "-d",
            &id,
            "--",
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i > /root/n; sleep 0.05; done",
        ]);
        d.cli_ok(&["exec", &id, "--", "sh", "-c", "head -c 100000 /dev/urandom > /root/blob"]);
        let layers_before = std::fs::read_dir(d.state("layers/sha256")).unwrap().count();
        assert!(!d.cli(&["checkpoint", &id]).status.success(), "{point}: the daemon died mid-checkpoint");
        d.env.clear();
        d.kill9_and_restart();
        let list: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["checkpoint", "ls", "--json"])).unwrap();
        assert!(list.is_empty(), "{point}: no partial checkpoint is visible: {list:?}");
        // Re-adopted and thawed (the crash may have left it frozen): it runs on.
        let n1 = d.cli_ok(&["exec", &id, "--", "cat", "/root/n"]);
        assert!(
            common::wait_until(10, || d.cli_ok(&["exec", &id, "--", "cat", "/root/n"]) != n1),
            "{point}: the sandbox runs after the restart"
        );
        // An orphaned layer is garbage; checkpoints work again.
        d.cli_ok(&["gc"]);
        assert_eq!(
            std::fs::read_dir(d.state("layers/sha256")).unwrap().count(),
            layers_before,
            "{point}: gc removed the unrecorded layer"
        );
        d.cli_ok(&["checkpoint", &id]);
    }
}
