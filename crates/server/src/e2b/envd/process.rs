//! `process.Process`: commands and terminals, as strata processes.

use super::*;

/// `process.ProcessConfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `process.StartRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartRequest {
    #[serde(default)]
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

/// `process.ProcessSelector` (a oneof: `pid` or `tag`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    #[serde(default)]
    pid: Option<u64>,
    #[serde(default)]
    tag: Option<String>,
}

/// Requests that name a process (`ConnectRequest`, `SendSignalRequest`,
/// `SendInputRequest`, `CloseStdinRequest`, `UpdateRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    signal: Option<Value>,
    #[serde(default)]
    input: Option<ProcessInput>,
}

/// `process.UpdateRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    pty: Option<Value>,
}

/// `process.PTY` -> its size, clamped to sane terminal sizes.
fn pty_size(v: &Value) -> TtySize {
    let dim = |k: &str, d: u64| {
        v.get("size").and_then(|s| s.get(k)).and_then(Value::as_u64).unwrap_or(d).clamp(1, 1000) as u16
    };
    TtySize { cols: dim("cols", 80), rows: dim("rows", 24) }
}

/// `process.Process/Update`: resizes a PTY (strata's terminal of the
/// process; right after its start too: the resize waits for it to run).
async fn resize(e: &SharedE2b, c: &Ctx, req: UpdateRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    let Some(size) = req.pty.as_ref().filter(|p| !p.is_null()) else { return Ok(()) };
    if !c.own_proc(e, pid).is_some_and(|m| m.pty) {
        return Err(ConnectError::new(Code::InvalidArgument, format!("process {pid} has no PTY")));
    }
    match c.client.resize_tty(&c.sandbox, pid, pty_size(size)).await {
        Ok(_) => Ok(()),
        Err(err) if err.body.code == ErrorCode::InvalidState => {
            Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")))
        }
        Err(err) => Err(native(err)),
    }
}

/// `process.ProcessInput` (a oneof: `stdin` or `pty`, base64 bytes).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// `process.StreamInputRequest` (a oneof: `start`, `data`, `keepalive`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamInputRequest {
    #[serde(default)]
    start: Option<ProcessRequest>,
    #[serde(default)]
    data: Option<ProcessRequest>,
}

