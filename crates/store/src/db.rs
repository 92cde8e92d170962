//! The metadata database: images, sandboxes, lifecycle events, checkpoints,
//! templates, tokens, approvals, the audit log ...
//!
//! Two engines hold it, behind one set of statements ([`crate::sql`]):
//!
//! * SQLite, the embedded default (one file in the state directory). It runs
//!   in WAL mode with `synchronous=NORMAL`: a crash (even a power loss) leaves
//!   the last committed state or an earlier one, never a torn one. The schema
//!   is versioned with `PRAGMA user_version` and upgraded by [`MIGRATIONS`].
//! * PostgreSQL (`strata daemon --database postgres://...`), for daemons that
//!   share their metadata. Its schema is [`POSTGRES_SCHEMA`], the SQLite
//!   schema at [`POSTGRES_SCHEMA_VERSION`] in PostgreSQL's types, versioned in
//!   the `strata_schema` table; write transactions are serialized across
//!   daemons (see [`crate::postgres`]).
//!
//! Every mutation is one transaction.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::Connection;
use strata_api::{
    Approval, ApprovalState, AuditEntry, Checkpoint, ComputeUsage, Image, ImageConfig, LayerInfo, Lease, Lifecycle,
    NameLikeId, PipelineRun, Preview, QuotaOverride, ResourceLimits, Sandbox, SandboxEvent, SandboxPolicy,
    SandboxState, TokenInfo, UsageRecord,
};
use strata_core::ids;

use crate::backend::{Backend, Tx};
use crate::postgres::{Postgres, Sharing};
use crate::sql::{args, Row, Sql, SqlExt};

/// Errors of the metadata database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite failed.
    #[error("metadata database")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL answered with an error.
    #[error("metadata database (postgres)")]
    Postgres(#[source] postgres::Error),
    /// The PostgreSQL server cannot be reached (at start, or the connection
    /// was lost); nothing of the statement or transaction was written.
    #[error("the metadata database at {target} is unavailable: {reason}")]
    Unavailable {
        /// `host:port/dbname`.
        target: String,
        /// Why.
        reason: String,
    },
    /// A column did not hold what the schema says.
    #[error("metadata column {index} holds {found}, not {expected}")]
    Column {
        /// Its position in the query.
        index: usize,
        /// What it should hold.
        expected: &'static str,
        /// What it held.
        found: String,
    },
    /// A stored JSON column did not parse.
    #[error("corrupt metadata column {column}")]
    Json {
        /// Which column.
        column: &'static str,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The database was written by a newer strata.
    #[error("metadata schema version {found} is newer than this strata understands ({known})")]
    TooNew {
        /// Version in the file.
        found: i64,
        /// Latest known version.
        known: i64,
    },
    /// A unique name is already used.
    #[error("name {0:?} is already in use")]
    NameTaken(String),
    /// Every user-namespace range is held by a sandbox.
    #[error("all {0} user-namespace ranges are in use; destroy sandboxes that have one, or create without userns")]
    UsernsExhausted(u32),
}

/// The tenant of warm-pool sandboxes: booted, not yet given to anyone. Not a
/// valid tenant name (no token can name it), and left out of every caller's
/// lookups, the operator's included, until a create adopts the sandbox.
pub const POOL_TENANT: &str = "~pool";

/// Schema migrations; entry `i` upgrades version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    // 1: initial schema
    "CREATE TABLE images (
        name TEXT PRIMARY KEY,
        id TEXT NOT NULL,
        source_kind TEXT NOT NULL,
        source TEXT NOT NULL,
        layers TEXT NOT NULL,
        config TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        state TEXT NOT NULL,
        state_reason TEXT NOT NULL,
        state_detail TEXT,
        source TEXT NOT NULL,
        image_id TEXT NOT NULL,
        runtime TEXT NOT NULL,
        lifecycle TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        ttl TEXT,
        expires_at TEXT,
        limits TEXT NOT NULL,
        env TEXT NOT NULL,
        hostname TEXT NOT NULL,
        labels TEXT NOT NULL,
        init_pid INTEGER,
        init_start_time INTEGER,
        oom_kills INTEGER NOT NULL DEFAULT 0,
        layers TEXT NOT NULL,
        image_config TEXT NOT NULL
    );
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        sandbox_id TEXT NOT NULL,
        time TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT NOT NULL,
        reason TEXT NOT NULL,
        detail TEXT,
        duration_ms INTEGER NOT NULL
    );
    CREATE INDEX events_by_sandbox ON events(sandbox_id, seq);",
    // 2: checkpoints and lineage
    "CREATE TABLE checkpoints (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        sandbox_id TEXT NOT NULL,
        parent TEXT,
        layer TEXT,
        layer_size INTEGER NOT NULL,
        layers TEXT NOT NULL,
        image TEXT NOT NULL,
        image_id TEXT NOT NULL,
        image_config TEXT NOT NULL,
        changed_paths INTEGER NOT NULL,
        labels TEXT NOT NULL,
        created_at TEXT NOT NULL,
        frozen_ms INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL
    );
    ALTER TABLE sandboxes ADD COLUMN base_checkpoint TEXT;
    ALTER TABLE sandboxes ADD COLUMN head_checkpoint TEXT;
    ALTER TABLE sandboxes ADD COLUMN fork_generation INTEGER NOT NULL DEFAULT 0;",
    // 3: templates and the template-build step cache
    "CREATE TABLE templates (
        name TEXT PRIMARY KEY,
        checkpoint TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE TABLE build_cache (
        key TEXT PRIMARY KEY,
        checkpoint TEXT NOT NULL,
        created_at TEXT NOT NULL
    );",
    // 4: checkpoint retention
    "ALTER TABLE checkpoints ADD COLUMN expires_at TEXT;
    ALTER TABLE checkpoints ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;",
    // 5: lifecycle policy (existing sandboxes get their lifecycle's default),
    // time since entering stopped/standby/archived, keep-alive leases
    "ALTER TABLE sandboxes ADD COLUMN policy TEXT NOT NULL DEFAULT '{\"on_idle\":\"standby\",\"idle_timeout\":\"15m\"}';
    UPDATE sandboxes SET policy = '{\"on_idle\":\"destroy\",\"idle_timeout\":\"15m\"}' WHERE lifecycle = 'ephemeral';
    ALTER TABLE sandboxes ADD COLUMN inactive_since TEXT;
    UPDATE sandboxes SET inactive_since = updated_at WHERE state IN ('stopped', 'standby', 'archived');
    CREATE TABLE leases (
        id TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL
    );
    CREATE INDEX leases_by_sandbox ON leases(sandbox_id);",
    // 6: cost accounting: per-sandbox usage accumulators (kept after the
    // sandbox row is deleted) and the compute behind each checkpoint's state
    "CREATE TABLE usage (
        sandbox_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_at TEXT NOT NULL,
        destroyed_at TEXT,
        record TEXT NOT NULL
    );
    CREATE INDEX usage_by_name ON usage(name);
    CREATE TABLE checkpoint_setup (
        checkpoint_id TEXT PRIMARY KEY,
        compute TEXT NOT NULL
    );
    INSERT INTO usage (sandbox_id, name, created_at, record)
        SELECT id, name, created_at, json_object('sandbox_id', id, 'name', name, 'source', source, 'base_checkpoint', base_checkpoint, 'created_at', created_at, 'updated_at', updated_at) FROM sandboxes;",
    // 7: accepted scan findings on templates, the hash-chained audit log
    "ALTER TABLE templates ADD COLUMN accepted_findings TEXT;
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY,
        time TEXT NOT NULL,
        actor TEXT NOT NULL,
        method TEXT NOT NULL,
        route TEXT NOT NULL,
        target TEXT,
        status INTEGER NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    );",
    // 8: pipeline runs and their stage results (JSON records; a run and its
    // stages change together in one transaction)
    "CREATE TABLE pipeline_runs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        spec TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE pipeline_stages (
        run_id TEXT NOT NULL REFERENCES pipeline_runs(id),
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (run_id, idx)
    );",
    // 9: tenants: every owned object records its tenant (existing ones are the
    // operator's `default`); API tokens (only a SHA-256 of the secret is kept;
    // names are unique among a tenant's live tokens); the audit log records the
    // tenant a request acted in.
    "ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE checkpoints ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE templates ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE pipeline_runs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE usage ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE audit ADD COLUMN tenant TEXT;
    CREATE INDEX sandboxes_by_tenant ON sandboxes(tenant);
    CREATE INDEX usage_by_tenant ON usage(tenant);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        tenant TEXT NOT NULL,
        secret_sha256 TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        last_used_at TEXT,
        expires_at TEXT,
        revoked_at TEXT
    );
    CREATE UNIQUE INDEX tokens_live_name ON tokens(tenant, name) WHERE revoked_at IS NULL;",
    // 10: Rule of Two: the capabilities a checkpoint's sandbox declared (a
    // sandbox started from it inherits them) and the approval queue (the record
    // as JSON; id, tenant, state, fingerprint and expiry as columns to query).
    "ALTER TABLE checkpoints ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]';
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        state TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX approvals_by_state ON approvals(state, expires_at);",
    // 11: preview URLs: a port (NULL: every port) of a sandbox opened through
    // the daemon's reverse proxy; only a SHA-256 of the token secret is kept.
    "CREATE TABLE previews (
        id TEXT PRIMARY KEY,
        sandbox_id TEXT NOT NULL,
        port INTEGER,
        tenant TEXT NOT NULL,
        secret_sha256 TEXT NOT NULL UNIQUE,
        public INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        revoked_at TEXT
    );
    CREATE INDEX previews_by_sandbox ON previews(sandbox_id);",
    // 12: whether setuid binaries take effect in a sandbox (no no_new_privs).
    "ALTER TABLE sandboxes ADD COLUMN allow_setuid INTEGER NOT NULL DEFAULT 0;",
    // 13: warm checkpoints: the process image kept with a checkpoint (JSON, NULL: filesystem only).
    "ALTER TABLE checkpoints ADD COLUMN processes TEXT;",
    // 14: per-tenant quota overrides set by the operator (JSON `QuotaOverride`;
    // a tenant without a row has the daemon's default quota).
    "CREATE TABLE tenant_quotas (
        tenant TEXT PRIMARY KEY,
        quota TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );",
    // 15: the isolation tier of a checkpoint's sandbox (NULL: namespace, the only tier before).
    "ALTER TABLE checkpoints ADD COLUMN isolation TEXT;",
    // 16: user namespaces on the namespace tier: the host uid/gid a sandbox's
    // root maps to (NULL: none; unique among the sandboxes that exist), and
    // whether a checkpoint's sandbox had one.
    "ALTER TABLE sandboxes ADD COLUMN userns_base INTEGER;
    CREATE UNIQUE INDEX sandboxes_userns_base ON sandboxes(userns_base);
    ALTER TABLE checkpoints ADD COLUMN userns INTEGER NOT NULL DEFAULT 0;",
    // 17: where /tmp lives (1: a tmpfs, what every sandbox had before: their
    // standby images and warm checkpoints hold that layout; new ones say disk).
    "ALTER TABLE sandboxes ADD COLUMN tmp_tmpfs INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE checkpoints ADD COLUMN tmp_tmpfs INTEGER NOT NULL DEFAULT 1;",
    // 18: quarantine (JSON `strata_api::Quarantine`, NULL: none).
    "ALTER TABLE sandboxes ADD COLUMN quarantine TEXT;
    ALTER TABLE checkpoints ADD COLUMN quarantine TEXT;",
    // 19: image versions (a name keeps every import of new content; the
    // highest version is what the name means), what each image's files say
    // it is, and the build file a template was built from (for rebuilds).
    "CREATE TABLE image_versions (
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        id TEXT NOT NULL,
        source_kind TEXT NOT NULL,
        source TEXT NOT NULL,
        layers TEXT NOT NULL,
        config TEXT NOT NULL,
        size INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        previous TEXT,
        platform TEXT,
        PRIMARY KEY (name, version)
    );
    INSERT INTO image_versions (name, version, id, source_kind, source, layers, config, size, created_at)
        SELECT name, 1, id, source_kind, source, layers, config, size, created_at FROM images;
    DROP TABLE images;
    ALTER TABLE image_versions RENAME TO images;
    CREATE INDEX images_by_id ON images (id);
    ALTER TABLE templates ADD COLUMN build TEXT;",
    // 20: checks of templates at set times (`check_every`, `on_findings`) and
    // the last one's report (JSON `strata_api::TemplateCheckReport`).
    "ALTER TABLE templates ADD COLUMN check_every TEXT;
    ALTER TABLE templates ADD COLUMN on_findings TEXT NOT NULL DEFAULT 'record';
    ALTER TABLE templates ADD COLUMN last_check TEXT;",
];

/// The SQLite schema version [`POSTGRES_SCHEMA`] is.
pub const POSTGRES_SCHEMA_VERSION: i64 = 20;

/// The schema of a new PostgreSQL database: the SQLite schema at
/// [`POSTGRES_SCHEMA_VERSION`] (the same tables, columns, keys and indexes),
/// with BIGINT for integers, `JSON` for the two JSON columns queried with
/// `->>`, BOOLEAN for `previews.public`, an identity column where SQLite has
/// an implicit one (`events.seq`, `approvals.rowid`), and every TEXT column
/// in byte order (`COLLATE "C"`, as SQLite compares text), so that listings
/// sort alike on both. A migration after version 20 is written for both
/// engines ([`MIGRATIONS`] and [`POSTGRES_MIGRATIONS`]).
pub const POSTGRES_SCHEMA: &str = r#"
CREATE TABLE images (
    name TEXT NOT NULL, version BIGINT NOT NULL, id TEXT NOT NULL, source_kind TEXT NOT NULL,
    source TEXT NOT NULL, layers TEXT NOT NULL, config TEXT NOT NULL, size BIGINT NOT NULL,
    created_at TEXT NOT NULL, previous TEXT, platform TEXT,
    PRIMARY KEY (name, version)
);
CREATE INDEX images_by_id ON images (id);
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, state TEXT NOT NULL, state_reason TEXT NOT NULL,
    state_detail TEXT, source TEXT NOT NULL, image_id TEXT NOT NULL, runtime TEXT NOT NULL,
    lifecycle TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL, ttl TEXT, expires_at TEXT,
    limits JSON NOT NULL, env TEXT NOT NULL, hostname TEXT NOT NULL, labels TEXT NOT NULL,
    init_pid BIGINT, init_start_time BIGINT, oom_kills BIGINT NOT NULL DEFAULT 0, layers TEXT NOT NULL,
    image_config TEXT NOT NULL, base_checkpoint TEXT, head_checkpoint TEXT,
    fork_generation BIGINT NOT NULL DEFAULT 0,
    policy JSON NOT NULL DEFAULT '{"on_idle":"standby","idle_timeout":"15m"}',
    inactive_since TEXT, tenant TEXT NOT NULL DEFAULT 'default', allow_setuid BIGINT NOT NULL DEFAULT 0,
    userns_base BIGINT, tmp_tmpfs BIGINT NOT NULL DEFAULT 1, quarantine TEXT
);
CREATE INDEX sandboxes_by_tenant ON sandboxes(tenant);
CREATE UNIQUE INDEX sandboxes_userns_base ON sandboxes(userns_base);
CREATE TABLE events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, sandbox_id TEXT NOT NULL, time TEXT NOT NULL,
    from_state TEXT, to_state TEXT NOT NULL, reason TEXT NOT NULL, detail TEXT, duration_ms BIGINT NOT NULL
);
CREATE INDEX events_by_sandbox ON events(sandbox_id, seq);
CREATE TABLE checkpoints (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, sandbox_id TEXT NOT NULL, parent TEXT, layer TEXT,
    layer_size BIGINT NOT NULL, layers TEXT NOT NULL, image TEXT NOT NULL, image_id TEXT NOT NULL,
    image_config TEXT NOT NULL, changed_paths BIGINT NOT NULL, labels TEXT NOT NULL, created_at TEXT NOT NULL,
    frozen_ms BIGINT NOT NULL, duration_ms BIGINT NOT NULL, expires_at TEXT, pinned BIGINT NOT NULL DEFAULT 0,
    tenant TEXT NOT NULL DEFAULT 'default', capabilities TEXT NOT NULL DEFAULT '[]', processes TEXT,
    isolation TEXT, userns BIGINT NOT NULL DEFAULT 0, tmp_tmpfs BIGINT NOT NULL DEFAULT 1, quarantine TEXT
);
CREATE TABLE templates (
    name TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, created_at TEXT NOT NULL, accepted_findings TEXT,
    tenant TEXT NOT NULL DEFAULT 'default', build TEXT, check_every TEXT,
    on_findings TEXT NOT NULL DEFAULT 'record', last_check TEXT
);
CREATE TABLE build_cache (key TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE leases (
    id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL
);
CREATE INDEX leases_by_sandbox ON leases(sandbox_id);
CREATE TABLE usage (
    sandbox_id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at TEXT NOT NULL, destroyed_at TEXT,
    record TEXT NOT NULL, tenant TEXT NOT NULL DEFAULT 'default'
);
CREATE INDEX usage_by_name ON usage(name);
CREATE INDEX usage_by_tenant ON usage(tenant);
CREATE TABLE checkpoint_setup (checkpoint_id TEXT PRIMARY KEY, compute TEXT NOT NULL);
CREATE TABLE audit (
    seq BIGINT PRIMARY KEY, time TEXT NOT NULL, actor TEXT NOT NULL, method TEXT NOT NULL,
    route TEXT NOT NULL, target TEXT, status BIGINT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
    tenant TEXT
);
CREATE TABLE pipeline_runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, spec TEXT NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, tenant TEXT NOT NULL DEFAULT 'default'
);
CREATE TABLE pipeline_stages (
    run_id TEXT NOT NULL REFERENCES pipeline_runs(id), idx BIGINT NOT NULL, name TEXT NOT NULL,
    record TEXT NOT NULL, PRIMARY KEY (run_id, idx)
);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL, secret_sha256 TEXT NOT NULL UNIQUE,
    created_at TEXT NOT NULL, last_used_at TEXT, expires_at TEXT, revoked_at TEXT
);
CREATE UNIQUE INDEX tokens_live_name ON tokens(tenant, name) WHERE revoked_at IS NULL;
CREATE TABLE approvals (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, fingerprint TEXT NOT NULL,
    expires_at TEXT NOT NULL, record TEXT NOT NULL, rowid BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE
);
CREATE INDEX approvals_by_state ON approvals(state, expires_at);
CREATE TABLE previews (
    id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL, port BIGINT, tenant TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL UNIQUE, public BOOLEAN NOT NULL DEFAULT false, created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL, revoked_at TEXT
);
CREATE INDEX previews_by_sandbox ON previews(sandbox_id);
CREATE TABLE tenant_quotas (tenant TEXT PRIMARY KEY, quota TEXT NOT NULL, updated_at TEXT NOT NULL);
"#;

