//! Isolation and limits: namespaces, capabilities, no_new_privs, seccomp,
//! read-only kernel interfaces, pids and memory limits (OOM reported).

mod common;

use common::TestDaemon;

#[test]
fn sandbox_sees_only_itself_and_cannot_reconfigure_the_kernel() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--name", "iso"]);
    let sh = |script: &str| d.cli(&["exec", &id, "--", "sh", "-c", script]);
    // Own pid namespace: only init, this exec's shim (a child of init) and the command.
    let out = d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo /proc/[0-9]*"]);
    assert_eq!(out.split_whitespace().count(), 3, "only init, the shim and this shell are visible: {out}");
    assert!(out.split_whitespace().any(|p| p == "/proc/1"), "{out}");
    let ppid_of_parent = d.cli_ok(&["exec", &id, "--", "sh", "-c", "cut -d' ' -f4 /proc/$PPID/stat"]);
    assert_eq!(ppid_of_parent.trim(), "1", "the shim is a child of the sandbox's pid 1");
    assert_eq!(d.cli_ok(&["exec", &id, "--", "hostname"]), "iso\n");
    // Own network namespace with loopback only.
    let ifaces = d.cli_ok(&["exec", &id, "--", "sh", "-c", "ls /sys/class/net"]);
    assert_eq!(ifaces.trim(), "lo");
    // Mounts, namespaces, kernel tunables, devices, host paths: see escape.rs.
    // no_new_privs, seccomp filter mode, reduced capability set.
    let status = d.cli_ok(&["exec", &id, "--", "cat", "/proc/self/status"]);
    assert!(status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{status}");
    assert!(status.lines().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{status}");
    let cap_bnd = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).unwrap().trim();
    let mask = u64::from_str_radix(cap_bnd, 16).unwrap();
    for cap in [
        21u32, /* SYS_ADMIN */
        16,    /* SYS_MODULE */
        19,    /* SYS_PTRACE */
        27,    /* MKNOD */
        17,    /* SYS_RAWIO */
        12,    /* NET_ADMIN */
    ] {
        assert_eq!(mask & (1 << cap), 0, "capability {cap} must be dropped (CapBnd {cap_bnd})");
    }
    // Pid 1 (started before the C library: see crates/init/src/bare_pid1.rs) keeps
    // only CAP_KILL, everywhere, and has no_new_privs.
    let pid1 = d.cli_ok(&["exec", &id, "--", "cat", "/proc/1/status"]);
    for line in ["CapInh:\t0000000000000020", "CapPrm:\t0000000000000020", "CapEff:\t0000000000000020"] {
        assert!(pid1.lines().any(|l| l == line), "pid 1 lacks {line:?}: {pid1}");
    }
    assert!(pid1.lines().any(|l| l == "CapBnd:\t0000000000000020"), "{pid1}");
    assert!(pid1.lines().any(|l| l == "NoNewPrivs:\t1"), "{pid1}");
    // Init (pid 1) and the shims are not readable or traceable by the workload.
    assert!(!sh("cat /proc/1/environ").status.success());
    assert!(!sh("readlink /proc/1/exe").status.success());
    assert!(!sh("cat /proc/$PPID/environ").status.success());
    // The in-sandbox helper binary cannot be replaced or written.
    assert!(!sh("echo x > /run/strata/init").status.success());
    assert!(!sh("rm -f /run/strata/init").status.success());
    assert!(!sh("umount /run/strata/init").status.success());
    // A non-root user gets no capabilities at all.
    let status = d.cli_ok(&["exec", "--user", "user", &id, "--", "cat", "/proc/self/status"]);
    assert!(status.lines().any(|l| l == "CapEff:\t0000000000000000"), "{status}");
}

/// The `CapBnd`, `CapEff`, `NoNewPrivs` and `Seccomp` lines of a process's status.
fn privileges(status: &str) -> Vec<&str> {
    status
        .lines()
        .filter(|l| ["CapBnd:", "CapEff:", "NoNewPrivs:", "Seccomp:"].iter().any(|p| l.starts_with(p)))
        .collect()
}