/// The `process.Process` service: one Connect call.
pub(super) async fn service(
    State(e): State<SharedE2b>,
    who: Who,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (f, c, limit) = match connect_call(&e, &who, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let keepalive = keepalive_of(&headers);
    let streams = Streams { keepalive, limit };
    let res = match (method.as_str(), f) {
        ("Start", Framing::Stream) => {
            match stream_message(&body).and_then(|m| parse::<StartRequest>(&m, "process.StartRequest")) {
                Ok(req) => return start(e, c, req, streams).await.unwrap_or_else(|err| stream_error(&err)),
                Err(err) => Err(err),
            }
        }
        ("Connect", Framing::Stream) => {
            match stream_message(&body).and_then(|m| parse::<ProcessRequest>(&m, "process.ConnectRequest")) {
                Ok(req) => return reconnect(e, c, req, streams).await.unwrap_or_else(|err| stream_error(&err)),
                Err(err) => Err(err),
            }
        }
        ("StreamInput", Framing::Stream) => stream_input(&e, &c, &body).await.map(|()| {
            let mut b = connect::envelope(0, b"{}").to_vec();
            b.extend_from_slice(&connect::end_stream(None));
            ([(header::CONTENT_TYPE, "application/connect+json")], b).into_response()
        }),
        ("List", Framing::Unary) => within(limit, list(&e, &c)).await.map(unary_ok),
        ("SendSignal", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.SendSignalRequest") {
            Ok(req) => within(limit, send_signal(&e, &c, req)).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("SendInput", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.SendInputRequest") {
            Ok(req) => within(limit, send_input(&e, &c, req.process, req.input)).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("CloseStdin", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.CloseStdinRequest") {
            Ok(req) => within(limit, close_stdin(&e, &c, req)).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("Update", Framing::Unary) => match parse::<UpdateRequest>(&body, "process.UpdateRequest") {
            Ok(req) => within(limit, resize(&e, &c, req)).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("Start" | "Connect" | "StreamInput", Framing::Unary)
        | ("List" | "SendSignal" | "SendInput" | "CloseStdin" | "Update", Framing::Stream) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("process.{method}: wrong content type for this method's streaming kind"),
        )),
        _ => {
            Err(ConnectError::new(Code::Unimplemented, format!("process.{method} is not a method of process.Process")))
        }
    };
    res.unwrap_or_else(|err| error_response(f, err))
}

/// The strata process id a selector names (a tag is looked up among the
/// processes started through envd).
fn resolve(e: &SharedE2b, c: &Ctx, sel: Option<Selector>) -> Result<u64, ConnectError> {
    let sel = sel.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process selector missing"))?;
    if let Some(pid) = sel.pid {
        return Ok(pid);
    }
    let tag =
        sel.tag.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process selector has neither pid nor tag"))?;
    let owner = c.owner();
    e.lock()
        .procs
        .iter()
        .find(|((sb, _), m)| sb == &c.sandbox && m.owner == owner && m.tag.as_deref() == Some(tag.as_str()))
        .map(|((_, pid), _)| *pid)
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("process with tag {tag:?} not found")))
}

fn end_event(p: &ProcessInfo) -> Value {
    let code = p.exit_status();
    let status = match (&p.spawn_error, p.signal) {
        (Some(err), _) => format!("spawn error: {err}"),
        (None, Some(sig)) => format!("signal: {sig}"),
        _ => format!("exit status {code}"),
    };
    let mut end = json!({"exitCode": code, "exited": p.signal.is_none() && p.spawn_error.is_none(), "status": status});
    if let Some(err) = &p.spawn_error {
        end["error"] = json!(err);
    } else if p.timed_out {
        end["error"] = json!("timed out");
    }
    json!({"event": {"end": end}})
}

/// How a process stream is held: the client's keepalive interval and the
/// call's deadline (`Connect-Timeout-Ms`).
#[derive(Debug, Clone, Copy)]
struct Streams {
    keepalive: Option<Duration>,
    limit: Option<Duration>,
}

/// Streams a process's events (`StartResponse`/`ConnectResponse`) from its log.
/// With a deadline: a process this stream started was given it as its
/// timeout (strata kills it then), and its stream ends with
/// `deadline_exceeded` instead of an exit; a reattached stream just ends then.
fn follow(c: Ctx, pid: u64, pty: bool, streams: Streams, started: bool) -> Response {
    let Streams { keepalive, limit } = streams;
    let deadline = limit.filter(|_| !started).map(|d| tokio::time::Instant::now() + d);
    let (tx, rx) = mpsc::channel::<Result<Value, ConnectError>>(64);
    tokio::spawn(async move {
        if tx.send(Ok(json!({"event": {"start": {"pid": pid}}}))).await.is_err() {
            return;
        }
        let mut stream = match c.client.logs(&c.sandbox, pid, 0, true).await {
            Ok(s) => s,
            Err(err) => {
                let _ = tx.send(Err(native(err))).await;
                return;
            }
        };
        let tick = keepalive.unwrap_or(Duration::from_secs(3600));
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = tokio::time::sleep(tick) => {
                    if tx.send(Ok(json!({"event": {"keepalive": {}}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
                _ = tx.closed() => return,
                _ = until(deadline) => {
                    let _ = tx.send(Err(deadline_exceeded(limit.unwrap_or_default()))).await;
                    return;
                }
            };
            let ev = match next {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    // The log ended without an exit event: report what strata knows.
                    match c.client.get_process(&c.sandbox, pid).await {
                        Ok(p) if p.status == ProcessStatus::Exited => {
                            let _ = tx.send(Ok(end_event(&p))).await;
                        }
                        Ok(_) => {
                            let _ = tx
                                .send(Err(ConnectError::new(
                                    Code::Unavailable,
                                    format!("the output stream of process {pid} ended before it exited"),
                                )))
                                .await;
                        }
                        Err(err) => {
                            let _ = tx.send(Err(native(err))).await;
                        }
                    }
                    return;
                }
                Err(err) => {
                    let _ = tx.send(Err(native(err))).await;
                    return;
                }
            };
            let msg = match ev {
                ProcessEvent::Started { .. } | ProcessEvent::Dropped { .. } => continue,
                ProcessEvent::Output { stream, data_b64, .. } => {
                    let key = match stream {
                        _ if pty => "pty",
                        StreamKind::Stdout => "stdout",
                        StreamKind::Stderr => "stderr",
                    };
                    json!({"event": {"data": {key: data_b64}}})
                }
                ProcessEvent::Exited { process } => {
                    // Killed with its sandbox: E2B's stream breaks and the SDK
                    // raises its not-found error, not an exit code of 137.
                    let end = if c.client.sandbox_destroyed(&c.sandbox).await {
                        Err(ConnectError::new(
                            Code::NotFound,
                            format!("sandbox {} was killed while process {pid} ran", c.sandbox),
                        ))
                    } else if let Some(d) = limit.filter(|_| started && process.timed_out) {
                        // Killed at the call's deadline, as envd kills it.
                        Err(deadline_exceeded(d))
                    } else {
                        Ok(end_event(&process))
                    };
                    let _ = tx.send(end).await;
                    return;
                }
            };
            if tx.send(Ok(msg)).await.is_err() {
                return;
            }
        }
    });
    stream_response(rx)
}

/// `process.Process/Start`: a strata background process, streamed.
async fn start(e: SharedE2b, c: Ctx, req: StartRequest, streams: Streams) -> Result<Response, ConnectError> {
    let pty = req.pty.as_ref().filter(|p| !p.is_null()).map(pty_size);
    let cfg =
        req.process.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process.StartRequest without process"))?;
    if cfg.cmd.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "process.cmd is empty"));
    }
    let mut cmd = vec![cfg.cmd.clone()];
    cmd.extend(cfg.args.iter().cloned());
    let cwd = c.path(cfg.cwd.as_deref().unwrap_or(""));
    let mut env = cfg.envs.clone();
    env.entry("HOME".into()).or_insert_with(|| c.home());
    env.entry("USER".into()).or_insert_with(|| c.user.clone());
    if pty.is_some() {
        // envd's terminal type.
        env.entry("TERM".into()).or_insert_with(|| "xterm-256color".into());
    }
    let native_req = ExecRequest {
        cmd,
        env,
        cwd: Some(cwd.clone()),
        user: Some(c.user.clone()),
        keep_stdin_open: req.stdin.unwrap_or(false),
        tty: pty,
        // envd runs the command under the call's deadline: it is killed then.
        timeout: streams.limit.map(|d| format!("{}ms", d.as_millis())),
        ..Default::default()
    };
    let info = c.client.start_process(&c.sandbox, &native_req).await.map_err(native)?;
    if let Some(err) = &info.spawn_error {
        return Err(ConnectError::new(Code::InvalidArgument, format!("cannot start {:?}: {err}", cfg.cmd)));
    }
    let config = json!({"cmd": cfg.cmd, "args": cfg.args, "envs": cfg.envs, "cwd": cwd});
    e.lock()
        .procs
        .insert((c.sandbox.clone(), info.id), ProcMeta { config, tag: req.tag, pty: pty.is_some(), owner: c.owner() });
    Ok(follow(c, info.id, pty.is_some(), streams, true))
}