/// PostgreSQL migrations after [`POSTGRES_SCHEMA_VERSION`]: entry `i`
/// upgrades version `POSTGRES_SCHEMA_VERSION + i` by one, as [`MIGRATIONS`]
/// entry `POSTGRES_SCHEMA_VERSION + i` does on SQLite.
pub const POSTGRES_MIGRATIONS: &[&str] = &[];

/// First host uid/gid given to a sandbox user namespace; each sandbox gets
/// [`USERNS_SIZE`] ids from `USERNS_FIRST + n * USERNS_SIZE` (the lowest free `n`).
pub const USERNS_FIRST: u32 = 1_000_000_000;
/// Ids per sandbox user namespace (uid and gid 0..65535 inside).
pub const USERNS_SIZE: u32 = 65_536;
/// How many sandbox user namespaces can exist at once (their ranges end below
/// 1,879,048,192, where systemd's reserved ranges start).
pub const USERNS_SLOTS: u32 = 13_000;

/// Shortest image id prefix that resolves to an image (image ids are sha256 digests).
pub const IMAGE_PREFIX_LEN: usize = 8;

/// `prev_hash` of the first audit entry.
pub const AUDIT_GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The canonical bytes of an audit entry (everything but its own hash), as
/// hashed into the chain: a JSON array, so fields cannot run into each other.
/// The tenant is appended only when there is one, so entries written before
/// tenants existed keep their hashes.
pub fn audit_canonical(e: &AuditEntry) -> Vec<u8> {
    let mut v = vec![
        serde_json::json!(e.seq),
        serde_json::json!(e.time),
        serde_json::json!(e.actor),
        serde_json::json!(e.method),
        serde_json::json!(e.route),
        serde_json::json!(e.target),
        serde_json::json!(e.status),
        serde_json::json!(e.prev_hash),
    ];
    if let Some(t) = &e.tenant {
        v.push(serde_json::json!(t));
    }
    serde_json::to_vec(&v).expect("serializes")
}

/// sha256 (hex) of an audit entry's canonical bytes.
pub fn audit_hash(e: &AuditEntry) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(audit_canonical(e)))
}

/// Recomputes the chain of `entries` (in seq order): the first entry whose
/// hash, predecessor link or position does not fit, with the reason.
pub fn audit_verify(entries: &[AuditEntry]) -> Option<(i64, String)> {
    let mut prev = AUDIT_GENESIS.to_string();
    for (expect_seq, e) in (1..).zip(entries) {
        if e.seq != expect_seq {
            return Some((
                e.seq,
                format!("expected entry {expect_seq} here, found {} (entries removed or reordered)", e.seq),
            ));
        }
        if e.prev_hash != prev {
            return Some((
                e.seq,
                "prev_hash does not match the previous entry (entries removed, reordered or edited)".into(),
            ));
        }
        let h = audit_hash(e);
        if e.hash != h {
            return Some((e.seq, "contents do not match its hash (entry edited)".into()));
        }
        prev = h;
    }
    None
}

/// What an audit entry records (its position and hashes are the log's).
#[derive(Debug, Clone, Copy)]
pub struct NewAudit<'a> {
    /// RFC 3339 time.
    pub time: &'a str,
    /// Who (see [`AuditEntry::actor`]).
    pub actor: &'a str,
    /// The tenant the request acted in.
    pub tenant: Option<&'a str>,
    /// HTTP method.
    pub method: &'a str,
    /// Route template.
    pub route: &'a str,
    /// Target id or name.
    pub target: Option<&'a str>,
    /// HTTP status.
    pub status: u16,
}

/// A template's checks at set times, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateChecks {
    /// Interval (`None`: not checked at set times).
    pub check_every: Option<String>,
    /// `record` or `quarantine`.
    pub on_findings: String,
    /// The last check's report (JSON `strata_api::TemplateCheckReport`).
    pub last_check: Option<String>,
}

/// A sandbox as stored: the API view plus what only the daemon needs.
#[derive(Debug, Clone)]
pub struct SandboxRecord {
    /// The API view.
    pub sandbox: Sandbox,
    /// Layer digests of its image, bottom first.
    pub layers: Vec<String>,
    /// Kernel start time of init (pid-reuse guard).
    pub init_start_time: Option<u64>,
    /// The image's process defaults.
    pub image_config: ImageConfig,
}

/// A state change to record.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    /// New state.
    pub to: SandboxState,
    /// Reason code.
    pub reason: &'a str,
    /// Optional detail.
    pub detail: Option<&'a str>,
    /// Duration of the transition.
    pub duration_ms: u64,
    /// RFC 3339 time.
    pub time: &'a str,
}

/// The metadata database.
pub struct Db {
    backend: Backend,
    /// The user-namespace slots new sandboxes take ranges from (see [`Db::set_userns_slots`]).
    userns_slots: Mutex<std::ops::Range<u32>>,
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("model serializes")
}

fn parse<T: serde::de::DeserializeOwned>(s: &str, column: &'static str) -> Result<T, DbError> {
    serde_json::from_str(s).map_err(|source| DbError::Json { column, source })
}

fn state_of(s: &str) -> SandboxState {
    SandboxState::parse(s).unwrap_or(SandboxState::Error)
}

fn lifecycle_str(l: Lifecycle) -> &'static str {
    match l {
        Lifecycle::Ephemeral => "ephemeral",
        Lifecycle::Persistent => "persistent",
    }
}

/// The lowest user-namespace range of `slots` no sandbox holds.
fn free_userns(tx: &Tx<'_>, slots: std::ops::Range<u32>) -> Result<strata_api::UserNamespace, DbError> {
    let taken = tx.rows(
        "SELECT userns_base FROM sandboxes WHERE userns_base IS NOT NULL ORDER BY userns_base",
        args![],
        |r| r.get::<i64>(0),
    )?;
    let mut slot = slots.start;
    for base in taken {
        let used = (base - USERNS_FIRST as i64) / USERNS_SIZE as i64;
        if used < slot as i64 {
            continue;
        }
        if used > slot as i64 {
            break;
        }
        slot = used as u32 + 1;
    }
    if slot >= slots.end {
        return Err(DbError::UsernsExhausted(slots.end - slots.start));
    }
    Ok(strata_api::UserNamespace { host_base: USERNS_FIRST + slot * USERNS_SIZE, size: USERNS_SIZE })
}

const SANDBOX_COLUMNS: &str = "id, name, state, state_reason, state_detail, source, image_id, runtime, lifecycle, created_at, updated_at, expires_at, limits, env, hostname, labels, init_pid, init_start_time, oom_kills, layers, image_config, ttl, base_checkpoint, head_checkpoint, fork_generation, policy, inactive_since, tenant, allow_setuid, userns_base, tmp_tmpfs, quarantine";

/// States in which a sandbox is parked (`inactive_since` is set), as SQL.
const INACTIVE_STATES: &str = "('stopped', 'standby', 'archived')";

fn sandbox_from_row(r: &Row) -> Result<SandboxRecord, DbError> {
    let limits: String = r.get(12)?;
    let env: String = r.get(13)?;
    let labels: String = r.get(15)?;
    let layers: String = r.get(19)?;
    let image_config: String = r.get(20)?;
    let ttl: Option<String> = r.get(21)?;
    let base_checkpoint: Option<String> = r.get(22)?;
    let head_checkpoint: Option<String> = r.get(23)?;
    let fork_generation: i64 = r.get(24)?;
    let policy: String = r.get(25)?;
    let lifecycle: String = r.get(8)?;
    let state: String = r.get(2)?;
    let build = || -> Result<SandboxRecord, DbError> {
        Ok(SandboxRecord {
            sandbox: Sandbox {
                id: r.get(0)?,
                tenant: r.get(27)?,
                name: r.get(1)?,
                state: state_of(&state),
                state_reason: r.get(3)?,
                state_detail: r.get(4)?,
                source: r.get(5)?,
                image_id: r.get(6)?,
                runtime: r.get(7)?,
                lifecycle: if lifecycle == "ephemeral" { Lifecycle::Ephemeral } else { Lifecycle::Persistent },
                created_at: r.get(9)?,
                updated_at: r.get(10)?,
                inactive_since: r.get(26)?,
                policy: parse::<SandboxPolicy>(&policy, "policy")?,
                ttl,
                expires_at: r.get(11)?,
                limits: parse::<ResourceLimits>(&limits, "limits")?,
                env: parse(&env, "env")?,
                hostname: r.get(14)?,
                labels: parse(&labels, "labels")?,
                init_pid: r.get(16)?,
                oom_kills: r.get::<i64>(18)? as u64,
                base_checkpoint,
                head_checkpoint,
                fork_generation: fork_generation as u32,
                standby: None,
                secrets: Vec::new(),
                network: Default::default(),
                capabilities: Vec::new(),
                allow_setuid: r.get::<i64>(28)? != 0,
                userns: r
                    .get::<Option<i64>>(29)?
                    .map(|b| strata_api::UserNamespace { host_base: b as u32, size: USERNS_SIZE }),
                tmp: tmp_of(r.get(30)?),
                quarantine: r.get::<Option<String>>(31)?.map(|q| parse(&q, "quarantine")).transpose()?,
            },
            init_start_time: r.get::<Option<i64>>(17)?.map(|v| v as u64),
            layers: parse(&layers, "layers")?,
            image_config: parse(&image_config, "image_config")?,
        })
    };
    build()
}

const CHECKPOINT_COLUMNS: &str = "id, name, sandbox_id, parent, layer, layer_size, layers, image, image_id, image_config, changed_paths, labels, created_at, frozen_ms, duration_ms, expires_at, pinned, tenant, capabilities, processes, isolation, userns, tmp_tmpfs, quarantine";

/// The `tmp_tmpfs` column as a [`strata_api::TmpStorage`].
fn tmp_of(tmpfs: i64) -> strata_api::TmpStorage {
    if tmpfs != 0 {
        strata_api::TmpStorage::Tmpfs
    } else {
        strata_api::TmpStorage::Disk
    }
}

fn checkpoint_from_row(r: &Row) -> Result<(Checkpoint, ImageConfig), DbError> {
    let layers: String = r.get(6)?;
    let config: String = r.get(9)?;
    let labels: String = r.get(11)?;
    let capabilities: String = r.get(18)?;
    let processes: Option<String> = r.get(19)?;
    let isolation: Option<String> = r.get(20)?;
    let build = || -> Result<(Checkpoint, ImageConfig), DbError> {
        Ok((
            Checkpoint {
                id: r.get(0)?,
                tenant: r.get(17)?,
                name: r.get(1)?,
                sandbox_id: r.get(2)?,
                parent: r.get(3)?,
                layer: r.get(4)?,
                layer_size: r.get::<i64>(5)? as u64,
                layers: parse(&layers, "layers")?,
                image: r.get(7)?,
                image_id: r.get(8)?,
                changed_paths: r.get::<i64>(10)? as u64,
                labels: parse(&labels, "labels")?,
                created_at: r.get(12)?,
                frozen_ms: r.get::<i64>(13)? as u64,
                duration_ms: r.get::<i64>(14)? as u64,
                expires_at: r.get(15)?,
                pinned: r.get::<i64>(16)? != 0,
                capabilities: parse(&capabilities, "capabilities")?,
                processes: processes.as_deref().map(|p| parse(p, "processes")).transpose()?,
                isolation: match isolation {
                    Some(t) => parse(&format!("{t:?}"), "isolation")?,
                    None => strata_api::Isolation::Namespace,
                },
                userns: r.get::<i64>(21)? != 0,
                tmp: tmp_of(r.get(22)?),
                quarantine: r.get::<Option<String>>(23)?.map(|q| parse(&q, "quarantine")).transpose()?,
            },
            parse(&config, "image_config")?,
        ))
    };
    build()
}

/// The columns [`image_from_row`] reads; `newest` says whether a row is its name's highest version.
const IMAGE_COLS: &str = "SELECT name, id, source_kind, source, layers, config, size, created_at, version, previous, platform, newest FROM (SELECT *, version = (SELECT MAX(version) FROM images j WHERE j.name = images.name) AS newest FROM images) AS i";

fn image_from_row(r: &Row) -> Result<Image, DbError> {
    let layers: String = r.get(4)?;
    let config: String = r.get(5)?;
    let platform: Option<String> = r.get(10)?;
    let build = || -> Result<Image, DbError> {
        Ok(Image {
            name: r.get(0)?,
            id: r.get(1)?,
            source_kind: r.get(2)?,
            source: r.get(3)?,
            layers: parse::<Vec<LayerInfo>>(&layers, "layers")?,
            config: parse(&config, "config")?,
            size: r.get::<i64>(6)? as u64,
            created_at: r.get(7)?,
            version: r.get(8)?,
            previous: r.get(9)?,
            platform: platform.as_deref().map(|p| parse(p, "platform")).transpose()?,
            newest: r.get(11)?,
        })
    };
    build()
}

fn usage_from(record: &str, destroyed_at: Option<String>, tenant: String) -> Result<UsageRecord, DbError> {
    let mut u: UsageRecord = parse(record, "usage.record")?;
    u.destroyed_at = destroyed_at;
    u.tenant = tenant;
    Ok(u)
}

fn lease_from_row(r: &Row) -> Result<Lease, DbError> {
    Ok(Lease { id: r.get(0)?, sandbox_id: r.get(1)?, created_at: r.get(2)?, expires_at: r.get(3)? })
}

/// Whether an error is a unique-key violation (a name or key already used), on either engine.
fn is_unique_violation(e: &DbError) -> bool {
    match e {
        DbError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
            f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
        }
        DbError::Postgres(e) => crate::postgres::is_unique_violation(e),
        _ => false,
    }
}

/// How an owned object's table is searched for a caller's key, in the
/// resolution order of [`strata_core::ids`]: exact id, exact name, then an id
/// prefix unique among the rows `scope` may see. With a scope (a tenant), rows
/// of other tenants are never looked at, so they can neither shadow nor make
/// ambiguous what the caller names, nor be detected through it.
struct Keyed {
    /// `SELECT <columns> FROM <table>`.
    select: String,
    /// The id column.
    id: &'static str,
    /// The name column, when names resolve; with the ORDER BY that picks one
    /// of several rows of the same name (empty when names are unique).
    name: Option<(&'static str, &'static str)>,
    /// The tenant column.
    tenant: &'static str,
}

impl Keyed {
    fn resolve<T>(
        &self,
        conn: &impl Sql,
        key: &str,
        scope: Option<&str>,
        map: impl Fn(&Row) -> Result<T, DbError>,
    ) -> Result<Option<T>, DbError> {
        let Keyed { select, id, name, tenant } = self;
        // Every tenant's but the warm pool's for no scope; one tenant's for a scope.
        let visible = format!("((CAST(?2 AS TEXT) IS NULL AND {tenant} <> '{POOL_TENANT}') OR {tenant} = ?2)");
        if let Some(found) = conn.one(&format!("{select} WHERE {id} = ?1 AND {visible}"), args![key, scope], &map)? {
            return Ok(Some(found));
        }
        if let Some((name, order)) = name {
            if let Some(found) =
                conn.one(&format!("{select} WHERE {name} = ?1 AND {visible} {order} LIMIT 1"), args![key, scope], &map)?
            {
                return Ok(Some(found));
            }
        }
        if !ids::is_id_prefix(key) {
            return Ok(None);
        }
        // substr, not LIKE: LIKE is case-insensitive and treats `%` and `_` as wildcards.
        let mut rows = conn.rows(
            &format!("{select} WHERE substr({id}, 1, length(CAST(?1 AS TEXT))) = ?1 AND {visible} LIMIT 2"),
            args![key, scope],
            &map,
        )?;
        Ok(if rows.len() == 1 { rows.pop() } else { None })
    }
}

fn sandboxes_keyed(columns: &str) -> Keyed {
    Keyed { select: format!("SELECT {columns} FROM sandboxes"), id: "id", name: Some(("name", "")), tenant: "tenant" }
}

fn checkpoints_keyed() -> Keyed {
    Keyed {
        select: format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints"),
        id: "id",
        name: Some(("name", "")),
        tenant: "tenant",
    }
}

/// Prepared statements kept per SQLite connection: more than the distinct
/// statements this module runs, so none is parsed again (parsing cost more
/// than running the lookups of a proxied preview request, measured with perf).
const STATEMENT_CACHE: usize = 256;

