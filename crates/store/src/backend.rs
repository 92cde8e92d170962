//! Which engine holds the metadata, and a connection or transaction of either
//! behind [`Sql`]: SQLite (one connection behind a mutex) or PostgreSQL (its
//! client thread, see [`crate::postgres`]).

use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use crate::db::DbError;
use crate::postgres::{PgConn, PgTransaction, Postgres};
use crate::sql::{Row, Sql, Value};

/// The engine of a [`crate::Db`].
pub(crate) enum Backend {
    /// An embedded SQLite file.
    Sqlite(Mutex<Connection>),
    /// A PostgreSQL server.
    Postgres(Postgres),
}

impl Backend {
    /// The connection, held until the guard is dropped.
    pub(crate) fn conn(&self) -> Conn<'_> {
        match self {
            Backend::Sqlite(c) => Conn::Sqlite(c.lock().unwrap_or_else(|p| p.into_inner())),
            Backend::Postgres(p) => Conn::Postgres(p.conn()),
        }
    }
}

/// A connection of either engine; each statement commits on its own.
pub(crate) enum Conn<'a> {
    Sqlite(MutexGuard<'a, Connection>),
    Postgres(PgConn<'a>),
}

impl Conn<'_> {
    /// Opens a transaction: rolled back unless [`Tx::commit`] is called. On
    /// PostgreSQL it holds the write lock (see [`crate::postgres::WRITE_LOCK`]).
    pub(crate) fn transaction(&mut self) -> Result<Tx<'_>, DbError> {
        Ok(match self {
            Conn::Sqlite(c) => Tx::Sqlite(c.transaction()?),
            Conn::Postgres(c) => Tx::Postgres(c.transaction()?),
        })
    }
}

/// A transaction of either engine.
pub(crate) enum Tx<'a> {
    Sqlite(rusqlite::Transaction<'a>),
    Postgres(PgTransaction<'a>),
}

impl Tx<'_> {
    /// Commits it.
    pub(crate) fn commit(self) -> Result<(), DbError> {
        match self {
            Tx::Sqlite(t) => Ok(t.commit()?),
            Tx::Postgres(t) => t.commit(),
        }
    }
}

macro_rules! dispatch {
    ($ty:ident) => {
        impl Sql for $ty<'_> {
            fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, DbError> {
                match self {
                    $ty::Sqlite(c) => Sql::execute(&**c, sql, args),
                    $ty::Postgres(c) => c.execute(sql, args),
                }
            }

            fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
                match self {
                    $ty::Sqlite(c) => Sql::query(&**c, sql, args),
                    $ty::Postgres(c) => c.query(sql, args),
                }
            }

            fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
                match self {
                    $ty::Sqlite(c) => Sql::execute_batch(&**c, sql),
                    $ty::Postgres(c) => c.execute_batch(sql),
                }
            }
        }
    };
}
dispatch!(Conn);
dispatch!(Tx);
