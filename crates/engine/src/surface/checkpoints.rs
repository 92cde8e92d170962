//! Checkpoints: take, list, inspect, delete, fork, restore, diff, export, fan-out.

use strata_api::{
    Checkpoint, CheckpointRequest, FanoutRequest, FanoutResult, FileChange, ForkRequest, ForkResult, RestoreRequest,
    RestoreResult,
};

use super::{holding, Engine};
use crate::access::Use;
use crate::checkpoints;
use crate::error::EngineResult;
use crate::transfer::ByteStream;

impl Engine {
    /// Checkpoints a sandbox (a running one is frozen briefly).
    pub async fn checkpoint(&self, key: &str, req: &CheckpointRequest) -> EngineResult<Checkpoint> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(checkpoints::checkpoint(&self.st, &sb.id, req.clone())).await
    }

    /// The caller's checkpoints (of one sandbox when `sandbox` names one).
    pub async fn list_checkpoints(&self, sandbox: Option<&str>) -> EngineResult<Vec<Checkpoint>> {
        self.run(async { checkpoints::list(&self.st, sandbox) }).await
    }

    /// Inspects a checkpoint.
    pub async fn get_checkpoint(&self, key: &str) -> EngineResult<Checkpoint> {
        self.run(async { checkpoints::get(&self.st, key) }).await
    }

    /// Deletes a checkpoint (409 naming what still builds on it).
    pub async fn delete_checkpoint(&self, key: &str) -> EngineResult<()> {
        self.run(checkpoints::delete(&self.st, key)).await
    }

    /// Deletes a checkpoint, or when something still builds on it retires it
    /// (gone as a source, its bytes freed once nothing needs it); says which,
    /// and what keeps it.
    pub async fn retire_checkpoint(&self, key: &str) -> EngineResult<strata_api::CheckpointDeleted> {
        self.run(checkpoints::retire(&self.st, key)).await
    }

    /// Forks sandboxes from a checkpoint or a live sandbox.
    pub async fn fork(&self, req: &ForkRequest) -> EngineResult<ForkResult> {
        self.run(checkpoints::fork(&self.st, req.clone())).await
    }

    /// Forks one child per attempt, runs the attempts and selects a winner.
    pub async fn fanout(&self, req: &FanoutRequest) -> EngineResult<FanoutResult> {
        self.run(crate::fanout::fanout(&self.st, req.clone())).await
    }

    /// Rolls a sandbox back to a checkpoint.
    pub async fn restore(&self, key: &str, req: &RestoreRequest) -> EngineResult<RestoreResult> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(checkpoints::restore(&self.st, &sb.id, req.clone())).await
    }

    /// Paths added, modified and deleted since the last checkpoint (or since `against`).
    pub async fn diff(&self, key: &str, against: Option<&str>) -> EngineResult<Vec<FileChange>> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(checkpoints::diff(&self.st, &sb.id, against)).await
    }

    /// The same change set as an OCI layer tar, streamed.
    pub async fn export(&self, key: &str, against: Option<&str>) -> EngineResult<ByteStream> {
        let sb = self.enter(key, Use::Contents).await?;
        let stream = self.run(checkpoints::export(&self.st, &sb.id, against)).await?;
        Ok(holding(stream, sb.hold))
    }
}