impl Db {
    /// Opens (creating and migrating) the SQLite database at `path`.
    pub fn open(path: &Path) -> Result<Self, DbError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every statement this module runs stays prepared (see [`crate::sql`]).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let db = Db { backend: Backend::Sqlite(Mutex::new(conn)), userns_slots: Mutex::new(0..USERNS_SLOTS) };
        db.migrate_sqlite()?;
        Ok(db)
    }

    /// Opens (creating the schema in, or migrating) the PostgreSQL database
    /// at `url` (`postgres://user:password@host:port/dbname`, or libpq's
    /// `key=value` form), shared with other users. An unreachable server is
    /// [`DbError::Unavailable`].
    pub fn open_postgres(url: &str) -> Result<Self, DbError> {
        Db::open_postgres_as(url, Sharing::Shared)
    }

    /// Like [`Db::open_postgres`], used as `sharing` says.
    pub fn open_postgres_as(url: &str, sharing: Sharing) -> Result<Self, DbError> {
        let db = Db {
            backend: Backend::Postgres(Postgres::connect(url, sharing)?),
            userns_slots: Mutex::new(0..USERNS_SLOTS),
        };
        db.migrate_postgres()?;
        Ok(db)
    }

    /// Opens the database a daemon's `--database` names, for that daemon
    /// alone: `postgres://` or `postgresql://` URLs are PostgreSQL (used
    /// [`Sharing::Exclusive`]ly); anything else is a SQLite file path.
    pub fn open_url(url: &str) -> Result<Self, DbError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Db::open_postgres_as(url, Sharing::Exclusive)
        } else {
            Db::open(Path::new(url.strip_prefix("sqlite://").unwrap_or(url)))
        }
    }

    /// Which engine holds the metadata and where: `sqlite` or `postgres host:port/dbname`.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite".into(),
            Backend::Postgres(p) => format!("postgres {}", p.target()),
        }
    }

    fn conn(&self) -> crate::backend::Conn<'_> {
        self.backend.conn()
    }

    /// Restricts the user-namespace slots new sandboxes get ranges from to
    /// `slots` (within `0..`[`USERNS_SLOTS`]): the daemon's share of the
    /// host's, so that sandboxes of two daemons never share host ids.
    /// Ranges already given keep their slots.
    pub fn set_userns_slots(&self, slots: std::ops::Range<u32>) {
        *self.userns_slots.lock().unwrap_or_else(|p| p.into_inner()) = slots.start..slots.end.min(USERNS_SLOTS);
    }

    fn migrate_sqlite(&self) -> Result<(), DbError> {
        let Backend::Sqlite(conn) = &self.backend else { unreachable!("a SQLite database") };
        let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(DbError::TooNew { found: version, known });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
            tracing::info!(version = i + 1, "applied metadata migration");
        }
        Ok(())
    }

    /// Creates the schema in an empty database, or brings an older one up to
    /// date, in one write transaction: daemons starting together on one
    /// database migrate it once.
    fn migrate_postgres(&self) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute_batch("CREATE TABLE IF NOT EXISTS strata_schema (version BIGINT NOT NULL)")?;
        let version = tx.one("SELECT version FROM strata_schema", args![], |r| r.get::<i64>(0))?;
        let known = POSTGRES_SCHEMA_VERSION + POSTGRES_MIGRATIONS.len() as i64;
        let mut current = match version {
            Some(v) if v > known => return Err(DbError::TooNew { found: v, known }),
            Some(v) => v,
            None => {
                tx.execute_batch(&POSTGRES_SCHEMA.replace(" TEXT", " TEXT COLLATE \"C\""))?;
                tx.execute("INSERT INTO strata_schema (version) VALUES (?1)", args![POSTGRES_SCHEMA_VERSION])?;
                tracing::info!(version = POSTGRES_SCHEMA_VERSION, "created the metadata schema in postgres");
                POSTGRES_SCHEMA_VERSION
            }
        };
        for sql in POSTGRES_MIGRATIONS.iter().skip((current - POSTGRES_SCHEMA_VERSION) as usize) {
            tx.execute_batch(sql)?;
            current += 1;
            tx.execute("UPDATE strata_schema SET version = ?1", args![current])?;
            tracing::info!(version = current, "applied metadata migration");
        }
        tx.commit()
    }

    /// The schema version in use.
    pub fn schema_version(&self) -> Result<i64, DbError> {
        match &self.backend {
            Backend::Sqlite(c) => {
                Ok(c.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pragma_query_value(None, "user_version", |r| r.get(0))?)
            }
            Backend::Postgres(_) => {
                Ok(self.conn().one("SELECT version FROM strata_schema", args![], |r| r.get(0))?.unwrap_or_default())
            }
        }
    }

    // ---- images ----

    /// Registers an image. A name already registered is refused
    /// ([`DbError::NameTaken`]) unless `replace`: then the image becomes the
    /// name's next version (the older ones stay, by id), or, when its content
    /// is the newest version's, nothing changes. Returns the record as stored.
    pub fn put_image(&self, image: &Image, replace: bool) -> Result<Image, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let newest = tx.one(
            &format!("{IMAGE_COLS} WHERE name = ?1 ORDER BY version DESC LIMIT 1"),
            args![image.name],
            image_from_row,
        )?;
        let mut stored = image.clone();
        stored.newest = true;
        match newest {
            Some(_) if !replace => return Err(DbError::NameTaken(image.name.clone())),
            Some(n) if n.id == image.id => return Ok(n),
            Some(n) => {
                stored.version = n.version + 1;
                stored.previous = Some(n.id);
            }
            None => {
                stored.version = 1;
                stored.previous = None;
            }
        }
        tx.execute(
            "INSERT INTO images (name, version, id, source_kind, source, layers, config, size, created_at, previous, platform) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            args![
                stored.name,
                stored.version,
                stored.id,
                stored.source_kind,
                stored.source,
                json(&stored.layers),
                json(&stored.config),
                stored.size as i64,
                stored.created_at,
                stored.previous,
                stored.platform.as_ref().map(json)
            ],
        )?;
        tx.commit()?;
        Ok(stored)
    }

    /// Records what an image's files say it is (for images imported before it was read at import).
    pub fn set_image_platform(&self, id: &str, platform: &strata_api::Platform) -> Result<(), DbError> {
        self.conn().execute("UPDATE images SET platform = ?2 WHERE id = ?1", args![id, json(platform)])?;
        Ok(())
    }

    /// Finds an image (images are shared by every tenant): by its id
    /// (`sha256:<hex>`; the newest version holding it), then by name (its
    /// newest version), then by a unique id prefix of at least
    /// [`IMAGE_PREFIX_LEN`] lower-case hex characters (with or without
    /// `sha256:`). A name never shadows an id.
    pub fn get_image(&self, name_or_id: &str) -> Result<Option<Image>, DbError> {
        let conn = self.conn();
        if let Some(img) = conn.one(
            &format!("{IMAGE_COLS} WHERE id = ?1 ORDER BY newest DESC, name, version DESC LIMIT 1"),
            args![name_or_id],
            image_from_row,
        )? {
            return Ok(Some(img));
        }
        if let Some(img) = conn.one(
            &format!("{IMAGE_COLS} WHERE name = ?1 ORDER BY version DESC LIMIT 1"),
            args![name_or_id],
            image_from_row,
        )? {
            return Ok(Some(img));
        }
        let hex = name_or_id.strip_prefix("sha256:").unwrap_or(name_or_id);
        if hex.len() < IMAGE_PREFIX_LEN
            || hex.len() > 64
            || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Ok(None);
        }
        // Several images may share an id (the same content under several names): one id, one answer.
        let rows: Vec<Image> =
            conn.rows(&format!(
            "{IMAGE_COLS} WHERE substr(id, 1, length(CAST(?1 AS TEXT))) = ?1 ORDER BY id, newest DESC, name, version DESC"
        ), args![format!("sha256:{hex}")], image_from_row)?;
        Ok(match rows.first() {
            Some(first) if rows.iter().all(|i| i.id == first.id) => rows.into_iter().next(),
            _ => None,
        })
    }

    /// The newest version of every image name, by name.
    pub fn list_images(&self) -> Result<Vec<Image>, DbError> {
        self.images_where("WHERE newest ORDER BY name", args![])
    }

    /// Every version of every image name (by name, newest first); with
    /// `name`, only that name's.
    pub fn list_image_versions(&self, name: Option<&str>) -> Result<Vec<Image>, DbError> {
        match name {
            Some(n) => self.images_where("WHERE name = ?1 ORDER BY version DESC", args![n]),
            None => self.images_where("ORDER BY name, version DESC", args![]),
        }
    }

    /// Every version (of any name) whose content id is `id`.
    pub fn images_with_id(&self, id: &str) -> Result<Vec<Image>, DbError> {
        self.images_where("WHERE id = ?1 ORDER BY name, version", args![id])
    }

    fn images_where(&self, tail: &str, args: &[crate::sql::Value]) -> Result<Vec<Image>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(&format!("{IMAGE_COLS} {tail}"), args, image_from_row)?;
        Ok(rows)
    }

    /// Removes every version of an image name. Returns whether there was one.
    pub fn delete_image(&self, name: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM images WHERE name = ?1", args![name])? > 0)
    }

    /// Removes one version of an image name (the one before it becomes the
    /// newest if it was). Returns whether it existed.
    pub fn delete_image_version(&self, name: &str, version: u32) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM images WHERE name = ?1 AND version = ?2", args![name, version])? > 0)
    }

    // ---- sandboxes ----

    /// Inserts a new sandbox and its creation event in one transaction.
    ///
    /// A record with a user namespace gets its host range here, in the same
    /// transaction: the lowest slot no existing sandbox holds (written back
    /// into `rec`); none left is [`DbError::UsernsExhausted`].
    pub fn insert_sandbox(&self, rec: &mut SandboxRecord) -> Result<SandboxEvent, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if rec.sandbox.userns.is_some() {
            let slots = self.userns_slots.lock().unwrap_or_else(|p| p.into_inner()).clone();
            rec.sandbox.userns = Some(free_userns(&tx, slots)?);
        }
        let s = &rec.sandbox;
        tx.execute(
            &format!("INSERT INTO sandboxes ({SANDBOX_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32)"),
            args![
                s.id, s.name, s.state.as_str(), s.state_reason, s.state_detail, s.source, s.image_id, s.runtime,
                lifecycle_str(s.lifecycle), s.created_at, s.updated_at, s.expires_at, json(&s.limits), json(&s.env),
                s.hostname, json(&s.labels), s.init_pid, rec.init_start_time.map(|v| v as i64), s.oom_kills as i64,
                json(&rec.layers), json(&rec.image_config), s.ttl, s.base_checkpoint, s.head_checkpoint, s.fork_generation,
                json(&s.policy), s.inactive_since, s.tenant, s.allow_setuid as i64, s.userns.map(|u| u.host_base as i64),
                (s.tmp == strata_api::TmpStorage::Tmpfs) as i64, s.quarantine.as_ref().map(json)
            ],
        )
        .map_err(|e| if is_unique_violation(&e) { DbError::NameTaken(s.name.clone()) } else { e })?;
        let ev = insert_event(
            &tx,
            &s.id,
            None,
            &Transition {
                to: s.state,
                reason: &s.state_reason,
                detail: s.state_detail.as_deref(),
                duration_ms: 0,
                time: &s.created_at,
            },
        )?;
        fresh_usage(&tx, s)?;
        tx.commit()?;
        Ok(ev)
    }

    /// Records a state change (and the init handle that goes with it) plus its event, atomically.
    /// `expected_from` guards against racing transitions: the update applies only
    /// if the sandbox is still in that state; otherwise `Ok(None)`. Entering
    /// stopped/standby/archived from another state sets `inactive_since`;
    /// moving among them keeps it; leaving them clears it.
    pub fn transition(
        &self,
        id: &str,
        expected_from: SandboxState,
        t: &Transition<'_>,
        init: Option<(i32, u64)>,
    ) -> Result<Option<SandboxEvent>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let n = tx.execute(
            &format!(
                "UPDATE sandboxes SET state = ?1, state_reason = ?2, state_detail = ?3, updated_at = ?4, init_pid = ?5, init_start_time = ?6,
                 inactive_since = CASE WHEN ?1 IN {INACTIVE_STATES} THEN (CASE WHEN state IN {INACTIVE_STATES} THEN COALESCE(inactive_since, ?4) ELSE ?4 END) END
                 WHERE id = ?7 AND state = ?8"
            ),
            args![t.to.as_str(), t.reason, t.detail, t.time, init.map(|i| i.0), init.map(|i| i.1 as i64), id, expected_from.as_str()],
        )?;
        if n == 0 {
            return Ok(None);
        }
        let ev = insert_event(&tx, id, Some(expected_from), t)?;
        tx.commit()?;
        Ok(Some(ev))
    }

    /// Deletes a sandbox record and its leases, recording its final event: the
    /// destroy transition, with the same compare-and-set as [`Db::transition`]
    /// (`Ok(None)`, nothing deleted, when the sandbox is no longer in `from`).
    pub fn delete_sandbox(
        &self,
        id: &str,
        from: SandboxState,
        t: &Transition<'_>,
    ) -> Result<Option<SandboxEvent>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if tx.execute("DELETE FROM sandboxes WHERE id = ?1 AND state = ?2", args![id, from.as_str()])? == 0 {
            return Ok(None);
        }
        tx.execute("DELETE FROM leases WHERE sandbox_id = ?1", args![id])?;
        tx.execute("DELETE FROM previews WHERE sandbox_id = ?1", args![id])?;
        tx.execute("UPDATE usage SET destroyed_at = ?1 WHERE sandbox_id = ?2", args![t.time, id])?;
        let ev = insert_event(&tx, id, Some(from), t)?;
        tx.commit()?;
        Ok(Some(ev))
    }

    /// Ids of sandboxes that have a TTL deadline (checked by the TTL reaper).
    pub fn with_expiry(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let ids =
            conn.rows("SELECT id FROM sandboxes WHERE expires_at IS NOT NULL", args![], |r| r.get::<String>(0))?;
        Ok(ids)
    }

    /// The usage accumulators of the sandbox with exactly this id, destroyed or not.
    pub fn usage_by_id(&self, id: &str) -> Result<Option<UsageRecord>, DbError> {
        self.find_usage_in(id, None, true)
    }

    /// The usage accumulators of a sandbox, destroyed or not, by the key
    /// resolution of [`strata_core::ids`] among `scope`'s records (every
    /// tenant's for `None`): exact id, exact name (a live sandbox's first, else
    /// the newest destroyed one's), unique id prefix.
    pub fn find_usage(&self, key: &str, scope: Option<&str>) -> Result<Option<UsageRecord>, DbError> {
        self.find_usage_in(key, scope, false)
    }

    fn find_usage_in(&self, key: &str, scope: Option<&str>, id_only: bool) -> Result<Option<UsageRecord>, DbError> {
        let conn = self.conn();
        let keyed = Keyed {
            select: "SELECT record, destroyed_at, tenant FROM usage".into(),
            id: "sandbox_id",
            name: (!id_only).then_some(("name", "ORDER BY destroyed_at IS NULL DESC, created_at DESC")),
            tenant: "tenant",
        };
        let row = if id_only {
            conn.one("SELECT record, destroyed_at, tenant FROM usage WHERE sandbox_id = ?1", args![key], |r| {
                Ok((r.get::<String>(0)?, r.get::<Option<String>>(1)?, r.get::<String>(2)?))
            })?
        } else {
            keyed.resolve(&conn, key, scope, |r| {
                Ok((r.get::<String>(0)?, r.get::<Option<String>>(1)?, r.get::<String>(2)?))
            })?
        };
        row.map(|(rec, destroyed, tenant)| usage_from(&rec, destroyed, tenant)).transpose()
    }

    /// Every usage record, oldest first.
    pub fn list_usage(&self) -> Result<Vec<UsageRecord>, DbError> {
        let conn = self.conn();
        conn.rows("SELECT record, destroyed_at, tenant FROM usage ORDER BY created_at, sandbox_id", args![], |r| {
            usage_from(&r.get::<String>(0)?, r.get(1)?, r.get(2)?)
        })
    }

    /// Adds storage GB-hours by kind to many usage records in one transaction
    /// (records that do not exist are skipped).
    pub fn add_storage_usage(
        &self,
        accrued: &[(String, std::collections::BTreeMap<String, f64>)],
    ) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for (id, kinds) in accrued {
            let row: Option<(String, Option<String>, String)> =
                tx.one("SELECT record, destroyed_at, tenant FROM usage WHERE sandbox_id = ?1", args![id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
            let Some((rec, destroyed, tenant)) = row else { continue };
            let mut u = usage_from(&rec, destroyed, tenant)?;
            for (k, gbh) in kinds {
                *u.storage_gb_hours.entry(k.clone()).or_default() += gbh;
            }
            tx.execute("UPDATE usage SET record = ?1 WHERE sandbox_id = ?2", args![json(&u), id])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Ids of sandboxes with processes (running or paused).
    pub fn live_sandbox_ids(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let ids = conn
            .rows("SELECT id FROM sandboxes WHERE state IN ('running', 'paused')", args![], |r| r.get::<String>(0))?;
        Ok(ids)
    }

    /// Reads, changes and writes back the usage record of `id` in one transaction
    /// (no-op when there is none). Returns the updated record.
    pub fn update_usage(&self, id: &str, f: impl FnOnce(&mut UsageRecord)) -> Result<Option<UsageRecord>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let row: Option<(String, Option<String>, String)> =
            tx.one("SELECT record, destroyed_at, tenant FROM usage WHERE sandbox_id = ?1", args![id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        let Some((rec, destroyed, tenant)) = row else { return Ok(None) };
        let mut u = usage_from(&rec, destroyed, tenant)?;
        f(&mut u);
        tx.execute("UPDATE usage SET record = ?1 WHERE sandbox_id = ?2", args![json(&u), id])?;
        tx.commit()?;
        Ok(Some(u))
    }

    /// Records the compute that produced a checkpoint's state (its lineage's setup).
    pub fn set_checkpoint_setup(&self, checkpoint_id: &str, compute: &ComputeUsage) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT INTO checkpoint_setup (checkpoint_id, compute) VALUES (?1, ?2) ON CONFLICT (checkpoint_id) DO UPDATE SET compute = excluded.compute",
            args![checkpoint_id, json(compute)],
        )?;
        Ok(())
    }

    /// The compute that produced a checkpoint's state, when recorded.
    pub fn checkpoint_setup(&self, checkpoint_id: &str) -> Result<Option<ComputeUsage>, DbError> {
        let s: Option<String> = self.conn().one(
            "SELECT compute FROM checkpoint_setup WHERE checkpoint_id = ?1",
            args![checkpoint_id],
            |r| r.get(0),
        )?;
        s.map(|s| parse(&s, "checkpoint_setup.compute")).transpose()
    }

    /// Sets (or clears) the TTL deadline.
    pub fn set_expires_at(&self, id: &str, expires_at: Option<&str>) -> Result<(), DbError> {
        self.conn().execute("UPDATE sandboxes SET expires_at = ?1 WHERE id = ?2", args![expires_at, id])?;
        Ok(())
    }

    /// Records an event that is not a state change (e.g. an OOM kill inside a running sandbox).
    pub fn record_event(
        &self,
        id: &str,
        state: SandboxState,
        reason: &str,
        detail: Option<&str>,
        time: &str,
    ) -> Result<SandboxEvent, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let ev = insert_event(&tx, id, Some(state), &Transition { to: state, reason, detail, duration_ms: 0, time })?;
        tx.commit()?;
        Ok(ev)
    }

    /// Changes a sandbox's policy with `f`, read and written in one transaction.
    /// Returns the new policy, or `None` when there is no such sandbox.
    pub fn update_policy(
        &self,
        id: &str,
        f: impl FnOnce(&mut SandboxPolicy),
    ) -> Result<Option<SandboxPolicy>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let Some(stored) = tx.one("SELECT policy FROM sandboxes WHERE id = ?1", args![id], |r| r.get::<String>(0))?
        else {
            return Ok(None);
        };
        let mut policy: SandboxPolicy = parse(&stored, "policy")?;
        f(&mut policy);
        tx.execute("UPDATE sandboxes SET policy = ?1 WHERE id = ?2", args![json(&policy), id])?;
        tx.commit()?;
        Ok(Some(policy))
    }

    /// Places (`Some`) or lifts (`None`) the quarantine of a sandbox or a
    /// checkpoint (`checkpoint`). Whether the object exists.
    pub fn set_quarantine(
        &self,
        checkpoint: bool,
        id: &str,
        q: Option<&strata_api::Quarantine>,
    ) -> Result<bool, DbError> {
        let table = if checkpoint { "checkpoints" } else { "sandboxes" };
        let n = self
            .conn()
            .execute(&format!("UPDATE {table} SET quarantine = ?1 WHERE id = ?2"), args![q.map(json), id])?;
        Ok(n > 0)
    }

    /// Every quarantined sandbox and checkpoint (of every tenant).
    pub fn quarantined(&self) -> Result<Vec<strata_api::QuarantineEntry>, DbError> {
        let conn = self.conn();
        let mut out = Vec::new();
        for (kind, table) in [("sandbox", "sandboxes"), ("checkpoint", "checkpoints")] {
            let rows = conn.rows(
                &format!("SELECT id, name, tenant, quarantine FROM {table} WHERE quarantine IS NOT NULL ORDER BY id"),
                args![],
                |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<String>(2)?, r.get::<String>(3)?)),
            )?;
            for (id, name, tenant, q) in rows {
                let quarantine = parse(&q, "quarantine")?;
                out.push(strata_api::QuarantineEntry { kind: kind.into(), id, name, tenant, quarantine });
            }
        }
        Ok(out)
    }

    /// The time of the sandbox's most recent event with `reason` (e.g. its last `checked`).
    pub fn last_event_time(&self, id: &str, reason: &str) -> Result<Option<String>, DbError> {
        self.conn().one(
            "SELECT time FROM events WHERE sandbox_id = ?1 AND reason = ?2 ORDER BY seq DESC LIMIT 1",
            args![id, reason],
            |r| r.get::<String>(0),
        )
    }

    /// Updates the OOM-kill counter.
    pub fn set_oom_kills(&self, id: &str, n: u64) -> Result<(), DbError> {
        self.conn().execute("UPDATE sandboxes SET oom_kills = ?1 WHERE id = ?2", args![n as i64, id])?;
        Ok(())
    }

    /// The sandbox with exactly this id (for ids the daemon itself holds; a
    /// caller's key goes through [`Db::find_sandbox`]).
    pub fn sandbox_by_id(&self, id: &str) -> Result<Option<SandboxRecord>, DbError> {
        let conn = self.conn();
        conn.one(&format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"), args![id], sandbox_from_row)
    }

    /// The sandbox a caller's key names, by the resolution of
    /// [`strata_core::ids`] among the sandboxes of `scope` (every tenant's for
    /// `None`): exact id, exact name, id prefix unique among them.
    pub fn find_sandbox(&self, key: &str, scope: Option<&str>) -> Result<Option<SandboxRecord>, DbError> {
        let conn = self.conn();
        sandboxes_keyed(SANDBOX_COLUMNS).resolve(&conn, key, scope, sandbox_from_row)
    }

    /// The id of the sandbox [`Db::find_sandbox`] resolves `key` to (cheaper).
    pub fn resolve_sandbox_id(&self, key: &str, scope: Option<&str>) -> Result<Option<String>, DbError> {
        let conn = self.conn();
        sandboxes_keyed("id").resolve(&conn, key, scope, |r| r.get(0))
    }

    /// Whether a sandbox (of any tenant) has exactly this name: names are unique daemon-wide.
    pub fn sandbox_name_taken(&self, name: &str) -> Result<bool, DbError> {
        self.conn().exists("SELECT 1 FROM sandboxes WHERE name = ?1", args![name])
    }

    /// All sandboxes, oldest first.
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxRecord>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes ORDER BY created_at, id"),
            args![],
            sandbox_from_row,
        )?;
        Ok(rows)
    }

    /// The warm-pool sandboxes ([`POOL_TENANT`]), oldest first.
    pub fn pooled_sandboxes(&self) -> Result<Vec<SandboxRecord>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE tenant = '{POOL_TENANT}' ORDER BY created_at, id"),
            args![],
            sandbox_from_row,
        )?;
        Ok(rows)
    }

    /// Gives a running warm-pool sandbox to its adopter: `rec` (same id) carries
    /// who and what it now is (tenant, name, hostname, source, lifecycle,
    /// policy, TTL, limits, environment, labels, creation time; the image id
    /// and process defaults its source names, which an image of the same
    /// layers under another name may set otherwise). Checked and
    /// written in one transaction with the `adopted` event and a fresh usage
    /// record: `Ok(None)` when the sandbox is no longer a running pool member
    /// (adopted by another create, or its init ended), and nothing changes.
    pub fn adopt_pooled(&self, rec: &SandboxRecord, detail: &str) -> Result<Option<SandboxEvent>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let s = &rec.sandbox;
        let changed = tx
            .execute(
                &format!(
                    "UPDATE sandboxes SET tenant = ?2, name = ?3, hostname = ?4, source = ?5, lifecycle = ?6, created_at = ?7, \
                     updated_at = ?7, policy = ?8, ttl = ?9, expires_at = ?10, limits = ?11, env = ?12, labels = ?13, \
                     state_reason = ?14, state_detail = NULL, image_id = ?15, image_config = ?16 \
                     WHERE id = ?1 AND tenant = '{POOL_TENANT}' AND state = 'running'"
                ),
                args![
                    s.id, s.tenant, s.name, s.hostname, s.source, lifecycle_str(s.lifecycle), s.created_at, json(&s.policy),
                    s.ttl, s.expires_at, json(&s.limits), json(&s.env), json(&s.labels), s.state_reason, s.image_id,
                    json(&rec.image_config)
                ],
            )
            .map_err(|e| if is_unique_violation(&e) { DbError::NameTaken(s.name.clone()) } else { e })?;
        if changed == 0 {
            return Ok(None);
        }
        let ev = insert_event(
            &tx,
            &s.id,
            Some(SandboxState::Running),
            &Transition {
                to: SandboxState::Running,
                reason: &s.state_reason,
                detail: Some(detail),
                duration_ms: 0,
                time: &s.created_at,
            },
        )?;
        fresh_usage(&tx, s)?;
        tx.commit()?;
        Ok(Some(ev))
    }

    /// Every sandbox id.
    pub fn sandbox_ids(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let ids = conn.rows("SELECT id FROM sandboxes", args![], |r| r.get::<String>(0))?;
        Ok(ids)
    }

    /// Sandboxes the lifecycle policy may act on: those with processes, and
    /// parked ones with an `archive_after` or `delete_after` limit. (Parked
    /// sandboxes without one are never due, so a host with many sandboxes in
    /// standby stays idle.)
    pub fn list_policy_candidates(&self) -> Result<Vec<SandboxRecord>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(&format!(
            "SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE tenant <> '{POOL_TENANT}' AND (state IN ('running', 'paused') \
             OR policy ->> 'archive_after' IS NOT NULL OR policy ->> 'delete_after' IS NOT NULL) \
             ORDER BY created_at, id"
        ), args![], sandbox_from_row)?;
        Ok(rows)
    }

    // ---- leases ----

    /// Records a new lease.
    pub fn insert_lease(&self, lease: &Lease) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT INTO leases (id, sandbox_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
            args![lease.id, lease.sandbox_id, lease.created_at, lease.expires_at],
        )?;
        Ok(())
    }

    /// One lease of a sandbox.
    pub fn get_lease(&self, sandbox_id: &str, id: &str) -> Result<Option<Lease>, DbError> {
        self.conn().one(
            "SELECT id, sandbox_id, created_at, expires_at FROM leases WHERE id = ?1 AND sandbox_id = ?2",
            args![id, sandbox_id],
            lease_from_row,
        )
    }

    /// Moves a lease's expiry. Returns the updated lease, or `None` when there is none.
    pub fn renew_lease(&self, sandbox_id: &str, id: &str, expires_at: &str) -> Result<Option<Lease>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE leases SET expires_at = ?1 WHERE id = ?2 AND sandbox_id = ?3",
            args![expires_at, id, sandbox_id],
        )?;
        let lease = tx.one(
            "SELECT id, sandbox_id, created_at, expires_at FROM leases WHERE id = ?1 AND sandbox_id = ?2",
            args![id, sandbox_id],
            lease_from_row,
        )?;
        tx.commit()?;
        Ok(lease)
    }

    /// Removes leases, each named by its sandbox and its id (a lease id alone
    /// never selects a row: the lease must be the sandbox's). Returns how many existed.
    pub fn delete_leases(&self, leases: &[(&str, &str)]) -> Result<usize, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut n = 0;
        for (sandbox_id, id) in leases {
            n += tx.execute("DELETE FROM leases WHERE id = ?1 AND sandbox_id = ?2", args![id, sandbox_id])?;
        }
        tx.commit()?;
        Ok(n)
    }

    /// Leases (of one sandbox, or all), oldest first, expired ones included.
    pub fn list_leases(&self, sandbox_id: Option<&str>) -> Result<Vec<Lease>, DbError> {
        let conn = self.conn();
        let rows = conn.rows("SELECT id, sandbox_id, created_at, expires_at FROM leases WHERE CAST(?1 AS TEXT) IS NULL OR sandbox_id = ?1 ORDER BY created_at, id", args![sandbox_id], lease_from_row)?;
        Ok(rows)
    }

    // ---- checkpoints ----

    /// Records a checkpoint and makes it the sandbox's head, atomically. Its
    /// tenant is the sandbox's (so automatic checkpoints inherit it too); `c.tenant`
    /// only counts when the sandbox record is gone.
    pub fn insert_checkpoint(&self, c: &Checkpoint, image_config: &ImageConfig) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO checkpoints (id, name, sandbox_id, parent, layer, layer_size, layers, image, image_id, image_config, changed_paths, labels, created_at, frozen_ms, duration_ms, expires_at, pinned, tenant, capabilities, processes, isolation, userns, tmp_tmpfs, quarantine)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, COALESCE((SELECT tenant FROM sandboxes WHERE id = ?3), ?18), ?19, ?20, ?21, ?22, ?23, ?24)",
            args![
                c.id, c.name, c.sandbox_id, c.parent, c.layer, c.layer_size as i64, json(&c.layers), c.image, c.image_id, json(image_config),
                c.changed_paths as i64, json(&c.labels), c.created_at, c.frozen_ms as i64, c.duration_ms as i64, c.expires_at, c.pinned as i64, c.tenant,
                json(&c.capabilities), c.processes.as_ref().map(json), c.isolation.as_str(), c.userns as i64,
                (c.tmp == strata_api::TmpStorage::Tmpfs) as i64, c.quarantine.as_ref().map(json)
            ],
        )
        .map_err(|e| if is_unique_violation(&e) { DbError::NameTaken(c.name.clone()) } else { e })?;
        tx.execute("UPDATE sandboxes SET head_checkpoint = ?1 WHERE id = ?2", args![c.id, c.sandbox_id])?;
        tx.commit()?;
        Ok(())
    }

    /// The checkpoint with exactly this id, with its image config (for ids the
    /// daemon itself holds; a caller's key goes through [`Db::find_checkpoint`]).
    pub fn checkpoint_by_id(&self, id: &str) -> Result<Option<(Checkpoint, ImageConfig)>, DbError> {
        let conn = self.conn();
        conn.one(&format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = ?1"), args![id], checkpoint_from_row)
    }

    /// The checkpoint a caller's key names, with its image config, by the
    /// resolution of [`strata_core::ids`] among the checkpoints of `scope`
    /// (every tenant's for `None`).
    pub fn find_checkpoint(
        &self,
        key: &str,
        scope: Option<&str>,
    ) -> Result<Option<(Checkpoint, ImageConfig)>, DbError> {
        let conn = self.conn();
        checkpoints_keyed().resolve(&conn, key, scope, checkpoint_from_row)
    }

    /// Whether a checkpoint (of any tenant) has exactly this name: names are unique daemon-wide.
    pub fn checkpoint_name_taken(&self, name: &str) -> Result<bool, DbError> {
        self.conn().exists("SELECT 1 FROM checkpoints WHERE name = ?1", args![name])
    }

    /// Checkpoints (of one sandbox, or all), oldest first.
    pub fn list_checkpoints(&self, sandbox_id: Option<&str>) -> Result<Vec<Checkpoint>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            &format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE CAST(?1 AS TEXT) IS NULL OR sandbox_id = ?1 ORDER BY created_at, id"
        ),
            args![sandbox_id],
            checkpoint_from_row,
        )?;
        Ok(rows.into_iter().map(|(c, _)| c).collect())
    }

    /// Retires a checkpoint that something still builds on: its labels
    /// (with the retirement mark) and expiry are replaced and it is unpinned,
    /// in one statement, so the retention GC removes it once nothing needs it.
    /// Returns whether it existed.
    pub fn retire_checkpoint(
        &self,
        id: &str,
        labels: &std::collections::BTreeMap<String, String>,
        expires_at: &str,
    ) -> Result<bool, DbError> {
        Ok(self.conn().execute(
            "UPDATE checkpoints SET labels = ?1, expires_at = ?2, pinned = 0 WHERE id = ?3",
            args![json(labels), expires_at, id],
        )? > 0)
    }

    /// Deletes a checkpoint record. Returns whether it existed.
    pub fn delete_checkpoint(&self, id: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM checkpoints WHERE id = ?1", args![id])? > 0)
    }

    /// Points a sandbox at a new layer chain (restore), atomically with its lineage pointers.
    pub fn set_chain(
        &self,
        id: &str,
        layers: &[String],
        image_config: &ImageConfig,
        base: Option<&str>,
        head: Option<&str>,
    ) -> Result<(), DbError> {
        self.conn().execute(
            "UPDATE sandboxes SET layers = ?1, image_config = ?2, base_checkpoint = ?3, head_checkpoint = ?4 WHERE id = ?5",
            args![json(&layers), json(image_config), base, head, id],
        )?;
        Ok(())
    }

    /// Moves a sandbox onto another image version (a rebase): its layer chain,
    /// image id and process defaults in one statement; its head checkpoint is
    /// cleared (that checkpoint's chain is on the old base: the next
    /// checkpoint seals the whole writable layer on the new one).
    pub fn set_base(
        &self,
        id: &str,
        layers: &[String],
        image_id: &str,
        image_config: &ImageConfig,
    ) -> Result<(), DbError> {
        self.conn().execute(
            "UPDATE sandboxes SET layers = ?1, image_id = ?2, image_config = ?3, head_checkpoint = NULL WHERE id = ?4",
            args![json(&layers), image_id, json(image_config), id],
        )?;
        Ok(())
    }

    // ---- templates and build cache ----

    /// Registers (or with `replace`, re-points) a template at a checkpoint. The
    /// template belongs to the checkpoint's tenant.
    pub fn put_template(&self, name: &str, checkpoint: &str, time: &str, replace: bool) -> Result<(), DbError> {
        // Re-pointed: what described the old content (its build, accepted findings, last
        // check) goes; the template's check policy stays.
        let on_conflict = match replace {
            true => " ON CONFLICT (name) DO UPDATE SET checkpoint = excluded.checkpoint, created_at = excluded.created_at, tenant = excluded.tenant, accepted_findings = NULL, build = NULL, last_check = NULL",
            false => "",
        };
        self.conn()
            .execute(
                &format!("INSERT INTO templates (name, checkpoint, created_at, tenant) VALUES (?1, ?2, ?3, COALESCE((SELECT tenant FROM checkpoints WHERE id = ?2), 'default')){on_conflict}"),
                args![name, checkpoint, time],
            )
            .map_err(|e| if is_unique_violation(&e) { DbError::NameTaken(name.to_string()) } else { e })?;
        Ok(())
    }

    /// A template's checkpoint id and creation time.
    pub fn get_template(&self, name: &str) -> Result<Option<(String, String)>, DbError> {
        self.conn().one("SELECT checkpoint, created_at FROM templates WHERE name = ?1", args![name], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
    }

    /// All templates: (name, checkpoint, created_at).
    pub fn list_templates(&self) -> Result<Vec<(String, String, String)>, DbError> {
        let conn = self.conn();
        let rows = conn.rows("SELECT name, checkpoint, created_at FROM templates ORDER BY name", args![], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
        Ok(rows)
    }

    /// The tenant of a template, if it exists.
    pub fn template_tenant(&self, name: &str) -> Result<Option<String>, DbError> {
        self.conn().one("SELECT tenant FROM templates WHERE name = ?1", args![name], |r| r.get(0))
    }

    /// Records (JSON) the scan findings accepted when the template was promoted.
    pub fn set_template_acceptance(&self, name: &str, acceptance: &str) -> Result<(), DbError> {
        self.conn().execute("UPDATE templates SET accepted_findings = ?1 WHERE name = ?2", args![acceptance, name])?;
        Ok(())
    }

    /// The accepted scan findings (JSON) of a template, if any.
    pub fn template_acceptance(&self, name: &str) -> Result<Option<String>, DbError> {
        Ok(self
            .conn()
            .one("SELECT accepted_findings FROM templates WHERE name = ?1", args![name], |r| {
                r.get::<Option<String>>(0)
            })?
            .flatten())
    }

    // ---- audit log ----

    /// Appends an audit entry, chained to the last one (in one transaction).
    pub fn append_audit(&self, n: &NewAudit<'_>) -> Result<AuditEntry, DbError> {
        let NewAudit { time, actor, tenant, method, route, target, status } = *n;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let last: Option<(i64, String)> =
            tx.one("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1", args![], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let (seq, prev_hash) = last.map(|(s, h)| (s + 1, h)).unwrap_or((1, AUDIT_GENESIS.to_string()));
        let mut e = AuditEntry {
            seq,
            time: time.into(),
            actor: actor.into(),
            tenant: tenant.map(str::to_string),
            method: method.into(),
            route: route.into(),
            target: target.map(str::to_string),
            status,
            prev_hash,
            hash: String::new(),
        };
        e.hash = audit_hash(&e);
        tx.execute(
            "INSERT INTO audit (seq, time, actor, method, route, target, status, prev_hash, hash, tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            args![e.seq, e.time, e.actor, e.method, e.route, e.target, e.status, e.prev_hash, e.hash, e.tenant],
        )?;
        tx.commit()?;
        Ok(e)
    }

    /// Audit entries in seq order: all of them, or the last `limit`.
    pub fn audit_entries(&self, limit: Option<u32>) -> Result<Vec<AuditEntry>, DbError> {
        self.audit_entries_of(None, limit)
    }

    /// Audit entries in seq order (of one tenant, or all): all of them, or the last `limit`.
    pub fn audit_entries_of(&self, tenant: Option<&str>, limit: Option<u32>) -> Result<Vec<AuditEntry>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            "SELECT seq, time, actor, method, route, target, status, prev_hash, hash, tenant FROM (SELECT * FROM audit WHERE CAST(?2 AS TEXT) IS NULL OR tenant = ?2 ORDER BY seq DESC LIMIT ?1) AS a ORDER BY seq",
        args![limit.map_or(i64::MAX, i64::from), tenant], |r| {
            Ok(AuditEntry {
                seq: r.get(0)?,
                time: r.get(1)?,
                actor: r.get(2)?,
                tenant: r.get(9)?,
                method: r.get(3)?,
                route: r.get(4)?,
                target: r.get(5)?,
                status: r.get(6)?,
                prev_hash: r.get(7)?,
                hash: r.get(8)?,
            })
        })?;
        Ok(rows)
    }

    /// Removes a template. Returns whether it existed.
    pub fn delete_template(&self, name: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM templates WHERE name = ?1", args![name])? > 0)
    }

    /// Records the build a template was made by (JSON the engine reads back
    /// for a rebuild); `None` for a template promoted from a checkpoint.
    pub fn set_template_build(&self, name: &str, build: Option<&str>) -> Result<(), DbError> {
        self.conn().execute("UPDATE templates SET build = ?2 WHERE name = ?1", args![name, build])?;
        Ok(())
    }

    /// Sets a template's checks at set times (`check_every` `None`: none).
    /// Returns whether the template exists.
    pub fn set_template_checks(
        &self,
        name: &str,
        check_every: Option<&str>,
        on_findings: &str,
    ) -> Result<bool, DbError> {
        Ok(self.conn().execute(
            "UPDATE templates SET check_every = ?2, on_findings = ?3 WHERE name = ?1",
            args![name, check_every, on_findings],
        )? > 0)
    }

    /// A template's checks: its `check_every`, `on_findings` and the last
    /// check's report (JSON), if it exists.
    pub fn template_checks(&self, name: &str) -> Result<Option<TemplateChecks>, DbError> {
        self.conn().one(
            "SELECT check_every, on_findings, last_check FROM templates WHERE name = ?1",
            args![name],
            |r| Ok(TemplateChecks { check_every: r.get(0)?, on_findings: r.get(1)?, last_check: r.get(2)? }),
        )
    }

    /// Records a template's last check (JSON), unless it was re-pointed at
    /// another checkpoint meanwhile. Returns whether it was recorded.
    pub fn set_template_last_check(&self, name: &str, checkpoint: &str, report: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute(
            "UPDATE templates SET last_check = ?3 WHERE name = ?1 AND checkpoint = ?2",
            args![name, checkpoint, report],
        )? > 0)
    }

    /// The build a template was made by, when it was built from a build file.
    pub fn template_build(&self, name: &str) -> Result<Option<String>, DbError> {
        Ok(self.conn().one("SELECT build FROM templates WHERE name = ?1", args![name], |r| r.get(0))?.flatten())
    }

    /// The checkpoint cached for a build step key.
    pub fn cached_step(&self, key: &str) -> Result<Option<String>, DbError> {
        self.conn().one("SELECT checkpoint FROM build_cache WHERE key = ?1", args![key], |r| r.get(0))
    }

    /// Caches a build step's checkpoint.
    pub fn cache_step(&self, key: &str, checkpoint: &str, time: &str) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT INTO build_cache (key, checkpoint, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO UPDATE SET checkpoint = excluded.checkpoint, created_at = excluded.created_at",
            args![key, checkpoint, time],
        )?;
        Ok(())
    }

    /// Checkpoints referenced by the build cache.
    pub fn cached_checkpoints(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let rows = conn.rows("SELECT checkpoint FROM build_cache", args![], |r| r.get(0))?;
        Ok(rows)
    }

    /// Replaces a sandbox's process defaults (template builds: ENV, WORKDIR).
    pub fn set_image_config(&self, id: &str, config: &ImageConfig) -> Result<(), DbError> {
        self.conn().execute("UPDATE sandboxes SET image_config = ?1 WHERE id = ?2", args![json(config), id])?;
        Ok(())
    }

    /// Events, optionally of one sandbox, with `seq > after`, oldest first, at most `limit`.
    pub fn events(&self, sandbox_id: Option<&str>, after: i64, limit: u32) -> Result<Vec<SandboxEvent>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            "SELECT seq, sandbox_id, time, from_state, to_state, reason, detail, duration_ms FROM events WHERE (CAST(?1 AS TEXT) IS NULL OR sandbox_id = ?1) AND seq > ?2 ORDER BY seq LIMIT ?3",
        args![sandbox_id, after, limit], event_of_row)?;
        Ok(rows)
    }

    /// Like [`Db::events`], only of sandboxes (live or destroyed) of `tenant`.
    pub fn events_of_tenant(
        &self,
        tenant: &str,
        sandbox_id: Option<&str>,
        after: i64,
        limit: u32,
    ) -> Result<Vec<SandboxEvent>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            "SELECT seq, sandbox_id, time, from_state, to_state, reason, detail, duration_ms FROM events
             WHERE (CAST(?1 AS TEXT) IS NULL OR sandbox_id = ?1) AND seq > ?2 AND sandbox_id IN (SELECT sandbox_id FROM usage WHERE tenant = ?4) ORDER BY seq LIMIT ?3",
        args![sandbox_id, after, limit, tenant], event_of_row)?;
        Ok(rows)
    }

    /// The tenant of a sandbox id, live or destroyed (from its usage record, which outlives it).
    pub fn sandbox_tenant_by_id(&self, id: &str) -> Result<Option<String>, DbError> {
        self.conn().one("SELECT tenant FROM usage WHERE sandbox_id = ?1", args![id], |r| r.get(0))
    }

    /// User-chosen names that could be read as an id or an id prefix
    /// ([`strata_core::ids::looks_like_id`]), refused for new objects since the
    /// name rule; records from before it keep them (they resolve by id first).
    /// A sandbox named after its own id (the default name) is not listed.
    pub fn names_like_ids(&self) -> Result<Vec<NameLikeId>, DbError> {
        let conn = self.conn();
        let mut out = Vec::new();
        for (kind, sql) in [
            ("sandbox", "SELECT id, name, tenant FROM sandboxes WHERE name != id"),
            ("checkpoint", "SELECT id, name, tenant FROM checkpoints"),
            ("template", "SELECT checkpoint, name, tenant FROM templates"),
            ("pipeline_run", "SELECT id, name, tenant FROM pipeline_runs"),
            ("token", "SELECT id, name, tenant FROM tokens WHERE revoked_at IS NULL"),
            ("image", "SELECT id, name, NULL FROM images"),
        ] {
            let rows = conn
                .rows(sql, args![], |r| Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<Option<String>>(2)?)))?;
            for (id, name, tenant) in rows {
                if ids::looks_like_id(&name) {
                    out.push(NameLikeId { kind: kind.to_string(), id, name, tenant });
                }
            }
        }
        Ok(out)
    }

    /// The event that destroyed sandbox `id` (its record is gone; the event log
    /// remembers it), if it was destroyed.
    pub fn destroyed_event(&self, id: &str) -> Result<Option<SandboxEvent>, DbError> {
        let conn = self.conn();
        let ev = conn
            .one(
                "SELECT seq, sandbox_id, time, from_state, to_state, reason, detail, duration_ms FROM events WHERE sandbox_id = ?1 AND to_state = ?2 ORDER BY seq DESC LIMIT 1",
                args![id, SandboxState::Destroyed.as_str()],
                event_of_row,
            )?;
        Ok(ev)
    }
}

