//! State-hygiene rules: what in a change set should not be carried into a
//! template. Pure functions over one changed path (its path, how it changed,
//! its mode and, for small regular files, its contents); the I/O lives in
//! [`crate::scan`]. Every rule has an id (`family.name`), a severity and a
//! short reason that never repeats the secret itself.

use strata_api::{Finding, Severity};

/// Largest file whose contents are read (bigger files are judged by path and mode only).
pub const MAX_READ: u64 = 1 << 20;

/// Directories on the default PATH.
pub const PATH_DIRS: &[&str] = &["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// System directories whose every change is reported.
pub const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/boot"];

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// New.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

/// One changed path, as the rules see it.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// Absolute path inside the sandbox.
    pub path: &'a str,
    /// How it changed.
    pub change: Change,
    /// `st_mode` (type and permission bits); 0 for deletions.
    pub mode: u32,
    /// Contents of a small regular file (at most [`MAX_READ`] bytes).
    pub content: Option<&'a [u8]>,
}

fn finding(path: &str, rule: &str, severity: Severity, reason: impl Into<String>) -> Finding {
    Finding { path: path.to_string(), rule: rule.to_string(), severity, reason: reason.into() }
}

fn under(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map(|(p, _)| if p.is_empty() { "/" } else { p }).unwrap_or("/")
}

/// Binary files (a NUL byte in the first 8 KiB) are not searched for text secrets.
pub fn is_binary(content: &[u8]) -> bool {
    content[..content.len().min(8192)].contains(&0)
}

fn find_prefixed(text: &[u8], prefix: &[u8], min_len: usize, ok: impl Fn(u8) -> bool) -> bool {
    let mut i = 0;
    while let Some(pos) = text[i..].windows(prefix.len()).position(|w| w == prefix) {
        let start = i + pos + prefix.len();
        let n = text[start..].iter().take_while(|b| ok(**b)).count();
        // A token starts at a word boundary.
        let boundary = i + pos == 0 || !text[i + pos - 1].is_ascii_alphanumeric();
        if n >= min_len && boundary {
            return true;
        }
        i = start;
    }
    false
}

/// Token kinds found in `text` (AWS access key ids, GitHub and Slack tokens).
pub fn tokens_in(text: &[u8]) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let upper_digit = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit();
    let mut aws = false;
    let mut i = 0;
    while let Some(pos) = text[i..].windows(4).position(|w| w == b"AKIA") {
        let s = i + pos;
        let tail = &text[s + 4..];
        if tail.len() >= 16
            && tail[..16].iter().all(|b| upper_digit(*b))
            && tail.get(16).is_none_or(|b| !upper_digit(*b))
            && (s == 0 || !upper_digit(text[s - 1]))
            && !is_documentation_key(&text[s..s + 20])
        {
            aws = true;
            break;
        }
        i = s + 4;
    }
    if aws {
        out.push(("credential.aws_access_key", "an AWS access key id (AKIA...)"));
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    if find_prefixed(text, b"ghp_", 20, alnum)
        || find_prefixed(text, b"gho_", 20, alnum)
        || find_prefixed(text, b"github_pat_", 20, |b| alnum(b) || b == b'_')
    {
        out.push(("credential.github_token", "a GitHub token (ghp_/github_pat_)"));
    }
    if [b"xoxb-", b"xoxa-", b"xoxp-", b"xoxr-", b"xoxs-"]
        .iter()
        .any(|p| find_prefixed(text, *p, 10, |b| alnum(b) || b == b'-'))
    {
        out.push(("credential.slack_token", "a Slack token (xox?-)"));
    }
    out
}

/// The kind of private key block found in a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyBlock {
    OpenSsh,
    Pem,
}

/// A private key block: a `-----BEGIN ... PRIVATE KEY-----` marker followed, past
/// line breaks, quotes, `\n` escapes and string-concatenation punctuation (a key
/// embedded in source as a fixture), by a base64 body or a PEM header. The marker
/// alone — a parser's constant such as `_BEGIN = b"-----BEGIN OPENSSH PRIVATE KEY-----"`
/// — is not key material.
fn private_key_block(s: &str) -> Option<KeyBlock> {
    let mut rest = s;
    while let Some(i) = rest.find("-----BEGIN ") {
        let after = &rest[i + "-----BEGIN ".len()..];
        let end = after.find("-----")?;
        let label = &after[..end];
        rest = &after[end + 5..];
        if label.len() > 40 || !label.ends_with("PRIVATE KEY") {
            continue;
        }
        let body = skip_separators(rest);
        let base64_run =
            body.bytes().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=')).count();
        if base64_run >= 16 || body.starts_with("Proc-Type:") {
            return Some(if label == "OPENSSH PRIVATE KEY" { KeyBlock::OpenSsh } else { KeyBlock::Pem });
        }
    }
    None
}

