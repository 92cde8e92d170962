//! PostgreSQL as the metadata engine (`strata daemon --database postgres://...`).
//!
//! The store's API is synchronous and is called from the daemon's async tasks.
//! The `postgres` crate's client is synchronous too, but drives its connection
//! on a runtime of its own, which must not be entered from inside another
//! one. So one thread owns the client and runs the statements it is sent
//! ([`Job`]); a caller holds the link for a whole transaction, so the
//! statements of two transactions never interleave on the connection (as with
//! SQLite's single connection behind a mutex).
//!
//! Write transactions take one transaction-scoped advisory lock
//! ([`WRITE_LOCK`]) first: the writers of every daemon on the database are
//! serialized exactly as SQLite serializes them, so a read-modify-write (the
//! audit chain, the lowest free user-namespace range, a usage record) sees
//! the last committed state, and a compare-and-set transition commits on one
//! side only. Reads take no lock.
//!
//! A lost connection is [`DbError::Unavailable`] (the API answers 503 with the
//! reason); the next statement outside a transaction connects again. A
//! transaction cut by a lost connection is rolled back by the server: nothing
//! of it is written.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::BytesMut;
use postgres::error::SqlState;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use postgres::{Client, Config, NoTls, Statement};

use strata_core::errors::chain;

use crate::db::DbError;
use crate::sql::{numbered_dollars, Row, Sql, Value};

/// The key of the advisory lock every write transaction takes ("strata" in ASCII).
pub const WRITE_LOCK: i64 = 0x7374_7261_7461;

/// How long a write transaction waits for [`WRITE_LOCK`].
const WRITE_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The key of the session advisory lock an exclusive owner holds ("stratao" in ASCII).
pub const OWNER_LOCK: i64 = 0x0073_7472_6174_616f;

/// Whether a database is used by one daemon only (see [`Postgres::connect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// This connection holds [`OWNER_LOCK`] for as long as it lives (taken
    /// again on every reconnection): a second exclusive user is refused, and a
    /// daemon that lost its connection while another took the database over
    /// stays unavailable instead of writing beside it.
    Exclusive,
    /// Any number of users (the store's tests; daemons of a cluster).
    Shared,
}

/// The server's side of a session's keepalives (settable by any session).
pub const SERVER_KEEPALIVES: &str =
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c tcp_user_timeout=15000";

/// How long a connection attempt may take when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the client thread is asked to do.
enum Job {
    Connect,
    Execute(String, Vec<Value>),
    Query(String, Vec<Value>),
    Batch(String),
    Begin,
    Commit,
    Rollback,
}

/// What it answers.
enum Done {
    Count(u64),
    Rows(Vec<Row>),
    Nothing,
}

/// The channel pair to the client thread.
struct Link {
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Result<Done, DbError>>,
}

/// A PostgreSQL database, reached through its client thread.
pub struct Postgres {
    link: Mutex<Link>,
    /// Where it is (`host:port/dbname`, no credentials), for messages.
    target: String,
}

impl Postgres {
    /// Connects to `url` (a libpq-style URL or key=value string). An
    /// unreachable server or a bad URL is [`DbError::Unavailable`] naming it.
    pub fn connect(url: &str, sharing: Sharing) -> Result<Self, DbError> {
        let mut config: Config = url.parse().map_err(|e: postgres::Error| DbError::Unavailable {
            target: "postgres".into(),
            reason: format!("bad database URL: {e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A dead server or network path shows as an error, not a hang.
        config.keepalives(true).keepalives_idle(Duration::from_secs(10)).tcp_user_timeout(Duration::from_secs(15));
        // And the server drops a session whose client is gone within about
        // 25 s, releasing its locks: a daemon cut off from its database can
        // take its owner lock again soon after the network comes back.
        let options = [config.get_options().unwrap_or_default(), SERVER_KEEPALIVES].join(" ");
        config.options(options.trim());
        let target = describe(&config);
        let (jobs, inbox) = mpsc::channel();
        let (outbox, done) = mpsc::channel();
        let worker = Worker { config, target: target.clone(), sharing, client: None, statements: HashMap::new() };
        std::thread::Builder::new().name("strata-postgres".into()).spawn(move || worker.serve(inbox, outbox)).map_err(
            |e| DbError::Unavailable { target: target.clone(), reason: format!("start its client thread: {e}") },
        )?;
        let pg = Postgres { link: Mutex::new(Link { jobs, done }), target };
        // The first connection, made on the client thread (the caller may be
        // inside an async runtime, which the client's own must not start in).
        pg.conn().call(Job::Connect)?;
        Ok(pg)
    }

    /// Where the database is (`host:port/dbname`).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The connection, held until the guard is dropped; its statements each
    /// commit on their own, or open a transaction with [`PgConn::transaction`].
    pub fn conn(&self) -> PgConn<'_> {
        PgConn { link: self.link.lock().unwrap_or_else(|p| p.into_inner()), target: &self.target }
    }
}

/// The connection of one caller (see [`Postgres::conn`]).
pub struct PgConn<'a> {
    link: MutexGuard<'a, Link>,
    target: &'a str,
}

impl PgConn<'_> {
    /// Opens a write transaction (holding [`WRITE_LOCK`]); it is rolled back
    /// unless [`PgTransaction::commit`] is called.
    pub fn transaction(&mut self) -> Result<PgTransaction<'_>, DbError> {
        let tx = PgTransaction { conn: self, open: true };
        tx.conn.call(Job::Begin)?;
        Ok(tx)
    }

    fn call(&self, job: Job) -> Result<Done, DbError> {
        let gone = || DbError::Unavailable { target: self.target.into(), reason: "its client thread ended".into() };
        self.link.jobs.send(job).map_err(|_| gone())?;
        self.link.done.recv().map_err(|_| gone())?
    }
}