#[test]
fn allow_setuid_drops_only_no_new_privs() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let strict = d.create(&[]);
    let setuid = d.create(&["--allow-setuid"]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &setuid, "--json"])).unwrap();
    assert_eq!(info["allow_setuid"], true, "{info}");
    assert!(d.cli_ok(&["inspect", &setuid]).contains("setuid"), "inspect names it");
    for user in ["root", "user"] {
        let a = d.cli_ok(&["exec", "--user", user, &strict, "--", "cat", "/proc/self/status"]);
        let b = d.cli_ok(&["exec", "--user", user, &setuid, "--", "cat", "/proc/self/status"]);
        let (a, b) = (privileges(&a), privileges(&b));
        // The same capabilities and the same filter; only no_new_privs differs.
        let same = |l: &&&str| !l.starts_with("NoNewPrivs:");
        assert_eq!(
            a.iter().filter(same).collect::<Vec<_>>(),
            b.iter().filter(same).collect::<Vec<_>>(),
            "{user}: {a:?} vs {b:?}"
        );
        assert!(a.contains(&"NoNewPrivs:\t1") && b.contains(&"NoNewPrivs:\t0"), "{user}: {a:?} vs {b:?}");
        assert!(b.contains(&"Seccomp:\t2"), "{b:?}");
        // The filter still holds without no_new_privs.
        let out = d.cli(&["exec", "--user", user, &setuid, "--", "unshare", "-m", "true"]);
        assert!(!out.status.success(), "unshare must be refused: {}", common::stderr(&out));
    }
    // Forks inherit it.
    let fork: serde_json::Value =
        serde_json::from_str(&d.cli_ok(&["fork", &setuid, "--count", "1", "--json"])).unwrap();
    let child = fork["sandboxes"][0].as_str().unwrap();
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", child, "--json"])).unwrap();
    assert_eq!(info["allow_setuid"], true, "{info}");
}

#[test]
fn fork_bomb_stays_inside_the_pids_limit() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--pids", "32"]);
    let out = d.cli(&[
        "exec",
        "--timeout",
        "20s",
        &id,
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done 2>/dev/null; wait",
    ]);
    assert!(out.status.code().is_some(), "the exec finished (killed at its timeout at worst)");
    let current = ["/sys/fs/cgroup/pids/strata", "/sys/fs/cgroup/strata"]
        .iter()
        .find_map(|root| std::fs::read_to_string(format!("{root}/{id}/pids.current")).ok())
        .expect("pids cgroup of the sandbox");
    let n: u32 = current.trim().parse().unwrap();
    assert!(n <= 32, "tasks in the sandbox are bounded by --pids 32: {n}");
    // The host and the daemon are fine: another sandbox still works.
    let other = d.create(&[]);
    assert_eq!(d.cli_ok(&["exec", &other, "--", "echo", "ok"]), "ok\n");
    d.cli_ok(&["rm", "-f", &id]);
}

#[test]
fn memory_hog_is_oom_killed_inside_its_limit_and_reported() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--memory", "32m"]);
    // Doubling a shell string quickly exceeds 32 MiB.
    let out = d.cli(&["exec", "--timeout", "60s", &id, "--", "sh", "-c", "x=a; while true; do x=$x$x; done"]);
    assert_eq!(out.status.code(), Some(137), "killed by SIGKILL: {}", common::stderr(&out));
    assert!(common::stderr(&out).contains("OOM"), "{}", common::stderr(&out));
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert!(info["oom_kills"].as_u64().unwrap() >= 1, "{info}");
    assert_eq!(info["state"], "running", "the sandbox survives its hog");
    let events = d.cli_ok(&["events", &id, "--json"]);
    assert!(events.contains("\"reason\":\"oom\""), "{events}");
    let procs: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["proc", "ls", &id, "--json"])).unwrap();
    assert!(procs.iter().any(|p| p["oom_killed"] == true), "{procs:?}");
}

#[test]
fn a_fork_bomb_in_a_default_sandbox_stays_inside_the_default_pids_limit() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    // No --pids: the daemon's default (1024) applies.
    let id = d.create(&[]);
    let cgroup = |file: &str| {
        ["/sys/fs/cgroup/pids/strata", "/sys/fs/cgroup/strata"]
            .iter()
            .find_map(|root| std::fs::read_to_string(format!("{root}/{id}/{file}")).ok())
            .unwrap_or_else(|| panic!("pids cgroup file {file} of the sandbox"))
    };
    assert_eq!(cgroup("pids.max").trim(), "1024", "a sandbox made without --pids has the default pids limit");
    // Try to start 1500 processes that outlive the exec: the limit stops it at 1024.
    let out = d.cli(&[
        "exec",
        "--timeout",
        "60s",
        &id,
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 1500 ]; do sleep 120 & i=$((i+1)); done 2>/dev/null; echo spawned",
    ]);
    assert!(out.status.code().is_some(), "the exec finished: {}", common::stderr(&out));
    let current: u32 = cgroup("pids.current").trim().parse().unwrap();
    assert!(current <= 1024, "tasks in the sandbox are bounded by the default 1024: {current}");
    assert!(current >= 1000, "the bomb reached the limit (so the limit is what stopped it): {current}");
    // The host keeps free pids: it still starts processes, and another sandbox works.
    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let host_tasks = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .count();
    assert!(host_tasks + 1024 < pid_max, "host has {host_tasks} processes of pid_max {pid_max}");
    assert!(std::process::Command::new("true").status().unwrap().success(), "the host can still fork");
    let other = d.create(&[]);
    assert_eq!(d.cli_ok(&["exec", &other, "--", "echo", "ok"]), "ok\n");
    d.cli_ok(&["rm", "-f", &id]);
}
