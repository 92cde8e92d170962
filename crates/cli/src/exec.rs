//! `strata exec` and `strata run`: stream a command's output, pass stdin
//! through with -i, forward Ctrl-C, exit with the command's status; with -t,
//! a terminal inside the sandbox over the daemon's WebSocket.

use std::io::Write;

use anyhow::{Context, Result};
use base64::Engine;
use strata_api::{ExecRequest, ProcessEvent, ProcessInfo, StdinRequest, StreamKind, TtyMessage, TtySize};
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
/// With `tty` (`req.tty` set), on a terminal inside the sandbox ([`terminal`]).
pub async fn run(client: &Client, id: &str, mut req: ExecRequest, interactive: bool, tty: bool) -> Result<i32> {
    if tty {
        let p = client.start_process(id, &req).await?;
        return terminal(client, id, p.id, Some(0)).await;
    }
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

/// The size of our own terminal (stdout's, else stdin's), or 80x24.
pub fn local_tty_size() -> TtySize {
    for fd in [1, 0] {
        let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one winsize to a valid pointer.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return TtySize { cols: ws.ws_col, rows: ws.ws_row };
        }
    }
    TtySize::default()
}

/// Our stdin in raw mode while it lives (when it is a terminal); the
/// previous mode comes back when dropped.
struct RawMode(Option<libc::termios>);

impl RawMode {
    fn enter() -> RawMode {
        if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return RawMode(None);
        }
        // SAFETY: termios calls on descriptor 0 with structs we own.
        unsafe {
            let mut before: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut before) != 0 {
                return RawMode(None);
            }
            let mut raw = before;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return RawMode(None);
            }
            RawMode(Some(before))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            // SAFETY: restores the mode read from descriptor 0 before.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, before) };
        }
    }
}

/// Attaches to the terminal of process `pid` (output from `offset`, default
/// from now on) until it exits: our stdin goes to it (in raw mode when it is
/// a terminal: Ctrl-C reaches the process as the byte it is), its output to
/// our stdout, our terminal's size follows ours. Returns its exit status, or
/// 0 when our stdin and the connection end first (it runs on).
pub async fn terminal(client: &Client, id: &str, pid: u64, offset: Option<u64>) -> Result<i32> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let mut ws = client.attach_tty(id, pid, offset).await?;
    let on_terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
    if on_terminal {
        let size = local_tty_size();
        let resize = TtyMessage::Resize { cols: size.cols, rows: size.rows };
        ws.send(Message::Text(serde_json::to_string(&resize)?.into())).await?;
    }
    let _raw = RawMode::enter();
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut stdin = tokio::io::stdin();
    let mut stdin_open = true;
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    out.write_all(&data)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<TtyMessage>(&t) {
                    Ok(TtyMessage::Exited { process }) => {
                        drop(_raw);
                        return Ok(status_of(&process));
                    }
                    Ok(TtyMessage::Dropped { bytes }) => eprint!("\r\nstrata: {bytes} bytes of output were dropped\r\n"),
                    Ok(TtyMessage::Error { message }) => eprint!("\r\nstrata: {message}\r\n"),
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None => {
                    drop(_raw);
                    // The process may have ended just now: its record says how.
                    let p = client.get_process(id, pid).await?;
                    return match p.status {
                        strata_api::ProcessStatus::Exited => Ok(status_of(&p)),
                        strata_api::ProcessStatus::Running => anyhow::bail!("the daemon closed the terminal"),
                    };
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e).context("the terminal's connection"),
            },
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(n) if n > 0 => ws.send(Message::Binary(buf[..n].to_vec().into())).await?,
                // The end of our input leaves the terminal open; its output goes on.
                _ => stdin_open = false,
            },
            _ = winch.recv(), if on_terminal => {
                let size = local_tty_size();
                let resize = TtyMessage::Resize { cols: size.cols, rows: size.rows };
                ws.send(Message::Text(serde_json::to_string(&resize)?.into())).await?;
            }
        }
    }
}
