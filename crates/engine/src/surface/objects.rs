//! Templates, pipeline runs, approvals and images as a caller sees them.

use strata_api::{
    Approval, BuildEvent, BuildTemplateRequest, CreateTemplateRequest, Image, OutdatedEntry, PipelineCost,
    PipelineEvent, PipelineRun, RebuildTemplateRequest, RunPipelineRequest, Template, TemplateCheckReport,
    TemplatePolicyPatch,
};

use super::Engine;
use crate::caller::run_as;
use crate::error::EngineResult;
use crate::state::Shared;
use crate::{approvals, pipelines, templates};

/// A pipeline run's progress, subscribed before the call that returned it
/// could move the run: [`Progress::follow`] misses nothing.
pub struct Progress {
    st: Shared,
    run_id: String,
    rx: tokio::sync::broadcast::Receiver<PipelineEvent>,
}

impl Progress {
    /// The stages that have started, then every change, then `finished`.
    pub fn follow(self) -> tokio::sync::mpsc::Receiver<PipelineEvent> {
        pipelines::progress(&self.st, self.run_id, self.rx)
    }
}

impl Engine {
    // ---- templates ----

    /// Promotes a checkpoint (or a sandbox, checkpointed first) to a template.
    pub async fn create_template(&self, req: &CreateTemplateRequest) -> EngineResult<Template> {
        self.run(templates::create(&self.st, req.clone(), &self.caller.actor())).await
    }

    /// The templates the caller sees.
    pub async fn list_templates(&self) -> EngineResult<Vec<Template>> {
        self.run(async { templates::list(&self.st) }).await
    }

    /// Removes a template (its checkpoint stays until deleted or collected).
    pub async fn delete_template(&self, name: &str) -> EngineResult<()> {
        self.run(async { templates::delete(&self.st, name) }).await
    }

    /// Sets a template's checks at set times (`check_every`, `on_findings`).
    pub async fn set_template_policy(&self, name: &str, patch: TemplatePolicyPatch) -> EngineResult<Template> {
        self.run(async { templates::set_policy(&self.st, name, patch) }).await
    }

    /// Checks a template now, as its `check_every` would (its `on_findings` applies).
    pub async fn check_template(&self, name: &str) -> EngineResult<TemplateCheckReport> {
        self.run(crate::checks::check_template(&self.st, name, "requested")).await
    }

    /// Rebuilds a template from the build file it was made by (on a new base
    /// when the request names one), in the background, as [`Engine::build_template`];
    /// an unknown template (404) or one with no build file (409) fails before it starts.
    pub async fn rebuild_template(
        &self,
        name: &str,
        req: RebuildTemplateRequest,
    ) -> EngineResult<tokio::sync::mpsc::Receiver<BuildEvent>> {
        let build = self.run(async { templates::rebuild_request(&self.st, name, req) }).await?;
        Ok(self.build_template(build))
    }

    /// Builds a template from a build file in the background; its events come
    /// on the returned channel (a failure as the last one). The build makes
    /// sandboxes and checkpoints as the caller.
    pub fn build_template(&self, req: BuildTemplateRequest) -> tokio::sync::mpsc::Receiver<BuildEvent> {
        let (tx, rx) = tokio::sync::mpsc::channel::<BuildEvent>(64);
        let (st, actor) = (self.st.clone(), self.caller.actor());
        tokio::spawn(run_as(self.caller.clone(), async move {
            if let Err((index, e)) = templates::build(&st, req, &tx, &actor).await {
                let _ = tx.send(BuildEvent::Failed { index, error: e.body }).await;
            }
        }));
        rx
    }

