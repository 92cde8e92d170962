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
        if tail.len() >= 16 && tail[..16].iter().all(|b| upper_digit(*b)) && tail.get(16).is_none_or(|b| !upper_digit(*b)) && (s == 0 || !upper_digit(text[s - 1])) {
            aws = true;
            break;
        }
        i = s + 4;
    }
    if aws {
        out.push(("credential.aws_access_key", "an AWS access key id (AKIA...)"));
    }
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    if find_prefixed(text, b"ghp_", 20, alnum) || find_prefixed(text, b"gho_", 20, alnum) || find_prefixed(text, b"github_pat_", 20, |b| alnum(b) || b == b'_') {
        out.push(("credential.github_token", "a GitHub token (ghp_/github_pat_)"));
    }
    if [b"xoxb-", b"xoxa-", b"xoxp-", b"xoxr-", b"xoxs-"].iter().any(|p| find_prefixed(text, *p, 10, |b| alnum(b) || b == b'-')) {
        out.push(("credential.slack_token", "a Slack token (xox?-)"));
    }
    out
}

/// `NAME_TOKEN=value` or `api_key=value` style assignments (non-empty value).
pub fn secret_assignments(text: &[u8]) -> bool {
    String::from_utf8_lossy(text).lines().any(|line| {
        let line = line.trim().trim_start_matches("export ").trim();
        let Some((k, v)) = line.split_once('=').or_else(|| line.split_once(':')) else { return false };
        let k = k.trim().trim_matches('"').to_ascii_lowercase();
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'' || c == ',');
        let secretish = k.ends_with("_token") || k == "token" || k.contains("api_key") || k.contains("apikey") || k.ends_with("_secret") || k == "secret_access_key" || k.ends_with("secret_access_key") || k.ends_with("_password");
        secretish && !k.contains(' ') && !v.is_empty() && !v.starts_with('$')
    })
}

fn is_env_file(name: &str) -> bool {
    name == ".env" || name.starts_with(".env.") || name.ends_with(".env") || name == "environment" || name == ".envrc"
}

const HISTORIES: &[&str] = &[".bash_history", ".zsh_history", ".python_history", ".sh_history", ".ash_history", ".history", ".node_repl_history", ".psql_history", ".mysql_history"];
const SHELL_RC: &[&str] = &[".bashrc", ".profile", ".zshrc", ".bash_profile", ".bash_login", ".bash_logout", ".zprofile", ".zshenv", ".zlogin"];
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
            out.push(finding(path, "credential.shell_history", Severity::High, format!("a shell history containing {}", kinds.join(", "))));
        }
        return;
    }
    let s = String::from_utf8_lossy(text);
    if s.contains("-----BEGIN OPENSSH PRIVATE KEY-----") {
        out.push(finding(path, "credential.ssh_key", Severity::Critical, "an OpenSSH private key"));
    } else if let Some(i) = s.find("-----BEGIN ") {
        let rest = &s[i..];
        if rest.lines().next().is_some_and(|l| l.contains("PRIVATE KEY-----")) {
            out.push(finding(path, "credential.private_key", Severity::Critical, "a PEM private key"));
        }
    }
    for (rule, why) in tokens_in(text) {
        out.push(finding(path, rule, Severity::Critical, format!("contains {why}")));
    }
    if is_env_file(name) && secret_assignments(text) {
        out.push(finding(path, "credential.env_secret", Severity::High, "an env file assigning a token, key or password"));
    }
}

