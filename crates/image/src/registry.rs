//! Registry pull: fetches an image from an OCI distribution registry into an
//! OCI image layout under the layer store's staging area, for [`crate::import`].
//!
//! [`fetch`] resolves the reference (an image index is narrowed to the image
//! for linux and the host architecture, as [`crate::import`] does for
//! layouts), downloads the manifest, the config and the layers, checking each
//! blob's size and sha256 while it arrives, and writes them as a single-image
//! OCI layout. Importing that layout ([`Fetched::layout`]) then applies every
//! check a local import does (hostile entries, whiteouts, size caps, diff ids).
//!
//! Access is anonymous (including the anonymous bearer-token dance of public
//! registries); a registry that demands credentials fails with
//! [`PullError::AuthRequired`]. `insecure` talks plain HTTP to the registry.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Once;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol, LayerDescriptor};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{manifest as mt, Client, Reference};
use oci_spec::image::{Descriptor, Digest, DigestAlgorithm, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest as _, Sha256};
use strata_store::LayerStore;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use crate::config::{self, MAX_JSON_BYTES};
use crate::error::{io_err, ImageError};
use crate::hash::sha256_digest;
use crate::oci::{check_layer_media_type, is_index, is_manifest, platform_of};

/// Nested indexes followed at most this deep (as for OCI layouts).
const MAX_INDEX_DEPTH: usize = 4;
/// Manifest media types we ask for (no Docker schema 1).
const ACCEPT: &[&str] = &[
    mt::OCI_IMAGE_MEDIA_TYPE,
    mt::IMAGE_MANIFEST_MEDIA_TYPE,
    mt::OCI_IMAGE_INDEX_MEDIA_TYPE,
    mt::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];
const USER_AGENT: &str = concat!("strata/", env!("CARGO_PKG_VERSION"));

/// Options of a pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOptions {
    /// Talk plain HTTP (not HTTPS) to the registry.
    pub insecure: bool,
    /// Upper bound on the compressed layer bytes of the image; a larger image
    /// is refused before anything is downloaded. Default 64 GiB (like
    /// [`crate::ImportOptions::max_unpacked_bytes`]).
    pub max_download_bytes: u64,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of each read from the registry.
    pub read_timeout: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        PullOptions {
            insecure: false,
            max_download_bytes: crate::ImportOptions::DEFAULT_MAX_UNPACKED_BYTES,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// Download progress of [`fetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownloadProgress<'a> {
    /// 0-based index of the layer being downloaded.
    pub index: usize,
    /// Number of layers.
    pub count: usize,
    /// Its blob digest.
    pub digest: &'a str,
    /// Layer bytes downloaded so far, across all layers.
    pub done: u64,
    /// Layer bytes in total (the sum of the manifest's layer sizes).
    pub total: u64,
}

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The reference does not parse.
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference {
        /// The reference as given.
        reference: String,
        /// Why.
        reason: String,
    },
    /// The registry does not know the repository, tag or digest, or has no
    /// image for this platform.
    #[error("{reference}: not found in registry {registry}: {message}")]
    NotFound {
        /// The registry host.
        registry: String,
        /// The (normalised) reference.
        reference: String,
        /// The registry's message.
        message: String,
    },
    /// The registry demands credentials (strata pulls anonymously).
    #[error("registry {registry} requires authentication, but strata pulls anonymously: {message}")]
    AuthRequired {
        /// The registry host.
        registry: String,
        /// Details.
        message: String,
    },
    /// The registry could not be reached (connection, TLS, timeout).
    #[error("registry {registry} is unreachable: {message}")]
    Unreachable {
        /// The registry host.
        registry: String,
        /// Details.
        message: String,
        /// Whether it was a timeout.
        timed_out: bool,
    },
    /// The registry answered with an error (rate limits, server errors, protocol violations).
    #[error("registry {registry}: {message}")]
    Registry {
        /// The registry host.
        registry: String,
        /// Details.
        message: String,
    },
    /// The image content was rejected (digest or size mismatch, unsupported
    /// or malformed metadata) or local I/O failed.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// A pulled image, as an OCI image layout in a staging directory of the
