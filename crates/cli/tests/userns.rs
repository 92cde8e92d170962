//! User namespaces on the namespace tier: each sandbox's root is an
//! unprivileged host uid/gid range of its own (the default where the host
//! supports it), files keep their in-sandbox owners on disk and through every
//! API, the range comes back when the sandbox is destroyed, and processes go
//! through standby and warm forks (each fork in a range of its own).

mod common;

use std::os::unix::fs::MetadataExt;

use common::{stderr, TestDaemon};

fn inspect(d: &TestDaemon, id: &str) -> serde_json::Value {
    serde_json::from_str(&d.cli_ok(&["inspect", id, "--json"])).unwrap()
}

/// The host base of a sandbox's user namespace (`None`: it has none).
fn host_base(d: &TestDaemon, id: &str) -> Option<u32> {
    inspect(d, id)["userns"]["host_base"].as_u64().map(|b| b as u32)
}

fn init_pid(d: &TestDaemon, id: &str) -> i32 {
    inspect(d, id)["init_pid"].as_i64().expect("running") as i32
}

/// The real uid (on the host) of host process `pid` (`u32::MAX` once it is gone).
fn host_uid(pid: i32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("Uid:"));
    line.and_then(|l| l.split_whitespace().nth(1)).and_then(|u| u.parse().ok()).unwrap_or(u32::MAX)
}

/// Host pids of every process in a sandbox (its cgroup's tasks, found by id in /proc).
fn host_pids(id: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        if std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id)) {
            pids.push(pid);
        }
    }
    pids
}

fn sh(d: &TestDaemon, id: &str, script: &str) -> String {
    d.cli_ok(&["exec", id, "--", "sh", "-c", script])
}

#[test]
fn a_sandbox_s_root_is_an_unprivileged_host_range_of_its_own() {
    require_host!();
    if let Some(why) = strata_runtime::probe::userns_unavailable() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI must be able to run this test, but: {why}");
        }
        println!("skipped: {why}");
        return;
    }
    let d = TestDaemon::start();
    d.import_busybox();
    let a = d.create(&[]);
    let b = d.create(&[]);
    let (ba, bb) = (host_base(&d, &a).expect("a user namespace by default"), host_base(&d, &b).unwrap());
    assert!(ba >= 1_000_000_000 && bb >= 1_000_000_000, "{ba} {bb}: above every login range");
    assert!(ba.abs_diff(bb) >= 65_536, "disjoint ranges: {ba} {bb}");

    // Root inside, host uid `base` outside, for pid 1 and every process started.
    assert_eq!(
        sh(&d, &a, "id -u; id -g; cat /proc/self/uid_map").split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "0", &ba.to_string(), "65536"]
    );
    d.cli_ok(&["exec", "-d", &a, "--", "sleep", "600"]);
    d.cli_ok(&["exec", "-d", &a, "--user", "1000", "--", "sleep", "601"]);
    let uids = || -> Vec<u32> { host_pids(&a).into_iter().map(host_uid).filter(|u| *u != u32::MAX).collect() };
    // (The second one runs as user 1000 once its shim has started it.)
    assert!(common::wait_until(10, || uids().contains(&(ba + 1000))), "{:?}", uids());
    let uids = uids();
    assert_eq!(host_uid(init_pid(&d, &a)), ba, "pid 1 is nobody on the host");
    assert!(uids.iter().all(|u| *u == ba || *u == ba + 1000), "every process in the range: {uids:?}");
    assert!(uids.contains(&(ba + 1000)), "user 1000 inside is host uid base + 1000: {uids:?}");

    // Files keep their in-sandbox owners on disk (what checkpoints, diffs and
    // templates read) and through the file API, whoever wrote them.
    sh(&d, &a, "echo x > /root/by-root; touch /tmp/t; mkdir -p /home/u; chown 1000:1000 /home/u");
    d.cli_ok(&["exec", "--user", "1000:1000", &a, "--", "touch", "/home/u/by-user"]);
    let meta = |rel: &str| std::fs::symlink_metadata(d.upper(&a, rel)).unwrap();
    assert_eq!((meta("root/by-root").uid(), meta("root/by-root").gid()), (0, 0));
    assert_eq!((meta("home/u/by-user").uid(), meta("home/u").uid()), (1000, 1000));
    let upload =
        common::write_file(std::env::temp_dir().as_path(), &format!("userns-up-{}", std::process::id()), b"up");
    d.cli_ok(&["cp", upload.to_str().unwrap(), &format!("{a}:/root/uploaded")]);
    let _ = std::fs::remove_file(&upload);
    assert_eq!(meta("root/uploaded").uid(), 0, "an upload belongs to the sandbox's root");
    assert_eq!(sh(&d, &a, "stat -c '%u %g' /root/uploaded /home/u/by-user /tmp/t"), "0 0\n1000 1000\n0 0\n");
    let listed: serde_json::Value = serde_json::from_str(&d.cli_ok(&["fs", "ls", &a, "/home/u", "--json"])).unwrap();
    let e = listed.as_array().unwrap().iter().find(|e| e["name"] == "by-user").expect("listed").clone();
    assert_eq!((e["uid"].as_u64(), e["gid"].as_u64()), (Some(1000), Some(1000)), "{e}");
    let st: serde_json::Value = serde_json::from_str(&d.cli_ok(&["fs", "stat", &a, "/root/uploaded"])).unwrap();
    assert_eq!((st["uid"].as_u64(), st["gid"].as_u64()), (Some(0), Some(0)), "{st}");

    // What the sandbox's root cannot do to the host's part of its tree.
    let out = d.cli(&["exec", &a, "--", "sh", "-c", "chmod 777 /dev/null"]);
    assert!(!out.status.success(), "the host's /dev/null stays the host's");
    assert_eq!(std::fs::metadata("/dev/null").unwrap().mode() & 0o777, 0o666);

    // Without one on request: host root with the reduced capability set, as before.
    let plain = d.create(&["--no-userns"]);
    assert_eq!(host_base(&d, &plain), None);
    assert_eq!(host_uid(init_pid(&d, &plain)), 0);
    assert_eq!(
        sh(&d, &plain, "cat /proc/self/uid_map").split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "4294967295"]
    );

    // A destroyed sandbox's range is the next one given.
    d.cli_ok(&["rm", "-f", &a]);
    let c = d.create(&[]);
    assert_eq!(host_base(&d, &c), Some(ba), "the lowest free range");
    // Other tiers have their own boundary: asking for a user namespace there is a 400.
    let out = d.cli(&["create", "busybox", "--isolation", "gvisor", "--userns"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("userns applies to the namespace tier") || err.contains("gvisor"), "{err}");
}

