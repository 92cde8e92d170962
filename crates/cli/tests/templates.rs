//! Templates: promotion, cached builds, failing steps.

mod common;

use common::TestDaemon;

fn build(d: &TestDaemon, file: &std::path::Path) -> (std::process::Output, Vec<serde_json::Value>) {
    let out = d.cli(&["template", "build", "app", "-f", file.to_str().unwrap(), "--json"]);
    let events = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    (out, events)
}

fn steps_run(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "step" && e["cached"] == false)
        .map(|e| e["instruction"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn builds_cache_unchanged_prefixes_and_templates_start_sandboxes() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("data.txt"), "from the context\n").unwrap();
    let file = ctx.path().join("Stratafile");
    std::fs::create_dir_all(ctx.path().join("conf/sub")).unwrap();
    std::fs::write(ctx.path().join("conf/sub/x.cfg"), "x=1\n").unwrap();
    let base = "FROM busybox\nENV STAGE=setup\nWORKDIR /app\nRUN echo \"installed $STAGE\" > /app/setup.log\nCOPY data.txt /app/\nCOPY data.txt /etc/renamed.txt\nCOPY conf /etc/conf/\n";
    std::fs::write(&file, base).unwrap();
    let (out, events) = build(&d, &file);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(
        steps_run(&events),
        [
            "RUN echo \"installed $STAGE\" > /app/setup.log",
            "COPY data.txt /app/",
            "COPY data.txt /etc/renamed.txt",
            "COPY conf /etc/conf/"
        ]
    );
    // Unchanged: nothing runs.
    let (_, events) = build(&d, &file);
    assert!(steps_run(&events).is_empty(), "{events:?}");
    // Only a changed last step reruns.
    std::fs::write(&file, format!("{base}RUN echo extra >> /app/setup.log\n")).unwrap();
    let (_, events) = build(&d, &file);
    assert_eq!(steps_run(&events), ["RUN echo extra >> /app/setup.log"]);
    // Changed COPY content invalidates that step and everything after it.
    std::fs::write(ctx.path().join("data.txt"), "new content\n").unwrap();
    let (_, events) = build(&d, &file);
    assert_eq!(
        steps_run(&events),
        [
            "COPY data.txt /app/",
            "COPY data.txt /etc/renamed.txt",
            "COPY conf /etc/conf/",
            "RUN echo extra >> /app/setup.log"
        ]
    );

    let id = d.cli_ok(&["create", "app"]).trim().to_string();
    assert_eq!(
        d.cli_ok(&["exec", &id, "--", "sh", "-c", "pwd; cat setup.log data.txt; echo $STAGE"]),
        "/app\ninstalled setup\nextra\nnew content\nsetup\n"
    );
    // COPY semantics: a file to a path is that path; a directory's contents go into the destination.
    assert_eq!(d.cli_ok(&["exec", &id, "--", "cat", "/etc/renamed.txt", "/etc/conf/sub/x.cfg"]), "new content\nx=1\n");
    let ls: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["template", "ls", "--json"])).unwrap();
    assert_eq!(ls.len(), 1);
    // The template's checkpoint cannot be deleted while the template points at it.
    let ck = ls[0]["checkpoint"].as_str().unwrap();
    let out = d.cli(&["checkpoint", "rm", ck]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("template app"), "{}", common::stderr(&out));

    // Promote a sandbox's state directly.
    d.cli_ok(&["exec", &id, "--", "sh", "-c", "echo tuned > /app/tuned"]);
    // Its state above the image includes the build's /etc files: promotion needs the override.
    d.cli_ok(&["template", "create", "app-tuned", "--from", &id, "--accept-findings"]);
    let child = d.cli_ok(&["create", "app-tuned"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &child, "--", "cat", "/app/tuned"]), "tuned\n");
}

#[test]
fn a_failing_step_fails_the_build_with_its_output_and_keeps_earlier_steps_cached() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let ctx = tempfile::tempdir().unwrap();
    let file = ctx.path().join("Stratafile");
    std::fs::write(&file, "FROM busybox\nRUN echo one > /one\nRUN echo 'about to fail' && exit 3\n").unwrap();
    let (out, events) = build(&d, &file);
    assert!(!out.status.success());
    let failed = events.iter().find(|e| e["type"] == "failed").expect("failed event");
    assert_eq!(failed["index"], 3);
    assert!(failed["error"]["message"].as_str().unwrap().contains("about to fail"), "{failed}");
    assert!(common::stderr(&out).contains("step 3"), "{}", common::stderr(&out));
    // Fix the step: the first RUN comes from the cache.
    std::fs::write(&file, "FROM busybox\nRUN echo one > /one\nRUN echo fixed > /two\n").unwrap();
    let (out, events) = build(&d, &file);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(steps_run(&events), ["RUN echo fixed > /two"]);
    // No build sandboxes are left behind.
    let ps: Vec<serde_json::Value> = serde_json::from_str(&d.cli_ok(&["ps", "--json"])).unwrap();
    assert!(ps.is_empty(), "{ps:?}");
    // Bad build files are rejected with the reason.
    std::fs::write(&file, "RUN true\n").unwrap();
    let out = d.cli(&["template", "build", "bad", "-f", file.to_str().unwrap()]);
    assert!(common::stderr(&out).contains("FROM"), "{}", common::stderr(&out));
}

#[test]
fn a_start_command_makes_a_warm_template() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let ctx = tempfile::tempdir().unwrap();
    let file = ctx.path().join("Stratafile");
    std::fs::write(&file, "FROM busybox\nRUN mkdir -p /srv && echo served > /srv/index.html\nWORKDIR /srv\n").unwrap();
    let f = file.to_str().unwrap();
    // ready_cmd alone is refused (it says when a start command is ready).
    let out = d.cli(&["template", "build", "bad", "-f", f, "--ready-cmd", "true"]);
    assert!(!out.status.success());
    let out = d.cli(&[
        "template",
        "build",
        "web",
        "-f",
        f,
        "--start-cmd",
        "httpd -f -p 8080 -h /srv",
        "--ready-cmd",
        "wget -qO- http://127.0.0.1:8080/index.html",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // A sandbox of it serves at once: the server is running, copied with the template.
    let sb = d.cli_ok(&["create", "web"]).trim().to_string();
    assert_eq!(d.cli_ok(&["exec", &sb, "--", "wget", "-qO-", "http://127.0.0.1:8080/index.html"]), "served\n");
    // A start command that exits before it is ready fails the build at once, saying so.
    let out = d.cli(&["template", "build", "dies", "-f", f, "--start-cmd", "exit 3", "--ready-cmd", "false"]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("exited (status 3) before it was ready"), "{}", common::stderr(&out));
}