/// A write transaction (see [`PgConn::transaction`]).
pub struct PgTransaction<'a> {
    conn: &'a PgConn<'a>,
    open: bool,
}

impl PgTransaction<'_> {
    /// Commits it.
    pub fn commit(mut self) -> Result<(), DbError> {
        self.open = false;
        self.conn.call(Job::Commit).map(drop)
    }
}

impl Drop for PgTransaction<'_> {
    fn drop(&mut self) {
        if self.open {
            // A failed rollback is a lost connection: the server rolls back.
            let _ = self.conn.call(Job::Rollback);
        }
    }
}

impl Sql for PgTransaction<'_> {
    fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, DbError> {
        self.conn.execute(sql, args)
    }

    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
        self.conn.query(sql, args)
    }

    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.conn.execute_batch(sql)
    }
}

/// `host:port/dbname` of a config (never its user or password).
fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or(""))
}

fn connect(config: &Config, target: &str, sharing: Sharing) -> Result<Client, DbError> {
    let unavailable = |reason: String| DbError::Unavailable { target: target.into(), reason };
    let mut client = config.connect(NoTls).map_err(|e| unavailable(chain(&e)))?;
    if sharing == Sharing::Exclusive {
        let row = client
            .query_one(&format!("SELECT pg_try_advisory_lock({OWNER_LOCK})"), &[])
            .map_err(|e| unavailable(chain(&e)))?;
        if !row.get::<_, bool>(0) {
            return Err(unavailable(
                "another strata daemon uses this database (one daemon per database; after a network cut, this \
                 daemon's own old session holds it until the server drops it, within about 25 s)"
                    .into(),
            ));
        }
    }
    Ok(client)
}

impl Sql for PgConn<'_> {
    fn execute(&self, sql: &str, args: &[Value]) -> Result<usize, DbError> {
        match self.call(Job::Execute(sql.to_string(), args.to_vec()))? {
            Done::Count(n) => Ok(n as usize),
            _ => unreachable!("an execute answers a count"),
        }
    }

    fn query(&self, sql: &str, args: &[Value]) -> Result<Vec<Row>, DbError> {
        match self.call(Job::Query(sql.to_string(), args.to_vec()))? {
            Done::Rows(rows) => Ok(rows),
            _ => unreachable!("a query answers rows"),
        }
    }

    fn execute_batch(&self, sql: &str) -> Result<(), DbError> {
        self.call(Job::Batch(sql.to_string())).map(drop)
    }
}

/// The client thread's state.
struct Worker {
    config: Config,
    target: String,
    sharing: Sharing,
    /// `None` after a lost connection, until the next statement outside a transaction.
    client: Option<Client>,
    /// Prepared statements by their SQL (cleared with a new connection).
    statements: HashMap<String, Statement>,
}

impl Worker {
    fn serve(mut self, jobs: mpsc::Receiver<Job>, done: mpsc::Sender<Result<Done, DbError>>) {
        let mut in_transaction = false;
        for job in jobs {
            let result = self.run(job, &mut in_transaction);
            if done.send(result).is_err() {
                return;
            }
        }
    }