#[test]
fn processes_survive_standby_and_warm_forks_each_in_a_range_of_its_own() {
    require_criu!();
    if let Some(why) = strata_runtime::probe::userns_unavailable() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI must be able to run this test, but: {why}");
        }
        println!("skipped: {why}");
        return;
    }
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--userns"]);
    let base = host_base(&d, &id).unwrap();
    d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.2; done"]);
    // A loopback connection held open across the cycle, by a user.
    d.cli_ok(&["exec", "-d", &id, "--user", "1000", "--", "sh", "-c", "sleep 600 | nc -l -p 7000"]);
    assert!(common::wait_until(10, || sh(&d, &id, "netstat -lnt").contains(":7000")));
    d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", "(echo before; sleep 600) | nc 127.0.0.1 7000"]);
    let count = || sh(&d, &id, "cat /tmp/n").trim().parse::<u64>().unwrap_or(0);
    assert!(common::wait_until(10, || count() > 2));
    let established =
        || sh(&d, &id, "netstat -nt").lines().filter(|l| l.contains(":7000") && l.contains("ESTABLISHED")).count();
    assert!(common::wait_until(10, || established() == 2), "{}", sh(&d, &id, "netstat -nt"));

    for cycle in 0..3 {
        let before = count();
        let pid1 = sh(&d, &id, "cat /proc/1/stat").split_whitespace().next().unwrap().to_string();
        d.cli_ok(&["standby", &id]);
        let s = inspect(&d, &id);
        assert_eq!(s["state"], "standby", "{s}");
        assert!(!s["state_reason"].as_str().unwrap_or("").contains("filesystem"), "processes kept: {s}");
        assert!(host_pids(&id).is_empty(), "cycle {cycle}: nothing left running");
        d.cli_ok(&["resume", &id]);
        assert_eq!(host_base(&d, &id), Some(base), "the same range after a resume");
        assert_eq!(host_uid(init_pid(&d, &id)), base);
        assert!(common::wait_until(10, || count() > before), "cycle {cycle}: the counter goes on");
        assert_eq!(sh(&d, &id, "cat /proc/1/stat").split_whitespace().next().unwrap(), pid1);
        assert_eq!(sh(&d, &id, "cat /proc/self/uid_map").split_whitespace().nth(1), Some(base.to_string().as_str()));
        assert_eq!(established(), 2, "cycle {cycle}: the connection is still there");
        assert!(sh(&d, &id, "ip -o link show lo").contains("UP"), "loopback up again");
    }

    // A warm checkpoint: each fork gets its own range, its processes running in it.
    let ck = d.cli_ok(&["checkpoint", &id, "--processes", "--name", "warm"]).trim().to_string();
    let ckpt: serde_json::Value = serde_json::from_str(&d.cli_ok(&["checkpoint", "inspect", &ck, "--json"])).unwrap();
    assert_eq!(ckpt["userns"], true, "{ckpt}");
    let kids: Vec<String> = d
        .cli_ok(&["fork", "warm", "--count", "2"])
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(kids.len(), 2);
    let mut bases = vec![base];
    for k in &kids {
        let b = host_base(&d, k).expect("a fork keeps its source's user namespace");
        assert!(!bases.contains(&b), "a range of its own: {b} in {bases:?}");
        bases.push(b);
        let kc = || sh(&d, k, "cat /tmp/n").trim().parse::<u64>().unwrap_or(0);
        let first = kc();
        assert!(common::wait_until(10, || kc() > first), "the fork's counter runs");
        let uids: Vec<u32> = host_pids(k).into_iter().map(host_uid).filter(|u| *u != u32::MAX).collect();
        assert!(uids.iter().all(|u| *u == b || *u == b + 1000), "{k}: its processes are in its range: {uids:?}");
        assert_eq!(sh(&d, k, "cat /proc/self/uid_map").split_whitespace().nth(1), Some(b.to_string().as_str()));
        assert_eq!(sh(&d, k, "stat -c %u /tmp/n"), "0\n");
    }
    // A fork changes nothing in another: files written after it stay its own.
    sh(&d, &kids[0], "echo mine > /root/only-here");
    assert!(!d.cli(&["exec", &kids[1], "--", "test", "-e", "/root/only-here"]).status.success());
    // Processes saved in a user namespace come back only in one.
    let out = d.cli(&["create", "warm", "--no-userns"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("user namespace"), "{}", stderr(&out));
    // Standby of a fork (restored into a moved range) works too.
    d.cli_ok(&["standby", &kids[1]]);
    d.cli_ok(&["resume", &kids[1]]);
    assert_eq!(host_base(&d, &kids[1]), Some(bases[2]));
    assert_eq!(
        sh(&d, &kids[1], "cat /proc/self/uid_map").split_whitespace().nth(1),
        Some(bases[2].to_string().as_str())
    );
}
