//! `strata exec` and `strata run`: stream a command's output, pass stdin
//! through with -i, forward Ctrl-C, exit with the command's status.

use std::io::Write;

use anyhow::{Context, Result};
use base64::Engine;
use strata_api::{ExecRequest, ProcessEvent, ProcessInfo, StdinRequest, StreamKind};
use strata_client::{Client, NdjsonStream};
use tokio::io::AsyncReadExt;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Writes output events to our stdout/stderr until the process exits; returns its record.
async fn pump(mut events: NdjsonStream<ProcessEvent>) -> Result<Option<ProcessInfo>> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    while let Some(ev) = events.next().await? {
        match ev {
            ProcessEvent::Output { stream, data_b64, .. } => {
                let data = B64.decode(data_b64).context("decoding output")?;
                match stream {
                    StreamKind::Stdout => {
                        out.write_all(&data)?;
                        out.flush()?;
                    }
                    StreamKind::Stderr => {
                        err.write_all(&data)?;
                        err.flush()?;
                    }
                }
            }
            ProcessEvent::Dropped { bytes } => {
                eprintln!("strata: {bytes} bytes of output were dropped from the buffer")
            }
            ProcessEvent::Exited { process } => return Ok(Some(process)),
            ProcessEvent::Started { .. } => {}
        }
    }
    Ok(None)
}

/// The exit status strata reports for a finished process, printing why when it did not exit normally.
pub fn status_of(p: &ProcessInfo) -> i32 {
    if let Some(e) = &p.spawn_error {
        eprintln!("strata: {e}");
    } else if p.timed_out {
        eprintln!("strata: command timed out and was killed");
    } else if p.oom_killed {
        eprintln!("strata: command was killed by the OOM killer (sandbox memory limit)");
    }
    p.exit_status()
}

/// Runs `req` in sandbox `id`, streaming output; returns the exit status.
pub async fn run(client: &Client, id: &str, mut req: ExecRequest, interactive: bool) -> Result<i32> {
    if !interactive {
        let mut events = client.exec_stream(id, &req).await?;
        if let (Some(from), true) =
            (events.header("strata-resumed-from"), std::io::IsTerminal::is_terminal(&std::io::stderr()))
        {
            eprintln!(
                "strata: sandbox {id} was {from}; resumed in {} ms",
                events.header("strata-resume-ms").unwrap_or("?")
            );
        }
        let pid = match events.next().await? {
            Some(ProcessEvent::Started { process }) => process.id,
            other => anyhow::bail!("unexpected first event from the daemon: {other:?}"),
        };
        let forward = forward_ctrl_c(client.clone(), id.to_string(), pid);
        let res = pump(events).await;
        forward.abort();
        return match res? {
            Some(p) => Ok(status_of(&p)),
            None => anyhow::bail!("the daemon closed the output stream before the command exited"),
        };
    }
    req.keep_stdin_open = true;
    let p = client.start_process(id, &req).await?;
    let pid = p.id;
    let (c2, id2) = (client.clone(), id.to_string());
    let stdin_task = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = stdin.read(&mut buf).await.unwrap_or(0);
            let req = StdinRequest { data_b64: B64.encode(&buf[..n]), close: n == 0 };
            if c2.write_stdin(&id2, pid, &req).await.is_err() || n == 0 {
                break;
            }
        }
    });
    let forward = forward_ctrl_c(client.clone(), id.to_string(), pid);
    let res = pump(client.logs(id, pid, 0, true).await?).await;
    stdin_task.abort();
    forward.abort();
    match res? {
        Some(p) => Ok(status_of(&p)),
        None => anyhow::bail!("the daemon closed the output stream before the command exited"),
    }
}

/// On Ctrl-C, sends SIGINT to the process.
fn forward_ctrl_c(client: Client, id: String, pid: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            let _ = client.signal(&id, pid, "INT").await;
        }
    })
}