/// An `events` row (columns as selected by [`Db::events`]).
fn event_of_row(r: &Row) -> Result<SandboxEvent, DbError> {
    Ok(SandboxEvent {
        seq: r.get(0)?,
        sandbox_id: r.get(1)?,
        time: r.get(2)?,
        from: r.get::<Option<String>>(3)?.map(|s| state_of(&s)),
        to: state_of(&r.get::<String>(4)?),
        reason: r.get(5)?,
        detail: r.get(6)?,
        duration_ms: r.get::<i64>(7)? as u64,
    })
}

/// Starts `s`'s usage record afresh (a new sandbox, or a pool sandbox adopted).
fn fresh_usage(tx: &Tx<'_>, s: &Sandbox) -> Result<(), DbError> {
    let usage = UsageRecord {
        sandbox_id: s.id.clone(),
        tenant: s.tenant.clone(),
        name: s.name.clone(),
        source: s.source.clone(),
        base_checkpoint: s.base_checkpoint.clone(),
        created_at: s.created_at.clone(),
        updated_at: s.created_at.clone(),
        ..Default::default()
    };
    tx.execute(
        "INSERT INTO usage (sandbox_id, name, created_at, record, tenant) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (sandbox_id) DO UPDATE SET name = excluded.name, created_at = excluded.created_at, \
         destroyed_at = NULL, record = excluded.record, tenant = excluded.tenant",
        args![s.id, s.name, s.created_at, json(&usage), s.tenant],
    )?;
    Ok(())
}

