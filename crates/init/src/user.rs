//! Resolving `--user` against the sandbox's own /etc/passwd and /etc/group.

/// A resolved user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    /// Uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Supplementary gids (from /etc/group membership).
    pub groups: Vec<u32>,
    /// Home directory (from /etc/passwd, `/` when unknown).
    pub home: String,
    /// User name, when known.
    pub name: Option<String>,
}

struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

fn passwd_entries(passwd: &str) -> impl Iterator<Item = PasswdEntry<'_>> {
    passwd.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 {
            return None;
        }
        Some(PasswdEntry { name: f[0], uid: f[2].parse().ok()?, gid: f[3].parse().ok()?, home: f[5] })
    })
}

fn group_gid(group: &str, name: &str) -> Option<u32> {
    group.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok()).flatten()
    })
}

fn member_gids(group: &str, user: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() >= 4 && f[3].split(',').any(|m| m == user) {
                f[2].parse().ok()
            } else {
                None
            }
        })
        .collect()
}

/// The home directory flush rules' `~/` means for `user` (a name or uid, a
/// `user:group` spec's user part; `None` or empty: root): its `/etc/passwd`
/// entry's when that is absolute, else `/root` for root and `/home/<user>`.
pub fn flush_home(passwd: &str, user: Option<&str>) -> String {
    let user = user.map(|u| u.split(':').next().unwrap_or(u)).filter(|u| !u.is_empty()).unwrap_or("root");
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 6 && (f[0] == user || f[2] == user) && f[5].starts_with('/') {
            return f[5].to_string();
        }
    }
    if user == "root" || user == "0" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// Resolves `spec` (`name`, `uid`, `name:group`, `uid:gid`; `None` = root).
pub fn resolve(spec: Option<&str>, passwd: &str, group: &str) -> Result<ResolvedUser, String> {
    let spec = spec.unwrap_or("0");
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = match user_part.parse::<u32>() {
        Ok(uid) => passwd_entries(passwd).find(|e| e.uid == uid),
        Err(_) => Some(
            passwd_entries(passwd)
                .find(|e| e.name == user_part)
                .ok_or_else(|| format!("unknown user {user_part:?} in the sandbox's /etc/passwd"))?,
        ),
    };
    let uid = match (&entry, user_part.parse::<u32>()) {
        (_, Ok(uid)) => uid,
        (Some(e), Err(_)) => e.uid,
        (None, Err(_)) => unreachable!("named users resolve to an entry or fail above"),
    };
    let mut gid = entry.as_ref().map_or(uid, |e| e.gid);
    if let Some(g) = group_part {
        gid = match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => group_gid(group, g).ok_or_else(|| format!("unknown group {g:?} in the sandbox's /etc/group"))?,
        };
    }
    let name = entry.as_ref().map(|e| e.name.to_string());
    let mut groups = name.as_deref().map(|n| member_gids(group, n)).unwrap_or_default();
    if !groups.contains(&gid) {
        groups.insert(0, gid);
    }
    let home = entry.as_ref().map_or("/".to_string(), |e| e.home.to_string());
    Ok(ResolvedUser { uid, gid, groups, home, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\nsudo:x:27:user\n";

    #[test]
    fn flush_homes_come_from_passwd_or_the_usual_places() {
        assert_eq!(flush_home(PASSWD, None), "/root");
        assert_eq!(flush_home(PASSWD, Some("user")), "/home/user");
        assert_eq!(flush_home(PASSWD, Some("1000:1000")), "/home/user");
        assert_eq!(flush_home("bad:x:5:5::relative:/bin/sh\n", Some("bad")), "/home/bad");
        assert_eq!(flush_home("", Some("0")), "/root");
    }

    #[test]
    fn resolves_names_ids_and_groups() {
        let root = resolve(None, PASSWD, GROUP).unwrap();
        assert_eq!((root.uid, root.gid, root.home.as_str()), (0, 0, "/root"));
        let u = resolve(Some("user"), PASSWD, GROUP).unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert!(u.groups.contains(&27));
        let anon = resolve(Some("4242:4243"), PASSWD, GROUP).unwrap();
        assert_eq!((anon.uid, anon.gid, anon.home.as_str()), (4242, 4243, "/"));
        assert!(resolve(Some("nobody-here"), PASSWD, GROUP).is_err());
        assert!(resolve(Some("user:nogroup"), PASSWD, GROUP).is_err());
    }
}
