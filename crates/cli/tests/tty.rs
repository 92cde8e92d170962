//! Processes on a pseudo-terminal, on every tier this host runs: `exec -t`
//! from the CLI, the terminal WebSocket and resizes through the API, the
//! user owning its terminal, the refusals, and a terminal kept through
//! standby with its shell.

mod common;

use std::time::{Duration, Instant};

use common::{rt, stderr, stdout, TestDaemon};
use futures_util::{SinkExt, StreamExt};
use strata_api::{ExecRequest, TtyMessage, TtySize};
use strata_client::TtySocket;
use tokio_tungstenite::tungstenite::Message;

/// Reads the terminal's output until it contains `want` (10 s at most);
/// returns all of it, carriage returns removed.
async fn read_until(ws: &mut TtySocket, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => seen.push_str(&String::from_utf8_lossy(&b).replace('\r', "")),
            Ok(Some(Ok(Message::Text(t)))) => panic!("a message before {want:?}: {t} (output: {seen:?})"),
            Ok(Some(Ok(_))) => {}
            other => panic!("no {want:?} in the terminal's output {seen:?}: {other:?}"),
        }
    }
    seen
}

async fn type_line(ws: &mut TtySocket, line: &str) {
    ws.send(Message::Binary(format!("{line}\n").into_bytes().into())).await.unwrap();
}

/// The same walk through a terminal on the sandbox `id`.
fn a_terminal_works_in(d: &TestDaemon, id: &str) {
    // The CLI: the process runs on a terminal of the default size (stdin here
    // is no terminal), typed input reaches it, its exit status is ours.
    let out =
        d.cli_stdin(&["exec", "-t", id, "--", "sh", "-c", "read x; tty; stty size; echo got:$x; exit 4"], b"hi\n");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out).replace('\r', "");
    assert!(text.contains("/dev/pts/") && text.contains("24 80\ngot:hi\n"), "{text:?}");

    let c = d.client();
    rt().block_on(async {
        // A shell on a 100x30 terminal, as a user: it owns its terminal.
        let req = ExecRequest {
            cmd: vec!["sh".into()],
            user: Some("user".into()),
            tty: Some(TtySize { cols: 100, rows: 30 }),
            ..Default::default()
        };
        let p = c.start_process(id, &req).await.unwrap();
        assert_eq!(p.tty, Some(TtySize { cols: 100, rows: 30 }));
        let mut ws = c.attach_tty(id, p.id, Some(0)).await.unwrap();
        type_line(&mut ws, "stty size; stat -c owner=%U $(tty)").await;
        let seen = read_until(&mut ws, "owner=user").await;
        assert!(seen.contains("30 100"), "{seen:?}");
        // A resize through the API, then one over the socket: the shell sees each.
        let resized = c.resize_tty(id, p.id, TtySize { cols: 132, rows: 50 }).await.unwrap();
        assert_eq!(resized.tty, Some(TtySize { cols: 132, rows: 50 }));
        type_line(&mut ws, "stty size").await;
        read_until(&mut ws, "50 132").await;
        let resize = serde_json::to_string(&TtyMessage::Resize { cols: 90, rows: 20 }).unwrap();
        ws.send(Message::Text(resize.into())).await.unwrap();
        type_line(&mut ws, "sleep 0.2; stty size").await;
        read_until(&mut ws, "20 90").await;

        // Bad input: a size no terminal has (400), a process without a terminal (409),
        // an unknown process (404), a socket message a client does not send.
        let bad = c.resize_tty(id, p.id, TtySize { cols: 0, rows: 10 }).await.unwrap_err();
        assert_eq!(bad.code(), Some(strata_api::ErrorCode::BadRequest), "{bad}");
        let plain =
            c.start_process(id, &ExecRequest { cmd: vec!["sleep".into(), "30".into()], ..Default::default() }).await;
        let plain = plain.unwrap();
        let no_tty = c.resize_tty(id, plain.id, TtySize { cols: 80, rows: 24 }).await.unwrap_err();
        assert_eq!(no_tty.code(), Some(strata_api::ErrorCode::InvalidState), "{no_tty}");
        assert!(c.attach_tty(id, plain.id, None).await.unwrap_err().to_string().contains("no terminal"));
        let unknown = c.attach_tty(id, 999_999, None).await.unwrap_err();
        assert_eq!(unknown.code(), Some(strata_api::ErrorCode::ProcessNotFound), "{unknown}");
        let _ = c.signal(id, plain.id, "KILL").await;
        ws.send(Message::Text(r#"{"type":"dropped","bytes":1}"#.into())).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    assert!(t.contains("error") && t.contains("only resize"), "{t}");
                    break;
                }
                Ok(Some(Ok(Message::Binary(_)))) => {} // the shell's prompt
                other => panic!("no error answer: {other:?}"),
            }
        }

        // Its end closes the socket with the exit status.
        type_line(&mut ws, "exit 3").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    match serde_json::from_str::<TtyMessage>(&t).unwrap() {
                        TtyMessage::Exited { process } => assert_eq!(process.exit_code, Some(3)),
                        other => panic!("{other:?}"),
                    }
                    break;
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("no end of the shell: {other:?}"),
            }
        }
        let ended = c.attach_tty(id, p.id, None).await.unwrap_err();
        assert_eq!(ended.code(), Some(strata_api::ErrorCode::InvalidState), "{ended}");
    });
}