/// layer store (removed when this is dropped).
pub struct Fetched {
    dir: tempfile::TempDir,
    /// The normalised reference with the manifest digest pinned
    /// (`registry/repository:tag@sha256:...`).
    pub reference: String,
    /// Digest of the image manifest (the platform's, for an index).
    pub manifest_digest: String,
    /// Layer bytes downloaded.
    pub download_bytes: u64,
    /// Notes for the user (e.g. which image of an index was chosen).
    pub warnings: Vec<String>,
}

impl Fetched {
    /// The OCI image layout directory, for [`crate::import`].
    pub fn layout(&self) -> &Path {
        self.dir.path()
    }
}

impl fmt::Debug for Fetched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetched")
            .field("layout", &self.dir.path())
            .field("reference", &self.reference)
            .field("manifest_digest", &self.manifest_digest)
            .field("download_bytes", &self.download_bytes)
            .finish()
    }
}

/// Parses an image reference (`[registry[:port]/]repository[:tag][@digest]`;
/// no registry means Docker Hub, no tag means `latest`).
pub fn parse_reference(reference: &str) -> Result<Reference, PullError> {
    let bad = |reason: String| PullError::BadReference { reference: reference.to_string(), reason };
    if reference.trim() != reference || reference.is_empty() {
        return Err(bad("empty or surrounded by whitespace".into()));
    }
    if reference.contains("://") {
        return Err(bad("a reference has no URL scheme (e.g. 127.0.0.1:5000/busybox:latest)".into()));
    }
    let parsed = Reference::from_str(reference).map_err(|e| bad(e.to_string()))?;
    if let Some(d) = parsed.digest() {
        if !d.starts_with("sha256:") {
            return Err(bad(format!("unsupported digest algorithm in {d:?} (only sha256)")));
        }
    }
    Ok(parsed)
}

