//! Makes and imports test images without a daemon or network.
//!
//! ```text
//! cargo run -p strata-image --example mkimage -- oci    ROOTFS.tar[.gz] OUT_DIR  [CMD...]
//! cargo run -p strata-image --example mkimage -- docker ROOTFS.tar[.gz] OUT.tar NAME:TAG [CMD...]
//! cargo run -p strata-image --example mkimage -- import SOURCE STORE_DIR [--trusted]
//! ```

use std::path::Path;
use std::process::ExitCode;

use strata_api::ImageConfig;
use strata_image::{import, write_docker_archive, write_oci_layout, ImportOptions};
use strata_store::LayerStore;

fn config(cmd: &[String]) -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        cmd: cmd.to_vec(),
        ..ImageConfig::default()
    }
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    match args {
        [op, rootfs, out, cmd @ ..] if op == "oci" => {
            write_oci_layout(Path::new(rootfs), Path::new(out), &config(cmd))?
        }
        [op, rootfs, out, tag, cmd @ ..] if op == "docker" => {
            write_docker_archive(Path::new(rootfs), Path::new(out), &config(cmd), Some(tag))?
        }
        [op, src, store, rest @ ..] if op == "import" => {
            let store = LayerStore::open(store)?;
            let opts = ImportOptions { trusted: rest.iter().any(|a| a == "--trusted"), ..Default::default() };
            let imported = import(Path::new(src), &store, &opts, &mut |_| {})?;
            println!("kind: {}", imported.kind);
            for l in &imported.layers {
                println!("layer: {} size={} new={}", l.digest, l.size, l.new);
            }
            println!("config: {:?}", imported.config);
            println!("bytes_stored: {}", imported.bytes_stored);
            for w in &imported.warnings {
                println!("warning: {w}");
            }
        }
        _ => return Err("usage: mkimage oci|docker|import ... (see the source)".into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("mkimage: {msg}");
            ExitCode::FAILURE
        }
    }
}