    fn run(&mut self, job: Job, in_transaction: &mut bool) -> Result<Done, DbError> {
        // A connection lost in a transaction fails the rest of it (the server
        // rolled it back; its commit or rollback ends it here too); outside
        // one, or at its start, a new connection is made.
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            self.statements.clear();
            if matches!(job, Job::Rollback) {
                *in_transaction = false;
                return Ok(Done::Nothing);
            }
            if *in_transaction {
                if matches!(job, Job::Commit) {
                    *in_transaction = false;
                }
                return Err(self.unavailable("the connection was lost during a transaction".into()));
            }
            let first = matches!(job, Job::Connect);
            self.client = Some(connect(&self.config, &self.target, self.sharing)?);
            if !first {
                tracing::info!(target = %self.target, "connected to the metadata database again");
            }
        }
        let result = match job {
            Job::Connect => return Ok(Done::Nothing),
            Job::Begin => {
                *in_transaction = true;
                // A writer of another daemon that holds the lock for long is an error, not a hang.
                let begin = format!(
                    "BEGIN; SET LOCAL lock_timeout = '{}s'; SELECT pg_advisory_xact_lock({WRITE_LOCK})",
                    WRITE_LOCK_TIMEOUT.as_secs()
                );
                self.client.as_mut().expect("connected above").batch_execute(&begin).map(|()| Done::Nothing)
            }
            Job::Commit | Job::Rollback => {
                *in_transaction = false;
                let sql = if matches!(job, Job::Commit) { "COMMIT" } else { "ROLLBACK" };
                self.client.as_mut().expect("connected above").batch_execute(sql).map(|()| Done::Nothing)
            }
            Job::Batch(sql) => {
                self.client.as_mut().expect("connected above").batch_execute(&sql).map(|()| Done::Nothing)
            }
            Job::Execute(sql, args) => {
                self.statement(&sql).and_then(|(c, s)| c.execute(&s, &refs(&args)).map(Done::Count))
            }
            Job::Query(sql, args) => self.statement(&sql).and_then(|(c, s)| {
                let rows = c.query(&s, &refs(&args))?;
                rows.iter().map(row_values).collect::<Result<Vec<_>, _>>().map(Done::Rows)
            }),
        };
        result.map_err(|e| self.error(e))
    }

    /// The client and `sql` prepared (once per connection).
    fn statement(&mut self, sql: &str) -> Result<(&mut Client, Statement), postgres::Error> {
        let client = self.client.as_mut().expect("connected above");
        let stmt = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let s = client.prepare(&numbered_dollars(sql))?;
                self.statements.insert(sql.to_string(), s.clone());
                s
            }
        };
        Ok((client, stmt))
    }

    fn unavailable(&self, reason: String) -> DbError {
        DbError::Unavailable { target: self.target.clone(), reason }
    }

    /// A lost connection (the client says so, or the server said it is going
    /// away) is [`DbError::Unavailable`]; anything else is the server's answer.
    fn error(&self, e: postgres::Error) -> DbError {
        if e.is_closed()
            || self.client.as_ref().is_none_or(Client::is_closed)
            || e.code().is_some_and(is_connection_class)
        {
            return self.unavailable(chain(&e));
        }
        DbError::Postgres(e)
    }
}

/// SQLSTATE class 08 (connection exception) and 57P (operator intervention: shutdown, terminated).
fn is_connection_class(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") || c.starts_with("57P")
}

/// Whether a PostgreSQL error is a unique-constraint violation.
pub fn is_unique_violation(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

fn refs(args: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

fn row_values(r: &postgres::Row) -> Result<Row, postgres::Error> {
    (0..r.len()).map(|i| r.try_get::<_, Value>(i)).collect::<Result<Vec<_>, _>>().map(Row)
}

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// A [`Value`] is bound as the type the server inferred for its parameter.
impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let mismatch = || -> BoxError { format!("cannot bind {self:?} as {ty}").into() };
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (*f as f32).to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Bool(b) => match *ty {
                Type::BOOL => b.to_sql(ty, out),
                Type::INT8 => i64::from(*b).to_sql(ty, out),
                Type::INT4 => i32::from(*b).to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Text(s) => match *ty {
                // JSON's binary form is its text; JSONB's is a version byte and the text.
                Type::JSON => {
                    out.extend_from_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                Type::JSONB => {
                    out.extend_from_slice(&[1]);
                    out.extend_from_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                _ if <&str as ToSql>::accepts(ty) => s.as_str().to_sql(ty, out),
                _ => Err(mismatch()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A column of any type the schema uses, as a [`Value`].
impl<'a> FromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(match *ty {
            Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::JSON => Value::Text(std::str::from_utf8(raw)?.to_string()),
            Type::JSONB => Value::Text(std::str::from_utf8(raw.get(1..).unwrap_or_default())?.to_string()),
            _ if <&str as FromSql>::accepts(ty) => Value::Text(<&str>::from_sql(ty, raw)?.to_string()),
            _ => return Err(format!("a column of type {ty} is not read by strata").into()),
        })
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}
