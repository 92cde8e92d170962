//! The warm pool (issue 18, point 6): `strata daemon --warm-pool SOURCE=N`
//! keeps N sandboxes booted and unassigned; a create of that source adopts one
//! (its name, hostname, environment, CPU limit applied then), nobody sees a
//! member before that, no adoption carries another sandbox's files or
//! identity, a create the pool does not fit boots as usual and says why in
//! the pool's counters, the pool refills, a removed source drains it, and a
//! restarted daemon replaces what the old one left.

mod common;

use common::TestDaemon;

fn pool(d: &TestDaemon) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&d.cli_ok(&["pool", "--json"])).unwrap();
    v.as_array().unwrap()[0].clone()
}

fn ready(d: &TestDaemon) -> u64 {
    pool(d)["ready"].as_u64().unwrap()
}

/// The ids of every sandbox directory in the state directory (members included).
fn sandbox_dirs(d: &TestDaemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.state("sandboxes"))
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The sandbox ids `strata ps` lists.
fn listed(d: &TestDaemon) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    v.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

fn reasons(d: &TestDaemon, id: &str) -> Vec<String> {
    let c = d.client();
    let evs = common::rt().block_on(c.events(Some(id), 0)).unwrap();
    evs.into_iter().map(|e| e.reason).collect()
}

fn exec(d: &TestDaemon, id: &str, cmd: &str) -> String {
    d.cli_ok(&["exec", id, "--", "sh", "-c", cmd]).trim().to_string()
}

#[test]
fn warm_pool_adopts_refills_and_drains() {
    if let Some(why) = common::missing_prerequisite() {
        eprintln!("SKIPPED warm_pool_adopts_refills_and_drains: {why}");
        return;
    }
    let mut d = TestDaemon::start_with_env(&[("STRATA_WARM_POOL", "busybox=2")]);

    // A source that does not exist yet: the pool stays empty and says why.
    assert!(common::wait_until(10, || pool(&d)["last_error"].as_str().is_some_and(|e| e.contains("busybox"))));
    assert_eq!(ready(&d), 0);
    d.import_busybox();
    assert!(common::wait_until(60, || ready(&d) == 2), "pool did not fill: {}\n{}", pool(&d), d.log());
    assert!(pool(&d)["last_error"].is_null());

    // Members are nobody's: not listed, not reachable by id, not even by the operator.
    let members = sandbox_dirs(&d);
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(listed(&d).is_empty(), "{:?}", listed(&d));
    for m in &members {
        assert!(!d.cli(&["inspect", m]).status.success(), "member {m} is visible");
        assert!(!d.cli(&["exec", m, "--", "true"]).status.success(), "member {m} ran a command");
    }

    // Adopted: the request's name, hostname, environment and CPU limit.
    let alpha =
        d.cli_ok(&["create", "busybox", "--name", "alpha", "--env", "FOO=bar", "--cpus", "1"]).trim().to_string();
    assert!(members.contains(&alpha), "alpha {alpha} was booted, not adopted from {members:?}");
    let r = reasons(&d, &alpha);
    assert!(r.contains(&"adopted".to_string()), "{r:?}");
    assert_eq!(exec(&d, "alpha", "hostname"), "alpha");
    assert_eq!(exec(&d, "alpha", "cat /etc/hostname"), "alpha");
    assert_eq!(exec(&d, "alpha", "cat /run/strata/sandbox-id"), alpha);
    assert_eq!(exec(&d, "alpha", "echo $FOO"), "bar");
    let sb: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", "alpha", "--json"])).unwrap();
    assert_eq!(sb["limits"]["cpus"].as_f64(), Some(1.0));
    assert_eq!(sb["name"], "alpha");
    let quota = ["/sys/fs/cgroup/cpu/strata", "/sys/fs/cgroup/unified/strata", "/sys/fs/cgroup/strata"]
        .iter()
        .find_map(|root| {
            let dir = std::path::Path::new(root).join(&alpha);
            std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))
                .or_else(|_| std::fs::read_to_string(dir.join("cpu.max")))
                .ok()
        })
        .expect("alpha's cpu cgroup");
    assert!(quota.trim() == "100000" || quota.starts_with("100000 "), "cpu quota {quota:?}");
    exec(&d, "alpha", "echo mine > /root/left-behind && echo t > /tmp/t");
    let alpha_machine = exec(&d, "alpha", "cat /etc/machine-id");

    // The next adoption is another sandbox entirely: nothing of alpha's.
    let beta = d.create(&["--name", "beta"]);
    assert!(members.contains(&beta) && beta != alpha, "{beta} not adopted from {members:?}");
    assert_eq!(exec(&d, "beta", "hostname"), "beta");
    assert_eq!(exec(&d, "beta", "ls /root/left-behind /tmp/t 2>&1 | grep -c 'No such file'"), "2");
    assert_ne!(exec(&d, "beta", "cat /etc/machine-id"), alpha_machine);
    assert_eq!(listed(&d).len(), 2, "{:?}", listed(&d));

    // An unnamed create: its name and hostname come from its (member's) id.
    assert!(common::wait_until(60, || ready(&d) >= 1), "no refill: {}", pool(&d));
    let gamma = d.create(&[]);
    assert_eq!(exec(&d, &gamma, "hostname"), gamma[..12]);
    let sb: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &gamma, "--json"])).unwrap();
    assert_eq!(sb["name"], gamma.as_str());

    // A create the pool does not fit boots as usual, counted with the reason.
    let small = d.create(&["--memory", "64m"]);
    assert!(!reasons(&d, &small).contains(&"adopted".to_string()));
    let p = pool(&d);
    assert!(p["missed_unfit"].as_u64().unwrap() >= 1, "{p}");
    assert!(p["last_unfit"].as_str().unwrap().contains("memory"), "{p}");
    assert!(p["adopted"].as_u64().unwrap() >= 3, "{p}");

    // It refills; a restarted daemon destroys what the old one left and boots new members.
    assert!(common::wait_until(60, || ready(&d) == 2), "no refill: {}", pool(&d));
    let before: Vec<String> =
        sandbox_dirs(&d).into_iter().filter(|s| ![&alpha, &beta, &gamma, &small].contains(&s)).collect();
    assert_eq!(before.len(), 2, "{before:?}");
    d.kill9_and_restart();
    assert!(common::wait_until(60, || ready(&d) == 2), "no refill after restart: {}", pool(&d));
    for old in &before {
        assert!(!d.state("sandboxes").join(old).exists(), "leftover member {old} was not destroyed");
    }
    assert_eq!(exec(&d, "alpha", "cat /root/left-behind"), "mine", "adopted sandboxes stay across restarts");

    // Removing the source drains the pool (members are the daemon's, not users of the image).
    for id in [&alpha, &beta, &gamma, &small] {
        d.cli_ok(&["rm", "-f", id]);
    }
    d.cli_ok(&["image", "rm", "busybox"]);
    assert_eq!(ready(&d), 0);
    assert!(
        sandbox_dirs(&d).is_empty() || common::wait_until(20, || sandbox_dirs(&d).is_empty()),
        "{:?}",
        sandbox_dirs(&d)
    );
    assert!(common::wait_until(20, || pool(&d)["last_error"].as_str().is_some()), "{}", pool(&d));
    assert!(pool(&d)["drained"].as_u64().unwrap() >= 2);
}
