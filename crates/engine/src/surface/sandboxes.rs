//! Sandboxes: create, inspect, the lifecycle transitions, leases, network,
//! previews, events, cost, scan and lineage.

use strata_api::{
    Accumulation, Advice, AdviseRequest, CheckReport, CostReport, CostSummary, CreatePreviewRequest,
    CreateSandboxRequest, CreatedPreview, CreatedSandbox, DaemonInfo, Lease, LeaseRequest, Lineage, NetworkInfo,
    NetworkSpec, Preview, QuarantineEntry, QuarantineRequest, RebaseReport, RebaseRequest, ResumeResult, Sandbox,
    SandboxEvent, ScanReport, StandbyRequest, UpdateSandboxRequest,
};

use super::Engine;
use crate::error::{EngineError, EngineResult};
use crate::{accounting, activity, events, lifecycle, network, preview, record};

/// Why a transition asked for through a front end happens, in its event.
const BY_USER: &str = "user";

impl Engine {
    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, req: &CreateSandboxRequest) -> EngineResult<CreatedSandbox> {
        let sb = self.run(lifecycle::create(&self.st, req.clone())).await?;
        Ok(CreatedSandbox { id: sb.id, name: sb.name })
    }

    /// The caller's sandboxes.
    pub async fn list_sandboxes(&self) -> EngineResult<Vec<Sandbox>> {
        self.run(async { record::list(&self.st) }).await
    }

    /// The full id of the sandbox `key` names for the caller (404 otherwise):
    /// a lookup only, none of what [`Engine::get_sandbox`] reads live.
    pub async fn sandbox_id(&self, key: &str) -> EngineResult<String> {
        self.run(async {
            crate::tenancy::resolve_sandbox_id(&self.st, key)?.ok_or_else(|| EngineError::sandbox_not_found(key))
        })
        .await
    }

    /// Inspects a sandbox.
    pub async fn get_sandbox(&self, key: &str) -> EngineResult<Sandbox> {
        self.run(async { record::inspect(&self.st, key) }).await
    }

    /// Destroys a sandbox.
    pub async fn remove_sandbox(&self, key: &str, force: bool) -> EngineResult<SandboxEvent> {
        self.run(lifecycle::destroy(&self.st, key, force, BY_USER)).await
    }

    /// Changes a sandbox's policy or labels (fields not given are kept).
    pub async fn update_sandbox(&self, key: &str, req: &UpdateSandboxRequest) -> EngineResult<Sandbox> {
        self.run(async { crate::policy::update(&self.st, key, req) }).await
    }

    /// Starts a stopped sandbox.
    pub async fn start_sandbox(&self, key: &str) -> EngineResult<Sandbox> {
        self.run(lifecycle::start(&self.st, key)).await
    }

    /// Stops a sandbox (processes killed, filesystem kept).
    pub async fn stop_sandbox(&self, key: &str) -> EngineResult<SandboxEvent> {
        self.run(lifecycle::stop(&self.st, key, BY_USER, lifecycle::STOP_GRACE)).await
    }

    /// Freezes a sandbox's processes (memory kept, no CPU).
    pub async fn pause_sandbox(&self, key: &str) -> EngineResult<SandboxEvent> {
        self.run(lifecycle::pause(&self.st, key)).await
    }

    /// Thaws a paused sandbox.
    pub async fn unpause_sandbox(&self, key: &str) -> EngineResult<SandboxEvent> {
        self.run(lifecycle::unpause(&self.st, key, BY_USER)).await
    }

    /// Puts a sandbox into standby (processes and memory to disk, or its filesystem only).
    pub async fn standby_sandbox(&self, key: &str, req: &StandbyRequest) -> EngineResult<SandboxEvent> {
        self.run(lifecycle::standby_with(&self.st, key, req, BY_USER)).await
    }

    /// Brings a parked sandbox back (resumes from standby, thaws, starts, unarchives).
    pub async fn resume_sandbox(&self, key: &str) -> EngineResult<ResumeResult> {
        self.resume_sandbox_with(key, &strata_api::ResumeRequest::default()).await
    }

    /// [`Self::resume_sandbox`] with options (`fs_only`: from standby, start
    /// afresh from the filesystem instead of restoring the processes).
    pub async fn resume_sandbox_with(&self, key: &str, req: &strata_api::ResumeRequest) -> EngineResult<ResumeResult> {
        self.run(lifecycle::resume_parked(&self.st, key, req, BY_USER)).await
    }

    /// Archives a stopped or standby sandbox into the object store.
    pub async fn archive_sandbox(&self, key: &str) -> EngineResult<SandboxEvent> {
        self.run(crate::lifecycle::archive(&self.st, key, BY_USER)).await
    }

    // ---- leases ----

    /// Takes a keep-alive lease: the sandbox is not idle while it is held.
    pub async fn create_lease(&self, key: &str, req: &LeaseRequest) -> EngineResult<Lease> {
        self.run(async { activity::create_lease(&self.st, key, req) }).await
    }

    /// The leases a sandbox holds.
    pub async fn list_leases(&self, key: &str) -> EngineResult<Vec<Lease>> {
        self.run(async { activity::list_leases(&self.st, key) }).await
    }

    /// Renews a lease of the sandbox.
    pub async fn renew_lease(&self, key: &str, lease: &str, req: &LeaseRequest) -> EngineResult<Lease> {
        self.run(async { activity::renew_lease(&self.st, key, lease, req) }).await
    }

    /// Releases a lease of the sandbox (a lease of another sandbox is a 404 and stays held).
    pub async fn release_lease(&self, key: &str, lease: &str) -> EngineResult<()> {
        self.run(async { activity::release_lease(&self.st, key, lease) }).await
    }

    // ---- network and previews ----

    /// A sandbox's network: mode, rules, address, counters, recent denials.
    pub async fn network(&self, key: &str) -> EngineResult<NetworkInfo> {
        self.run(async {
            let rec = record::load(&self.st, key)?;
            network::info(&self.st, &rec.sandbox.id).await
        })
        .await
    }

    /// Replaces a sandbox's network mode and rules.
    pub async fn set_network(&self, key: &str, spec: &NetworkSpec) -> EngineResult<NetworkInfo> {
        self.run(network::update(&self.st, key, spec.clone())).await
    }

    /// Makes a preview of a sandbox's port.
    pub async fn create_preview(&self, key: &str, req: &CreatePreviewRequest) -> EngineResult<CreatedPreview> {
        self.run(async { preview::create(&self.st, key, req) }).await
    }

    /// A sandbox's previews (revoked and expired ones too with `all`).
    pub async fn list_previews(&self, key: &str, all: bool) -> EngineResult<Vec<Preview>> {
        self.run(async { preview::list(&self.st, key, all) }).await
    }

    /// Revokes a preview of the sandbox.
    pub async fn revoke_preview(&self, key: &str, preview: &str) -> EngineResult<Preview> {
        self.run(async { preview::revoke(&self.st, key, preview) }).await
    }

    // ---- what happened, what it cost, what it holds ----

    /// Lifecycle events after `after` (of the sandbox `sandbox` names, when given).
    pub async fn events(&self, sandbox: Option<&str>, after: i64) -> EngineResult<Vec<SandboxEvent>> {
        self.run(async { events::list(&self.st, sandbox, after) }).await
    }

    /// [`Engine::events`], then each new one as it happens.
    pub async fn follow_events(
        &self,
        sandbox: Option<&str>,
        after: i64,
    ) -> EngineResult<tokio::sync::mpsc::Receiver<SandboxEvent>> {
        self.run(async { events::follow(&self.st, sandbox, after) }).await
    }

    /// The cost report of a sandbox (destroyed ones too).
    pub async fn cost(&self, key: &str) -> EngineResult<CostReport> {
        self.run(accounting::report_for(&self.st, key)).await
    }

    /// The sandbox's recent metric points within `[start, end]` (seconds since
    /// the epoch): one per accounting interval over the last hour, plus one
    /// taken now when it runs and `end` is not in the past.
    pub async fn metrics_history(&self, key: &str, start: u64, end: u64) -> EngineResult<Vec<accounting::MetricPoint>> {
        self.run(async {
            let s = record::inspect(&self.st, key)?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
            if s.state == strata_api::SandboxState::Running && end >= now {
                accounting::sample(&self.st, &s.id);
            }
            Ok(self.st.accounting.history(&s.id, start, end))
        })
        .await
    }

    /// The cost of every sandbox of the caller's, with totals.
    pub async fn cost_summary(&self) -> EngineResult<CostSummary> {
        self.run(accounting::summary(&self.st)).await
    }

    /// The last sampled CPU, memory and disk figures of every running or
    /// paused sandbox the caller sees (none yet for one started less than an
    /// interval ago).
    pub async fn live_stats(&self) -> EngineResult<Vec<strata_api::SandboxStats>> {
        self.run(async { accounting::live_stats(&self.st) }).await
    }

    /// The state-hygiene scan of a sandbox or a checkpoint.
    pub async fn scan(&self, key: &str) -> EngineResult<ScanReport> {
        self.run(crate::scan::scan(&self.st, key)).await
    }

    /// Checks a sandbox now, as its `check_every` would (its `on_findings`
    /// applies; a parked sandbox is checked without being resumed).
    pub async fn check_sandbox(&self, key: &str) -> EngineResult<CheckReport> {
        let id = self.sandbox_id(key).await?;
        self.run(crate::checks::check(&self.st, &id, "requested")).await
    }

    /// What a sandbox has accumulated (its writable layer is walked; a parked
    /// sandbox is not resumed).
    pub async fn accumulation(&self, key: &str) -> EngineResult<Accumulation> {
        let id = self.sandbox_id(key).await?;
        let rec = self.st.db.sandbox_by_id(&id)?.ok_or_else(|| EngineError::sandbox_not_found(key))?;
        let st = self.st.clone();
        tokio::task::spawn_blocking(move || crate::accumulation::measure(&st, &rec))
            .await
            .map_err(|e| EngineError::internal("measure task", &e))?
    }

    /// Moves a stopped or standby sandbox onto another image version, keeping
    /// its writable layer (its processes start again).
    pub async fn rebase(&self, key: &str, req: &RebaseRequest) -> EngineResult<RebaseReport> {
        let id = self.sandbox_id(key).await?;
        self.run(crate::patching::rebase(&self.st, &id, req.clone())).await
    }

    /// Quarantines a sandbox or a checkpoint.
    pub async fn quarantine(&self, key: &str, req: &QuarantineRequest) -> EngineResult<QuarantineEntry> {
        let by = self.caller.actor();
        self.run(crate::checks::place(&self.st, key, &req.reason, &by)).await
    }

    /// Lifts the quarantine of a sandbox or a checkpoint: the operator's, with a reason.
    pub async fn lift_quarantine(&self, key: &str, req: &QuarantineRequest) -> EngineResult<QuarantineEntry> {
        self.operator_only("lifting a quarantine")?;
        let by = self.caller.actor();
        self.run(crate::checks::lift(&self.st, key, &req.reason, &by)).await
    }

    /// The quarantined sandboxes and checkpoints the caller sees.
    pub async fn quarantined(&self) -> EngineResult<Vec<QuarantineEntry>> {
        self.run(async { crate::checks::list(&self.st) }).await
    }

    /// The tree of images, sandboxes, checkpoints and templates around a sandbox or checkpoint.
    pub async fn lineage(&self, key: &str) -> EngineResult<Lineage> {
        self.run(async { crate::checkpoints::lineage(&self.st, key) }).await
    }

    /// The daemon's version and counts (of what the caller sees).
    pub async fn info(&self) -> EngineResult<DaemonInfo> {
        self.run(async { events::info(&self.st) }).await
    }

    /// The lifecycle the advisor recommends for a stage, priced.
    pub async fn advise(&self, req: &AdviseRequest) -> EngineResult<Advice> {
        let mut advice = strata_core::advisor::advise(&crate::advisor::profile(req)?, &self.st.prices);
        if let Some(why) = self.st.tiers.why_not(advice.isolation) {
            advice.warnings.push(format!(
                "the recommended isolation {} cannot run on this daemon ({why}): ask the operator for it, or run the stage on the namespace tier knowing it shares the host's kernel",
                advice.isolation
            ));
        } else if advice.recommendation == strata_api::Strategy::StandbyBetweenTurns {
            if let Some(why) = self.st.runtime_for(advice.isolation).process_dump_unsupported() {
                advice.warnings.push(format!(
                    "standby between turns keeps processes, which isolation {} cannot do on this daemon ({why}): `standby --fs-only` keeps the files only",
                    advice.isolation
                ));
            }
        }
        Ok(advice)
    }
}
