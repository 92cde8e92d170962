//! Events and host facts the engine checks itself: names left from before
//! names that read as ids were refused ([`names_like_ids`]). Listing and
//! following events, `/v1/info` and `/v1/doctor` are the server's routes.

use crate::error::EngineResult;
use crate::state::Shared;

/// Names in the metadata that could be read as ids (from before such names
/// were refused), each logged as a warning: they still resolve, by id first,
/// but one can win over another object's id *prefix* for whoever sees both.
pub fn names_like_ids(st: &Shared) -> EngineResult<Vec<strata_api::NameLikeId>> {
    let found = st.db.names_like_ids()?;
    for n in &found {
        tracing::warn!(kind = %n.kind, id = %n.id, name = %n.name, tenant = n.tenant.as_deref().unwrap_or("-"), "a name that could be read as an id (made before such names were refused); it resolves by id first, but use ids for it");
    }
    Ok(found)
}
