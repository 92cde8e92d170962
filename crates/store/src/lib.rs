//! Durable state of the strata daemon.
//!
//! * [`db`]: SQLite metadata (images, sandboxes, events), transactional, with
//!   schema migrations keyed on `PRAGMA user_version`.
//! * [`layers`]: the content-addressed layer store (`layers/sha256/<hex>/fs`).
//! * [`fsutil`]: atomic file writes (temp + fsync + rename + fsync of the directory).

pub mod db;
pub mod fsutil;
pub mod layers;

pub use db::{Db, DbError};
pub use layers::{LayerStore, LayerStoreError, UnpackPolicy};
