//! The isolation tiers this daemon can run and the default one
//! (`strata daemon --default-isolation`). A create names a tier or gets the
//! default; a tier that cannot run here is refused with why (501), never
//! replaced by another one.

use std::collections::BTreeMap;

use strata_api::{ErrorCode, Isolation};

use crate::error::{EngineError, EngineResult};

/// Which tiers run here, and the default.
#[derive(Debug, Clone)]
pub struct Tiers {
    default: Isolation,
    /// Why each tier that cannot run here cannot.
    unavailable: BTreeMap<Isolation, String>,
}

impl Default for Tiers {
    /// The namespace tier only (what a daemon without a probe, e.g. in unit tests, runs).
    fn default() -> Self {
        let why = "not probed on this daemon".to_string();
        Tiers {
            default: Isolation::Namespace,
            unavailable: BTreeMap::from([(Isolation::Gvisor, why.clone()), (Isolation::Microvm, why)]),
        }
    }
}

impl Tiers {
    /// Tiers with `unavailable` (each with why) and `default`, which must be available.
    pub fn new(default: Isolation, unavailable: BTreeMap<Isolation, String>) -> Result<Tiers, String> {
        if let Some(why) = unavailable.get(&default) {
            return Err(format!("default isolation {default}: {why}"));
        }
        Ok(Tiers { default, unavailable })
    }

    /// The default tier.
    pub fn default_tier(&self) -> Isolation {
        self.default
    }

    /// Why `tier` cannot run here (`None`: it can).
    pub fn why_not(&self, tier: Isolation) -> Option<&str> {
        self.unavailable.get(&tier).map(String::as_str)
    }

    /// The tier a create gets: the one it asked for, or the default; 501
    /// naming what is missing when that tier cannot run here.
    pub fn resolve(&self, requested: Option<Isolation>) -> EngineResult<Isolation> {
        let tier = requested.unwrap_or(self.default);
        match self.why_not(tier) {
            None => Ok(tier),
            Some(why) => Err(EngineError::new(ErrorCode::Unsupported, format!("isolation {tier}: {why}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_that_cannot_run_is_refused_with_why_and_never_replaced() {
        let t = Tiers::default();
        assert_eq!(t.resolve(None).unwrap(), Isolation::Namespace);
        assert_eq!(t.resolve(Some(Isolation::Namespace)).unwrap(), Isolation::Namespace);
        let e = t.resolve(Some(Isolation::Gvisor)).unwrap_err();
        assert_eq!(e.body.code, ErrorCode::Unsupported);
        assert!(e.body.message.starts_with("isolation gvisor: "), "{}", e.body.message);
        let why = BTreeMap::from([(Isolation::Gvisor, "runsc not installed".to_string())]);
        let err = Tiers::new(Isolation::Gvisor, why.clone()).unwrap_err();
        assert_eq!(err, "default isolation gvisor: runsc not installed");
        assert_eq!(Tiers::new(Isolation::Namespace, why).unwrap().default_tier(), Isolation::Namespace);
    }
}
