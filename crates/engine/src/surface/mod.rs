//! The engine's surface for front ends: an [`Engine`] is the engine acting
//! for one explicit [`Caller`] (made from a request's credentials by the
//! front end), with one method per operation, grouped by resource in the
//! files of this folder. Every front end calls the engine only through it:
//! the native HTTP API, the E2B API and MCP (in the daemon).
//!
//! What each call does besides the operation:
//! - **Access**: a call on a sandbox's contents or processes enters it through
//!   [`crate::access::enter`] with the [`Use`] the operation needs (resolved
//!   once among the caller's own, held awake while the call runs and, for
//!   its processes or files, resumed first when it is parked). The method says
//!   which `Use`; there is no route table to keep in step.
//! - **Caller**: the operation runs as the caller (tenancy, the Rule of Two,
//!   quotas apply); operator-only operations refuse a tenant here
//!   (`Engine::operator_only`), whatever the front end checked before.
//! - **Audit** is the front ends' (they know the request and its answer).

mod checkpoints;
mod files;
mod objects;
mod operator;
mod processes;
mod sandboxes;

pub use objects::Progress;
pub use processes::{Terminal, TerminalInput};

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use strata_api::{ErrorCode, ProcessEvent, ResumeResult};
use strata_store::db::SandboxRecord;

use crate::access::{enter, Use};
use crate::activity::ActivityGuard;
use crate::caller::{run_as, Caller};
use crate::error::{EngineError, EngineResult};
use crate::state::Shared;
use crate::transfer::ByteStream;

/// Where a front end learns of the resume a call made (the native API says it
/// in the `strata-resumed-from` and `strata-resume-ms` headers).
pub type ResumeReport = Arc<Mutex<Option<ResumeResult>>>;

/// The engine, acting for one caller.
#[derive(Clone)]
pub struct Engine {
    st: Shared,
    caller: Caller,
    resumes: Option<ResumeReport>,
}

/// A stream of a process's events, holding the sandbox awake until dropped.
pub struct Events {
    rx: tokio::sync::mpsc::Receiver<ProcessEvent>,
    _hold: Option<ActivityGuard>,
}

impl Events {
    /// The next event; `None` once the process's log ended.
    pub async fn next(&mut self) -> EngineResult<Option<ProcessEvent>> {
        Ok(self.rx.recv().await)
    }
}

impl futures_util::Stream for Events {
    type Item = ProcessEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ProcessEvent>> {
        self.rx.poll_recv(cx)
    }
}

/// A file's bytes (or a tar stream) as they are read, holding the sandbox
/// awake until the stream is dropped.
pub struct Download {
    /// The file's length (`None`: a tar stream).
    pub len: Option<u64>,
    /// The bytes.
    pub stream: ByteStream,
}

/// A sandbox a call entered: its id (or, when the key names none of the
/// caller's live sandboxes, the key itself, for the operation to answer: 404,
/// or 409 for the caller's destroyed sandbox), its record as entered, and the
/// activity hold.
struct Target {
    id: String,
    record: Option<SandboxRecord>,
    hold: Option<ActivityGuard>,
}

/// `stream` holding `hold` until it ends or is dropped (its drop counts as activity).
fn holding(stream: ByteStream, hold: Option<ActivityGuard>) -> ByteStream {
    Box::pin(futures_util::StreamExt::map(stream, move |chunk| {
        let _held = &hold;
        chunk
    }))
}

impl Engine {
    /// The engine of `st`, acting for `caller`.
    pub fn new(st: Shared, caller: Caller) -> Engine {
        Engine { st, caller, resumes: None }
    }

    /// This engine, telling `report` of the resume a call on a parked sandbox made.
    pub fn reporting_resumes(mut self, report: ResumeReport) -> Engine {
        self.resumes = Some(report);
        self
    }

    /// Who calls.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Runs `fut` as the caller.
    async fn run<T>(&self, fut: impl std::future::Future<Output = EngineResult<T>>) -> EngineResult<T> {
        run_as(self.caller.clone(), fut).await
    }

    /// Enters the sandbox `key` names for a call that needs `using` (as the
    /// caller). A key that names none of the caller's sandboxes is passed on
    /// as it is: the operation answers it.
    async fn enter(&self, key: &str, using: Use) -> EngineResult<Target> {
        match self.run(enter(&self.st, key, using)).await {
            Ok(entered) => {
                if let (Some(report), Some(r)) = (&self.resumes, &entered.resumed) {
                    *report.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.clone());
                }
                let (record, hold) = entered.into_parts();
                Ok(Target { id: record.sandbox.id.clone(), record: Some(record), hold })
            }
            Err(e) if e.body.code == ErrorCode::SandboxNotFound => {
                Ok(Target { id: key.to_string(), record: None, hold: None })
            }
            Err(e) => Err(e),
        }
    }

    /// The record of a sandbox a call entered (loaded only when the key named
    /// none of the caller's live sandboxes, which answers it: 404).
    async fn record_of<'t>(&self, target: &'t Target) -> EngineResult<Cow<'t, SandboxRecord>> {
        match &target.record {
            Some(r) => Ok(Cow::Borrowed(r)),
            None => Ok(Cow::Owned(self.run(async { crate::record::load(&self.st, &target.id) }).await?)),
        }
    }

    /// Refuses a tenant (403): `what` is for the operator only.
    fn operator_only(&self, what: &str) -> EngineResult<()> {
        if self.caller.is_operator() {
            return Ok(());
        }
        Err(EngineError::new(
            ErrorCode::Forbidden,
            format!("{what} is for the operator only (a tenant token cannot use it)"),
        ))
    }
}