fn insert_event(
    tx: &Tx<'_>,
    id: &str,
    from: Option<SandboxState>,
    t: &Transition<'_>,
) -> Result<SandboxEvent, DbError> {
    let seq = tx.one(
        "INSERT INTO events (sandbox_id, time, from_state, to_state, reason, detail, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING seq",
        args![id, t.time, from.map(|f| f.as_str()), t.to.as_str(), t.reason, t.detail, t.duration_ms as i64],
        |r| r.get::<i64>(0),
    )?;
    Ok(SandboxEvent {
        seq: seq.unwrap_or_default(),
        sandbox_id: id.to_string(),
        time: t.time.to_string(),
        from,
        to: t.to,
        reason: t.reason.to_string(),
        detail: t.detail.map(str::to_string),
        duration_ms: t.duration_ms,
    })
}

/// Pipeline runs (migration 8).
impl Db {
    /// Stores a new run with its stages, or replaces a run's state and all its
    /// stage records, in one transaction.
    pub fn put_pipeline_run(&self, run: &PipelineRun) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO pipeline_runs (id, name, state, reason, spec, created_at, updated_at, tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT(id) DO UPDATE SET state = excluded.state, reason = excluded.reason, updated_at = excluded.updated_at",
            args![run.id, run.name, run.state.as_str(), run.reason, json(&run.spec), run.created_at, run.updated_at, run.tenant],
        )?;
        for (i, stage) in run.stages.iter().enumerate() {
            tx.execute(
                "INSERT INTO pipeline_stages (run_id, idx, name, record) VALUES (?1, ?2, ?3, ?4) ON CONFLICT(run_id, idx) DO UPDATE SET record = excluded.record",
                args![run.id, i as i64, stage.name, json(stage)],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The run with exactly this id.
    pub fn pipeline_run_by_id(&self, id: &str) -> Result<Option<PipelineRun>, DbError> {
        self.find_pipeline_run_in(id, None, true)
    }

    /// The run a caller's key names: its exact id, else an id prefix unique
    /// among the runs of `scope` (every tenant's for `None`). Runs are not
    /// resolved by name (several runs of one spec share it).
    pub fn find_pipeline_run(&self, key: &str, scope: Option<&str>) -> Result<Option<PipelineRun>, DbError> {
        self.find_pipeline_run_in(key, scope, false)
    }

    fn find_pipeline_run_in(
        &self,
        key: &str,
        scope: Option<&str>,
        id_only: bool,
    ) -> Result<Option<PipelineRun>, DbError> {
        type RunRow = (String, String, String, Option<String>, String, String, String, String);
        let conn = self.conn();
        let keyed = Keyed {
            select: "SELECT id, name, state, reason, spec, created_at, updated_at, tenant FROM pipeline_runs".into(),
            id: "id",
            name: None,
            tenant: "tenant",
        };
        let map = |r: &Row| -> Result<RunRow, DbError> {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
        };
        let row = if id_only {
            conn.one(&format!("{} WHERE id = ?1", keyed.select), args![key], map)?
        } else {
            keyed.resolve(&conn, key, scope, map)?
        };
        let Some((id, name, state, reason, spec, created_at, updated_at, tenant)) = row else { return Ok(None) };
        let stages =
            conn.rows("SELECT record FROM pipeline_stages WHERE run_id = ?1 ORDER BY idx", args![id], |r| {
                r.get::<String>(0)
            })?;
        let stages = stages.iter().map(|s| parse(s, "pipeline_stages.record")).collect::<Result<Vec<_>, _>>()?;
        let state = parse(&format!("\"{state}\""), "pipeline_runs.state")?;
        Ok(Some(PipelineRun {
            id,
            tenant,
            name,
            state,
            reason,
            created_at,
            updated_at,
            spec: parse(&spec, "pipeline_runs.spec")?,
            stages,
        }))
    }

    /// Ids of every run, newest first.
    pub fn list_pipeline_run_ids(&self) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let ids =
            conn.rows("SELECT id FROM pipeline_runs ORDER BY created_at DESC, id", args![], |r| r.get::<String>(0))?;
        Ok(ids)
    }

    /// Marks every `running` run `interrupted` (at daemon start: nothing runs them
    /// any more), together with its running stages' records; returns their ids.
    pub fn interrupt_pipeline_runs(&self, reason: &str, time: &str) -> Result<Vec<String>, DbError> {
        let ids: Vec<String> = {
            let conn = self.conn();

            conn.rows("SELECT id FROM pipeline_runs WHERE state = 'running'", args![], |r| r.get::<String>(0))?
        };
        for id in &ids {
            if let Some(mut run) = self.pipeline_run_by_id(id)? {
                let Ok(next) = strata_core::lifecycle::pipeline::next_run_state(
                    run.state,
                    strata_core::lifecycle::pipeline::RunAction::Interrupt,
                ) else {
                    continue;
                };
                run.state = next;
                run.reason = Some(reason.to_string());
                run.updated_at = time.to_string();
                self.put_pipeline_run(&run)?;
            }
        }
        Ok(ids)
    }
}

fn token_from_row(r: &Row) -> Result<TokenInfo, DbError> {
    Ok(TokenInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        tenant: r.get(2)?,
        created_at: r.get(3)?,
        last_used_at: r.get(4)?,
        expires_at: r.get(5)?,
        revoked_at: r.get(6)?,
    })
}

const TOKEN_COLUMNS: &str = "id, name, tenant, created_at, last_used_at, expires_at, revoked_at";

/// API tokens (migration 9). Only the SHA-256 of a secret is stored.
impl Db {
    /// Stores a new token; a live token of the same name in the tenant is [`DbError::NameTaken`].
    pub fn insert_token(&self, t: &TokenInfo, secret_sha256: &str) -> Result<(), DbError> {
        self.conn()
            .execute(
                &format!("INSERT INTO tokens ({TOKEN_COLUMNS}, secret_sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"),
                args![t.id, t.name, t.tenant, t.created_at, t.last_used_at, t.expires_at, t.revoked_at, secret_sha256],
            )
            .map_err(|e| {
                if is_unique_violation(&e) {
                    DbError::NameTaken(format!("{}/{}", t.tenant, t.name))
                } else {
                    e
                }
            })?;
        Ok(())
    }

    /// The token whose secret hashes to `secret_sha256` (revoked and expired ones included: the caller decides).
    pub fn token_by_hash(&self, secret_sha256: &str) -> Result<Option<TokenInfo>, DbError> {
        let conn = self.conn();
        conn.one(
            &format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE secret_sha256 = ?1"),
            args![secret_sha256],
            token_from_row,
        )
    }

    /// Tokens (of one tenant, or all), oldest first; revoked ones only with `include_revoked`.
    pub fn list_tokens(&self, tenant: Option<&str>, include_revoked: bool) -> Result<Vec<TokenInfo>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens WHERE (CAST(?1 AS TEXT) IS NULL OR tenant = ?1) AND (?2 OR revoked_at IS NULL) ORDER BY created_at, id"
        ), args![tenant, include_revoked], token_from_row)?;
        Ok(rows)
    }

    /// Tokens matching an id, or the name of a live token (in `tenant` when given).
    pub fn find_tokens(&self, id_or_name: &str, tenant: Option<&str>) -> Result<Vec<TokenInfo>, DbError> {
        let conn = self.conn();
        let by_id = conn.one(
            &format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?1 AND (CAST(?2 AS TEXT) IS NULL OR tenant = ?2)"),
            args![id_or_name, tenant],
            token_from_row,
        )?;
        if let Some(t) = by_id {
            return Ok(vec![t]);
        }
        let rows = conn.rows(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE name = ?1 AND revoked_at IS NULL AND (CAST(?2 AS TEXT) IS NULL OR tenant = ?2) ORDER BY tenant"), args![id_or_name, tenant], token_from_row)?;
        Ok(rows)
    }

    /// Revokes a token (keeping the first revocation time). Returns it, or `None` when unknown.
    pub fn revoke_token(&self, id: &str, time: &str) -> Result<Option<TokenInfo>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2", args![time, id])?;
        let t = tx.one(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE id = ?1"), args![id], token_from_row)?;
        tx.commit()?;
        Ok(t)
    }

    /// Sets a token's `last_used_at` to `now` unless it was set at or after `stale_before` (one write a minute at most).
    pub fn touch_token(&self, id: &str, now: &str, stale_before: &str) -> Result<(), DbError> {
        self.conn().execute(
            "UPDATE tokens SET last_used_at = ?1 WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at < ?3)",
            args![now, id, stale_before],
        )?;
        Ok(())
    }
}

fn approval_from_row(r: &Row) -> Result<Approval, DbError> {
    let record: String = r.get(0)?;
    parse(&record, "approvals.record")
}

/// The Rule of Two's approval queue (migration 10).
impl Db {
    /// Stores a new approval.
    pub fn insert_approval(&self, a: &Approval) -> Result<(), DbError> {
        self.conn().execute(
            "INSERT INTO approvals (id, tenant, state, fingerprint, expires_at, record) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            args![a.id, a.tenant, a.state.as_str(), a.fingerprint, a.expires_at, json(a)],
        )?;
        Ok(())
    }

    /// An approval by id.
    pub fn get_approval(&self, id: &str) -> Result<Option<Approval>, DbError> {
        let conn = self.conn();
        conn.one("SELECT record FROM approvals WHERE id = ?1", args![id], approval_from_row)
    }

    /// Approvals (of one tenant, or all; in one state, or any), oldest first.
    pub fn list_approvals(&self, tenant: Option<&str>, state: Option<ApprovalState>) -> Result<Vec<Approval>, DbError> {
        let conn = self.conn();
        let rows = conn.rows("SELECT record FROM approvals WHERE (CAST(?1 AS TEXT) IS NULL OR tenant = ?1) AND (CAST(?2 AS TEXT) IS NULL OR state = ?2) ORDER BY rowid", args![tenant, state.map(ApprovalState::as_str)], approval_from_row)?;
        Ok(rows)
    }

    /// The pending or approved approval of `tenant` for exactly this request (`fingerprint`), if any.
    pub fn open_approval(&self, tenant: &str, fingerprint: &str) -> Result<Option<Approval>, DbError> {
        let conn = self.conn();
        conn.one(
            "SELECT record FROM approvals WHERE tenant = ?1 AND fingerprint = ?2 AND state IN ('pending', 'approved') ORDER BY rowid DESC LIMIT 1",
            args![tenant, fingerprint],
            approval_from_row,
        )
    }

    /// Changes an approval in one transaction: `change` sees the current record
    /// and returns whether it changed it. Returns the record after the call and
    /// that flag, or `None` when the id is unknown.
    pub fn update_approval(
        &self,
        id: &str,
        change: impl FnOnce(&mut Approval) -> bool,
    ) -> Result<Option<(Approval, bool)>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let Some(mut a) = tx.one("SELECT record FROM approvals WHERE id = ?1", args![id], approval_from_row)? else {
            return Ok(None);
        };
        let changed = change(&mut a);
        if changed {
            tx.execute(
                "UPDATE approvals SET state = ?1, expires_at = ?2, record = ?3 WHERE id = ?4",
                args![a.state.as_str(), a.expires_at, json(&a), id],
            )?;
        }
        tx.commit()?;
        Ok(Some((a, changed)))
    }

    /// Ids of pending approvals whose `expires_at` is before `now` (RFC 3339, same format).
    pub fn expired_approvals(&self, now: &str) -> Result<Vec<String>, DbError> {
        let conn = self.conn();
        let rows =
            conn.rows("SELECT id FROM approvals WHERE state = 'pending' AND expires_at < ?1", args![now], |r| {
                r.get(0)
            })?;
        Ok(rows)
    }
}

