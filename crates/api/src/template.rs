//! Templates (warm images) and template builds.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ApiErrorBody, StreamKind};

/// A template: a checkpoint promoted to a named starting point.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Template {
    /// Unique name; `strata create NAME` starts from it.
    pub name: String,
    /// The tenant that owns it (that of its checkpoint).
    #[serde(default = "crate::tenant::default_tenant")]
    pub tenant: String,
    /// The checkpoint it points at.
    pub checkpoint: String,
    /// The image at the bottom of its chain.
    pub image: String,
    /// Number of layers in its chain.
    pub layers: usize,
    /// The tier its sandboxes run on unless a create names another (its
    /// checkpoint's: the tier of the sandbox it was made from).
    #[serde(default)]
    pub isolation: crate::Isolation,
    /// RFC 3339 time.
    pub created_at: String,
    /// The `FROM` of the build file it was built from (`None`: promoted from
    /// a checkpoint); such a template can be rebuilt on a new base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_from: Option<String>,
    /// Set when the template was promoted although its state-hygiene scan had findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_findings: Option<crate::FindingsAcceptance>,
    /// How often it is checked (`None`: not at set times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_every: Option<String>,
    /// What a check with findings leads to (`record` or `quarantine`).
    #[serde(default)]
    pub on_findings: crate::OnFindings,
    /// The last check, scheduled or requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check: Option<Box<TemplateCheckReport>>,
}

/// Request body of `PATCH /v1/templates/{name}`: its checks at set times.
/// Fields left out are kept; `check_every: "none"` stops them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplatePolicyPatch {
    /// Interval, e.g. `24h` (at least [`crate::MIN_CHECK_EVERY`]), or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_every: Option<String>,
    /// `record` or `quarantine` (a template has no processes to stop or layer to flush).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_findings: Option<crate::OnFindings>,
}

/// A check of a template (`POST /v1/templates/{name}/check`, or at set
/// times): the state-hygiene scan of its checkpoint under today's rules, and
/// whether its image has a newer version.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TemplateCheckReport {
    /// The template.
    pub template: String,
    /// The checkpoint it pointed at when checked.
    pub checkpoint: String,
    /// RFC 3339 time of the check.
    pub time: String,
    /// `scheduled` or `requested`.
    pub trigger: String,
    /// Paths its layers add, change or delete above its image.
    pub changed_paths: u64,
    /// The scan's findings, then `image.outdated` when its image has a newer version.
    pub findings: Vec<crate::Finding>,
    /// Its image version (`name@version`), while registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The newest version of that name, when it is another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_image: Option<String>,
    /// What followed the findings (`none` when there were none).
    pub action: String,
    /// How long the check took.
    pub duration_ms: u64,
}

/// Request body of `POST /v1/templates`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreateTemplateRequest {
    /// Template name.
    pub name: String,
    /// A checkpoint, or a sandbox (checkpointed first).
    pub from: String,
    /// Re-point an existing template of that name.
    #[serde(default)]
    pub replace: bool,
    /// Promote even if the state-hygiene scan has findings (the acceptance is recorded on the template).
    #[serde(default)]
    pub accept_findings: bool,
}

/// Request body of `POST /v1/templates/build`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BuildTemplateRequest {
    /// Template name.
    pub name: String,
    /// The build file (a Dockerfile subset: FROM, RUN, COPY, ENV, WORKDIR, USER).
    pub file: String,
    /// Directory on the daemon's host that COPY sources are relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Ignore the step cache.
    #[serde(default)]
    pub no_cache: bool,
    /// Register the template even if the scan of its final state has findings
    /// (changes to system paths never block a build); recorded on the template.
    #[serde(default)]
    pub accept_findings: bool,
    /// A command started (in the background, as the build's user, in its
    /// working directory) once the steps are done: the template is then a warm
    /// checkpoint taken when `ready_cmd` succeeds, and its sandboxes start with
    /// the command running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    /// Polled every 2 s (for at most 5 minutes) until it exits 0; without one
    /// the start command is given 20 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
}

/// Request body of `POST /v1/templates/{name}/rebuild`: the template's build
/// file run again, on another base if `base` names one. Steps whose inputs
/// are unchanged (the base included) come from the step cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct RebuildTemplateRequest {
    /// The image (or template, or checkpoint) its `FROM` becomes; without it,
    /// the same `FROM` (an image name means that name's newest version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Ignore the step cache.
    #[serde(default)]
    pub no_cache: bool,
    /// Register the template even if the scan of its final state has findings.
    #[serde(default)]
    pub accept_findings: bool,
}

/// One line of the NDJSON stream of `POST /v1/templates/build`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BuildEvent {
    /// A step begins (or is taken from the cache).
    Step {
        /// 1-based step number.
        index: usize,
        /// Number of steps.
        count: usize,
        /// The instruction.
        instruction: String,
        /// Served from the cache (nothing runs).
        cached: bool,
    },
    /// Output of a RUN step.
    Output {
        /// Stream.
        stream: StreamKind,
        /// Bytes, base64.
        data_b64: String,
    },
    /// A step finished and was sealed as a checkpoint.
    StepDone {
        /// 1-based step number.
        index: usize,
        /// The step's checkpoint (its cache entry).
        checkpoint: String,
        /// Milliseconds.
        duration_ms: u64,
    },
    /// The build finished.
    Done {
        /// The template.
        template: Template,
        /// Steps that ran.
        steps_run: usize,
        /// Steps served from the cache.
        steps_cached: usize,
        /// Milliseconds.
        duration_ms: u64,
    },
    /// The build failed; earlier steps stay cached.
    Failed {
        /// 1-based step number (0 before any step).
        index: usize,
        /// The error.
        error: ApiErrorBody,
    },
}