/// Skips what may separate a key marker from its body in a file or a source
/// literal: whitespace, quotes, `\n` escapes, `(`, `)`, `+`, `,` and a `b` prefix.
fn skip_separators(mut s: &str) -> &str {
    loop {
        let t = s.trim_start_matches(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | ')' | '+' | ','));
        let t = t
            .strip_prefix("\\n")
            .or_else(|| t.strip_prefix("\\r"))
            .or_else(|| t.strip_prefix("b\""))
            .or_else(|| t.strip_prefix("b'"))
            .unwrap_or(t);
        if t.len() == s.len() {
            return t;
        }
        s = t;
    }
}

/// AWS's documented example key ids (`AKIAIOSFODNN7EXAMPLE`, `AKIAI44QH8DHBEXAMPLE`)
/// appear in SDK docs and examples; ids ending in `EXAMPLE` are not credentials.
fn is_documentation_key(id: &[u8]) -> bool {
    id.ends_with(b"EXAMPLE")
}

/// One entry of a Python distribution's `RECORD` (PEP 376/627): a file the
/// package installed and the SHA-256 of its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordEntry {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// SHA-256 of the file as installed.
    pub sha256: [u8; 32],
}

/// Whether `path` is a distribution's `RECORD` (`<site>/<name>.dist-info/RECORD`).
pub fn is_dist_record(path: &str) -> bool {
    basename(path) == "RECORD" && parent(path).ends_with(".dist-info")
}

/// The distribution name of a `RECORD` path (`requests-2.32.3` for
/// `.../requests-2.32.3.dist-info/RECORD`).
pub fn dist_name(record_path: &str) -> &str {
    basename(parent(record_path)).trim_end_matches(".dist-info")
}

/// Parses a `RECORD`: `relative/path,sha256=<urlsafe-base64>,size` lines, relative
/// to the directory holding the `.dist-info`. Entries without a SHA-256 (the RECORD
/// itself, .pyc files), with `..` components (scripts outside site-packages) or
/// malformed are skipped: they are never treated as verified.
pub fn parse_record(record_path: &str, text: &[u8]) -> Vec<RecordEntry> {
    use base64::Engine as _;
    let site = parent(parent(record_path));
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(text).lines() {
        // Paths with commas are quoted (csv); they are skipped rather than mis-split.
        let mut parts = line.rsplitn(3, ',');
        let (Some(_size), Some(hash), Some(rel)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let Some(b64) = hash.strip_prefix("sha256=") else { continue };
        if rel.starts_with('"') || rel.starts_with('/') || rel.split('/').any(|c| c == ".." || c == "." || c.is_empty())
        {
            continue;
        }
        let Ok(digest) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(b64.trim_end_matches('=')) else {
            continue;
        };
        let Ok(sha256) = <[u8; 32]>::try_from(digest.as_slice()) else { continue };
        out.push(RecordEntry { path: format!("{}/{rel}", site.trim_end_matches('/')), sha256 });
    }
    out
}

/// Whether a finding may be set aside when its file is verified as shipped by an
/// installed package: content-based credential matches (test fixtures, docs), never
/// file-name rules, privilege, persistence or system-path findings.
pub fn excusable_in_package(rule: &str) -> bool {
    matches!(
        rule,
        "credential.private_key"
            | "credential.ssh_key"
            | "credential.aws_access_key"
            | "credential.github_token"
            | "credential.slack_token"
    )
}

/// `NAME_TOKEN=value` or `api_key=value` style assignments (non-empty value).
pub fn secret_assignments(text: &[u8]) -> bool {
    String::from_utf8_lossy(text).lines().any(|line| {
        let line = line.trim().trim_start_matches("export ").trim();
        let Some((k, v)) = line.split_once('=').or_else(|| line.split_once(':')) else { return false };
        let k = k.trim().trim_matches('"').to_ascii_lowercase();
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'' || c == ',');
        let secretish = k.ends_with("_token")
            || k == "token"
            || k.contains("api_key")
            || k.contains("apikey")
            || k.ends_with("_secret")
            || k == "secret_access_key"
            || k.ends_with("secret_access_key")
            || k.ends_with("_password");
        secretish && !k.contains(' ') && !v.is_empty() && !v.starts_with('$')
    })
}

