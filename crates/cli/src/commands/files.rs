//! Files of a sandbox: `diff` and `export` (the changes since a checkpoint), `cp`
//! (streamed to and from the host, directories as tar) and `fs ls|stat|mkdir|rm|mv`.

use anyhow::{bail, Context, Result};
use strata_client::Client;

use crate::args::files::{ChangeSet, DiffArgs, ExportArgs, FsCmd, SandboxPath};
use crate::args::{JsonOutput, SandboxId};
use crate::{output, transfer};

/// `strata diff`: one line per changed path, `A`, `M` or `D` first.
pub(super) async fn diff(c: &Client, a: DiffArgs) -> Result<i32> {
    let DiffArgs { changes: ChangeSet { sandbox: SandboxId { id }, against }, out: JsonOutput { json } } = a;
    let list = c.diff(&id, against.as_deref()).await?;
    if json {
        output::json(&list);
    } else {
        for ch in &list {
            let mark = match ch.change {
                strata_api::ChangeKind::Added => 'A',
                strata_api::ChangeKind::Modified => 'M',
                strata_api::ChangeKind::Deleted => 'D',
            };
            let size = if ch.change == strata_api::ChangeKind::Deleted || ch.kind == "dir" {
                String::new()
            } else {
                format!("  ({})", output::size(ch.size))
            };
            println!("{mark} {}{size}", ch.path);
        }
    }
    Ok(0)
}

/// `strata export`: the change set as a tar file.
pub(super) async fn export(c: &Client, a: ExportArgs) -> Result<i32> {
    let ExportArgs { changes: ChangeSet { sandbox: SandboxId { id }, against }, output: out } = a;
    transfer::download_to(c.export_stream(&id, against.as_deref()).await?, &out, 0o644).await?;
    Ok(0)
}

/// Splits `ID:/path` into (id, path); local paths have no `:` before a `/`.
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (id, path) = spec.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && path.starts_with('/')).then_some((id, path))
}

/// `strata cp SRC DST`: exactly one side is `ID:/absolute/path`.
pub(super) async fn cp(c: &Client, src: &str, dst: &str) -> Result<i32> {
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let local = std::path::Path::new(src);
            let meta = std::fs::metadata(local).with_context(|| format!("reading {src}"))?;
            if meta.is_dir() {
                // The tar is made while it is sent: nothing is held whole in memory.
                let root = local.to_path_buf();
                let (chunks, archived) = transfer::produce(move |w| {
                    let mut b = tar::Builder::new(w);
                    b.follow_symlinks(false);
                    b.append_dir_all(".", &root)?;
                    b.finish()
                });
                let sent = c.upload_stream(id, path, chunks, None, true).await;
                archived.await.context("archiving thread")?.with_context(|| format!("archiving {src}"))?;
                sent?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let file = tokio::fs::File::open(local).await.with_context(|| format!("reading {src}"))?;
                // Copying into an existing directory keeps the file name, like cp(1).
                let target = match c.stat(id, path).await {
                    Ok(s) if s.kind == strata_api::FileKind::Dir => format!(
                        "{}/{}",
                        path.trim_end_matches('/'),
                        local.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
                    ),
                    _ => path.to_string(),
                };
                c.upload_stream(
                    id,
                    &target,
                    transfer::file_chunks(file),
                    Some(meta.permissions().mode() & 0o777),
                    false,
                )
                .await?;
            }
            Ok(0)
        }
        (Some((id, path)), None) => {
            let st = c.stat(id, path).await?;
            if st.kind == strata_api::FileKind::Dir {
                let dst_path = std::path::Path::new(dst);
                // Like cp -r: into an existing directory keeps the name, otherwise the copy is named `dst`.
                let (into, rename_to) = if dst_path.is_dir() {
                    (dst_path.to_path_buf(), None)
                } else {
                    (
                        dst_path
                            .parent()
                            .filter(|p| !p.as_os_str().is_empty())
                            .unwrap_or(std::path::Path::new("."))
                            .to_path_buf(),
                        Some(dst_path),
                    )
                };
                let staging = tempfile_dir(&into)?;
                // Unpacked while it arrives (the tar crate's unpack refuses entries that would leave the target directory).
                let target_dir = staging.clone();
                let res = transfer::consume(c.download_stream(id, path, true).await?, move |r| {
                    tar::Archive::new(r).unpack(&target_dir)
                })
                .await
                .with_context(|| format!("extracting into {}", staging.display()));
                let res = res.and_then(|_| {
                    let target = rename_to.map(|p| p.to_path_buf()).unwrap_or_else(|| into.join(&st.name));
                    std::fs::rename(staging.join(&st.name), &target)
                        .with_context(|| format!("moving into {}", target.display()))
                });
                let _ = std::fs::remove_dir_all(&staging);
                res?;
            } else {
                let target = if std::path::Path::new(dst).is_dir() {
                    std::path::Path::new(dst).join(&st.name)
                } else {
                    dst.into()
                };
                transfer::download_to(c.download_stream(id, path, false).await?, &target, st.mode & 0o777).await?;
            }
            Ok(0)
        }
        (Some(_), Some(_)) => bail!("copying between two sandboxes is not supported; copy through a local path"),
        (None, None) => bail!("one side of cp must be ID:/absolute/path"),
    }
}

