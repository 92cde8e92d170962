//! Durable state of the strata daemon.
//!
//! * [`db`]: the metadata (images, sandboxes, events ...), transactional, with
//!   schema migrations, on SQLite (the embedded default) or PostgreSQL.
//! * [`sql`]: the SQL interface both engines are driven through; [`postgres`]:
//!   the PostgreSQL client thread.
//! * [`layers`]: the content-addressed layer store (`layers/sha256/<hex>/fs`).
//! * [`fsutil`]: atomic file writes (temp + fsync + rename + fsync of the directory).
//! * [`testing`]: a private PostgreSQL server for tests.

mod backend;
pub mod db;
pub mod fsutil;
pub mod layers;
pub mod postgres;
pub mod sql;
pub mod testing;

pub use db::{Db, DbError};
pub use layers::{LayerStore, LayerStoreError, UnpackPolicy};