fn is_env_file(name: &str) -> bool {
    name == ".env" || name.starts_with(".env.") || name.ends_with(".env") || name == "environment" || name == ".envrc"
}

const HISTORIES: &[&str] = &[
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".sh_history",
    ".ash_history",
    ".history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
];
const SHELL_RC: &[&str] = &[
    ".bashrc",
    ".profile",
    ".zshrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".zprofile",
    ".zshenv",
    ".zlogin",
];
const SSH_KEY_NAMES: &[&str] = &["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk"];

fn credential_rules(e: &Entry<'_>, out: &mut Vec<Finding>) {
    let path = e.path;
    let name = basename(path);
    let text = e.content.filter(|c| !is_binary(c));
    if name == ".netrc" || name == "_netrc" {
        out.push(finding(path, "credential.netrc", Severity::High, "a .netrc file (machine passwords)"));
    }
    if name == ".git-credentials" {
        out.push(finding(path, "credential.git_credentials", Severity::High, "stored git credentials"));
    }
    if path.ends_with("/.docker/config.json") && text.is_some_and(|t| String::from_utf8_lossy(t).contains("\"auth\"")) {
        out.push(finding(path, "credential.docker_auth", Severity::High, "registry auths in a Docker config"));
    }
    if SSH_KEY_NAMES.contains(&name) && parent(path).ends_with("/.ssh") {
        out.push(finding(path, "credential.ssh_key", Severity::Critical, "an SSH private key file"));
    }
    let Some(text) = text else { return };
    if HISTORIES.contains(&name) {
        let mut kinds: Vec<&str> = tokens_in(text).into_iter().map(|(_, why)| why).collect();
        if secret_assignments(text) {
            kinds.push("a secret assignment (*_TOKEN=, api_key=)");
        }
        if !kinds.is_empty() {
            out.push(finding(
                path,
                "credential.shell_history",
                Severity::High,
                format!("a shell history containing {}", kinds.join(", ")),
            ));
        }
        return;
    }
    match private_key_block(&String::from_utf8_lossy(text)) {
        Some(KeyBlock::OpenSsh) => {
            out.push(finding(path, "credential.ssh_key", Severity::Critical, "an OpenSSH private key"))
        }
        Some(KeyBlock::Pem) => {
            out.push(finding(path, "credential.private_key", Severity::Critical, "a PEM private key"))
        }
        None => {}
    }
    for (rule, why) in tokens_in(text) {
        out.push(finding(path, rule, Severity::Critical, format!("contains {why}")));
    }
    if is_env_file(name) && secret_assignments(text) {
        out.push(finding(
            path,
            "credential.env_secret",
            Severity::High,
            "an env file assigning a token, key or password",
        ));
    }
}

fn privilege_rules(e: &Entry<'_>, out: &mut Vec<Finding>) {
    let ftype = e.mode & libc::S_IFMT;
    if ftype == libc::S_IFREG && e.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        let which = if e.mode & libc::S_ISUID != 0 { "setuid" } else { "setgid" };
        out.push(finding(
            e.path,
            "privilege.setuid",
            Severity::High,
            format!("{which} file (mode {:04o})", e.mode & 0o7777),
        ));
    }
    let in_path = PATH_DIRS.iter().any(|d| under(e.path, d) || e.path == *d);
    let world_writable =
        e.mode & 0o002 != 0 && ftype != libc::S_IFLNK && !(ftype == libc::S_IFDIR && e.mode & libc::S_ISVTX != 0);
    if in_path && world_writable {
        out.push(finding(
            e.path,
            "privilege.world_writable",
            Severity::High,
            format!("world-writable in a PATH directory (mode {:04o})", e.mode & 0o7777),
        ));
    }
}

