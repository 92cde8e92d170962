//! The lifecycle operations of a sandbox, one file each (youki keeps one file
//! per container operation): [`create`](mod@create) (and its [`adopt`]ion of a warm-pool sandbox), [`start`](mod@start),
//! [`stop`](mod@stop), [`destroy`](mod@destroy), [`pause`](mod@pause) (and
//! unpause), [`standby`](mod@standby), [`resume`](mod@resume),
//! [`ensure_running`](mod@ensure_running) (resume on access),
//! [`archive`](mod@archive) and [`unarchive`](mod@unarchive) (to and from the archive store, [`crate::archive`]), and the daemon's
//! own: [`reconcile`](mod@reconcile) at start and the init [`watch`]er (the TTL reaper, which
//! also collects garbage, is [`crate::reaper`], above the operations). Warm starts from a checkpoint that kept its processes: [`warm`] (a
//! create or start that restores them instead of booting init). What several of them share: [`boot`] (disk, mount spec,
//! admission, the boot); below them, [`crate::process_image`] (CRIU images
//! with their manifest).
//!
//! Every state change is made with [`crate::record::transition`], which asks
//! the core state machine (`strata_core::lifecycle`) whether it is legal and
//! records it with its event in one transaction. Records are read through
//! [`crate::record`], the layer below this one, which calls no operation.

pub mod adopt;
pub mod archive;
pub mod boot;
pub mod create;
pub mod destroy;
pub mod ensure_running;
pub mod pause;
pub mod reconcile;
pub mod resume;
pub mod standby;
pub mod start;
pub mod stop;
pub mod unarchive;
pub mod warm;
pub mod watch;

pub use archive::*;
pub use boot::*;
pub use create::*;
pub use destroy::*;
pub use ensure_running::*;
pub use pause::*;
pub use reconcile::*;
pub use resume::*;
pub use standby::*;
pub use start::*;
pub use stop::*;
pub use unarchive::*;
pub use watch::*;
