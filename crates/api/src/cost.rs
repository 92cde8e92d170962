//! Cost accounting: per-sandbox usage accumulators, prices and priced reports.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::SandboxState;

/// Storage kinds that accrue GB-hours.
pub const STORAGE_KINDS: [&str; 5] = ["writable", "checkpoint", "template", "standby", "archive"];

/// Compute consumed while running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ComputeUsage {
    /// Wall-clock seconds with processes (running or paused).
    pub running_seconds: f64,
    /// CPU-seconds (from the cgroup's cumulative CPU counter).
    pub cpu_seconds: f64,
    /// Memory GB-seconds (memory samples integrated over time, 1 GB = 10^9 bytes).
    pub memory_gb_seconds: f64,
}

impl ComputeUsage {
    /// Component-wise sum.
    pub fn plus(self, o: ComputeUsage) -> ComputeUsage {
        ComputeUsage {
            running_seconds: self.running_seconds + o.running_seconds,
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            memory_gb_seconds: self.memory_gb_seconds + o.memory_gb_seconds,
        }
    }
}

/// The accumulators of one sandbox, kept after it is destroyed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct UsageRecord {
    /// Sandbox id.
    pub sandbox_id: String,
    /// The tenant that owned the sandbox.
    pub tenant: String,
    /// Sandbox name.
    pub name: String,
    /// Image, template or checkpoint it was created from.
    pub source: String,
    /// The checkpoint it started from (templates and forks), if any.
    pub base_checkpoint: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, once destroyed.
    pub destroyed_at: Option<String>,
    /// Compute while running.
    pub compute: ComputeUsage,
    /// Highest memory sample, bytes.
    pub peak_memory_bytes: u64,
    /// Last memory sample while running, bytes.
    pub last_memory_bytes: u64,
    /// GB-hours by storage kind (`writable`, `checkpoint`, `template`, `standby`, `archive`).
    pub storage_gb_hours: BTreeMap<String, f64>,
    /// Compute that produced the checkpoint it started from (its lineage), 0 for an image.
    pub inherited_setup: ComputeUsage,
    /// Setup compute an ephemeral-only platform would have repeated: the
    /// inherited setup at creation from a checkpoint/template, and everything
    /// accumulated so far at every start/resume of kept state.
    pub repaid_setup: ComputeUsage,
    /// How many times kept state was reused (create from checkpoint/template, start, resume).
    pub reuses: u32,
    /// RFC 3339 time of the last update.
    pub updated_at: String,
}

/// Storage prices per GB-hour, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct StoragePrices {
    /// A sandbox's private writable layer.
    pub writable: f64,
    /// Checkpoint layers.
    pub checkpoint: f64,
    /// Checkpoint layers promoted to templates.
    pub template: f64,
    /// Standby images (process memory dumps).
    pub standby: f64,
    /// Archived objects.
    pub archive: f64,
}

/// Block storage, modelled on AWS EBS gp3 ($0.08 per GB-month, 730 h/month);
/// archives on S3 Standard ($0.023 per GB-month).
impl Default for StoragePrices {
    fn default() -> Self {
        let block = 0.08 / 730.0;
        StoragePrices { writable: block, checkpoint: block, template: block, standby: block, archive: 0.023 / 730.0 }
    }
}

impl StoragePrices {
    /// Price of `kind` (0 for an unknown kind).
    pub fn of(&self, kind: &str) -> f64 {
        match kind {
            "writable" => self.writable,
            "checkpoint" => self.checkpoint,
            "template" => self.template,
            "standby" => self.standby,
            "archive" => self.archive,
            _ => 0.0,
        }
    }
}

/// Prices (`strata daemon --prices FILE`, JSON; missing fields keep their default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Prices {
    /// Currency label.
    pub currency: String,
    /// Per CPU-second. Default: AWS Fargate Linux/x86 us-east-1, $0.04048 per vCPU-hour.
    pub cpu_second: f64,
    /// Per GB-second of memory. Default: AWS Fargate, $0.004445 per GB-hour.
    pub memory_gb_second: f64,
    /// Per GB-hour of storage, by kind.
    pub storage_gb_hour: StoragePrices,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            currency: "USD".into(),
            cpu_second: 0.04048 / 3600.0,
            memory_gb_second: 0.004445 / 3600.0,
            storage_gb_hour: StoragePrices::default(),
        }
    }
}

/// Priced compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ComputeCost {
    /// CPU.
    pub cpu: f64,
    /// Memory.
    pub memory: f64,
    /// cpu + memory.
    pub total: f64,
}

/// A priced what-if for the same sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Counterfactual {
    /// Compute it would have paid.
    pub compute: ComputeCost,
    /// Storage it would have paid.
    pub storage: f64,
    /// compute + storage.
    pub total: f64,
    /// Extra wall-clock seconds it would have spent (setup repeated), or 0.
    pub extra_seconds: f64,
    /// How this figure is computed.
    pub method: String,
}

/// The cost of one sandbox (`GET /v1/cost/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostReport {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Sandbox name.
    pub name: String,
    /// Current state (`destroyed` once gone).
    pub state: SandboxState,
    /// Seconds from creation to destruction (or now).
    pub lifetime_seconds: f64,
    /// The raw accumulators.
    pub usage: UsageRecord,
    /// Compute while running.
    pub compute: ComputeCost,
    /// Storage cost by kind.
    pub storage: BTreeMap<String, f64>,
    /// Sum of storage.
    pub storage_total: f64,
    /// compute + storage.
    pub total: f64,
    /// Nothing kept between stages: storage is 0, every reuse of kept state repays its setup compute.
    pub ephemeral_only: Counterfactual,
    /// Never released: compute charged for the whole lifetime.
    pub always_on: Counterfactual,
    /// The prices used.
    pub prices: Prices,
}

/// Every sandbox's cost (`GET /v1/cost`), destroyed ones included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostSummary {
    /// Per sandbox, oldest first.
    pub sandboxes: Vec<CostReport>,
    /// Sum of actual totals.
    pub total: f64,
    /// Sum of ephemeral-only totals.
    pub ephemeral_only_total: f64,
    /// Sum of always-on totals.
    pub always_on_total: f64,
    /// The prices used.
    pub prices: Prices,
}

/// Live resource figures of one sandbox with processes (`GET /v1/stats`), as
/// last sampled from its cgroup (every 5 s by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxStats {
    /// Sandbox id.
    pub sandbox_id: String,
    /// When it was sampled, seconds since the Unix epoch.
    pub unix_secs: u64,
    /// CPU used over the last interval, in percent of one core.
    pub cpu_core_pct: f64,
    /// Memory charged to its cgroup, bytes.
    pub memory_bytes: u64,
    /// Its memory limit, bytes (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Bytes of its writable layer (re-measured every minute by default).
    pub disk_bytes: u64,
    /// Its disk size, bytes (absent: no disk limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit_bytes: Option<u64>,
}