/// Standby keeps a shell on its terminal: after resume the same shell
/// answers on the same terminal, its variables intact; a warm fork's copy
/// of it answers on a terminal of the child's own.
fn a_terminal_survives_standby_and_warm_forks(d: &TestDaemon, id: &str) {
    let c = d.client();
    rt().block_on(async {
        let req = ExecRequest { cmd: vec!["sh".into()], tty: Some(TtySize::default()), ..Default::default() };
        let p = c.start_process(id, &req).await.unwrap();
        let mut ws = c.attach_tty(id, p.id, Some(0)).await.unwrap();
        type_line(&mut ws, "KEPT=before-$$; echo set").await;
        read_until(&mut ws, "set").await;
        drop(ws);
        c.standby_sandbox(id, false).await.unwrap();
        c.resume_sandbox(id).await.unwrap();
        let mut ws = c.attach_tty(id, p.id, None).await.unwrap();
        type_line(&mut ws, "echo now:$KEPT; stty size").await;
        let seen = read_until(&mut ws, "24 80").await;
        assert!(seen.contains("now:before-"), "{seen:?}");
        c.resize_tty(id, p.id, TtySize { cols: 120, rows: 40 }).await.unwrap();
        type_line(&mut ws, "stty size").await;
        read_until(&mut ws, "40 120").await;

        // A warm checkpoint carries the shell on its terminal into a fork.
        let ck = strata_api::CheckpointRequest { processes: true, ..Default::default() };
        let ck = c.checkpoint(id, &ck).await.unwrap();
        let fork: strata_api::ForkRequest =
            serde_json::from_value(serde_json::json!({"source": ck.id, "count": 1})).unwrap();
        let child = c.fork(&fork).await.unwrap().sandboxes.remove(0);
        let mut cws = c.attach_tty(&child, p.id, None).await.unwrap();
        type_line(&mut cws, "echo child:$KEPT; stty size").await;
        let seen = read_until(&mut cws, "40 120").await;
        assert!(seen.contains("child:before-"), "{seen:?}");
        c.resize_tty(&child, p.id, TtySize { cols: 70, rows: 15 }).await.unwrap();
        type_line(&mut cws, "stty size").await;
        read_until(&mut cws, "15 70").await;
        // The source's terminal is its own still.
        type_line(&mut ws, "stty size").await;
        read_until(&mut ws, "40 120").await;
        type_line(&mut ws, "exit").await;
        c.remove_sandbox(&child, true).await.unwrap();
    });
}

#[test]
fn terminals_on_the_namespace_tier() {
    require_criu!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--isolation", "namespace"]);
    a_terminal_works_in(&d, &id);
    a_terminal_survives_standby_and_warm_forks(&d, &id);
}

#[test]
fn terminals_on_the_gvisor_tier() {
    require_gvisor!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&["--isolation", "gvisor"]);
    a_terminal_works_in(&d, &id);
    a_terminal_survives_standby_and_warm_forks(&d, &id);
}
