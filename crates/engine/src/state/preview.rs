//! The preview proxy's engine state ([`Previews`]: settings, the listener's
//! address for URLs, and the socket makers of sandboxes' networks, kept per
//! init) and its errors. Preview records, tokens and readying a sandbox for a
//! request are [`crate::preview`]'s.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strata_api::{ErrorCode, Preview, PREVIEW_PATH_PREFIX};
use strata_runtime::{NetSockets, Runtime};

use crate::error::EngineError;

/// Default preview domain (`*.localhost` resolves to loopback in browsers and most resolvers).
pub const DEFAULT_DOMAIN: &str = "preview.localhost";

/// How long connecting to a sandbox port may take (loopback: refused or accepted at once).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A sandbox network's socket maker ends after this long without requests.
pub(crate) const CONNECTOR_IDLE: Duration = Duration::from_secs(10);

/// Errors of the proxy's upstream side.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The sandbox's network namespace could not be entered.
    #[error("entering the network namespace of sandbox {sandbox}: {source}")]
    Netns {
        /// Sandbox id.
        sandbox: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Nothing accepts connections on the port.
    #[error("nothing accepts connections on 127.0.0.1:{port} inside sandbox {sandbox}: {source}")]
    Connect {
        /// Sandbox id.
        sandbox: String,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox's pid 1, which relays its ports (a microVM), could not be reached.
    #[error("reaching the init of sandbox {sandbox}, which relays its ports: {why}")]
    Relay {
        /// Sandbox id.
        sandbox: String,
        /// Why.
        why: String,
    },
    /// The HTTP exchange with the sandbox's server failed.
    #[error("the server on port {port} of sandbox {sandbox} failed: {source}")]
    Upstream {
        /// Sandbox id.
        sandbox: String,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl From<PreviewError> for EngineError {
    fn from(e: PreviewError) -> Self {
        match &e {
            PreviewError::Netns { .. } | PreviewError::Relay { .. } => EngineError::internal("preview", &e),
            PreviewError::Connect { .. } | PreviewError::Upstream { .. } => {
                EngineError::new(ErrorCode::UpstreamUnavailable, crate::error::chain(&e))
            }
        }
    }
}

/// Preview settings of the daemon.
#[derive(Debug, Clone)]
pub struct PreviewConfig {
    /// Host-based previews are `<port>-<sandbox>.<domain>` (lowercase, no trailing dot).
    pub domain: String,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        PreviewConfig { domain: DEFAULT_DOMAIN.to_string() }
    }
}

/// Preview settings and the socket makers of sandboxes' networks (the runtime's).
#[derive(Default)]
pub struct Previews {
    /// Settings.
    pub config: PreviewConfig,
    /// The TCP listener's address once bound, for the URLs shown (path-based URLs are relative without one).
    pub listen: std::sync::OnceLock<SocketAddr>,
    /// Socket makers by (sandbox, init pid, init start time).
    connectors: Mutex<HashMap<InitKey, Arc<dyn NetSockets>>>,
    /// Counts preview creations and revocations (see [`crate::preview::generation`]).
    changes: std::sync::atomic::AtomicU64,
}

/// A sandbox's init: (sandbox id, init pid, init start time).
pub(crate) type InitKey = (String, i32, u64);

impl std::fmt::Debug for Previews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Previews").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Previews {
    /// A proxy with these settings.
    pub fn new(config: PreviewConfig) -> Self {
        Previews {
            config,
            listen: std::sync::OnceLock::new(),
            connectors: Mutex::new(HashMap::new()),
            changes: 0.into(),
        }
    }

    /// Records that a preview was created or revoked.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// How many previews were created or revoked so far.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Forgets the connector threads of a sandbox (its init is gone or changed).
    pub fn forget_connectors(&self, sandbox: &str) {
        self.connectors.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| k.0 != sandbox);
    }

    /// The listing form of a stored preview (with its URLs).
    pub fn with_urls(&self, mut p: Preview) -> Preview {
        let port = p.port.map_or_else(|| "{port}".to_string(), |p| p.to_string());
        let (host_port, base) = match self.listen.get().copied() {
            Some(a) => (
                if a.port() == 80 { String::new() } else { format!(":{}", a.port()) },
                format!("http://{}", crate::loopback(a)),
            ),
            None => (String::new(), String::new()),
        };
        p.url_host = format!("http://{port}-{}.{}{host_port}/", p.sandbox_id, self.config.domain);
        p.url_path = format!("{base}{PREVIEW_PATH_PREFIX}{}/{port}/", p.sandbox_id);
        p
    }
}

