//! The lifecycle advisor behind `POST /v1/advise` (crates/core/src/advisor.rs) priced
//! with this daemon's price table.

use strata_api::AdviseRequest;
use strata_core::advisor::StageProfile;
use strata_core::units;

use crate::error::{EngineError, EngineResult};

/// The stage in numbers; a bad field is a 400 naming it.
pub fn profile(req: &AdviseRequest) -> EngineResult<StageProfile> {
    let d = StageProfile::default();
    let secs = |field: &str, v: &Option<String>, default: f64| -> EngineResult<f64> {
        match v {
            None => Ok(default),
            Some(s) => units::parse_duration(s)
                .map(|d| d.as_secs_f64())
                .map_err(|e| EngineError::bad_request(format!("{field}: {e}"))),
        }
    };
    let gb = |field: &str, v: &Option<String>, default: f64| -> EngineResult<f64> {
        match v {
            None => Ok(default),
            Some(s) => units::parse_size(s)
                .map(|b| b as f64 / 1e9)
                .map_err(|e| EngineError::bad_request(format!("{field}: {e}"))),
        }
    };
    let turns = req.turns.unwrap_or(1);
    if turns == 0 || turns > 1_000_000 {
        return Err(EngineError::bad_request(format!("turns: {turns} is out of range (1 to 1000000)")));
    }
    let fan_out = req.fan_out.unwrap_or(0);
    if fan_out > 64 {
        return Err(EngineError::bad_request(format!("fan_out: {fan_out} is more than a fork can make (64)")));
    }
    let cpus = req.cpus.unwrap_or(d.cpus);
    if !(cpus > 0.0 && cpus <= 1024.0) {
        return Err(EngineError::bad_request(format!("cpus: {cpus} is out of range (0 < cpus <= 1024)")));
    }
    let mut keep = req.keep.clone();
    keep.sort();
    keep.dedup();
    Ok(StageProfile {
        keep,
        setup_seconds: secs("setup", &req.setup, d.setup_seconds)?,
        turns,
        turn_seconds: secs("turn", &req.turn, d.turn_seconds)?,
        idle_seconds: secs("idle", &req.idle, d.idle_seconds)?,
        untrusted_input: req.untrusted_input,
        fan_out,
        cpus,
        memory_gb: gb("memory", &req.memory, d.memory_gb)?,
        disk_gb: gb("disk", &req.disk, d.disk_gb)?,
    })
}