/// `process.Process/Connect`: reattach to a process; its output is replayed
/// from the start of strata's buffer, then followed.
async fn reconnect(e: SharedE2b, c: Ctx, req: ProcessRequest, streams: Streams) -> Result<Response, ConnectError> {
    let pid = resolve(&e, &c, req.process)?;
    let p = c.client.get_process(&c.sandbox, pid).await.map_err(native)?;
    if p.status == ProcessStatus::Exited {
        return Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")));
    }
    let pty = c.own_proc(&e, pid).is_some_and(|m| m.pty);
    Ok(follow(c, pid, pty, streams, false))
}

/// `process.Process/List`: running processes.
async fn list(e: &SharedE2b, c: &Ctx) -> Result<Value, ConnectError> {
    let procs = c.client.list_processes(&c.sandbox).await.map_err(native)?;
    let owner = c.owner();
    let mut st = e.lock();
    // Forget what is no longer running (the map only serves tags and configs of live processes).
    let running: std::collections::HashSet<u64> =
        procs.iter().filter(|p| p.status == ProcessStatus::Running).map(|p| p.id).collect();
    st.procs.retain(|(sb, pid), _| sb != &c.sandbox || running.contains(pid));
    let out: Vec<Value> = procs
        .iter()
        .filter(|p| p.status == ProcessStatus::Running)
        .map(|p| {
            let meta = st.procs.get(&(c.sandbox.clone(), p.id)).filter(|m| m.owner == owner);
            let config = meta.map(|m| m.config.clone()).unwrap_or_else(|| {
                let cmd = p.cmd.first().cloned().unwrap_or_default();
                json!({"cmd": cmd, "args": p.cmd.iter().skip(1).collect::<Vec<_>>(), "envs": {}})
            });
            let mut v = json!({"config": config, "pid": p.id});
            if let Some(tag) = meta.and_then(|m| m.tag.clone()) {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    Ok(json!({"processes": out}))
}

async fn send_signal(e: &SharedE2b, c: &Ctx, req: ProcessRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    let sig = match req.signal.as_ref() {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => "SIGKILL",
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => "SIGTERM",
        Some(Value::Number(n)) if n.as_u64() == Some(9) => "SIGKILL",
        Some(Value::Number(n)) if n.as_u64() == Some(15) => "SIGTERM",
        other => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("unsupported signal {other:?} (SIGNAL_SIGKILL, SIGNAL_SIGTERM)"),
            ))
        }
    };
    // A process that has just started may not have its in-sandbox pid yet
    // (strata answers 409 `not running` for a moment): retry briefly.
    for _ in 0..50 {
        let p = c.client.get_process(&c.sandbox, pid).await.map_err(native)?;
        if p.status == ProcessStatus::Exited {
            return Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")));
        }
        match c.client.signal(&c.sandbox, pid, sig).await {
            Ok(_) => return Ok(()),
            Err(err) if err.code() == ErrorCode::InvalidState => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(err) => return Err(native(err)),
        }
    }
    Err(ConnectError::new(
        Code::Unavailable,
        format!("process {pid} could not be signalled: it stayed between start and running for 1 s"),
    ))
}