fn persistence_rules(e: &Entry<'_>, out: &mut Vec<Finding>) {
    let p = e.path;
    let name = basename(p);
    let mut hit = |rule: &str, why: &str| out.push(finding(p, rule, Severity::High, why));
    if p == "/etc/crontab"
        || p == "/etc/anacrontab"
        || [
            "/etc/cron.d",
            "/etc/cron.hourly",
            "/etc/cron.daily",
            "/etc/cron.weekly",
            "/etc/cron.monthly",
            "/var/spool/cron",
            "/var/spool/cron/crontabs",
        ]
        .iter()
        .any(|d| under(p, d))
    {
        hit("persistence.cron", "a cron job or crontab");
    } else if p == "/etc/ld.so.preload" {
        out.push(finding(
            p,
            "persistence.ld_preload",
            Severity::Critical,
            "ld.so.preload injects a library into every process",
        ));
    } else if p == "/etc/rc.local" || under(p, "/etc/init.d") || under(p, "/etc/rc.d") {
        hit("persistence.rc_local", "a boot script");
    } else if under(p, "/etc/profile.d")
        || p == "/etc/profile"
        || p == "/etc/bash.bashrc"
        || p == "/etc/zsh/zshrc"
        || p == "/etc/environment"
    {
        hit("persistence.shell_profile", "a system-wide login script");
    } else if SHELL_RC.contains(&name) {
        hit("persistence.shell_rc", "a shell startup file");
    } else if p.contains("/.git/hooks/") && !name.ends_with(".sample") && parent(p).ends_with("/.git/hooks") {
        hit("persistence.git_hook", "a git hook (runs on git commands)");
    } else if ["/etc/systemd", "/usr/lib/systemd", "/lib/systemd", "/run/systemd"].iter().any(|d| under(p, d))
        || p.contains("/.config/systemd/")
    {
        hit("persistence.systemd", "a systemd unit or drop-in");
    }
}

/// The findings for one changed path.
pub fn check(e: &Entry<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let is_dir = e.mode & libc::S_IFMT == libc::S_IFDIR;
    if let Some(d) = SYSTEM_DIRS.iter().find(|d| under(e.path, d)) {
        // Added directories are reported through their contents.
        if !(is_dir && e.change == Change::Added) {
            let how = match e.change {
                Change::Added => "added",
                Change::Modified => "modified",
                Change::Deleted => "deleted",
            };
            out.push(finding(e.path, "system_path", Severity::Medium, format!("{how} under {d}")));
        }
    }
    if e.change == Change::Deleted {
        return out;
    }
    credential_rules(e, &mut out);
    privilege_rules(e, &mut out);
    if !is_dir {
        persistence_rules(e, &mut out);
    }
    // One finding per rule and path (a key file can match by name and by contents).
    let mut seen = std::collections::HashSet::new();
    out.retain(|f| seen.insert(f.rule.clone()));
    out
}

