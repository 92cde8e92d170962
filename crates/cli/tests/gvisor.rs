//! The gVisor tier end to end: a sandbox under runsc on strata's own layers,
//! through the same CLI and API as the namespace tier (exec, files, limits,
//! stop/start, pause, checkpoints, forks, destroy, standby with its
//! processes, warm forks), what it refuses with why, and the same escape
//! attempts against both tiers.

mod common;

use common::{stderr, stdout, TestDaemon};

fn sh(d: &TestDaemon, id: &str, script: &str) -> std::process::Output {
    d.cli(&["exec", "--timeout", "60s", id, "--", "sh", "-c", script])
}

fn sh_ok(d: &TestDaemon, id: &str, script: &str) -> String {
    let out = sh(d, id, script);
    assert!(out.status.success(), "{script}: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

/// Nothing of a destroyed gVisor sandbox is left on the host: no runsc
/// process, mount, cgroup or bundle.
fn assert_released(d: &TestDaemon, id: &str) {
    let released = common::wait_until(15, || {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        !mounts.contains(&format!("sandboxes/{id}/"))
            && !runsc_runs(id)
            && !std::path::Path::new(&format!("/sys/fs/cgroup/memory/strata/{id}")).exists()
            && !std::path::Path::new(&format!("/sys/fs/cgroup/strata/{id}")).exists()
            && !d.state(&format!("run/gvisor/{id}")).exists()
    });
    assert!(released, "sandbox {id} left something on the host");
}

#[test]
fn a_gvisor_sandbox_runs_the_whole_filesystem_lifecycle() {
    require_gvisor!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--isolation", "gvisor", "--name", "gv"]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["runtime"], "gvisor", "{info}");

    // Exec: output, exit status, stderr, the guest kernel is gVisor's, strata's pid 1.
    let out = sh(&d, &id, "echo out; echo err >&2; exit 7");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).contains("err"), "{}", stderr(&out));
    assert_eq!(sh_ok(&d, &id, "hostname; cat /etc/hostname"), "gv\ngv\n");
    let kernel = sh_ok(&d, &id, "cat /proc/1/cmdline | tr '\\0' ' '; echo; uname -r");
    assert!(kernel.starts_with("/run/strata/init _pid1"), "strata's init is pid 1: {kernel}");
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(kernel.lines().nth(1).unwrap().trim(), host_release.trim(), "the guest sees gVisor's kernel");
    // Stdin reaches the process; users resolve against the sandbox's /etc/passwd.
    let out = d.cli_stdin(&["exec", "-i", &id, "--", "sh", "-c", "tr a-z A-Z"], b"piped\n");
    assert_eq!(stdout(&out), "PIPED\n");
    // Megabytes both ways at once, the process reading its stdin only after it
    // wrote its output: the exec channel holds stdin back without blocking output.
    let input: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 251) as u8).collect();
    let out = cli_stdin_concurrently(
        &d,
        &["exec", "-i", &id, "--", "sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; cat"],
        &input,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout.len(), 3_000_000 + input.len());
    assert!(out.stdout[..3_000_000].iter().all(|b| *b == b'x') && out.stdout[3_000_000..] == input[..]);
    assert_eq!(d.cli_ok(&["exec", "--user", "user", &id, "--", "id", "-un"]), "user\n");
    assert_eq!(d.cli_ok(&["exec", "--cwd", "/etc", &id, "--", "pwd"]), "/etc\n");
    let missing = d.cli(&["exec", &id, "--", "no-such-program"]);
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("no-such-program"), "{}", stderr(&missing));

    // Files: the API and the sandbox see the same tree, /tmp included, with no stale reads.
    let host = d.dir.path().join("f");
    std::fs::write(&host, "one\n").unwrap();
    d.cli_ok(&["cp", host.to_str().unwrap(), &format!("{id}:/root/f")]);
    assert_eq!(sh_ok(&d, &id, "cat /root/f"), "one\n");
    std::fs::write(&host, "two, longer\n").unwrap();
    d.cli_ok(&["cp", host.to_str().unwrap(), &format!("{id}:/root/f")]);
    assert_eq!(sh_ok(&d, &id, "cat /root/f"), "two, longer\n", "a host-side write is seen at once");
    sh_ok(&d, &id, "echo scratch > /tmp/t; echo kept > /kept; rm /bin/vi");
    let back = d.dir.path().join("t");
    d.cli_ok(&["cp", &format!("{id}:/tmp/t"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "scratch\n");
    // Writes land in strata's writable layer (a deletion as a whiteout).
    assert_eq!(std::fs::read_to_string(d.upper(&id, "kept")).unwrap(), "kept\n");
    let diff = d.cli_ok(&["diff", &id]);
    assert!(diff.contains("/kept") && diff.contains("/bin/vi") && diff.contains("/root/f"), "{diff}");
    assert!(diff.contains("/tmp/t"), "/tmp is part of the filesystem, not runsc's own tmpfs: {diff}");
    assert!(!diff.contains("/etc/hostname"), "identity stays out: {diff}");

    // Checkpoint, then forks: on the same tier, with the parent's files and their own identity.
    d.cli_ok(&["checkpoint", &id]);
    let fork: serde_json::Value = serde_json::from_str(&d.cli_ok(&["fork", &id, "--count", "2", "--json"])).unwrap();
    let children: Vec<String> =
        fork["sandboxes"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
    assert_eq!(children.len(), 2, "{fork}");
    for (i, c) in children.iter().enumerate() {
        let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", c, "--json"])).unwrap();
        assert_eq!(info["runtime"], "gvisor", "a fork runs on its parent's tier: {info}");
        let seen = sh_ok(&d, c, "cat /kept; hostname; cat /run/strata/generation; test -e /bin/vi || echo no-vi");
        assert_eq!(seen, format!("kept\ngv-{}\n1\nno-vi\n", i + 1));
    }
    // A fork may name the children's tier: the same files on the namespace tier.
    let ck = d.cli_ok(&["checkpoint", &id]).trim().to_string();
    let on_ns = d.cli_ok(&["fork", &ck, "-n", "1", "--isolation", "namespace"]).trim().to_string();
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &on_ns, "--json"])).unwrap();
    assert_eq!(info["runtime"], "namespace", "{info}");
    assert_eq!(sh_ok(&d, &on_ns, "cat /kept"), "kept\n");
    d.cli_ok(&["rm", "-f", &on_ns]);

    // A template remembers its tier; a create may still name another one (files only).
    d.cli_ok(&["template", "create", "gv-tpl", "--from", &id, "--accept-findings"]);
    let tpls: serde_json::Value = serde_json::from_str(&d.cli_ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(tpls[0]["isolation"], "gvisor", "{tpls}");
    let on_gvisor = d.cli_ok(&["create", "gv-tpl"]).trim().to_string();
    let on_ns = d.cli_ok(&["create", "gv-tpl", "--isolation", "namespace"]).trim().to_string();
    for (sb, tier) in [(&on_gvisor, "gvisor"), (&on_ns, "namespace")] {
        let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", sb, "--json"])).unwrap();
        assert_eq!(info["runtime"], tier, "{info}");
        assert_eq!(sh_ok(&d, sb, "cat /kept"), "kept\n");
        d.cli_ok(&["rm", "-f", sb]);
    }

    // Stop keeps the writable layer, /tmp included; start brings it back; pause freezes.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["start", &id]);
    assert_eq!(sh_ok(&d, &id, "cat /kept /tmp/t"), "kept\nscratch\n");
    d.cli_ok(&["pause", &id]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["state"], "paused");
    d.cli_ok(&["unpause", &id]);
    assert_eq!(sh_ok(&d, &id, "echo thawed"), "thawed\n");

    // A background process is listed, signalled and reports how it ended.
    let pid = d.cli_ok(&["exec", "-d", &id, "--", "sleep", "300"]).trim().to_string();
    d.cli_ok(&["proc", "kill", &id, &pid, "--signal", "KILL"]);
    let waited = d.cli(&["proc", "wait", &id, &pid]);
    assert!(!waited.status.success(), "a killed process does not exit 0");
    // A timeout kills the command's whole process group.
    let out = d.cli(&["exec", "--timeout", "1s", &id, "--", "sh", "-c", "sleep 100 & sleep 100"]);
    assert!(!out.status.success());
    assert!(
        common::wait_until(10, || !sh_ok(&d, &id, "ps").contains("sleep 100")),
        "the timed-out group is gone: {}",
        sh_ok(&d, &id, "ps")
    );

    for s in [&id, &children[0], &children[1]] {
        d.cli_ok(&["rm", "-f", s]);
        assert_released(&d, s);
    }
}