    /// Builds a template from already parsed steps (the E2B template SDK's
    /// build), in the background, as [`Engine::build_template`] does.
    pub fn build_template_steps(
        &self,
        name: String,
        steps: Vec<(String, templates::Step)>,
        opts: templates::BuildOpts,
    ) -> tokio::sync::mpsc::Receiver<BuildEvent> {
        let (tx, rx) = tokio::sync::mpsc::channel::<BuildEvent>(64);
        let (st, actor) = (self.st.clone(), self.caller.actor());
        tokio::spawn(run_as(self.caller.clone(), async move {
            if let Err((index, e)) = templates::build_steps(&st, &name, steps, None, opts, &tx, &actor).await {
                let _ = tx.send(BuildEvent::Failed { index, error: e.body }).await;
            }
        }));
        rx
    }

    // ---- pipelines ----

    fn progress(&self, run_id: &str, rx: tokio::sync::broadcast::Receiver<PipelineEvent>) -> Progress {
        Progress { st: self.st.clone(), run_id: run_id.to_string(), rx }
    }

    /// Starts a pipeline run (a bad spec is a 400 naming the stage and field).
    pub async fn start_pipeline(&self, req: RunPipelineRequest) -> EngineResult<(PipelineRun, Progress)> {
        let spec = pipelines::parse_request(req)?;
        let rx = self.st.pipelines.events().subscribe();
        let run = self.run(pipelines::start(&self.st, spec)).await?;
        let progress = self.progress(&run.id, rx);
        Ok((run, progress))
    }

    /// The caller's pipeline runs, newest first.
    pub async fn list_pipelines(&self) -> EngineResult<Vec<PipelineRun>> {
        self.run(async { pipelines::list_runs(&self.st) }).await
    }

    /// A run's status, stage by stage.
    pub async fn get_pipeline(&self, key: &str) -> EngineResult<(PipelineRun, Progress)> {
        let rx = self.st.pipelines.events().subscribe();
        let run = self.run(async { pipelines::get_run(&self.st, key) }).await?;
        let progress = self.progress(&run.id, rx);
        Ok((run, progress))
    }

    /// Continues a failed or interrupted run from its first unfinished stage.
    pub async fn resume_pipeline(&self, key: &str) -> EngineResult<(PipelineRun, Progress)> {
        let rx = self.st.pipelines.events().subscribe();
        let run = self.run(pipelines::resume(&self.st, key)).await?;
        let progress = self.progress(&run.id, rx);
        Ok((run, progress))
    }

    /// Pauses a running run at its next stage boundary.
    pub async fn pause_pipeline(&self, key: &str) -> EngineResult<PipelineRun> {
        self.run(async { pipelines::pause(&self.st, key) }).await
    }

    /// A run's cost, per stage.
    pub async fn pipeline_cost(&self, key: &str) -> EngineResult<PipelineCost> {
        self.run(async { pipelines::cost(&self.st, key) }).await
    }

    // ---- approvals (deciding one is the operator's) ----

    /// Rule-of-Two approvals the caller sees, oldest first (`state` filters).
    pub async fn list_approvals(&self, state: Option<&str>) -> EngineResult<Vec<Approval>> {
        self.run(async { approvals::list(&self.st, state) }).await
    }

    /// One approval.
    pub async fn get_approval(&self, id: &str) -> EngineResult<Approval> {
        self.run(async { approvals::get(&self.st, id) }).await
    }

    // ---- images (shared, read-only for tenants; importing is the operator's) ----

    /// The images.
    pub async fn list_images(&self) -> EngineResult<Vec<Image>> {
        crate::images::list(&self.st)
    }

    /// One image.
    pub async fn get_image(&self, name: &str) -> EngineResult<Image> {
        crate::images::get(&self.st, name)
    }

    /// Every version of an image's name, newest first.
    pub async fn image_versions(&self, name: &str) -> EngineResult<Vec<Image>> {
        crate::images::versions(&self.st, name)
    }

    /// The caller's sandboxes, checkpoints and templates on an image version
    /// that is no longer its name's newest.
    pub async fn outdated(&self) -> EngineResult<Vec<OutdatedEntry>> {
        self.run(async { crate::patching::outdated(&self.st) }).await
    }
}