fn privilege_rules(e: &Entry<'_>, out: &mut Vec<Finding>) {
    let ftype = e.mode & libc::S_IFMT;
    if ftype == libc::S_IFREG && e.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        let which = if e.mode & libc::S_ISUID != 0 { "setuid" } else { "setgid" };
        out.push(finding(e.path, "privilege.setuid", Severity::High, format!("{which} file (mode {:04o})", e.mode & 0o7777)));
    }
    let in_path = PATH_DIRS.iter().any(|d| under(e.path, d) || e.path == *d);
    let world_writable = e.mode & 0o002 != 0 && ftype != libc::S_IFLNK && !(ftype == libc::S_IFDIR && e.mode & libc::S_ISVTX != 0);
    if in_path && world_writable {
        out.push(finding(e.path, "privilege.world_writable", Severity::High, format!("world-writable in a PATH directory (mode {:04o})", e.mode & 0o7777)));
    }
}

fn persistence_rules(e: &Entry<'_>, out: &mut Vec<Finding>) {
    let p = e.path;
    let name = basename(p);
    let mut hit = |rule: &str, why: &str| out.push(finding(p, rule, Severity::High, why));
    if p == "/etc/crontab" || p == "/etc/anacrontab" || ["/etc/cron.d", "/etc/cron.hourly", "/etc/cron.daily", "/etc/cron.weekly", "/etc/cron.monthly", "/var/spool/cron", "/var/spool/cron/crontabs"].iter().any(|d| under(p, d)) {
        hit("persistence.cron", "a cron job or crontab");
    } else if p == "/etc/ld.so.preload" {
        out.push(finding(p, "persistence.ld_preload", Severity::Critical, "ld.so.preload injects a library into every process"));
    } else if p == "/etc/rc.local" || under(p, "/etc/init.d") || under(p, "/etc/rc.d") {
        hit("persistence.rc_local", "a boot script");
    } else if under(p, "/etc/profile.d") || p == "/etc/profile" || p == "/etc/bash.bashrc" || p == "/etc/zsh/zshrc" || p == "/etc/environment" {
        hit("persistence.shell_profile", "a system-wide login script");
    } else if SHELL_RC.contains(&name) {
        hit("persistence.shell_rc", "a shell startup file");
    } else if p.contains("/.git/hooks/") && !name.ends_with(".sample") && parent(p).ends_with("/.git/hooks") {
        hit("persistence.git_hook", "a git hook (runs on git commands)");
    } else if ["/etc/systemd", "/usr/lib/systemd", "/lib/systemd", "/run/systemd"].iter().any(|d| under(p, d)) || p.contains("/.config/systemd/") {
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
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.path.cmp(&b.path)).then_with(|| a.rule.cmp(&b.rule)));
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

    #[test]
    fn private_keys() {
        assert_eq!(added("/root/key.pem", "x\n-----BEGIN RSA PRIVATE KEY-----\nMII\n"), ["credential.private_key"]);
        assert_eq!(added("/root/k", "-----BEGIN PRIVATE KEY-----\n"), ["credential.private_key"]);
        assert_eq!(added("/root/k", "-----BEGIN EC PRIVATE KEY-----\n"), ["credential.private_key"]);
        assert_eq!(added("/app/cert.pem", "-----BEGIN CERTIFICATE-----\n"), Vec::<String>::new());
        assert_eq!(added("/home/u/notes", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n"), ["credential.ssh_key"]);
        assert_eq!(rules("/home/u/.ssh/id_ed25519", Change::Added, FILE, None), ["credential.ssh_key"]);
        assert!(added("/home/u/.ssh/id_ed25519.pub", "ssh-ed25519 AAAA").is_empty());
        assert_eq!(added("/home/u/.ssh/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\n"), ["credential.ssh_key"], "one finding per rule and path");
    }

    #[test]
    fn tokens() {
        assert_eq!(added("/app/config.py", "KEY = 'AKIAIOSFODNN7EXAMPLE'\n"), ["credential.aws_access_key"]);
        assert!(added("/app/x", "AKIAshort").is_empty());
        assert!(added("/app/x", "XAKIAIOSFODNN7EXAMPLEZZ").is_empty(), "not at a boundary");
        assert_eq!(added("/app/x", "t=ghp_0123456789abcdefghijABCDEFGHIJ0123"), ["credential.github_token"]);
        assert_eq!(added("/app/x", "github_pat_11ABCDEFG0123456789_abcdefghij"), ["credential.github_token"]);
        assert!(added("/app/x", "ghp_short").is_empty());
        assert_eq!(added("/app/x", "xoxb-1234567890-abcdefghij"), ["credential.slack_token"]);
        assert!(added("/app/x", "xoxz-1234567890-abcdefghij").is_empty());
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
        assert_eq!(added("/root/.docker/config.json", "{\"auths\":{\"r\":{\"auth\":\"dTpw\"}}}"), ["credential.docker_auth"]);
        assert!(added("/root/.docker/config.json", "{\"credsStore\":\"pass\"}").is_empty());
    }

    #[test]
    fn shell_histories() {
        assert_eq!(added("/root/.bash_history", "ls\nexport GITHUB_TOKEN=ghp_0123456789abcdefghijABCD\n"), ["credential.shell_history"]);
        assert_eq!(added("/home/u/.python_history", "api_key = 'abc'\n"), ["credential.shell_history"]);
        assert!(added("/root/.zsh_history", "ls\ncd /tmp\n").is_empty());
    }

    #[test]
    fn binaries_are_not_searched() {
        assert!(check(&Entry { path: "/app/blob", change: Change::Added, mode: FILE, content: Some(b"\0\0AKIAIOSFODNN7EXAMPLE") }).is_empty());
    }

    #[test]
    fn setuid_and_world_writable() {
        assert_eq!(rules("/usr/local/bin/tool", Change::Added, libc::S_IFREG | 0o4755, None), ["system_path", "privilege.setuid"]);
        assert_eq!(rules("/opt/x", Change::Added, libc::S_IFREG | 0o2755, None), ["privilege.setuid"]);
        assert_eq!(rules("/usr/local/bin/w", Change::Added, libc::S_IFREG | 0o777, None), ["system_path", "privilege.world_writable"]);
        assert!(rules("/usr/local/bin/l", Change::Added, libc::S_IFLNK | 0o777, None).iter().all(|r| r == "system_path"));
        assert!(rules("/tmp/w", Change::Added, libc::S_IFREG | 0o777, None).is_empty());
    }

    #[test]
    fn system_paths() {
        assert_eq!(rules("/etc/hosts.allow", Change::Modified, FILE, Some("")), ["system_path"]);
        assert_eq!(rules("/usr/lib/libc.so", Change::Deleted, 0, None), ["system_path"]);
        assert!(rules("/usr/share/new", Change::Added, libc::S_IFDIR | 0o755, None).is_empty(), "added directories: contents are reported");
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
        assert_eq!(rules("/app/.git/hooks/pre-commit", Change::Added, libc::S_IFREG | 0o755, Some("#!/bin/sh")), ["persistence.git_hook"]);
        assert!(added("/app/.git/hooks/pre-commit.sample", "").is_empty());
        assert_eq!(added("/etc/ld.so.preload", "/lib/evil.so"), ["system_path", "persistence.ld_preload"]);
        assert_eq!(added("/etc/systemd/system/x.service", "[Service]"), ["system_path", "persistence.systemd"]);
        assert_eq!(added("/root/.config/systemd/user/x.service", "[Service]"), ["persistence.systemd"]);
        assert_eq!(added("/etc/rc.local", "sh"), ["system_path", "persistence.rc_local"]);
        assert!(rules("/root/.bashrc", Change::Deleted, 0, None).is_empty(), "deleting a hook is not persistence");
    }

    #[test]
    fn most_severe_first() {
        let mut f = check(&Entry { path: "/etc/cron.d/k", change: Change::Added, mode: FILE, content: Some(b"-----BEGIN PRIVATE KEY-----") });
        sort(&mut f);
        let sev: Vec<Severity> = f.iter().map(|f| f.severity).collect();
        assert_eq!(sev, [Severity::Critical, Severity::High, Severity::Medium]);
    }
}