/// A preview row: the listing fields without the URLs (the daemon adds those).
fn preview_from_row(r: &Row) -> Result<Preview, DbError> {
    let port: Option<i64> = r.get(2)?;
    Ok(Preview {
        id: r.get(0)?,
        sandbox_id: r.get(1)?,
        port: port.and_then(|p| u16::try_from(p).ok()),
        tenant: r.get(3)?,
        public: r.get(4)?,
        created_at: r.get(5)?,
        expires_at: r.get(6)?,
        revoked_at: r.get(7)?,
        url_host: String::new(),
        url_path: String::new(),
    })
}

/// What a sandbox commits of the host's resources, as admission control and
/// quotas count it (see [`Db::resource_claims`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceClaim {
    /// Sandbox id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its state.
    pub state: SandboxState,
    /// `limits.memory_bytes`.
    pub memory_bytes: Option<u64>,
    /// `limits.disk_bytes`.
    pub disk_bytes: Option<u64>,
}

/// Admission control and tenant quotas (migration 14).
impl Db {
    /// Every sandbox's tenant, state, memory limit and nominal disk size, read
    /// from the limits column without decoding whole records (one pass over
    /// the table per admission check).
    pub fn resource_claims(&self) -> Result<Vec<ResourceClaim>, DbError> {
        let conn = self.conn();
        conn.rows(
            "SELECT id, tenant, state, CAST(limits ->> 'memory_bytes' AS BIGINT), CAST(limits ->> 'disk_bytes' AS BIGINT) FROM sandboxes",
            args![],
            |r| {
            let state: String = r.get(2)?;
            let bytes = |i: usize| -> Result<Option<u64>, DbError> {
                Ok(r.get::<Option<i64>>(i)?.map(|v| v.max(0) as u64))
            };
            Ok(ResourceClaim {
                id: r.get(0)?,
                tenant: r.get(1)?,
                state: SandboxState::parse(&state).unwrap_or(SandboxState::Error),
                memory_bytes: bytes(3)?,
                disk_bytes: bytes(4)?,
            })
        })
    }

    /// Sets (replaces) a tenant's quota override.
    pub fn put_tenant_quota(&self, tenant: &str, quota: &QuotaOverride, time: &str) -> Result<(), DbError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO tenant_quotas (tenant, quota, updated_at) VALUES (?1, ?2, ?3) ON CONFLICT(tenant) DO UPDATE SET quota = excluded.quota, updated_at = excluded.updated_at",
            args![tenant, json(quota), time],
        )?;
        Ok(())
    }

    /// A tenant's quota override and when it was set, if it has one.
    pub fn tenant_quota(&self, tenant: &str) -> Result<Option<(QuotaOverride, String)>, DbError> {
        let conn = self.conn();
        let row = conn.one("SELECT quota, updated_at FROM tenant_quotas WHERE tenant = ?1", args![tenant], |r| {
            Ok((r.get::<String>(0)?, r.get::<String>(1)?))
        })?;
        row.map(|(q, t)| Ok((parse(&q, "tenant_quotas.quota")?, t))).transpose()
    }

    /// Removes a tenant's quota override (it gets the defaults again). Returns whether there was one.
    pub fn delete_tenant_quota(&self, tenant: &str) -> Result<bool, DbError> {
        Ok(self.conn().execute("DELETE FROM tenant_quotas WHERE tenant = ?1", args![tenant])? > 0)
    }
}

const PREVIEW_COLUMNS: &str = "id, sandbox_id, port, tenant, public, created_at, expires_at, revoked_at";