/// rustls needs a process-wide crypto provider: ring (no aws-lc).
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Fails only when another provider is installed already, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Fetches `reference` into a fresh OCI layout under `store`'s staging
/// directory (removed again on error, or when the result is dropped).
pub async fn fetch(
    reference: &str,
    store: &LayerStore,
    opts: &PullOptions,
    progress: &mut (dyn FnMut(DownloadProgress<'_>) + Send),
) -> Result<Fetched, PullError> {
    let reference = parse_reference(reference)?;
    let registry = reference.resolve_registry().to_string();
    install_crypto_provider();
    let config = ClientConfig {
        protocol: if opts.insecure {
            ClientProtocol::HttpsExcept(vec![registry.clone()])
        } else {
            ClientProtocol::Https
        },
        connect_timeout: Some(opts.connect_timeout),
        read_timeout: Some(opts.read_timeout),
        user_agent: USER_AGENT,
        ..Default::default()
    };
    let client = Client::try_from(config).map_err(|e| {
        Classifier { registry: &registry, reference: reference.whole(), insecure: opts.insecure }.classify(e)
    })?;
    let staging = store.root().join("staging");
    let dir = tempfile::Builder::new().prefix("pull-").tempdir_in(&staging).map_err(io_err(&staging))?;
    let mut remote = Remote { client, registry, reference, insecure: opts.insecure, warnings: Vec::new() };
    let (manifest_digest, download_bytes) = remote.fetch_into(dir.path(), opts, progress).await?;
    let r = &remote.reference;
    let pinned = match r.tag() {
        Some(tag) => format!("{}/{}:{tag}@{manifest_digest}", r.registry(), r.repository()),
        None => format!("{}/{}@{manifest_digest}", r.registry(), r.repository()),
    };
    info!(reference = %pinned, download_bytes, "fetched image");
    Ok(Fetched { dir, reference: pinned, manifest_digest, download_bytes, warnings: remote.warnings })
}

struct Remote {
    client: Client,
    registry: String,
    reference: Reference,
    insecure: bool,
    warnings: Vec<String>,
}

/// Maps [`OciDistributionError`]s to [`PullError`]s.
struct Classifier<'a> {
    registry: &'a str,
    reference: String,
    insecure: bool,
}

impl Remote {
    fn err(&self, e: OciDistributionError) -> PullError {
        Classifier { registry: &self.registry, reference: self.reference.whole(), insecure: self.insecure }.classify(e)
    }

    /// Downloads everything into the layout at `dir`; returns the manifest
    /// digest and the layer bytes downloaded.
    async fn fetch_into(
        &mut self,
        dir: &Path,
        opts: &PullOptions,
        progress: &mut (dyn FnMut(DownloadProgress<'_>) + Send),
    ) -> Result<(String, u64), PullError> {
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;

        // The manifest the reference names; an index is narrowed to our platform.
        let reference = self.reference.clone();
        let (mut bytes, mut digest) = self.manifest(&reference, reference.digest()).await?;
        let mut platform = None;
        let mut depth = 0;
        let manifest_desc = loop {
            let media_type = manifest_media_type(&bytes, &format!("manifest {digest}"))?;
            if is_manifest(&media_type) {
                let mut desc = Descriptor::new(media_type, bytes.len() as u64, oci_digest(&digest)?);
                desc.set_platform(platform);
                break desc;
            }
            if !is_index(&media_type) {
                return Err(ImageError::UnsupportedMediaType {
                    media_type: media_type.to_string(),
                    reason: format!("{} is not a container image manifest or index", self.reference.whole()),
                }
                .into());
            }
            if depth >= MAX_INDEX_DEPTH {
                return Err(ImageError::archive("index", format!("nested deeper than {MAX_INDEX_DEPTH} levels")).into());
            }
            depth += 1;
            let what = format!("index {digest}");
            let index = ImageIndex::from_reader(&bytes[..]).map_err(|source| ImageError::Oci { what, source })?;
            let chosen = self.select(index.manifests())?;
            debug!(digest = %chosen.digest(), platform = %platform_of(&chosen), "selected manifest of index");
            let chosen_digest = chosen.digest().to_string();
            (bytes, digest) =
                self.manifest(&self.reference.clone_with_digest(chosen_digest.clone()), Some(&chosen_digest)).await?;
            if bytes.len() as u64 != chosen.size() {
                return Err(ImageError::SizeMismatch {
                    what: format!("manifest {chosen_digest}"),
                    expected: chosen.size(),
                    actual: bytes.len() as u64,
                }
                .into());
            }
            platform = chosen.platform().clone();
        };
        write_blob(&blobs, &digest, &bytes)?;
        let what = format!("manifest {digest}");
        let manifest = ImageManifest::from_reader(&bytes[..]).map_err(|source| ImageError::Oci { what, source })?;

        // The config, checked before any layer is downloaded.
        let config_desc = manifest.config();
        let config_type = config_desc.media_type();
        if *config_type != MediaType::ImageConfig && config_type.as_ref() != mt::IMAGE_DOCKER_CONFIG_MEDIA_TYPE {
            return Err(ImageError::UnsupportedMediaType {
                media_type: config_type.to_string(),
                reason: format!("{} is not a container image (config media type)", self.reference.whole()),
            }
            .into());
        }
        let what = format!("config {}", config_desc.digest());
        if config_desc.size() > MAX_JSON_BYTES {
            return Err(ImageError::archive(what, format!("larger than {MAX_JSON_BYTES} bytes")).into());
        }
        let config_bytes = self.blob_to_memory(config_desc, &what).await?;
        write_blob(&blobs, config_desc.digest().as_ref(), &config_bytes)?;
        let image_config = config::parse(&config_bytes, &what)?;
        config::check(&image_config, &what, &mut Vec::new())?;
        let layers = manifest.layers();
        if image_config.rootfs().diff_ids().len() != layers.len() {
            return Err(ImageError::archive(
                "image",
                format!(
                    "manifest lists {} layers but the config has {} diff_ids",
                    layers.len(),
                    image_config.rootfs().diff_ids().len()
                ),
            )
            .into());
        }
        for layer in layers {
            check_layer_media_type(layer.media_type())?;
        }
        let total = layers.iter().try_fold(0u64, |sum, l| sum.checked_add(l.size())).unwrap_or(u64::MAX);
        if total > opts.max_download_bytes {
            return Err(ImageError::TooLarge {
                what: format!("{} ({total} bytes of layers)", self.reference.whole()),
                limit: opts.max_download_bytes,
            }
            .into());
        }

        // The layers, one after the other.
        let count = layers.len();
        let mut done = 0u64;
        for (index, desc) in layers.iter().enumerate() {
            let digest = desc.digest().to_string();
            progress(DownloadProgress { index, count, digest: &digest, done, total });
            let what = format!("layer {}/{count} ({digest})", index + 1);
            let base = done;
            let mut relay =
                |n: u64| progress(DownloadProgress { index, count, digest: &digest, done: base + n, total });
            self.blob_to_file(desc, &blobs, &what, &mut relay).await?;
            done += desc.size();
        }

        // index.json naming just this image, and the oci-layout marker.
        let mut manifest_desc = manifest_desc;
        manifest_desc.set_annotations(Some(HashMap::from([(
            "org.opencontainers.image.ref.name".to_string(),
            self.reference.whole(),
        )])));
        let index = oci_spec::image::ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(vec![manifest_desc])
            .build()
            .map_err(|source| ImageError::Oci { what: "index.json".into(), source })?;
        let index_json =
            serde_json::to_vec(&index).map_err(|source| ImageError::Json { what: "index.json".into(), source })?;
        let index_path = dir.join("index.json");
        std::fs::write(&index_path, index_json).map_err(io_err(&index_path))?;
        let layout_path = dir.join("oci-layout");
        std::fs::write(&layout_path, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io_err(&layout_path))?;
        Ok((digest, done))
    }

    /// Fetches a manifest or index; checks its size and, when `expected`
    /// names one, its digest. Returns the bytes and their digest.
    async fn manifest(&self, reference: &Reference, expected: Option<&str>) -> Result<(Vec<u8>, String), PullError> {
        debug!(reference = %reference.whole(), "fetching manifest");
        let (bytes, _) = self
            .client
            .pull_manifest_raw(reference, &RegistryAuth::Anonymous, ACCEPT)
            .await
            .map_err(|e| self.err(e))?;
        let what = format!("manifest of {}", reference.whole());
        if bytes.len() as u64 > MAX_JSON_BYTES {
            return Err(ImageError::archive(what, format!("larger than {MAX_JSON_BYTES} bytes")).into());
        }
        let digest = sha256_digest(&bytes);
        if let Some(expected) = expected {
            if digest != expected {
                return Err(ImageError::DigestMismatch { what, expected: expected.to_string(), actual: digest }.into());
            }
        }
        Ok((bytes.to_vec(), digest))
    }

    /// Picks the image of an index: the only one, else the one for linux and
    /// the host architecture (attestations ignored), as [`crate::import`]
    /// does for OCI layouts.
    fn select(&mut self, manifests: &[Descriptor]) -> Result<Descriptor, PullError> {
        match crate::oci::choose_manifest(manifests) {
            crate::oci::Choice::Empty => Err(ImageError::archive("index", "lists no image manifests").into()),
            crate::oci::Choice::One(d) => Ok(d.clone()),
            crate::oci::Choice::FirstOfUnlabelled(d, n) => {
                self.warnings.push(format!("index lists {n} images; pulled the first ({})", d.digest()));
                Ok(d.clone())
            }
            crate::oci::Choice::NoMatch { host, available } => Err(PullError::NotFound {
                registry: self.registry.clone(),
                reference: self.reference.whole(),
                message: format!("no image for linux/{host} (available: {})", available.join(", ")),
            }),
        }
    }

    /// Downloads a small blob (the config) into memory, checking size and digest.
    async fn blob_to_memory(&self, desc: &Descriptor, what: &str) -> Result<Vec<u8>, PullError> {
        let mut out = Vec::with_capacity(desc.size() as usize);
        self.download(desc, what, &mut out, Path::new("(memory)"), &mut |_| {}).await?;
        Ok(out)
    }

    /// Downloads a layer blob into `blobs/<hex>`, checking size and digest.
    async fn blob_to_file(
        &self,
        desc: &Descriptor,
        blobs: &Path,
        what: &str,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), PullError> {
        let path = blob_path(blobs, desc.digest())?;
        if path.exists() {
            // The same blob twice in one image: already downloaded and checked.
            progress(desc.size());
            return Ok(());
        }
        let part = path.with_extension("partial");
        let file = tokio::fs::File::create(&part).await.map_err(io_err(&part))?;
        let mut out = tokio::io::BufWriter::with_capacity(256 * 1024, file);
        self.download(desc, what, &mut out, &part, progress).await?;
        drop(out);
        tokio::fs::rename(&part, &path).await.map_err(io_err(&path))?;
        Ok(())
    }

    /// Downloads a blob into `out` (`dest` names it in errors); checks its
    /// size while it arrives and its digest at the end.
    async fn download<W: AsyncWrite + Unpin>(
        &self,
        desc: &Descriptor,
        what: &str,
        out: &mut W,
        dest: &Path,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), PullError> {
        let mut stream = self.open_blob(desc, what).await?;
        let mut hasher = Sha256::new();
        let mut received = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.stream_err(e, desc, what))?;
            received += chunk.len() as u64;
            if received > desc.size() {
                return Err(ImageError::SizeMismatch {
                    what: what.to_string(),
                    expected: desc.size(),
                    actual: received,
                }
                .into());
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(io_err(dest))?;
            progress(received);
        }
        out.flush().await.map_err(io_err(dest))?;
        if received != desc.size() {
            return Err(
                ImageError::SizeMismatch { what: what.to_string(), expected: desc.size(), actual: received }.into()
            );
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest().as_ref() {
            return Err(ImageError::DigestMismatch {
                what: what.to_string(),
                expected: desc.digest().to_string(),
                actual,
            }
            .into());
        }
        Ok(())
    }

    async fn open_blob(&self, desc: &Descriptor, what: &str) -> Result<oci_client::client::SizedStream, PullError> {
        if *desc.digest().algorithm() != DigestAlgorithm::Sha256 {
            return Err(ImageError::archive(
                what,
                format!("unsupported digest algorithm {}", desc.digest().algorithm()),
            )
            .into());
        }
        let digest = desc.digest().to_string();
        // Never follow a descriptor's foreign `urls`: blobs come from this registry only.
        let no_urls = None;
        debug!(%digest, size = desc.size(), "downloading blob");
        let stream = self
            .client
            .pull_blob_stream(&self.reference, &LayerDescriptor { digest: &digest, urls: &no_urls })
            .await
            .map_err(|e| self.err(e))?;
        if let Some(len) = stream.content_length {
            if len != desc.size() {
                return Err(
                    ImageError::SizeMismatch { what: what.to_string(), expected: desc.size(), actual: len }.into()
                );
            }
        }
        Ok(stream)
    }

    /// An error while reading a blob body: oci-client's digest check, or the connection.
    fn stream_err(&self, e: std::io::Error, desc: &Descriptor, what: &str) -> PullError {
        if let Some(oci_client::errors::DigestError::VerificationError { actual, .. }) =
            e.get_ref().and_then(|inner| inner.downcast_ref::<oci_client::errors::DigestError>())
        {
            return ImageError::DigestMismatch {
                what: what.to_string(),
                expected: desc.digest().to_string(),
                actual: actual.clone(),
            }
            .into();
        }
        PullError::Registry { registry: self.registry.clone(), message: format!("reading {what}: {}", chain(&e)) }
    }
}

impl Classifier<'_> {
    fn not_found(&self, message: String) -> PullError {
        PullError::NotFound { registry: self.registry.to_string(), reference: self.reference.clone(), message }
    }

    fn auth(&self, message: String) -> PullError {
        PullError::AuthRequired { registry: self.registry.to_string(), message }
    }

    fn registry(&self, message: String) -> PullError {
        PullError::Registry { registry: self.registry.to_string(), message }
    }

    /// Maps an oci-client error to what the caller can act on.
    fn classify(&self, e: OciDistributionError) -> PullError {
        use OciDistributionError as E;
        match e {
            E::RegistryError { envelope, url } => {
                let message = envelope
                    .errors
                    .iter()
                    .map(|e| {
                        let code = serde_json::to_value(&e.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_else(|| format!("{:?}", e.code));
                        if e.message.is_empty() {
                            code
                        } else {
                            format!("{code}: {}", e.message)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                let has = |c: &[OciErrorCode]| envelope.errors.iter().any(|e| c.contains(&e.code));
                if has(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]) {
                    self.auth(message)
                } else if has(&[
                    OciErrorCode::ManifestUnknown,
                    OciErrorCode::NameUnknown,
                    OciErrorCode::NotFound,
                    OciErrorCode::BlobUnknown,
                ]) {
                    self.not_found(message)
                } else if has(&[OciErrorCode::NameInvalid, OciErrorCode::TagInvalid]) {
                    PullError::BadReference { reference: self.reference.clone(), reason: message }
                } else {
                    self.registry(format!("{message} ({url})"))
                }
            }
            E::UnauthorizedError { url } => self.auth(format!("HTTP 401 from {url}")),
            E::AuthenticationFailure(reason) => self.auth(format!("token request failed: {}", reason.trim())),
            E::ServerError { code, url, message } => {
                let mut message = format!("HTTP {code} from {url}: {}", message.trim());
                if self.insecure && message.contains("HTTPS server") {
                    message.push_str(&format!(" ({} serves HTTPS: pull without --insecure)", self.registry));
                }
                match code {
                    404 => self.not_found(message),
                    401 | 403 => self.auth(message),
                    _ => self.registry(message),
                }
            }
            E::ImageManifestNotFoundError(m) => self.not_found(m),
            E::DigestError(oci_client::errors::DigestError::VerificationError { expected, actual }) => {
                ImageError::DigestMismatch { what: format!("manifest of {}", self.reference), expected, actual }.into()
            }
            E::RequestError(re) => {
                let timed_out = re.is_timeout();
                let mut message = chain(&re);
                // TLS records answered in plain HTTP: rustls sees garbage.
                let plain_http = ["InvalidContentType", "corrupt message"].iter().any(|w| message.contains(w));
                if plain_http && !self.insecure {
                    message.push_str(&format!(
                        " (if {} serves plain HTTP, pull with --insecure / \"insecure\": true)",
                        self.registry
                    ));
                }
                if re.is_connect() || timed_out || plain_http {
                    PullError::Unreachable { registry: self.registry.to_string(), message, timed_out }
                } else {
                    self.registry(message)
                }
            }
            other => self.registry(chain(&other)),
        }
    }
}

use strata_core::errors::chain;

/// The media type of a manifest or index: its `mediaType` field, else
/// guessed from its shape (the field is optional in OCI documents).
fn manifest_media_type(bytes: &[u8], what: &str) -> Result<MediaType, ImageError> {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|source| ImageError::Json { what: what.to_string(), source })?;
    Ok(match probe.media_type {
        Some(m) => MediaType::from(m.as_str()),
        None if probe.manifests.is_some() => MediaType::ImageIndex,
        None if probe.layers.is_some() => MediaType::ImageManifest,
        None => return Err(ImageError::archive(what, "neither an image manifest nor an index")),
    })
}

fn oci_digest(s: &str) -> Result<Digest, ImageError> {
    Digest::from_str(s).map_err(|source| ImageError::Oci { what: format!("digest {s}"), source })
}

/// `blobs/<hex>` for a sha256 digest (oci-spec guarantees 64 lowercase hex digits).
fn blob_path(blobs: &Path, digest: &Digest) -> Result<PathBuf, ImageError> {
    if *digest.algorithm() != DigestAlgorithm::Sha256 {
        return Err(ImageError::archive(
            format!("blob {digest}"),
            format!("unsupported digest algorithm {}", digest.algorithm()),
        ));
    }
    Ok(blobs.join(digest.digest()))
}

fn write_blob(blobs: &Path, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
    let path = blob_path(blobs, &oci_digest(digest)?)?;
    std::fs::write(&path, bytes).map_err(io_err(&path))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::{ImportOptions, ImportedLayer};

    /// Canned responses by request path: status, extra headers, body.
    type Routes = Arc<Mutex<HashMap<String, (u16, Vec<(String, String)>, Vec<u8>)>>>;

    /// A minimal plain-HTTP registry on loopback serving canned responses.
    struct FakeRegistry {
        addr: String,
        routes: Routes,
    }

    impl FakeRegistry {
        fn start() -> FakeRegistry {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let routes: Routes = Arc::default();
            routes.lock().unwrap().insert("/v2/".into(), (200, vec![], b"{}".to_vec()));
            let r = Arc::clone(&routes);
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    let Ok(mut conn) = conn else { return };
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        continue;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                            break;
                        }
                    }
                    let (status, headers, body) = r.lock().unwrap().get(&path).cloned().unwrap_or((
                        404,
                        vec![],
                        br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#.to_vec(),
                    ));
                    let mut head =
                        format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
                    for (k, v) in headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(&body);
                }
            });
            FakeRegistry { addr, routes }
        }

        fn route(&self, path: &str, status: u16, headers: &[(&str, &str)], body: &[u8]) {
            let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            self.routes.lock().unwrap().insert(path.to_string(), (status, headers, body.to_vec()));
        }

        /// Serves a one-layer image `test:latest` whose layer blob is `layer`
        /// (uncompressed tar); the registry serves `served` as that blob.
        fn image(&self, layer: &[u8], served: &[u8]) {
            let layer_digest = sha256_digest(layer);
            let config = serde_json::json!({
                "architecture": oci_spec::image::Arch::default().to_string(), "os": "linux",
                "config": {"Env": ["PATH=/bin"]},
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            });
            let config = serde_json::to_vec(&config).unwrap();
            let manifest = serde_json::json!({
                "schemaVersion": 2, "mediaType": mt::OCI_IMAGE_MEDIA_TYPE,
                "config": {"mediaType": mt::IMAGE_CONFIG_MEDIA_TYPE, "digest": sha256_digest(&config), "size": config.len()},
                "layers": [{"mediaType": mt::IMAGE_LAYER_MEDIA_TYPE, "digest": layer_digest, "size": layer.len()}],
            });
            let manifest = serde_json::to_vec(&manifest).unwrap();
            self.route("/v2/test/manifests/latest", 200, &[("Content-Type", mt::OCI_IMAGE_MEDIA_TYPE)], &manifest);
            self.route(&format!("/v2/test/blobs/{}", sha256_digest(&config)), 200, &[], &config);
            self.route(&format!("/v2/test/blobs/{layer_digest}"), 200, &[], served);
        }

        fn reference(&self) -> String {
            format!("{}/test:latest", self.addr)
        }
    }

    fn tar_with(name: &[u8], data: &[u8]) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, data).unwrap();
        b.into_inner().unwrap()
    }

    fn new_store() -> (tempfile::TempDir, LayerStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path().join("layers")).unwrap();
        (dir, store)
    }

    fn staging_is_empty(store: &LayerStore) -> bool {
        std::fs::read_dir(store.root().join("staging")).unwrap().next().is_none()
    }

    fn fetch_blocking(reference: &str, store: &LayerStore) -> Result<Fetched, PullError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let opts = PullOptions { insecure: true, ..Default::default() };
        rt.block_on(fetch(reference, store, &opts, &mut |_| {}))
    }

    #[test]
    fn references_parse_or_are_rejected_with_a_reason() {
        let r = parse_reference("127.0.0.1:5000/busybox:latest").unwrap();
        assert_eq!((r.registry(), r.repository(), r.tag()), ("127.0.0.1:5000", "busybox", Some("latest")));
        let r = parse_reference("busybox").unwrap();
        assert_eq!((r.registry(), r.repository(), r.tag()), ("docker.io", "library/busybox", Some("latest")));
        for bad in ["", " busybox", "http://127.0.0.1:5000/busybox", "a b", "127.0.0.1:5000/BusyBox"] {
            match parse_reference(bad) {
                Err(PullError::BadReference { reference, .. }) => assert_eq!(reference, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn media_type_is_read_or_guessed() {
        assert_eq!(manifest_media_type(br#"{"manifests":[]}"#, "m").unwrap(), MediaType::ImageIndex);
        assert_eq!(manifest_media_type(br#"{"layers":[]}"#, "m").unwrap(), MediaType::ImageManifest);
        let docker =
            manifest_media_type(format!(r#"{{"mediaType":"{}"}}"#, mt::IMAGE_MANIFEST_MEDIA_TYPE).as_bytes(), "m");
        assert!(is_manifest(&docker.unwrap()));
        assert!(manifest_media_type(b"{}", "m").is_err());
    }

    #[test]
    fn a_pulled_image_imports_and_leaves_no_staging() {
        let reg = FakeRegistry::start();
        let layer = tar_with(b"bin/hello", b"hi");
        reg.image(&layer, &layer);
        let (_dir, store) = new_store();
        let fetched = fetch_blocking(&reg.reference(), &store).unwrap();
        assert!(fetched.reference.starts_with(&format!("{}/test:latest@sha256:", reg.addr)), "{}", fetched.reference);
        assert_eq!(fetched.download_bytes, layer.len() as u64);
        let imported = crate::import(fetched.layout(), &store, &ImportOptions::default(), &mut |_| {}).unwrap();
        assert_eq!(
            imported.layers,
            vec![ImportedLayer {
                key: format!("{}+untrusted", sha256_digest(&layer)),
                digest: sha256_digest(&layer),
                size: 2,
                new: true
            }]
        );
        assert_eq!(imported.config.env, vec!["PATH=/bin"]);
        drop(fetched);
        assert!(staging_is_empty(&store));
    }

    #[test]
    fn a_hostile_layer_from_a_registry_is_rejected_by_the_import() {
        let reg = FakeRegistry::start();
        let layer = tar_with(b"../escape", b"x");
        reg.image(&layer, &layer);
        let (_dir, store) = new_store();
        let fetched = fetch_blocking(&reg.reference(), &store).unwrap();
        let e = crate::import(fetched.layout(), &store, &ImportOptions::default(), &mut |_| {}).unwrap_err();
        assert!(matches!(&e, ImageError::InvalidEntry { entry, .. } if entry == "../escape"), "{e}");
        drop(fetched);
        assert!(store.list().unwrap().is_empty());
        assert!(staging_is_empty(&store));
    }

    #[test]
    fn blobs_that_do_not_match_their_descriptor_are_refused() {
        let layer = tar_with(b"bin/hello", b"hi");
        // Same size, different bytes.
        let mut tampered = layer.clone();
        tampered[600] ^= 1;
        // Longer than the descriptor says.
        let mut longer = layer.clone();
        longer.extend_from_slice(&[0u8; 512]);
        for (served, want) in [(tampered, "digest"), (longer, "size")] {
            let reg = FakeRegistry::start();
            reg.image(&layer, &served);
            let (_dir, store) = new_store();
            let e = fetch_blocking(&reg.reference(), &store).unwrap_err();
            let ok = match want {
                "digest" => matches!(e, PullError::Image(ImageError::DigestMismatch { .. })),
                _ => matches!(e, PullError::Image(ImageError::SizeMismatch { .. })),
            };
            assert!(ok, "{want}: {e:?}");
            assert!(staging_is_empty(&store), "{want}: the partial download is removed");
        }
    }

    #[test]
    fn registry_errors_are_classified() {
        let reg = FakeRegistry::start();
        let (_dir, store) = new_store();
        let e = fetch_blocking(&reg.reference(), &store).unwrap_err();
        assert!(matches!(&e, PullError::NotFound { registry, .. } if *registry == reg.addr), "{e:?}");
        assert!(e.to_string().contains("MANIFEST_UNKNOWN: manifest unknown"), "{e}");

        reg.route("/v2/test/manifests/latest", 401, &[("WWW-Authenticate", "Basic realm=\"x\"")], b"");
        let e = fetch_blocking(&reg.reference(), &store).unwrap_err();
        assert!(matches!(&e, PullError::AuthRequired { registry, .. } if *registry == reg.addr), "{e:?}");

        reg.route("/v2/test/manifests/latest", 503, &[], b"down for maintenance");
        let e = fetch_blocking(&reg.reference(), &store).unwrap_err();
        assert!(matches!(&e, PullError::Registry { .. }), "{e:?}");
        assert!(e.to_string().contains("down for maintenance"), "{e}");
        assert!(staging_is_empty(&store));
    }
}
