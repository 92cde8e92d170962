//! Commands in a sandbox: `exec` (in the foreground with streamed output, or detached)
//! and `proc ls|logs|kill|wait` for background processes.

use std::io::Write;

use anyhow::{bail, Result};
use strata_api::ExecRequest;
use strata_client::Client;

use super::kv;
use crate::args::process::{ExecArgs, ProcCmd, ProcOpts, ProcessRef};
use crate::args::JsonOutput;
use crate::{exec, output};

/// `strata exec`: runs the command and exits with its status, or (-d) prints the process id.
pub(super) async fn exec_cmd(c: &Client, a: ExecArgs) -> Result<i32> {
    let id = a.sandbox.id;
    let req = exec_request(a.cmd, &a.opts)?;
    if a.detach {
        let p = c.start_process(&id, &req).await?;
        println!("{}", p.id);
        return Ok(0);
    }
    exec::run(c, &id, req, a.opts.interactive, a.opts.tty).await
}

/// The request of a command and its `ProcOpts` (`exec` and `run`).
pub(super) fn exec_request(cmd: Vec<String>, o: &ProcOpts) -> Result<ExecRequest> {
    Ok(ExecRequest {
        cmd,
        env: kv(&o.env, "--env")?,
        cwd: o.cwd.clone(),
        user: o.user.clone(),
        timeout: o.timeout.clone(),
        tty: o.tty.then(exec::local_tty_size),
        ..Default::default()
    })
}

/// `strata proc ...`.
pub(super) async fn proc_cmd(c: &Client, cmd: ProcCmd) -> Result<i32> {
    match cmd {
        ProcCmd::Ls { id, out: JsonOutput { json } } => {
            let list = c.list_processes(&id).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["ID", "PID", "STATUS", "EXIT", "COMMAND"],
                    list.iter()
                        .map(|p| {
                            let exit = match p.status {
                                strata_api::ProcessStatus::Running => String::new(),
                                strata_api::ProcessStatus::Exited => p.exit_status().to_string(),
                            };
                            vec![
                                p.id.to_string(),
                                p.pid.map(|x| x.to_string()).unwrap_or_default(),
                                format!("{:?}", p.status).to_lowercase(),
                                exit,
                                p.cmd.join(" "),
                            ]
                        })
                        .collect(),
                );
            }
            Ok(0)
        }
        ProcCmd::Logs { process: ProcessRef { id, pid }, follow } => {
            let mut events = c.logs(&id, pid, 0, follow).await?;
            let b64 = base64::engine::general_purpose::STANDARD;
            while let Some(ev) = events.next().await? {
                if let strata_api::ProcessEvent::Output { stream, data_b64, .. } = ev {
                    let data = base64::Engine::decode(&b64, data_b64)?;
                    match stream {
                        strata_api::StreamKind::Stdout => std::io::stdout().write_all(&data)?,
                        strata_api::StreamKind::Stderr => std::io::stderr().write_all(&data)?,
                    }
                }
            }
            Ok(0)
        }
        ProcCmd::Kill { process: ProcessRef { id, pid }, signal } => {
            c.signal(&id, pid, &signal).await?;
            Ok(0)
        }
        ProcCmd::Wait { process: ProcessRef { id, pid }, timeout } => {
            let p = c.wait(&id, pid, timeout.as_deref()).await?;
            if p.status == strata_api::ProcessStatus::Running {
                bail!("process {pid} still running after {}", timeout.unwrap_or_default());
            }
            Ok(exec::status_of(&p))
        }
        ProcCmd::Attach { process: ProcessRef { id, pid }, replay } => {
            exec::terminal(c, &id, pid, replay.then_some(0)).await
        }
    }
}