#[test]
fn gvisor_limits_hold_and_what_the_tier_lacks_is_refused_with_why() {
    require_gvisor!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--isolation", "gvisor", "--memory", "128m", "--pids", "24", "--disk", "64m"]);
    // Processes are limited inside the guest kernel; the sandbox survives the attempt.
    let out = sh(&d, &id, "i=0; while [ $i -lt 60 ]; do sleep 30 & i=$((i+1)); done; wait");
    assert!(stderr(&out).contains("can't fork"), "{}", stderr(&out));
    // The sandbox is full (as a namespace sandbox at its pids limit is): a restart empties it.
    d.cli_ok(&["stop", &id]);
    d.cli_ok(&["start", &id]);
    // Memory: the guest's total is the limit (plus the sentry's headroom).
    let total_kb: u64 = sh_ok(&d, &id, "awk '/MemTotal/ {print $2}' /proc/meminfo").trim().parse().expect("MemTotal");
    assert!((128 * 1024..=(128 + 64) * 1024).contains(&total_kb), "MemTotal {total_kb} kB");
    // The disk: writing past it fails with ENOSPC inside, /tmp counts too.
    let out = sh(&d, &id, "dd if=/dev/zero of=/tmp/fill bs=1M count=100");
    assert!(!out.status.success() && stderr(&out).contains("No space left"), "{}", stderr(&out));
    sh_ok(&d, &id, "rm -f /tmp/fill; echo ok > /after");

    // Bad input: an unknown tier is 400 naming it; what the tier lacks is 501 naming it.
    let out = d.cli(&["create", "busybox", "--isolation", "firecracker"]);
    assert!(!out.status.success() && stderr(&out).contains("firecracker"), "{}", stderr(&out));
    // A checkpoint with processes (here of the namespace tier) starts only on its own tier.
    if strata_runtime::namespace::criu::unsupported().is_none() {
        let ns = d.create(&[]);
        let warm = d.cli_ok(&["checkpoint", &ns, "--processes"]).trim().to_string();
        let out = d.cli(&["create", &warm, "--isolation", "gvisor"]);
        assert!(!out.status.success(), "{}", stdout(&out));
        assert!(
            stderr(&out).contains("keeps processes of the namespace tier") && stderr(&out).contains("400"),
            "{}",
            stderr(&out)
        );
        let fs_only = d.cli_ok(&["create", &warm, "--isolation", "gvisor", "--no-processes"]).trim().to_string();
        let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &fs_only, "--json"])).unwrap();
        assert_eq!(info["runtime"], "gvisor");
    } else if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI must have CRIU");
    }
    // Nothing was lost to the refusals.
    assert_eq!(sh_ok(&d, &id, "cat /after"), "ok\n");
}