/// Preview URLs (migration 11). Only the SHA-256 of a token secret is stored.
impl Db {
    /// Stores a new preview.
    pub fn insert_preview(&self, p: &Preview, secret_sha256: &str) -> Result<(), DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            &format!(
                "INSERT INTO previews ({PREVIEW_COLUMNS}, secret_sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            args![
                p.id,
                p.sandbox_id,
                p.port.map(i64::from),
                p.tenant,
                p.public,
                p.created_at,
                p.expires_at,
                p.revoked_at,
                secret_sha256
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The preview whose token hashes to `secret_sha256` (revoked and expired ones included: the caller decides).
    pub fn preview_by_hash(&self, secret_sha256: &str) -> Result<Option<Preview>, DbError> {
        let conn = self.conn();
        conn.one(
            &format!("SELECT {PREVIEW_COLUMNS} FROM previews WHERE secret_sha256 = ?1"),
            args![secret_sha256],
            preview_from_row,
        )
    }

    /// The previews of a sandbox, oldest first (revoked and expired ones included).
    pub fn list_previews(&self, sandbox_id: &str) -> Result<Vec<Preview>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            &format!("SELECT {PREVIEW_COLUMNS} FROM previews WHERE sandbox_id = ?1 ORDER BY created_at, id"),
            args![sandbox_id],
            preview_from_row,
        )?;
        Ok(rows)
    }

    /// The public previews of a sandbox that open `port` (revoked and expired ones included).
    pub fn public_previews(&self, sandbox_id: &str, port: u16) -> Result<Vec<Preview>, DbError> {
        let conn = self.conn();
        let rows = conn.rows(
            &format!(
            "SELECT {PREVIEW_COLUMNS} FROM previews WHERE sandbox_id = ?1 AND public AND (port IS NULL OR port = ?2)"
        ),
            args![sandbox_id, i64::from(port)],
            preview_from_row,
        )?;
        Ok(rows)
    }

    /// Revokes a preview of a sandbox (idempotent: the first revocation time stays); `None` if it does not exist.
    pub fn revoke_preview(&self, sandbox_id: &str, id: &str, time: &str) -> Result<Option<Preview>, DbError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE previews SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2 AND sandbox_id = ?3",
            args![time, id, sandbox_id],
        )?;
        let p = tx.one(
            &format!("SELECT {PREVIEW_COLUMNS} FROM previews WHERE id = ?1 AND sandbox_id = ?2"),
            args![id, sandbox_id],
            preview_from_row,
        )?;
        tx.commit()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `test` on a new SQLite database, then on a new PostgreSQL database
    /// of the test server ([`crate::testing`]): skipped, saying why, where
    /// there is none, and failed in CI.
    fn each_db(test: impl Fn(&Db)) {
        each_engine(|open| test(&open()));
    }

    /// Like [`each_db`], with a function that opens the test's database (again).
    fn each_engine(test: impl Fn(&dyn Fn() -> Db)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        test(&|| Db::open(&path).unwrap());
        match crate::testing::shared() {
            Ok(server) => {
                let url = server.fresh_database();
                test(&|| Db::open_postgres(&url).unwrap())
            }
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("CI must run the store tests on PostgreSQL too, but: {why}")
            }
            Err(why) => println!("skipped: the PostgreSQL half: {why}"),
        }
    }
    use std::collections::BTreeMap;

    #[test]
    fn tenant_quotas_are_stored_replaced_and_removed() {
        use strata_api::QuotaValue;
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("m.db")).unwrap();
        assert_eq!(db.tenant_quota("acme").unwrap(), None);
        let q = QuotaOverride {
            sandboxes: Some(QuotaValue::Limit(3)),
            memory_bytes: Some(QuotaValue::Unlimited),
            ..Default::default()
        };
        db.put_tenant_quota("acme", &q, "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(db.tenant_quota("acme").unwrap(), Some((q, "2026-01-01T00:00:00Z".to_string())));
        let q2 = QuotaOverride { disk_bytes: Some(QuotaValue::Limit(1 << 30)), ..Default::default() };
        db.put_tenant_quota("acme", &q2, "2026-01-02T00:00:00Z").unwrap();
        assert_eq!(db.tenant_quota("acme").unwrap().unwrap().0, q2, "a put replaces the whole override");
        assert_eq!(db.tenant_quota("globex").unwrap(), None);
        assert!(db.delete_tenant_quota("acme").unwrap());
        assert!(!db.delete_tenant_quota("acme").unwrap());
        assert_eq!(db.tenant_quota("acme").unwrap(), None);
    }

    #[test]
    fn resource_claims_read_limits_without_whole_records() {
        each_db(|db| {
            let mut a = record("0123456789abcdef", "a");
            a.sandbox.tenant = "acme".into();
            a.sandbox.limits.disk_bytes = Some(1 << 30);
            db.insert_sandbox(&mut a).unwrap();
            let mut b = record("1123456789abcdef", "b");
            b.sandbox.limits = ResourceLimits::default();
            db.insert_sandbox(&mut b).unwrap();
            let mut claims = db.resource_claims().unwrap();
            claims.sort_by(|x, y| x.id.cmp(&y.id));
            assert_eq!(
                claims[0],
                ResourceClaim {
                    id: a.sandbox.id.clone(),
                    tenant: "acme".into(),
                    state: SandboxState::Creating,
                    memory_bytes: Some(1 << 20),
                    disk_bytes: Some(1 << 30)
                }
            );
            assert_eq!(
                (claims[1].memory_bytes, claims[1].disk_bytes, claims[1].tenant.as_str()),
                (None, None, "default")
            );
        });
    }

    #[test]
    fn user_namespace_ranges_are_the_lowest_free_ones_and_come_back_with_the_record() {
        each_db(|db| {
            let want = |slot: u32| {
                Some(strata_api::UserNamespace { host_base: USERNS_FIRST + slot * USERNS_SIZE, size: USERNS_SIZE })
            };
            let mut ids = Vec::new();
            for i in 0..3 {
                let id = format!("{i}123456789abcdef");
                let mut r = record(&id, &format!("u{i}"));
                r.sandbox.userns = Some(strata_api::UserNamespace { host_base: 0, size: 0 });
                db.insert_sandbox(&mut r).unwrap();
                assert_eq!(r.sandbox.userns, want(i), "written back");
                assert_eq!(db.sandbox_by_id(&id).unwrap().unwrap().sandbox.userns, want(i), "stored");
                ids.push(id);
            }
            // Without one: none taken.
            let mut plain = record("9123456789abcdef", "plain");
            db.insert_sandbox(&mut plain).unwrap();
            assert_eq!(db.sandbox_by_id("9123456789abcdef").unwrap().unwrap().sandbox.userns, None);
            // A destroyed sandbox's range is the next one given.
            let t = Transition {
                to: SandboxState::Destroyed,
                reason: "user",
                detail: None,
                duration_ms: 0,
                time: "2026-01-01T00:00:01Z",
            };
            assert!(db.delete_sandbox(&ids[1], SandboxState::Creating, &t).unwrap().is_some());
            let mut r = record("a123456789abcdef", "again");
            r.sandbox.userns = Some(strata_api::UserNamespace { host_base: 0, size: 0 });
            db.insert_sandbox(&mut r).unwrap();
            assert_eq!(r.sandbox.userns, want(1));
            // A daemon's share of the host's slots: the lowest free one in it, and none past it.
            db.set_userns_slots(2..4);
            let mut got = Vec::new();
            for i in 0..2 {
                let mut r = record(&format!("b{i}23456789abcdef"), &format!("s{i}"));
                r.sandbox.userns = Some(strata_api::UserNamespace { host_base: 0, size: 0 });
                got.push(db.insert_sandbox(&mut r).map(|_| r.sandbox.userns));
            }
            assert_eq!(got[0].as_ref().unwrap(), &want(3), "slot 2 is taken (by u2)");
            assert!(matches!(got[1], Err(DbError::UsernsExhausted(2))), "{:?}", got[1]);
        });
    }

    fn record(id: &str, name: &str) -> SandboxRecord {
        SandboxRecord {
            sandbox: Sandbox {
                id: id.into(),
                tenant: "default".into(),
                name: name.into(),
                state: SandboxState::Creating,
                state_reason: "user".into(),
                state_detail: None,
                source: "busybox".into(),
                image_id: "sha256:aa".into(),
                runtime: "namespace".into(),
                lifecycle: Lifecycle::Ephemeral,
                created_at: "2026-01-01T00:00:00Z".into(),
                updated_at: "2026-01-01T00:00:00Z".into(),
                inactive_since: None,
                policy: SandboxPolicy::default_for(Lifecycle::Ephemeral),
                ttl: None,
                expires_at: None,
                limits: ResourceLimits {
                    memory_bytes: Some(1 << 20),
                    cpus: None,
                    pids: Some(10),
                    ..Default::default()
                },
                env: BTreeMap::from([("A".into(), "1".into())]),
                hostname: "h".into(),
                labels: BTreeMap::new(),
                init_pid: None,
                oom_kills: 0,
                base_checkpoint: None,
                head_checkpoint: None,
                fork_generation: 0,
                standby: None,
                secrets: Vec::new(),
                network: Default::default(),
                capabilities: Vec::new(),
                allow_setuid: true,
                userns: None,
                tmp: strata_api::TmpStorage::Tmpfs,
                quarantine: None,
            },
            layers: vec!["sha256:00".into()],
            init_start_time: None,
            image_config: ImageConfig::default(),
        }
    }

    #[test]
    fn a_pool_sandbox_is_hidden_and_adopted_once() {
        each_db(|db| {
            let mut member = record("0123456789abcdef", "0123456789abcdef");
            member.sandbox.tenant = POOL_TENANT.into();
            member.sandbox.state = SandboxState::Running;
            db.insert_sandbox(&mut member).unwrap();
            db.insert_sandbox(&mut record("1123456789abcdef", "taken")).unwrap();
            // Nobody's lookups find it (the operator's neither), the pool's own do.
            for key in ["0123456789abcdef", "0123"] {
                assert!(db.find_sandbox(key, None).unwrap().is_none(), "{key}");
                assert!(db.find_sandbox(key, Some("default")).unwrap().is_none(), "{key}");
            }
            assert!(db.find_sandbox("0123456789abcdef", Some(POOL_TENANT)).unwrap().is_some());
            assert_eq!(db.pooled_sandboxes().unwrap().len(), 1);
            assert!(db.list_policy_candidates().unwrap().iter().all(|r| r.sandbox.tenant != POOL_TENANT));
            // Adopted: who it now is, with its event; a name in use is refused and changes nothing.
            let mut adopted = member.clone();
            adopted.sandbox.tenant = "acme".into();
            adopted.sandbox.name = "taken".into();
            adopted.sandbox.state_reason = "adopted".into();
            assert!(matches!(db.adopt_pooled(&adopted, "from the pool"), Err(DbError::NameTaken(_))));
            assert!(db.sandbox_by_id("0123456789abcdef").unwrap().unwrap().sandbox.tenant == POOL_TENANT);
            adopted.sandbox.name = "web".into();
            adopted.sandbox.image_id = "sha256:bb".into();
            adopted.image_config.user = Some("app".into());
            let ev = db.adopt_pooled(&adopted, "from the pool").unwrap().expect("adopted");
            assert_eq!((ev.reason.as_str(), ev.detail.as_deref()), ("adopted", Some("from the pool")));
            let got = db.find_sandbox("web", Some("acme")).unwrap().expect("the adopter sees it");
            assert_eq!((got.sandbox.image_id.as_str(), got.image_config.user.as_deref()), ("sha256:bb", Some("app")));
            assert!(db.pooled_sandboxes().unwrap().is_empty());
            // Once: a second adoption finds no pool member.
            assert!(db.adopt_pooled(&adopted, "again").unwrap().is_none());
        });
    }

    #[test]
    fn sandbox_roundtrip_transitions_and_events() {
        each_db(|db| {
            assert_eq!(db.schema_version().unwrap(), MIGRATIONS.len() as i64);
            db.insert_sandbox(&mut record("0123456789abcdef", "web")).unwrap();
            assert!(matches!(db.insert_sandbox(&mut record("1123456789abcdef", "web")), Err(DbError::NameTaken(_))));
            let t = Transition {
                to: SandboxState::Running,
                reason: "user",
                detail: None,
                duration_ms: 5,
                time: "2026-01-01T00:00:01Z",
            };
            assert!(db.transition("0123456789abcdef", SandboxState::Creating, &t, Some((42, 7))).unwrap().is_some());
            // A second transition from the old state loses the race and changes nothing.
            assert!(db.transition("0123456789abcdef", SandboxState::Creating, &t, None).unwrap().is_none());
            let got = db.find_sandbox("web", None).unwrap().unwrap();
            assert_eq!(got.sandbox.state, SandboxState::Running);
            assert_eq!(got.sandbox.init_pid, Some(42));
            assert_eq!(got.init_start_time, Some(7));
            assert_eq!(got.sandbox.limits.pids, Some(10));
            assert!(got.sandbox.allow_setuid);
            assert_eq!(got.sandbox.tmp, strata_api::TmpStorage::Tmpfs);
            assert!(db.find_sandbox("0123", None).unwrap().is_some(), "unique prefix resolves");
            assert!(db.find_sandbox("nope", None).unwrap().is_none());
            let evs = db.events(Some("0123456789abcdef"), 0, 100).unwrap();
            assert_eq!(evs.len(), 2);
            assert_eq!(evs[1].from, Some(SandboxState::Creating));
            let t = Transition {
                to: SandboxState::Destroyed,
                reason: "user",
                detail: None,
                duration_ms: 1,
                time: "2026-01-01T00:00:02Z",
            };
            // Destroy is a compare-and-set transition too: from a state the sandbox
            // is not in, nothing is deleted and no event is written.
            assert!(db.delete_sandbox("0123456789abcdef", SandboxState::Stopped, &t).unwrap().is_none());
            assert!(db.find_sandbox("web", None).unwrap().is_some());
            assert_eq!(db.events(None, 0, 100).unwrap().len(), 2);
            assert!(db.delete_sandbox("0123456789abcdef", SandboxState::Running, &t).unwrap().is_some());
            assert!(db.find_sandbox("web", None).unwrap().is_none());
            assert_eq!(db.events(None, 0, 100).unwrap().len(), 3);
        });
    }

    /// The resolution order of `strata_core::ids` over sandboxes, checkpoints,
    /// usage and pipeline runs: exact id, exact name, id prefix unique among
    /// the caller's own objects; other tenants' rows are never looked at.
    #[test]
    fn keys_resolve_exactly_and_within_the_scope() {
        each_db(|db| {
            let put = |id: &str, name: &str, tenant: &str| {
                let mut r = record(id, name);
                r.sandbox.tenant = tenant.into();
                db.insert_sandbox(&mut r).unwrap();
            };
            put("abcd000000000001", "web", "acme");
            put("abcd000000000002", "db", "globex");
            // A legacy name (from before the rule) that is another sandbox's id prefix, and one that is a full id.
            put("ffff000000000003", "abcd0000", "acme");
            put("eeee000000000004", "abcd000000000002", "acme");
            let id = |k: &str, scope: Option<&str>| db.find_sandbox(k, scope).unwrap().map(|r| r.sandbox.id);
            // A full id always resolves to that id, never to a name that spells it.
            assert_eq!(id("abcd000000000002", None).as_deref(), Some("abcd000000000002"));
            assert_eq!(
                id("abcd000000000002", Some("acme")).as_deref(),
                Some("eeee000000000004"),
                "for acme the other tenant's id does not exist: its own name matches"
            );
            assert_eq!(id("abcd000000000002", Some("globex")).as_deref(), Some("abcd000000000002"));
            // Prefixes: among the caller's own objects only.
            assert_eq!(id("abcd", None), None, "ambiguous among all tenants");
            assert_eq!(id("abcd", Some("acme")).as_deref(), Some("abcd000000000001"), "unique among acme's");
            assert_eq!(id("abcd", Some("globex")).as_deref(), Some("abcd000000000002"), "unique among globex's");
            assert_eq!(id("abcd", Some("initech")), None);
            // A legacy hex name is an exact name: it wins over a prefix for whoever sees it, and only for them.
            assert_eq!(id("abcd0000", Some("acme")).as_deref(), Some("ffff000000000003"));
            assert_eq!(
                id("abcd0000", Some("globex")).as_deref(),
                Some("abcd000000000002"),
                "another tenant's name never shadows globex's prefix"
            );
            assert_eq!(id("abcd0000", None).as_deref(), Some("ffff000000000003"));
            // Names of another tenant are unknown; no wildcards, no case folding.
            assert_eq!(id("db", Some("acme")), None);
            assert_eq!(id("db", Some("globex")).as_deref(), Some("abcd000000000002"));
            for k in ["ABCD", "abc", "ab%", "a_cd", "%%%%", "____"] {
                assert_eq!(id(k, Some("globex")), None, "{k}");
            }
            assert_eq!(db.resolve_sandbox_id("abcd", Some("globex")).unwrap().as_deref(), Some("abcd000000000002"));
            assert_eq!(db.sandbox_by_id("abcd").unwrap().map(|r| r.sandbox.id), None, "by id means the whole id");
            assert_eq!(
                db.find_usage("abcd", Some("globex")).unwrap().map(|u| u.sandbox_id).as_deref(),
                Some("abcd000000000002")
            );
            assert_eq!(db.find_usage("abcd", None).unwrap().map(|u| u.sandbox_id), None);
            assert_eq!(db.usage_by_id("abcd").unwrap().map(|u| u.sandbox_id), None);
            // Pipeline runs: by id or a prefix unique among the caller's runs, never by name.
            let run = |id: &str, tenant: &str| PipelineRun {
                id: id.into(),
                tenant: tenant.into(),
                name: "abcd1234".into(),
                state: strata_api::PipelineState::Succeeded,
                reason: None,
                created_at: "t".into(),
                updated_at: "t".into(),
                spec: Default::default(),
                stages: vec![],
            };
            db.put_pipeline_run(&run("abcd1234ffff0001", "acme")).unwrap();
            db.put_pipeline_run(&run("abcd1234ffff0002", "globex")).unwrap();
            let r = |k: &str, scope: Option<&str>| db.find_pipeline_run(k, scope).unwrap().map(|r| r.id);
            assert_eq!(r("abcd1234", Some("acme")).as_deref(), Some("abcd1234ffff0001"));
            assert_eq!(r("abcd1234", None), None);
            assert_eq!(r("abcd1234ffff0002", Some("acme")), None);
            assert_eq!(db.pipeline_run_by_id("abcd1234ffff0002").unwrap().map(|r| r.tenant).as_deref(), Some("globex"));
            // The check lists the legacy hex names, not default names equal to the sandbox's own id.
            put("1111000000000005", "1111000000000005", "acme");
            let listed: Vec<(String, String)> =
                db.names_like_ids().unwrap().into_iter().map(|n| (n.kind, n.name)).collect();
            assert!(
                listed.contains(&("sandbox".into(), "abcd0000".into()))
                    && listed.contains(&("sandbox".into(), "abcd000000000002".into())),
                "{listed:?}"
            );
            assert!(listed.contains(&("pipeline_run".into(), "abcd1234".into())), "{listed:?}");
            assert!(!listed.iter().any(|(_, n)| n == "1111000000000005" || n == "web"), "{listed:?}");
        });
    }

    #[test]
    fn usage_outlives_the_sandbox_row() {
        each_db(|db| {
            let id = "0123456789abcdef";
            db.insert_sandbox(&mut record(id, "web")).unwrap();
            let u = db.find_usage("web", None).unwrap().unwrap();
            assert_eq!((u.sandbox_id.as_str(), u.destroyed_at.as_deref()), (id, None));
            db.update_usage(id, |r| {
                r.compute.cpu_seconds += 1.5;
                r.storage_gb_hours.insert("writable".into(), 0.25);
            })
            .unwrap();
            let t =
                Transition { to: SandboxState::Destroyed, reason: "user", detail: None, duration_ms: 0, time: "t9" };
            db.delete_sandbox(id, SandboxState::Creating, &t).unwrap();
            assert!(db.find_sandbox(id, None).unwrap().is_none());
            let u = db.find_usage("0123", None).unwrap().unwrap();
            assert_eq!(u.compute.cpu_seconds, 1.5);
            assert_eq!(u.storage_gb_hours["writable"], 0.25);
            assert_eq!(u.destroyed_at.as_deref(), Some("t9"));
            assert_eq!(db.list_usage().unwrap().len(), 1);
            assert!(db.find_usage("nope", None).unwrap().is_none());
            db.set_checkpoint_setup("c1", &ComputeUsage { cpu_seconds: 2.0, ..Default::default() }).unwrap();
            assert_eq!(db.checkpoint_setup("c1").unwrap().unwrap().cpu_seconds, 2.0);
            assert!(db.checkpoint_setup("c2").unwrap().is_none());
        });
    }

    #[test]
    fn inactive_since_spans_stopped_standby_and_archived() {
        each_db(|db| {
            let id = "0123456789abcdef";
            db.insert_sandbox(&mut record(id, "web")).unwrap();
            let step = |from, to, time: &str| {
                let t = Transition { to, reason: "user", detail: None, duration_ms: 0, time };
                db.transition(id, from, &t, None).unwrap().unwrap();
                db.find_sandbox(id, None).unwrap().unwrap().sandbox.inactive_since
            };
            assert_eq!(step(SandboxState::Creating, SandboxState::Running, "t1"), None);
            assert_eq!(step(SandboxState::Running, SandboxState::Stopped, "t2").as_deref(), Some("t2"));
            assert_eq!(
                step(SandboxState::Stopped, SandboxState::Archived, "t3").as_deref(),
                Some("t2"),
                "kept while parked"
            );
            assert_eq!(step(SandboxState::Archived, SandboxState::Stopped, "t4").as_deref(), Some("t2"));
            assert_eq!(step(SandboxState::Stopped, SandboxState::Running, "t5"), None, "cleared when it runs");
            assert_eq!(step(SandboxState::Running, SandboxState::Standby, "t6").as_deref(), Some("t6"));
        });
    }

    #[test]
    fn policy_candidates_skip_parked_sandboxes_without_limits() {
        each_db(|db| {
            for (id, to) in [
                ("a000000000000000", SandboxState::Running),
                ("b000000000000000", SandboxState::Standby),
                ("c000000000000000", SandboxState::Stopped),
            ] {
                db.insert_sandbox(&mut record(id, &id[..1])).unwrap();
                let t = Transition {
                    to: SandboxState::Running,
                    reason: "created",
                    detail: None,
                    duration_ms: 0,
                    time: "t1",
                };
                db.transition(id, SandboxState::Creating, &t, None).unwrap().unwrap();
                if to != SandboxState::Running {
                    let t = Transition { to, reason: "user", detail: None, duration_ms: 0, time: "t2" };
                    db.transition(id, SandboxState::Running, &t, None).unwrap().unwrap();
                }
            }
            let ids = |v: Vec<SandboxRecord>| v.into_iter().map(|r| r.sandbox.id).collect::<Vec<_>>();
            assert_eq!(ids(db.list_policy_candidates().unwrap()), vec!["a000000000000000"]);
            db.update_policy("c000000000000000", |p| p.delete_after = Some("1h".into())).unwrap();
            assert_eq!(ids(db.list_policy_candidates().unwrap()), vec!["a000000000000000", "c000000000000000"]);
            assert_eq!(db.sandbox_ids().unwrap().len(), 3);
            assert!(db.with_expiry().unwrap().is_empty());
            db.set_expires_at("b000000000000000", Some("t9")).unwrap();
            assert_eq!(db.with_expiry().unwrap(), vec!["b000000000000000".to_string()]);
        });
    }

    #[test]
    fn policies_update_in_place_and_leases_go_with_their_sandbox() {
        each_db(|db| {
            let id = "0123456789abcdef";
            db.insert_sandbox(&mut record(id, "web")).unwrap();
            assert_eq!(db.find_sandbox(id, None).unwrap().unwrap().sandbox.policy.on_idle, strata_api::OnIdle::Destroy);
            let p = db.update_policy(id, |p| p.delete_after = Some("1h".into())).unwrap().unwrap();
            assert_eq!(p.delete_after.as_deref(), Some("1h"));
            assert_eq!(db.find_sandbox("web", None).unwrap().unwrap().sandbox.policy, p);
            assert!(db.update_policy("nope", |_| {}).unwrap().is_none());
            assert_eq!(db.resolve_sandbox_id("web", None).unwrap().as_deref(), Some(id));
            assert_eq!(db.resolve_sandbox_id("0123", None).unwrap().as_deref(), Some(id));
            assert_eq!(db.resolve_sandbox_id("nope", None).unwrap(), None);

            let lease =
                Lease { id: "l1".into(), sandbox_id: id.into(), created_at: "t0".into(), expires_at: "t1".into() };
            db.insert_lease(&lease).unwrap();
            db.insert_lease(&Lease { id: "l2".into(), sandbox_id: "other".into(), ..lease.clone() }).unwrap();
            assert_eq!(db.list_leases(Some(id)).unwrap(), vec![lease.clone()]);
            assert_eq!(db.list_leases(None).unwrap().len(), 2);
            assert_eq!(db.renew_lease(id, "l1", "t9").unwrap().unwrap().expires_at, "t9");
            assert!(db.renew_lease("other", "l1", "t9").unwrap().is_none(), "a lease belongs to one sandbox");
            assert!(db.get_lease("other", "l1").unwrap().is_none());
            let t =
                Transition { to: SandboxState::Destroyed, reason: "user", detail: None, duration_ms: 0, time: "t2" };
            db.delete_sandbox(id, SandboxState::Creating, &t).unwrap();
            assert!(db.list_leases(Some(id)).unwrap().is_empty());
            assert_eq!(
                db.delete_leases(&[(id, "l2"), ("other", "l3")]).unwrap(),
                0,
                "a lease is deleted only through its own sandbox"
            );
            assert_eq!(db.list_leases(Some("other")).unwrap().len(), 1);
            assert_eq!(db.delete_leases(&[("other", "l2"), ("other", "l3")]).unwrap(), 1);
        });
    }

    #[test]
    fn migrating_gives_existing_sandboxes_their_lifecycle_default_policy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.db");
        {
            // A database at schema 4 with a stopped persistent and a running ephemeral sandbox.
            let conn = Connection::open(&p).unwrap();
            for sql in &MIGRATIONS[..4] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 4).unwrap();
            for (id, state, lifecycle) in [("a", "stopped", "persistent"), ("b", "running", "ephemeral")] {
                conn.execute(
                    "INSERT INTO sandboxes (id, name, state, state_reason, source, image_id, runtime, lifecycle, created_at, updated_at, limits, env, hostname, labels, layers, image_config)
                     VALUES (?1, ?1, ?2, 'user', 'busybox', 'sha256:aa', 'namespace', ?3, 't0', 't1', '{}', '{}', 'h', '{}', '[]', '{}')",
                    rusqlite::params![id, state, lifecycle],
                )
                .unwrap();
            }
        }
        let db = Db::open(&p).unwrap();
        assert_eq!(db.schema_version().unwrap(), MIGRATIONS.len() as i64);
        // Migration 6 gives every existing sandbox an empty usage record.
        let ua = db.find_usage("a", None).unwrap().unwrap();
        assert_eq!((ua.sandbox_id.as_str(), ua.source.as_str(), ua.compute.cpu_seconds), ("a", "busybox", 0.0));
        let a = db.find_sandbox("a", None).unwrap().unwrap().sandbox;
        assert_eq!(a.policy, SandboxPolicy::default_for(Lifecycle::Persistent));
        assert_eq!(a.inactive_since.as_deref(), Some("t1"));
        let b = db.find_sandbox("b", None).unwrap().unwrap().sandbox;
        assert_eq!(b.policy, SandboxPolicy::default_for(Lifecycle::Ephemeral));
        assert_eq!(b.inactive_since, None);
    }

    #[test]
    fn an_image_name_keeps_its_versions() {
        each_db(|db| {
            let img = |id: &str| Image {
                id: id.into(),
                name: "base".into(),
                source_kind: "rootfs-dir".into(),
                source: "/r".into(),
                layers: vec![LayerInfo { digest: format!("{id}-layer"), size: 1 }],
                config: ImageConfig::default(),
                size: 1,
                created_at: "t".into(),
                version: 0,
                previous: None,
                newest: false,
                platform: None,
            };
            let v1 = db.put_image(&img("sha256:1111111111"), false).unwrap();
            let v2 = db.put_image(&img("sha256:2222222222"), true).unwrap();
            assert_eq!((v1.version, v2.version, v2.previous.as_deref()), (1, 2, Some("sha256:1111111111")));
            assert_eq!(db.get_image("base").unwrap().unwrap().id, "sha256:2222222222", "the name means the newest");
            let old = db.get_image("sha256:1111111111").unwrap().unwrap();
            assert!(!old.newest && old.version == 1, "an old version stays, by its id");
            assert_eq!(db.list_images().unwrap().len(), 1);
            assert_eq!(db.list_image_versions(Some("base")).unwrap().len(), 2);
            assert_eq!(db.images_with_id("sha256:1111111111").unwrap().len(), 1);
            // Removing the newest version makes the one before it the newest again.
            assert!(db.delete_image_version("base", 2).unwrap());
            assert!(db.get_image("base").unwrap().unwrap().newest);
            assert_eq!(db.get_image("base").unwrap().unwrap().version, 1);
            assert!(db.delete_image("base").unwrap());
            assert!(db.list_image_versions(None).unwrap().is_empty());
        });
    }

    #[test]
    fn reopening_keeps_data_and_schema() {
        each_engine(|open| {
            {
                let db = open();
                let img = Image {
                    id: "sha256:abcdef0123456789".into(),
                    name: "busybox".into(),
                    source_kind: "rootfs-tar".into(),
                    source: "/x.tar".into(),
                    layers: vec![LayerInfo { digest: "sha256:00".into(), size: 3 }],
                    config: ImageConfig::default(),
                    size: 3,
                    created_at: "t".into(),
                    version: 0,
                    previous: None,
                    newest: false,
                    platform: None,
                };
                assert_eq!(db.put_image(&img, false).unwrap().version, 1);
                assert!(matches!(db.put_image(&img, false), Err(DbError::NameTaken(_))));
                assert_eq!(db.put_image(&img, true).unwrap().version, 1, "the same content is no new version");
            }
            let db = open();
            assert_eq!(db.schema_version().unwrap(), MIGRATIONS.len() as i64);
            assert_eq!(db.list_images().unwrap().len(), 1);
            assert!(db.get_image("abcdef01").unwrap().is_some());
            assert!(db.get_image("sha256:abcdef01").unwrap().is_some());
            assert!(db.get_image("ABCDEF01").unwrap().is_none(), "ids are lower-case");
            assert!(db.get_image("abcdef0").unwrap().is_none(), "prefixes of images need 8 characters");
            assert!(db.delete_image("busybox").unwrap());
            assert!(!db.delete_image("busybox").unwrap());
        });
    }

    #[test]
    fn approvals_are_found_by_fingerprint_and_changed_in_a_transaction() {
        each_db(|db| {
            let a = |id: &str, tenant: &str, expires: &str| Approval {
                id: id.into(),
                tenant: tenant.into(),
                state: ApprovalState::Pending,
                action: "create sandbox".into(),
                target: "busybox".into(),
                capabilities: vec![],
                requested_by: "uid:0".into(),
                requested_at: "2026-12-01T10:00:00.000Z".into(),
                expires_at: expires.into(),
                decided_by: None,
                decided_at: None,
                reason: None,
                used_at: None,
                fingerprint: "f1".into(),
            };
            db.insert_approval(&a("apr-1", "acme", "2026-12-01T10:15:00.000Z")).unwrap();
            db.insert_approval(&a("apr-2", "globex", "2026-12-01T10:05:00.000Z")).unwrap();
            assert_eq!(db.open_approval("acme", "f1").unwrap().unwrap().id, "apr-1");
            assert!(db.open_approval("acme", "f2").unwrap().is_none());
            assert_eq!(db.list_approvals(Some("globex"), None).unwrap().len(), 1);
            assert_eq!(db.expired_approvals("2026-12-01T10:10:00.000Z").unwrap(), vec!["apr-2".to_string()]);
            let (after, changed) = db
                .update_approval("apr-1", |r| {
                    r.state = ApprovalState::Denied;
                    true
                })
                .unwrap()
                .unwrap();
            assert!(changed && after.state == ApprovalState::Denied);
            assert_eq!(db.get_approval("apr-1").unwrap().unwrap().state, ApprovalState::Denied);
            assert!(db.open_approval("acme", "f1").unwrap().is_none(), "a denied approval is not open");
            assert_eq!(db.list_approvals(None, Some(ApprovalState::Pending)).unwrap().len(), 1);
            let (_, changed) = db.update_approval("apr-2", |_| false).unwrap().unwrap();
            assert!(!changed);
            assert!(db.update_approval("apr-9", |_| true).unwrap().is_none());
        });
    }

    #[test]
    fn previews_are_stored_by_hash_and_revoked_once() {
        each_db(|db| {
            let p = Preview {
                id: "p1".into(),
                sandbox_id: "s1".into(),
                port: Some(8000),
                public: false,
                tenant: "acme".into(),
                created_at: "t0".into(),
                expires_at: "t9".into(),
                revoked_at: None,
                url_host: String::new(),
                url_path: String::new(),
            };
            db.insert_preview(&p, "h1").unwrap();
            db.insert_preview(&Preview { id: "p2".into(), port: None, public: true, ..p.clone() }, "h2").unwrap();
            db.insert_preview(&Preview { id: "p3".into(), sandbox_id: "s2".into(), public: true, ..p.clone() }, "h3")
                .unwrap();
            assert!(
                db.insert_preview(&Preview { id: "p4".into(), ..p.clone() }, "h1").is_err(),
                "a secret hash is unique"
            );
            assert_eq!(db.preview_by_hash("h1").unwrap(), Some(p.clone()));
            assert_eq!(db.preview_by_hash("nope").unwrap(), None);
            assert_eq!(db.list_previews("s1").unwrap().iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["p1", "p2"]);
            assert_eq!(
                db.public_previews("s1", 8000).unwrap().iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
                ["p2"],
                "every-port public previews match any port"
            );
            assert_eq!(
                db.public_previews("s2", 8001).unwrap().len(),
                0,
                "a one-port public preview matches its port only"
            );
            assert!(
                db.revoke_preview("s2", "p1", "r0").unwrap().is_none(),
                "a preview of another sandbox is not found"
            );
            assert_eq!(db.revoke_preview("s1", "p1", "r1").unwrap().unwrap().revoked_at.as_deref(), Some("r1"));
            assert_eq!(
                db.revoke_preview("s1", "p1", "r2").unwrap().unwrap().revoked_at.as_deref(),
                Some("r1"),
                "the first revocation time stays"
            );
        });
    }

    #[test]
    fn tokens_are_stored_by_hash_with_names_unique_among_live_ones() {
        each_db(|db| {
            let t = TokenInfo {
                id: "t1".into(),
                name: "ci".into(),
                tenant: "acme".into(),
                created_at: "t0".into(),
                last_used_at: None,
                expires_at: None,
                revoked_at: None,
            };
            db.insert_token(&t, "h1").unwrap();
            assert!(
                matches!(
                    db.insert_token(&TokenInfo { id: "t2".into(), ..t.clone() }, "h2"),
                    Err(DbError::NameTaken(_))
                ),
                "same name, same tenant"
            );
            db.insert_token(&TokenInfo { id: "t3".into(), tenant: "globex".into(), ..t.clone() }, "h3").unwrap();
            assert_eq!(db.token_by_hash("h1").unwrap(), Some(t.clone()));
            assert_eq!(db.token_by_hash("nope").unwrap(), None);
            assert_eq!(db.find_tokens("ci", None).unwrap().len(), 2);
            assert_eq!(db.find_tokens("ci", Some("globex")).unwrap()[0].id, "t3");
            assert_eq!(db.find_tokens("t1", None).unwrap()[0].tenant, "acme");
            assert!(db.find_tokens("t1", Some("globex")).unwrap().is_empty(), "an id outside the tenant is not found");
            db.touch_token("t1", "2026-01-01T00:01:00Z", "2026-01-01T00:00:00Z").unwrap();
            db.touch_token("t1", "2026-01-01T00:01:30Z", "2026-01-01T00:00:30Z").unwrap();
            assert_eq!(
                db.token_by_hash("h1").unwrap().unwrap().last_used_at.as_deref(),
                Some("2026-01-01T00:01:00Z"),
                "at most one write a minute"
            );
            assert_eq!(db.revoke_token("t1", "r1").unwrap().unwrap().revoked_at.as_deref(), Some("r1"));
            assert_eq!(
                db.revoke_token("t1", "r2").unwrap().unwrap().revoked_at.as_deref(),
                Some("r1"),
                "the first revocation time stays"
            );
            assert!(db.revoke_token("nope", "r1").unwrap().is_none());
            assert_eq!(db.list_tokens(Some("acme"), false).unwrap().len(), 0);
            assert_eq!(db.list_tokens(Some("acme"), true).unwrap().len(), 1);
            assert_eq!(db.list_tokens(None, false).unwrap().len(), 1);
            db.insert_token(&TokenInfo { id: "t4".into(), ..t.clone() }, "h4").unwrap();
            assert_eq!(db.find_tokens("ci", Some("acme")).unwrap()[0].id, "t4", "a revoked token's name is free again");
        });
    }

    #[test]
    fn owned_objects_inherit_their_tenant() {
        each_db(|db| {
            let mut rec = record("0123456789abcdef", "web");
            rec.sandbox.tenant = "acme".into();
            db.insert_sandbox(&mut rec).unwrap();
            assert_eq!(db.find_sandbox("web", None).unwrap().unwrap().sandbox.tenant, "acme");
            assert_eq!(db.find_usage("web", None).unwrap().unwrap().tenant, "acme");
            let c = Checkpoint {
                id: "c000000000000001".into(),
                tenant: "wrong".into(),
                name: "c1".into(),
                sandbox_id: rec.sandbox.id.clone(),
                parent: None,
                layer: None,
                layer_size: 0,
                layers: vec![],
                image: "busybox".into(),
                image_id: "sha256:aa".into(),
                changed_paths: 0,
                labels: Default::default(),
                created_at: "t".into(),
                frozen_ms: 0,
                duration_ms: 0,
                expires_at: None,
                pinned: false,
                capabilities: vec![strata_api::Capability::UntrustedInput],
                processes: Some(strata_api::ProcessImage { bytes: 7, api_processes: 1, dump_ms: 3 }),
                isolation: strata_api::Isolation::Gvisor,
                userns: true,
                tmp: strata_api::TmpStorage::Disk,
                quarantine: Some(strata_api::Quarantine {
                    reason: "taken from quarantined sandbox".into(),
                    since: "t".into(),
                    by: "inherited".into(),
                    network_before: None,
                }),
            };
            db.insert_checkpoint(&c, &ImageConfig::default()).unwrap();
            let got = db.find_checkpoint("c1", None).unwrap().unwrap().0;
            assert_eq!(got.quarantine, c.quarantine, "a checkpoint is born with its quarantine");
            assert!(db.set_quarantine(true, &c.id, None).unwrap());
            assert_eq!(db.find_checkpoint("c1", None).unwrap().unwrap().0.quarantine, None, "lifted");
            let q = strata_api::Quarantine {
                reason: "found a key".into(),
                since: "t3".into(),
                by: "check".into(),
                network_before: Some(strata_api::NetworkSpec {
                    mode: strata_api::NetworkMode::Egress,
                    ..Default::default()
                }),
            };
            assert!(db.set_quarantine(false, &rec.sandbox.id, Some(&q)).unwrap());
            assert!(!db.set_quarantine(false, "nope", Some(&q)).unwrap(), "an unknown id says so");
            assert_eq!(db.sandbox_by_id(&rec.sandbox.id).unwrap().unwrap().sandbox.quarantine.as_ref(), Some(&q));
            let listed = db.quarantined().unwrap();
            assert_eq!(listed.len(), 1);
            assert_eq!(
                (listed[0].kind.as_str(), &listed[0].id, &listed[0].quarantine),
                ("sandbox", &rec.sandbox.id, &q)
            );
            assert_eq!(got.tenant, "acme", "a checkpoint is its sandbox's tenant's");
            assert_eq!(got.processes, c.processes);
            assert_eq!(got.isolation, strata_api::Isolation::Gvisor, "a checkpoint keeps its sandbox's tier");
            assert!(got.userns, "and whether it had a user namespace");
            assert_eq!(got.tmp, strata_api::TmpStorage::Disk, "and where its /tmp was");
            db.put_template("tpl", &c.id, "t", false).unwrap();
            assert_eq!(
                db.template_tenant("tpl").unwrap().as_deref(),
                Some("acme"),
                "a template is its checkpoint's tenant's"
            );
            // Its check policy outlives a re-point; what described the old content does not.
            assert!(db.set_template_checks("tpl", Some("24h"), "quarantine").unwrap());
            assert!(!db.set_template_checks("nope", None, "record").unwrap());
            assert!(db.set_template_last_check("tpl", &c.id, "{}").unwrap());
            assert!(!db.set_template_last_check("tpl", "another", "{}").unwrap(), "re-pointed meanwhile");
            db.set_template_build("tpl", Some("FROM x")).unwrap();
            db.put_template("tpl", &c.id, "t2", true).unwrap();
            let checks = db.template_checks("tpl").unwrap().unwrap();
            assert_eq!((checks.check_every.as_deref(), checks.on_findings.as_str()), (Some("24h"), "quarantine"));
            assert_eq!((checks.last_check, db.template_build("tpl").unwrap()), (None, None));
            assert_eq!(db.get_template("tpl").unwrap().unwrap().1, "t2");
            assert!(matches!(db.put_template("tpl", &c.id, "t3", false), Err(DbError::NameTaken(_))));
            db.record_event(&rec.sandbox.id, SandboxState::Creating, "x", None, "t").unwrap();
            assert_eq!(db.last_event_time(&rec.sandbox.id, "x").unwrap().as_deref(), Some("t"));
            assert_eq!(db.last_event_time(&rec.sandbox.id, "checked").unwrap(), None);
            assert_eq!(db.events_of_tenant("acme", None, 0, 100).unwrap().len(), 2);
            assert!(db.events_of_tenant("globex", None, 0, 100).unwrap().is_empty());
            let t =
                Transition { to: SandboxState::Destroyed, reason: "user", detail: None, duration_ms: 0, time: "t2" };
            db.delete_sandbox(&rec.sandbox.id, SandboxState::Creating, &t).unwrap();
            assert_eq!(
                db.sandbox_tenant_by_id(&rec.sandbox.id).unwrap().as_deref(),
                Some("acme"),
                "remembered after destroy"
            );
            assert_eq!(db.events_of_tenant("acme", None, 0, 100).unwrap().len(), 3);
        });
    }

    #[test]
    fn audit_entries_without_a_tenant_keep_their_old_hash() {
        let e = AuditEntry {
            seq: 1,
            time: "t".into(),
            actor: "uid:0".into(),
            tenant: None,
            method: "POST".into(),
            route: "/v1/x".into(),
            target: None,
            status: 200,
            prev_hash: AUDIT_GENESIS.into(),
            hash: String::new(),
        };
        let old = serde_json::to_vec(&serde_json::json!([
            e.seq,
            e.time,
            e.actor,
            e.method,
            e.route,
            e.target,
            e.status,
            e.prev_hash
        ]))
        .unwrap();
        assert_eq!(audit_canonical(&e), old);
        let with = AuditEntry { tenant: Some("acme".into()), ..e.clone() };
        assert_ne!(audit_hash(&with), audit_hash(&e), "the tenant is covered by the hash");
    }

    #[test]
    fn audit_chain_detects_edits_removals_and_reordering() {
        each_db(|db| {
            for (i, route) in ["/v1/sandboxes", "/v1/sandboxes/{id}/exec", "/v1/sandboxes/{id}"].iter().enumerate() {
                let e = db
                    .append_audit(&NewAudit {
                        time: "2026-01-01T00:00:00Z",
                        actor: "uid:0",
                        tenant: (i == 1).then_some("acme"),
                        method: "POST",
                        route,
                        target: Some("x"),
                        status: 200 + i as u16,
                    })
                    .unwrap();
                assert_eq!(e.seq, i as i64 + 1);
            }
            let all = db.audit_entries(None).unwrap();
            assert_eq!(all.len(), 3);
            assert_eq!(all[0].prev_hash, AUDIT_GENESIS);
            assert_eq!(all[1].prev_hash, all[0].hash);
            assert!(audit_verify(&all).is_none());
            assert_eq!(all[1].tenant.as_deref(), Some("acme"));
            assert_eq!(db.audit_entries_of(Some("acme"), None).unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
            assert_eq!(db.audit_entries(Some(2)).unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
            let mut edited = all.clone();
            edited[1].status = 500;
            assert_eq!(audit_verify(&edited).unwrap().0, 2);
            let removed = vec![all[0].clone(), all[2].clone()];
            assert_eq!(audit_verify(&removed).unwrap().0, 3);
            let mut swapped = all.clone();
            swapped.swap(1, 2);
            assert_eq!(audit_verify(&swapped).unwrap().0, 3);
            let mut renumbered = swapped.clone();
            renumbered[1].seq = 2;
            renumbered[2].seq = 3;
            assert_eq!(audit_verify(&renumbered).unwrap().0, 2);
        });
    }

    /// The PostgreSQL test server, or `None` (skipped, saying why; failed in CI).
    fn postgres_or_skip() -> Option<&'static crate::testing::PgServer> {
        match crate::testing::shared() {
            Ok(s) => Some(s),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("CI must run this test, but: {why}"),
            Err(why) => {
                println!("skipped: {why}");
                None
            }
        }
    }

    #[test]
    fn the_postgres_schema_has_every_sqlite_table_and_column() {
        let Some(server) = postgres_or_skip() else { return };
        let dir = tempfile::tempdir().unwrap();
        let lite = Db::open(&dir.path().join("m.db")).unwrap();
        let pg = Db::open_postgres(&server.fresh_database()).unwrap();
        assert_eq!(pg.schema_version().unwrap(), lite.schema_version().unwrap());
        let columns = |db: &Db, sql: &str| -> std::collections::BTreeSet<(String, String, bool)> {
            db.conn().rows(sql, args![], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().into_iter().collect()
        };
        let lite_columns = columns(
            &lite,
            "SELECT m.name, p.name, p.\"notnull\" OR p.pk = 1 FROM sqlite_master m, pragma_table_info(m.name) p \
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
        );
        let mut pg_columns = columns(
            &pg,
            "SELECT table_name::text, column_name::text, is_nullable = 'NO' FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name <> 'strata_schema'",
        );
        // SQLite's implicit rowid, made explicit.
        assert!(pg_columns.remove(&("approvals".into(), "rowid".into(), true)));
        // SQLite lets an INTEGER PRIMARY KEY be NULL on insert (it assigns one); the schema says NOT NULL on both.
        let lite_columns: std::collections::BTreeSet<_> = lite_columns
            .into_iter()
            .map(|(t, c, n)| {
                let n = n || (t == "events" && c == "seq") || (t == "audit" && c == "seq");
                (t, c, n)
            })
            .collect();
        assert_eq!(pg_columns, lite_columns);
    }

    #[test]
    fn an_unreachable_postgres_is_named_without_its_password() {
        let e =
            Db::open_postgres("postgres://strata:s3cret@127.0.0.1:1/meta").err().expect("nothing listens on port 1");
        let msg = e.to_string();
        assert!(matches!(e, DbError::Unavailable { .. }), "{e:?}");
        assert!(msg.contains("127.0.0.1:1/meta"), "{msg}");
        assert!(!msg.contains("s3cret"), "{msg}");
        let e = Db::open_url("postgres://[not a url").err().unwrap();
        assert!(e.to_string().contains("bad database URL"), "{e}");
    }

    #[test]
    fn a_lost_postgres_connection_is_unavailable_writes_nothing_and_comes_back() {
        if postgres_or_skip().is_none() {
            return;
        }
        let mut server = crate::testing::PgServer::start().unwrap();
        let db = Db::open_postgres(&server.fresh_database()).unwrap();
        let mut a = record("0123456789abcdef", "a");
        db.insert_sandbox(&mut a).unwrap();
        server.stop();
        let e = db.sandbox_by_id("0123456789abcdef").unwrap_err();
        assert!(matches!(e, DbError::Unavailable { .. }), "{e:?}");
        let mut b = record("1123456789abcdef", "b");
        let e = db.insert_sandbox(&mut b).unwrap_err();
        assert!(matches!(e, DbError::Unavailable { .. }), "{e:?}");
        server.restart().unwrap();
        assert_eq!(db.sandbox_by_id("0123456789abcdef").unwrap().unwrap().sandbox.name, "a");
        assert!(db.sandbox_by_id("1123456789abcdef").unwrap().is_none(), "the failed insert left nothing");
        db.insert_sandbox(&mut b).unwrap();
        assert_eq!(db.events(None, 0, 100).unwrap().len(), 2);
    }

    #[test]
    fn writers_of_two_daemons_on_one_postgres_are_serialized() {
        let Some(server) = postgres_or_skip() else { return };
        let url = server.fresh_database();
        let (one, two) = (Db::open_postgres(&url).unwrap(), Db::open_postgres(&url).unwrap());
        std::thread::scope(|s| {
            for (n, db) in [(0, &one), (1, &two)] {
                s.spawn(move || {
                    for i in 0..25 {
                        db.append_audit(&NewAudit {
                            time: "2026-01-01T00:00:00Z",
                            actor: "uid:0",
                            tenant: None,
                            method: "POST",
                            route: "/v1/sandboxes",
                            target: None,
                            status: 200,
                        })
                        .unwrap();
                        let id = format!("{n}{i:02}3456789abcdef");
                        let mut r = record(&id, &format!("s{n}-{i}"));
                        r.sandbox.userns = Some(strata_api::UserNamespace { host_base: 0, size: 0 });
                        db.insert_sandbox(&mut r).unwrap();
                    }
                });
            }
        });
        let all = one.audit_entries(None).unwrap();
        assert_eq!(all.len(), 50);
        assert!(audit_verify(&all).is_none(), "one chain, no fork");
        let bases: std::collections::BTreeSet<_> =
            two.list_sandboxes().unwrap().iter().map(|r| r.sandbox.userns.unwrap().host_base).collect();
        assert_eq!(bases.len(), 50, "every sandbox got its own user-namespace range");
    }

    #[test]
    fn an_exclusive_postgres_database_refuses_a_second_daemon_until_the_first_is_gone() {
        let Some(server) = postgres_or_skip() else { return };
        let url = server.fresh_database();
        let first = Db::open_url(&url).unwrap();
        assert_eq!(first.describe(), format!("postgres {}", url.trim_start_matches("postgres://postgres@")));
        let e = Db::open_url(&url).err().expect("a second daemon is refused");
        assert!(e.to_string().contains("another strata daemon uses this database"), "{e}");
        drop(first);
        // The lock goes with the first daemon's connection.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let second = loop {
            match Db::open_url(&url) {
                Ok(db) => break db,
                Err(e) if std::time::Instant::now() > deadline => panic!("{e}"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        };
        assert_eq!(second.schema_version().unwrap(), MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_database_url_that_requires_tls_is_refused_with_the_reason() {
        let Some(server) = postgres_or_skip() else { return };
        let url = format!("{}?sslmode=require", server.fresh_database());
        let e = Db::open_postgres(&url).err().expect("no TLS to the database yet");
        assert!(matches!(e, DbError::Unavailable { .. }), "{e:?}");
        assert!(e.to_string().to_lowercase().contains("tls"), "{e}");
    }

    #[test]
    fn the_server_drops_a_session_whose_client_is_gone_within_seconds() {
        let Some(server) = postgres_or_skip() else { return };
        let db = Db::open_url(&server.fresh_database()).unwrap();
        let setting = |name: &str| db.conn().one(&format!("SHOW {name}"), args![], |r| r.get::<String>(0)).unwrap();
        assert_eq!(setting("tcp_keepalives_idle").as_deref(), Some("10"));
        assert_eq!(setting("tcp_keepalives_count").as_deref(), Some("3"));
        assert_eq!(setting("tcp_user_timeout").as_deref(), Some("15000"), "milliseconds");
    }
}
