//! OCI / Docker image configs: parsing, mapping to [`ImageConfig`], building.

use oci_spec::image::{Arch, ConfigBuilder, ImageConfiguration, ImageConfigurationBuilder, Os, RootFsBuilder};
use strata_api::ImageConfig;
use tracing::debug;

use crate::error::ImageError;

/// The `PATH` rootfs images get (the usual Docker default).
pub(crate) const DEFAULT_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Largest JSON document (index, manifest, config) read into memory.
pub(crate) const MAX_JSON_BYTES: u64 = 8 << 20;

/// The config of a rootfs import: only a default `PATH`.
pub(crate) fn rootfs_config() -> ImageConfig {
    ImageConfig { env: vec![DEFAULT_PATH_ENV.to_string()], ..ImageConfig::default() }
}

/// Parses an OCI (or Docker v1) image config. A missing `history` (optional
/// in practice, required by `oci-spec`) is tolerated.
pub(crate) fn parse(bytes: &[u8], what: &str) -> Result<ImageConfiguration, ImageError> {
    let json = |source| ImageError::Json { what: what.to_string(), source };
    let mut value: serde_json::Value = serde_json::from_slice(bytes).map_err(json)?;
    let obj = value.as_object_mut().ok_or_else(|| ImageError::archive(what, "not a JSON object"))?;
    match obj.get("history") {
        Some(v) if !v.is_null() => {}
        _ => {
            obj.insert("history".into(), serde_json::Value::Array(Vec::new()));
        }
    }
    serde_json::from_value(value).map_err(json)
}

/// Checks that the image is a Linux image whose layers are sha256 diff ids;
/// notes an architecture other than the host's in `warnings`.
pub(crate) fn check(config: &ImageConfiguration, what: &str, warnings: &mut Vec<String>) -> Result<(), ImageError> {
    if *config.os() != Os::Linux {
        return Err(ImageError::archive(what, format!("image is for {}, not linux", config.os())));
    }
    let host = Arch::default();
    if *config.architecture() != host {
        warnings.push(format!("image architecture {} differs from the host's ({host})", config.architecture()));
    }
    for id in config.rootfs().diff_ids() {
        strata_store::layers::digest_hex(id)
            .map_err(|_| ImageError::archive(what, format!("diff_id {id:?} is not a sha256 digest")))?;
    }
    Ok(())
}

/// Maps the process defaults of an image config.
pub(crate) fn map(config: &ImageConfiguration) -> ImageConfig {
    let Some(c) = config.config() else { return ImageConfig::default() };
    let non_empty = |s: &Option<String>| s.as_ref().filter(|s| !s.is_empty()).cloned();
    let mapped = ImageConfig {
        env: c.env().clone().unwrap_or_default(),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
        working_dir: non_empty(c.working_dir()),
        user: non_empty(c.user()),
    };
    debug!(?mapped, "image config");
    mapped
}

/// Builds a Linux image config for one layer, for the test image writers.
pub(crate) fn build(config: &ImageConfig, diff_id: &str) -> Result<ImageConfiguration, ImageError> {
    let oci = |source| ImageError::Oci { what: "image config".into(), source };
    let mut c = ConfigBuilder::default();
    if !config.env.is_empty() {
        c = c.env(config.env.clone());
    }
    if !config.entrypoint.is_empty() {
        c = c.entrypoint(config.entrypoint.clone());
    }
    if !config.cmd.is_empty() {
        c = c.cmd(config.cmd.clone());
    }
    if let Some(w) = &config.working_dir {
        c = c.working_dir(w.clone());
    }
    if let Some(u) = &config.user {
        c = c.user(u.clone());
    }
    let rootfs = RootFsBuilder::default().typ("layers").diff_ids(vec![diff_id.to_string()]).build().map_err(oci)?;
    ImageConfigurationBuilder::default()
        .architecture(Arch::default())
        .os(Os::Linux)
        .config(c.build().map_err(oci)?)
        .rootfs(rootfs)
        .history(Vec::new())
        .build()
        .map_err(oci)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_docker_style_config_without_history() {
        let json = br#"{"architecture":"amd64","os":"linux",
            "config":{"Env":["A=1"],"Cmd":["sh"],"WorkingDir":"","User":"1000","ExposedPorts":{"80/tcp":{}}},
            "rootfs":{"type":"layers","diff_ids":[]},"container_config":{"Cmd":["x"]}}"#;
        let c = parse(json, "config").unwrap();
        let m = map(&c);
        assert_eq!(m.env, vec!["A=1"]);
        assert_eq!(m.cmd, vec!["sh"]);
        assert_eq!(m.working_dir, None);
        assert_eq!(m.user.as_deref(), Some("1000"));
    }

    #[test]
    fn build_roundtrips_through_parse() {
        let cfg = ImageConfig {
            env: vec!["PATH=/bin".into()],
            entrypoint: vec!["/bin/sh".into()],
            cmd: vec!["-c".into(), "true".into()],
            working_dir: Some("/root".into()),
            user: Some("0:0".into()),
        };
        let d = format!("sha256:{}", "a".repeat(64));
        let built = build(&cfg, &d).unwrap();
        let bytes = serde_json::to_vec(&built).unwrap();
        let parsed = parse(&bytes, "config").unwrap();
        assert_eq!(map(&parsed), cfg);
        assert_eq!(parsed.rootfs().diff_ids(), &vec![d]);
        check(&parsed, "config", &mut Vec::new()).unwrap();
    }
}