/// A fresh hidden directory inside `parent` for staging a download.
fn tempfile_dir(parent: &std::path::Path) -> Result<std::path::PathBuf> {
    let p = parent.join(format!(".strata-cp-{}", std::process::id()));
    std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
    Ok(p)
}

/// `strata fs ...`.
pub(super) async fn fs_cmd(c: &Client, cmd: FsCmd) -> Result<i32> {
    match cmd {
        FsCmd::Ls { at: SandboxPath { id, path }, out: JsonOutput { json } } => {
            let list = c.list_dir(&id, &path).await?;
            if json {
                output::json(&list);
            } else {
                output::table(
                    &["MODE", "UID", "GID", "SIZE", "NAME"],
                    list.iter()
                        .map(|f| {
                            let name = match &f.link_target {
                                Some(t) => format!("{} -> {t}", f.name),
                                None => f.name.clone(),
                            };
                            vec![
                                format!("{:?} {:o}", f.kind, f.mode).to_lowercase(),
                                f.uid.to_string(),
                                f.gid.to_string(),
                                f.size.to_string(),
                                name,
                            ]
                        })
                        .collect(),
                );
            }
        }
        FsCmd::Stat(SandboxPath { id, path }) => output::json(&c.stat(&id, &path).await?),
        FsCmd::Mkdir { at: SandboxPath { id, path }, parents } => c.mkdir(&id, &path, parents).await?,
        FsCmd::Rm { at: SandboxPath { id, path }, recursive } => c.remove_path(&id, &path, recursive).await?,
        FsCmd::Mv { id, from, to } => c.move_path(&id, &from, &to).await?,
        FsCmd::Watch { at: SandboxPath { id, path }, recursive, out: JsonOutput { json } } => {
            return watch(c, &id, &path, recursive, json).await
        }
    }
    Ok(0)
}

/// `strata fs watch`: one line per change (`create  sub/f.txt`, a directory
/// with a `/`), or its JSON; exit status 1 when the watch ends on its own.
async fn watch(c: &Client, id: &str, path: &str, recursive: bool, json: bool) -> Result<i32> {
    use std::io::Write;
    let mut lines = c.watch_dir(id, path, recursive).await?;
    while let Some(line) = lines.next().await? {
        if json {
            println!("{}", serde_json::to_string(&line).expect("API models serialize"));
        }
        match line {
            strata_api::WatchLine::Event(ev) if !json => {
                let name = if ev.name.is_empty() { "." } else { ev.name.as_str() };
                let op = format!("{:?}", ev.op).to_lowercase();
                println!("{op:<7} {name}{}", if ev.dir { "/" } else { "" });
            }
            strata_api::WatchLine::Event(_) => {}
            strata_api::WatchLine::Ended { error } => {
                if !json {
                    eprintln!("strata: the watch ended: {}", error.message);
                }
                return Ok(1);
            }
        }
        let _ = std::io::stdout().flush();
    }
    Ok(0)
}