/// A connection to a port inside a sandbox: a TCP connection made in its
/// network from the host (`Left`), or a stream to its pid 1, which relays it
/// to the port (`Right`: a microVM's or a gVisor sandbox's).
pub type Upstream = tokio_util::either::Either<tokio::net::TcpStream, tokio::net::UnixStream>;

impl Previews {
    /// Connects to 127.0.0.1:`port` inside the sandbox whose init is `init`:
    /// through the runtime's socket maker for its network
    /// ([`Runtime::net_sockets`], kept for `CONNECTOR_IDLE` between
    /// requests), or, on a tier whose ports only its pid 1 reaches (a
    /// microVM), through a stream pid 1 relays ([`Runtime::pid1_stream`]).
    pub async fn connect(
        &self,
        runtime: &Arc<dyn Runtime>,
        sandbox: &str,
        init: &strata_runtime::SandboxHandle,
        port: u16,
    ) -> Result<Upstream, PreviewError> {
        if runtime.ports_through_pid1() {
            return relayed(runtime, sandbox, port).await.map(Upstream::Right);
        }
        let netns_err = |source| PreviewError::Netns { sandbox: sandbox.to_string(), source };
        let key = (sandbox.to_string(), init.init_pid, init.init_start_time);
        let mut socket = None;
        // A maker that just ended (idle) drops the request: then once more with a new one.
        for _ in 0..2 {
            let existing = self.connectors.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
            let maker = match existing {
                Some(m) => m,
                None => {
                    let m: Arc<dyn NetSockets> = Arc::from(
                        runtime
                            .net_sockets(init, CONNECTOR_IDLE)
                            .map_err(|e| netns_err(std::io::Error::other(e.to_string())))?,
                    );
                    self.connectors.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), m.clone());
                    m
                }
            };
            let (rtx, rrx) = tokio::sync::oneshot::channel();
            if maker.socket(Box::new(move |s| drop(rtx.send(s)))) {
                if let Ok(r) = rrx.await {
                    let fd = r.map_err(netns_err)?;
                    socket = Some(tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd)));
                    break;
                }
            }
            self.connectors.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        }
        let socket = socket.ok_or_else(|| netns_err(std::io::Error::other("the network's socket maker ended")))?;
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let conn_err = |source| PreviewError::Connect { sandbox: sandbox.to_string(), port, source };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
            .await
            .map_err(|_| conn_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(conn_err)?;
        let _ = stream.set_nodelay(true);
        Ok(Upstream::Left(stream))
    }
}

/// A stream to `port` in sandbox `sandbox`'s guest, relayed by its pid 1.
async fn relayed(runtime: &Arc<dyn Runtime>, sandbox: &str, port: u16) -> Result<tokio::net::UnixStream, PreviewError> {
    let (rt, id) = (runtime.clone(), sandbox.to_string());
    let req = strata_init::spawner::Request::Connect { port };
    // Pid 1 gives up on the port after its own timeout, and answers why.
    let patience = CONNECT_TIMEOUT + Duration::from_secs(5);
    let opened = tokio::task::spawn_blocking(move || rt.pid1_stream(&id, &req, patience))
        .await
        .map_err(|e| PreviewError::Relay { sandbox: sandbox.to_string(), why: e.to_string() })?;
    let stream = match opened {
        Ok((stream, _)) => stream,
        Err(strata_runtime::RuntimeError::Refused(why)) => {
            return Err(PreviewError::Connect {
                sandbox: sandbox.to_string(),
                port,
                source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, why),
            })
        }
        Err(e) => return Err(PreviewError::Relay { sandbox: sandbox.to_string(), why: e.to_string() }),
    };
    stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(stream))
        .map_err(|e| PreviewError::Relay { sandbox: sandbox.to_string(), why: e.to_string() })
}