/// The last number a counter process printed (its lines are `tick N`).
fn last_tick(d: &TestDaemon, id: &str, proc_id: &str) -> u64 {
    let logs = d.cli_ok(&["proc", "logs", id, proc_id]);
    logs.lines().rev().filter_map(|l| l.strip_prefix("tick ")).find_map(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// The status and pid `proc ls` shows for process `proc_id`.
fn proc_row(d: &TestDaemon, id: &str, proc_id: &str) -> (String, String) {
    let ls = d.cli_ok(&["proc", "ls", id]);
    let row = ls.lines().find(|l| l.split_whitespace().next() == Some(proc_id)).unwrap_or_else(|| panic!("{ls}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    (cols[2].to_string(), cols[1].to_string())
}

#[test]
fn a_gvisor_sandbox_keeps_its_processes_through_standby_archive_and_warm_forks() {
    require_gvisor!();
    let d = TestDaemon::start();
    d.import_busybox();
    // Doctor says so.
    let doctor: serde_json::Value = serde_json::from_str(&d.cli_ok(&["doctor", "--json"])).unwrap();
    let tier = doctor["tiers"].as_array().unwrap().iter().find(|t| t["name"] == "gvisor").unwrap();
    for cap in ["standby", "warm_checkpoint"] {
        let c = tier["capabilities"].as_array().unwrap().iter().find(|c| c["name"] == cap).unwrap();
        assert_eq!(c["available"], true, "{c}");
    }
    let id = d.create(&["--isolation", "gvisor"]);
    sh_ok(&d, &id, "echo shm > /dev/shm/kept; echo tmp > /tmp/kept");
    let counter = "i=0; while true; do i=$((i+1)); echo tick $i; echo $i > /tmp/count; sleep 0.1; done";
    let proc_id = d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", counter]).trim().to_string();
    assert!(common::wait_until(10, || last_tick(&d, &id, &proc_id) >= 3), "the counter does not count");
    let (_, pid) = proc_row(&d, &id, &proc_id);

    // Standby: the sentry is saved and ends; resume brings back the same process, still counting.
    d.cli_ok(&["standby", &id]);
    let info: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", &id, "--json"])).unwrap();
    assert_eq!(info["state"], "standby");
    assert!(common::wait_until(10, || !runsc_runs(&id)), "the sentry outlived its standby");
    let before = last_tick(&d, &id, &proc_id);
    // Kept through the archive store, too.
    d.cli_ok(&["archive", &id]);
    d.cli_ok(&["resume", &id]);
    assert!(
        common::wait_until(10, || last_tick(&d, &id, &proc_id) > before + 2),
        "the output did not continue after resume"
    );
    assert_eq!(proc_row(&d, &id, &proc_id), ("running".to_string(), pid.clone()), "not the same process");
    assert!(sh_ok(&d, &id, "cat /tmp/count").trim().parse::<u64>().unwrap() > before);
    assert_eq!(sh_ok(&d, &id, "cat /dev/shm/kept /tmp/kept"), "shm\ntmp\n", "memory-backed files came back");

    // A warm checkpoint leaves the source running (its process keeps streaming) and
    // starts forks with the process running in each, with their own identity and /tmp.
    let warm = d.cli_ok(&["checkpoint", &id, "--processes"]).trim().to_string();
    let after = last_tick(&d, &id, &proc_id);
    assert!(common::wait_until(10, || last_tick(&d, &id, &proc_id) > after + 2), "the source stopped streaming");
    // Its processes cannot start on another tier (400, nothing made); files only can.
    let count =
        || serde_json::from_str::<serde_json::Value>(&d.cli_ok(&["ps", "--json"])).unwrap().as_array().unwrap().len();
    let before = count();
    let refused = d.cli(&["fork", &warm, "-n", "2", "--isolation", "namespace"]);
    assert!(
        !refused.status.success() && stderr(&refused).contains("cannot start on the namespace tier"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(count(), before, "a refused fork made nothing");
    // Nor onto a microVM (whether or not this host runs that tier: a 400 or a 501, never a start).
    let microvm = d.cli(&["fork", &warm, "-n", "1", "--isolation", "microvm"]);
    assert!(!microvm.status.success() && stderr(&microvm).contains("microvm"), "{}", stderr(&microvm));
    assert_eq!(count(), before, "a refused fork made nothing");
    let forks: Vec<String> = d.cli_ok(&["fork", &warm, "-n", "3"]).split_whitespace().map(str::to_string).collect();
    assert_eq!(forks.len(), 3);
    for f in &forks {
        assert_eq!(proc_row(&d, f, &proc_id), ("running".to_string(), pid.clone()), "fork {f}");
        let start = last_tick(&d, f, &proc_id);
        assert!(common::wait_until(10, || last_tick(&d, f, &proc_id) > start + 2), "fork {f} does not count");
        let host = sh_ok(&d, f, "hostname").trim().to_string();
        let name: serde_json::Value = serde_json::from_str(&d.cli_ok(&["inspect", f, "--json"])).unwrap();
        assert_eq!(host, name["name"].as_str().unwrap(), "fork {f} kept the source's hostname");
        assert_eq!(sh_ok(&d, f, "cat /tmp/kept /dev/shm/kept"), "tmp\nshm\n");
        // Its own root: a write stays in it.
        sh_ok(&d, f, &format!("echo {f} > /mine"));
    }
    assert!(!sh(&d, &id, "cat /mine").status.success(), "a fork wrote into its source");
    // The fork's process is its own: killing it there leaves the source's running.
    d.cli_ok(&["proc", "kill", &forks[0], &proc_id]);
    assert!(common::wait_until(10, || proc_row(&d, &forks[0], &proc_id).0 == "exited"));
    assert_eq!(proc_row(&d, &id, &proc_id).0, "running");

    // Bad input: a warm checkpoint of the gVisor tier does not start on the namespace tier.
    let out = d.cli(&["create", &warm, "--isolation", "namespace"]);
    assert!(!out.status.success() && stderr(&out).contains("400"), "{}", stderr(&out));

    // A scratch /tmp (--tmp tmpfs: a host directory outside the writable layer) is
    // emptied by a cold start, left out of the filesystem, and copied with processes.
    let scratch = d.create(&["--isolation", "gvisor", "--tmp", "tmpfs"]);
    sh_ok(&d, &scratch, "echo s > /tmp/s");
    assert!(!d.cli_ok(&["diff", &scratch]).contains("/tmp/s"));
    let warm_scratch = d.cli_ok(&["checkpoint", &scratch, "--processes"]).trim().to_string();
    let copy = d.cli_ok(&["fork", &warm_scratch, "-n", "1"]).trim().to_string();
    assert_eq!(sh_ok(&d, &copy, "cat /tmp/s"), "s\n", "the copy has its source's scratch files");
    sh_ok(&d, &copy, "echo mine > /tmp/s");
    assert_eq!(sh_ok(&d, &scratch, "cat /tmp/s"), "s\n", "in a directory of its own");
    d.cli_ok(&["stop", &scratch]);
    d.cli_ok(&["start", &scratch]);
    assert_eq!(sh_ok(&d, &scratch, "ls /tmp"), "");
    for f in forks.iter().chain([&id, &scratch, &copy]) {
        d.cli_ok(&["rm", "-f", f]);
        assert_released(&d, f);
    }
}

/// Whether a runsc process of sandbox `id` runs.
fn runsc_runs(id: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.starts_with("runsc") && cmdline.contains(id)
    })
}

/// One escape attempt: a script that must fail on every tier.
struct Attempt {
    what: &'static str,
    script: &'static str,
}

const ATTEMPTS: &[Attempt] = &[
    Attempt { what: "mount a filesystem", script: "mount -t tmpfs x /mnt" },
    Attempt { what: "load a kernel module", script: "insmod /lib/modules/x.ko || modprobe dummy" },
    // Pid 1's stdio were the host's (runsc's log) before it pointed them at
    // /dev/null. (Its other descriptors are the sandbox's own: on the gVisor
    // tier, sentry pipes of the processes it started.)
    Attempt {
        what: "a host file through pid 1's descriptors",
        script: "readlink /proc/1/fd/0 /proc/1/fd/1 /proc/1/fd/2 | grep -vx /dev/null | grep .",
    },
    Attempt { what: "a raw socket", script: "ping -c1 -W1 127.0.0.1" },
    Attempt { what: "write a kernel tunable", script: "echo 1 > /proc/sys/kernel/sysrq" },
    Attempt { what: "write /sys", script: "echo 1 > /sys/kernel/profiling" },
    Attempt { what: "make a device node", script: "mknod /tmp/sda b 8 0" },
    Attempt { what: "open a host disk", script: "head -c1 /dev/sda || head -c1 /dev/vda" },
    Attempt { what: "replace strata's init", script: "echo x > /run/strata/init" },
    Attempt { what: "reach the daemon's socket", script: "ls /run/strata/strata.sock /var/tmp/strata-it-*" },
    Attempt { what: "see host processes", script: "ls /proc | grep -qx 2 && cat /proc/2/comm | grep -q kthreadd" },
    Attempt {
        what: "leave the cgroup",
        script: "echo $$ > /sys/fs/cgroup/cgroup.procs || echo $$ > /sys/fs/cgroup/memory/cgroup.procs",
    },
    // ls's own: stdio and the directory it reads; anything more came from the host.
    Attempt { what: "a leaked host descriptor", script: "test \"$(ls /proc/self/fd | tr '\\n' ' ')\" != '0 1 2 3 '" },
];

#[test]
fn the_same_escape_attempts_fail_on_every_tier_and_the_host_keeps_working() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    // The namespace tier both ways: in a user namespace of its own (the
    // default where the host has them) and with host root's reduced set.
    let mut tiers: Vec<(&str, &[&str])> = vec![("namespace --no-userns", &["--isolation", "namespace", "--no-userns"])];
    match strata_runtime::probe::userns_unavailable() {
        None => tiers.push(("namespace --userns", &["--isolation", "namespace", "--userns"])),
        Some(why) if ci => panic!("CI must run the namespace tier with user namespaces: {why}"),
        Some(why) => println!("namespace tier with user namespaces skipped: {why}"),
    }
    match strata_runtime::gvisor::probe().unavailable() {
        None => tiers.push(("gvisor", &["--isolation", "gvisor"])),
        Some(why) if ci => panic!("CI must run the gvisor tier: {why}"),
        Some(why) => println!("gvisor tier skipped: {why}"),
    }
    match strata_runtime::microvm::probe().unavailable() {
        None => tiers.push(("microvm", &["--isolation", "microvm", "--network", "none"])),
        Some(why) if ci => panic!("CI must run the microvm tier: {why}"),
        Some(why) => println!("microvm tier skipped: {why}"),
    }
    let canary = d.create(&["--name", "canary"]);
    sh_ok(&d, &canary, "echo alive > /canary");
    for (tier, how) in &tiers {
        let mut args = how.to_vec();
        args.extend(["--pids", "64", "--memory", "256m"]);
        let id = d.create(&args);
        for a in ATTEMPTS {
            // In a guest, /dev/vd* are its own disks (its image and its writable disk),
            // not the host's; pid 1 runs from the initramfs, out of reach after the
            // switch to the root, not from a binary bound at /run/strata/init; and the
            // kernel threads it sees (kthreadd is pid 2) are its own kernel's.
            let script = match (*tier, a.what) {
                ("microvm", "open a host disk") => "head -c1 /dev/sda",
                ("microvm", "replace strata's init") => "echo x > /proc/1/exe",
                ("microvm", "see host processes") => {
                    "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -q 'strata[ ]daemon'"
                }
                _ => a.script,
            };
            let out = sh(&d, &id, script);
            assert!(!out.status.success(), "{tier}: {} succeeded: {}{}", a.what, stdout(&out), stderr(&out));
        }
        if *tier == "gvisor" {
            // The exec channel's host directory: nothing inside may change it (the
            // broker binds and chmods its socket there by path), and no user but
            // root may read the token that proves pid 1 to the host.
            for script in [
                "touch /run/strata/chan/x",
                "rm /run/strata/chan/broker.sock",
                "ln -s /etc/shadow /run/strata/chan/y",
                "mv /run/strata/chan/broker.sock /run/strata/chan/z",
            ] {
                let out = sh(&d, &id, script);
                assert!(!out.status.success(), "{tier}: {script} succeeded");
            }
            let out = d.cli(&["exec", "--user", "user", &id, "--", "cat", "/run/strata/chan/token"]);
            assert!(!out.status.success() && stdout(&out).is_empty(), "a user read the channel token");
            assert_eq!(sh_ok(&d, &id, "echo still"), "still\n", "the channel still works");
        }
        // A fork bomb and a memory bomb stay inside the sandbox.
        let _ = d.cli(&["exec", "--timeout", "10s", &id, "--", "sh", "-c", "b() { b | b & }; b"]);
        let _ = d.cli(&["exec", "--timeout", "20s", &id, "--", "sh", "-c", "x=$(head -c 400m /dev/zero | tr '\\0' a)"]);
        d.cli_ok(&["rm", "-f", &id]);
    }
    // The host and the other sandbox kept working.
    assert_eq!(sh_ok(&d, &canary, "cat /canary"), "alive\n");
    assert!(std::process::Command::new("true").status().unwrap().success());
}

/// Runs the CLI with `input` on its stdin, written while its output is read.
fn cli_stdin_concurrently(d: &TestDaemon, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(common::strata_bin())
        .args(args)
        .env("STRATA_SOCKET", &d.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run strata");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    out
}