async fn send_input(
    e: &SharedE2b,
    c: &Ctx,
    sel: Option<Selector>,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let pid = resolve(e, c, sel)?;
    let input = input.unwrap_or_default();
    let data = input.stdin.or(input.pty).unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(&data)
        .map_err(|err| ConnectError::new(Code::InvalidArgument, format!("stdin is not base64: {err}")))?;
    c.client.write_stdin(&c.sandbox, pid, &StdinRequest { data_b64: data, close: false }).await.map_err(native)
}

async fn close_stdin(e: &SharedE2b, c: &Ctx, req: ProcessRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    c.client.write_stdin(&c.sandbox, pid, &StdinRequest { data_b64: String::new(), close: true }).await.map_err(native)
}

/// `process.Process/StreamInput` (client streaming): the request's messages in
/// order (a `start` naming the process, then `data`).
async fn stream_input(e: &SharedE2b, c: &Ctx, body: &[u8]) -> Result<(), ConnectError> {
    let frames = connect::decode_all(body)?;
    let mut pid = None;
    for (flags, payload) in frames {
        if flags & connect::FLAG_END_STREAM != 0 {
            break;
        }
        let m: StreamInputRequest = parse(&payload, "process.StreamInputRequest")?;
        if let Some(start) = m.start {
            pid = Some(resolve(e, c, start.process)?);
        } else if let Some(data) = m.data {
            let p = pid.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "StreamInput data before start"))?;
            send_input(e, c, Some(Selector { pid: Some(p), tag: None }), data.input).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_request_is_read_from_its_stream_message() {
        let m = connect::envelope(0, b"{\"process\":{\"cmd\":\"ls\"}}");
        let req: StartRequest = parse(&stream_message(&m).unwrap(), "x").unwrap();
        assert_eq!(req.process.unwrap().cmd, "ls");
        assert!(parse::<StartRequest>(b"\xff\xfe", "x").is_err());
    }
}