/// Sorts findings most severe first, then by path and rule.
pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity.cmp(&a.severity).then_with(|| a.path.cmp(&b.path)).then_with(|| a.rule.cmp(&b.rule))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: u32 = libc::S_IFREG | 0o644;

    fn rules(path: &str, change: Change, mode: u32, content: Option<&str>) -> Vec<String> {
        check(&Entry { path, change, mode, content: content.map(str::as_bytes) }).into_iter().map(|f| f.rule).collect()
    }

    fn added(path: &str, content: &str) -> Vec<String> {
        rules(path, Change::Added, FILE, Some(content))
    }

    const BODY: &str = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n";

    #[test]
    fn private_keys() {
        assert_eq!(
            added("/root/key.pem", &format!("x\n-----BEGIN RSA PRIVATE KEY-----\n{BODY}")),
            ["credential.private_key"]
        );
        assert_eq!(added("/root/k", &format!("-----BEGIN PRIVATE KEY-----\n{BODY}")), ["credential.private_key"]);
        assert_eq!(
            added("/root/k", "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"),
            ["credential.private_key"]
        );
        assert_eq!(added("/app/cert.pem", &format!("-----BEGIN CERTIFICATE-----\n{BODY}")), Vec::<String>::new());
        assert_eq!(
            added("/home/u/notes", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"),
            ["credential.ssh_key"]
        );
        assert_eq!(rules("/home/u/.ssh/id_ed25519", Change::Added, FILE, None), ["credential.ssh_key"]);
        assert!(added("/home/u/.ssh/id_ed25519.pub", "ssh-ed25519 AAAA").is_empty());
        assert_eq!(
            added("/home/u/.ssh/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\n"),
            ["credential.ssh_key"],
            "one finding per rule and path"
        );
        // A key embedded in source as a string literal (a test fixture) is key material.
        assert_eq!(
            added("/app/keys.py", &format!("KEY = \"\"\"\n    -----BEGIN RSA PRIVATE KEY-----\n    {BODY}\"\"\"")),
            ["credential.private_key"]
        );
        assert_eq!(
            added("/app/k.py", &format!("k = (\"-----BEGIN PRIVATE KEY-----\\n\"\n  \"{}\\n\")", BODY.trim())),
            ["credential.private_key"]
        );
        // A parser's marker constant is not.
        assert!(added(
            "/app/ssh.py",
            "_SK_START = b\"-----BEGIN OPENSSH PRIVATE KEY-----\"\n_SK_END = b\"-----END\"\n"
        )
        .is_empty());
        assert!(added("/app/p.py", "if line == '-----BEGIN RSA PRIVATE KEY-----':\n    parse()\n").is_empty());
    }

    #[test]
    fn tokens() {
        assert_eq!(added("/app/config.py", "KEY = 'AKIAZ7QRSTUVWXY23456'\n"), ["credential.aws_access_key"]);
        assert!(
            added("/app/docs.rst", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n").is_empty(),
            "AWS's documented example key"
        );
        assert!(added("/app/x", "AKIAshort").is_empty());
        assert!(added("/app/x", "XAKIAZ7QRSTUVWXY23456ZZ").is_empty(), "not at a boundary");
        assert_eq!(added("/app/x", "t=ghp_0123456789abcdefghijABCDEFGHIJ0123"), ["credential.github_token"]);
        assert_eq!(added("/app/x", "github_pat_11ABCDEFG0123456789_abcdefghij"), ["credential.github_token"]);
        assert!(added("/app/x", "ghp_short").is_empty());
        assert_eq!(added("/app/x", "xoxb-1234567890-abcdefghij"), ["credential.slack_token"]);
        assert!(added("/app/x", "xoxz-1234567890-abcdefghij").is_empty());
    }

    #[test]
    fn python_package_records() {
        use base64::Engine as _;
        let digest: [u8; 32] = std::array::from_fn(|i| i as u8);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest);
        let record = format!("tornado/test/test.key,sha256={b64},1234\ntornado-6.4.dist-info/RECORD,,\n../../../bin/tool,sha256={b64},10\n\"we,ird\",sha256={b64},1\ntornado/x.pyc,,\nbad,sha256=!!,1\n");
        let rec = "/home/u/venv/lib/python3.11/site-packages/tornado-6.4.dist-info/RECORD";
        assert!(is_dist_record(rec));
        assert!(!is_dist_record("/app/RECORD"));
        assert_eq!(dist_name(rec), "tornado-6.4");
        let entries = parse_record(rec, record.as_bytes());
        assert_eq!(
            entries,
            [RecordEntry {
                path: "/home/u/venv/lib/python3.11/site-packages/tornado/test/test.key".into(),
                sha256: digest
            }],
            "only hashed, in-tree, unquoted entries"
        );
        assert!(excusable_in_package("credential.private_key"));
        assert!(
            !excusable_in_package("credential.netrc")
                && !excusable_in_package("privilege.setuid")
                && !excusable_in_package("persistence.cron")
        );
    }

    #[test]
    fn env_files() {
        assert_eq!(added("/app/.env", "DEBUG=1\nOPENAI_TOKEN=sk-abc\n"), ["credential.env_secret"]);
        assert_eq!(added("/app/prod.env", "export api_key=\"abc\"\n"), ["credential.env_secret"]);
        assert!(added("/app/.env", "GITHUB_TOKEN=\nX_TOKEN=$FROM_ENV\n").is_empty(), "empty or indirect values");
        assert!(added("/app/settings.py", "API_KEY=abc\n").is_empty(), "only env files for generic assignments");
    }

    #[test]
    fn credential_files() {
        assert_eq!(added("/root/.netrc", "machine x login y password z"), ["credential.netrc"]);
        assert_eq!(added("/home/u/.git-credentials", "https://u:p@host"), ["credential.git_credentials"]);
        assert_eq!(
            added("/root/.docker/config.json", "{\"auths\":{\"r\":{\"auth\":\"dTpw\"}}}"),
            ["credential.docker_auth"]
        );
        assert!(added("/root/.docker/config.json", "{\"credsStore\":\"pass\"}").is_empty());
    }

    #[test]
    fn shell_histories() {
        assert_eq!(
            added("/root/.bash_history", "ls\nexport GITHUB_TOKEN=ghp_0123456789abcdefghijABCD\n"),
            ["credential.shell_history"]
        );
        assert_eq!(added("/home/u/.python_history", "api_key = 'abc'\n"), ["credential.shell_history"]);
        assert!(added("/root/.zsh_history", "ls\ncd /tmp\n").is_empty());
    }

    #[test]
    fn binaries_are_not_searched() {
        assert!(check(&Entry {
            path: "/app/blob",
            change: Change::Added,
            mode: FILE,
            content: Some(b"\0\0AKIAZ7QRSTUVWXY23456")
        })
        .is_empty());
    }

    #[test]
    fn setuid_and_world_writable() {
        assert_eq!(
            rules("/usr/local/bin/tool", Change::Added, libc::S_IFREG | 0o4755, None),
            ["system_path", "privilege.setuid"]
        );
        assert_eq!(rules("/opt/x", Change::Added, libc::S_IFREG | 0o2755, None), ["privilege.setuid"]);
        assert_eq!(
            rules("/usr/local/bin/w", Change::Added, libc::S_IFREG | 0o777, None),
            ["system_path", "privilege.world_writable"]
        );
        assert!(rules("/usr/local/bin/l", Change::Added, libc::S_IFLNK | 0o777, None)
            .iter()
            .all(|r| r == "system_path"));
        assert!(rules("/tmp/w", Change::Added, libc::S_IFREG | 0o777, None).is_empty());
    }

    #[test]
    fn system_paths() {
        assert_eq!(rules("/etc/hosts.allow", Change::Modified, FILE, Some("")), ["system_path"]);
        assert_eq!(rules("/usr/lib/libc.so", Change::Deleted, 0, None), ["system_path"]);
        assert!(
            rules("/usr/share/new", Change::Added, libc::S_IFDIR | 0o755, None).is_empty(),
            "added directories: contents are reported"
        );
        assert!(rules("/usrx/a", Change::Added, FILE, Some("")).is_empty());
        assert!(rules("/app/main.py", Change::Modified, FILE, Some("print(1)")).is_empty());
    }

    #[test]
    fn persistence() {
        assert_eq!(added("/etc/cron.d/job", "* * * * * root sh"), ["system_path", "persistence.cron"]);
        assert_eq!(added("/var/spool/cron/crontabs/root", "* * * * * sh"), ["persistence.cron"]);
        assert_eq!(added("/etc/profile.d/x.sh", "export A=1"), ["system_path", "persistence.shell_profile"]);
        assert_eq!(rules("/root/.bashrc", Change::Modified, FILE, Some("alias x=y")), ["persistence.shell_rc"]);
        assert_eq!(added("/home/u/.zshrc", ""), ["persistence.shell_rc"]);
        assert_eq!(
            rules("/app/.git/hooks/pre-commit", Change::Added, libc::S_IFREG | 0o755, Some("#!/bin/sh")),
            ["persistence.git_hook"]
        );
        assert!(added("/app/.git/hooks/pre-commit.sample", "").is_empty());
        assert_eq!(added("/etc/ld.so.preload", "/lib/evil.so"), ["system_path", "persistence.ld_preload"]);
        assert_eq!(added("/etc/systemd/system/x.service", "[Service]"), ["system_path", "persistence.systemd"]);
        assert_eq!(added("/root/.config/systemd/user/x.service", "[Service]"), ["persistence.systemd"]);
        assert_eq!(added("/etc/rc.local", "sh"), ["system_path", "persistence.rc_local"]);
        assert!(rules("/root/.bashrc", Change::Deleted, 0, None).is_empty(), "deleting a hook is not persistence");
    }

    #[test]
    fn most_severe_first() {
        let content = format!("-----BEGIN PRIVATE KEY-----\n{BODY}");
        let mut f = check(&Entry {
            path: "/etc/cron.d/k",
            change: Change::Added,
            mode: FILE,
            content: Some(content.as_bytes()),
        });
        sort(&mut f);
        let sev: Vec<Severity> = f.iter().map(|f| f.severity).collect();
        assert_eq!(sev, [Severity::Critical, Severity::High, Severity::Medium]);
    }
}
