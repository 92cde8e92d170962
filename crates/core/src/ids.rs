//! Ids and names, and how a key given by a caller is resolved to one object.
//!
//! Ids (of sandboxes, checkpoints, pipeline runs, leases, tokens, ...) are
//! [`ID_LEN`] lower-case hex characters. Sandboxes, checkpoints, templates,
//! tokens and images also have a user-chosen name. A key a caller gives is
//! resolved in this order, among the objects the caller may see (its own
//! tenant's; every tenant's for the operator) and nowhere else:
//!
//! 1. an object whose id is exactly the key;
//! 2. an object whose name is exactly the key;
//! 3. the one object whose id starts with the key, when the key is an id
//!    prefix ([`is_id_prefix`]: at least [`MIN_PREFIX_LEN`] lower-case hex
//!    characters) and exactly one of the caller's objects matches (an
//!    ambiguous prefix resolves to nothing).
//!
//! So that a name can never shadow an id, a user-chosen name of at least
//! [`MIN_PREFIX_LEN`] characters made only of hex digits (which could be read
//! as an id or an id prefix) is refused at creation ([`validate_new_name`]). Records from before that rule keep their
//! names and resolve by id first; [`looks_like_id`] finds them.

/// Length of an id: 16 lower-case hex characters (64 random bits).
pub const ID_LEN: usize = 16;

/// Shortest id prefix that resolves to an object.
pub const MIN_PREFIX_LEN: usize = 4;

/// Errors of name validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name has characters outside `[A-Za-z0-9_.-]`, is empty, too long, or starts with a symbol.
    #[error("invalid name {0:?}: use 1-63 characters [A-Za-z0-9_.-], starting with a letter or digit")]
    Invalid(String),
    /// The name is made only of hex digits (at least [`MIN_PREFIX_LEN`]), so it could be read as an id or an id prefix.
    #[error("invalid name {0:?}: a name of 4 or more hex digits (0-9, a-f) and nothing else could be read as an id or an id prefix; add a character outside 0-9a-f (e.g. a letter past f or a '-')")]
    LooksLikeId(String),
}

/// A new random id: [`ID_LEN`] lower-case hex characters.
pub fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whether `key` is a full id: exactly [`ID_LEN`] lower-case hex characters.
pub fn is_id(key: &str) -> bool {
    key.len() == ID_LEN && is_lower_hex(key)
}

/// Whether `key` can be an id prefix: [`MIN_PREFIX_LEN`] to [`ID_LEN`]
/// lower-case hex characters (ids are lower-case, so `ABCD` is no prefix).
pub fn is_id_prefix(key: &str) -> bool {
    (MIN_PREFIX_LEN..=ID_LEN).contains(&key.len()) && is_lower_hex(key)
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether a name could be read as an id or an id prefix: it is made only of
/// hex digits, in either case, and is at least [`MIN_PREFIX_LEN`] long (a
/// shorter key is never resolved as a prefix), or it is an image id
/// (`sha256:<hex>`). Such names are refused for new objects ([`validate_new_name`]).
pub fn looks_like_id(name: &str) -> bool {
    let hex_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    match name.strip_prefix("sha256:") {
        Some(hex) => hex_only(hex),
        None => name.len() >= MIN_PREFIX_LEN && hex_only(name),
    }
}

/// [`validate_name`] for the name of a new object, which must also not look
/// like an id ([`looks_like_id`]): names never shadow ids.
pub fn validate_new_name(name: &str, allow_ref: bool) -> Result<(), NameError> {
    validate_name(name, allow_ref)?;
    if looks_like_id(name) {
        return Err(NameError::LooksLikeId(name.to_string()));
    }
    Ok(())
}

/// Checks a user-chosen sandbox or image name. Image names may contain `/` and `:`
/// (registry-style); pass `allow_ref = true` for those.
pub fn validate_name(name: &str, allow_ref: bool) -> Result<(), NameError> {
    let ok_char = |c: char| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') || (allow_ref && matches!(c, '/' | ':' | '@'))
    };
    let max = if allow_ref { 255 } else { 63 };
    let valid = !name.is_empty()
        && name.len() <= max
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(ok_char)
        && !name.contains("..");
    if valid {
        Ok(())
    } else {
        Err(NameError::Invalid(name.to_string()))
    }
}

/// A valid hostname derived from a name: lower-case, `[a-z0-9-]`, at most 63 characters.
pub fn hostname_for(name: &str) -> String {
    let h: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(63).collect();
    let h = h.trim_matches('-').to_string();
    if h.is_empty() {
        "sandbox".to_string()
    } else {
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_hex_and_distinct() {
        let a = new_id();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, new_id());
    }

    #[test]
    fn names() {
        assert!(validate_name("web-1", false).is_ok());
        assert!(validate_name("../x", false).is_err());
        assert!(validate_name("a/b", false).is_err());
        assert!(validate_name("registry.local:5000/busybox:1", true).is_ok());
        assert!(validate_name("", false).is_err());
        assert_eq!(hostname_for("My_Box.1"), "my-box-1");
    }

    #[test]
    fn names_that_could_be_read_as_ids_are_refused() {
        for n in ["deadbeef", "ABCDEF12", "1234", "beef", &new_id(), "sha256:abcdef", "sha256:a"] {
            assert!(looks_like_id(n), "{n}");
            assert_eq!(validate_new_name(n, true), Err(NameError::LooksLikeId(n.to_string())), "{n}");
        }
        for n in ["web-1", "beefy", "cafe-babe", "x0123", "busybox:1", "0123abcdg", "bb", "c1", "bad", "0"] {
            assert!(!looks_like_id(n), "{n}");
            assert!(validate_new_name(n, true).is_ok(), "{n}");
        }
        assert!(validate_new_name("../x", false).is_err(), "the other rules still apply");
        assert!(validate_new_name("dead", false).unwrap_err().to_string().contains("hex"));
    }

    #[test]
    fn ids_and_prefixes_are_lower_case_hex() {
        let id = new_id();
        assert!(is_id(&id) && is_id_prefix(&id) && is_id_prefix(&id[..MIN_PREFIX_LEN]));
        assert!(!is_id_prefix(&id[..MIN_PREFIX_LEN - 1]), "too short");
        assert!(!is_id_prefix("ABCD") && !is_id("ABCDEF0123456789"), "ids are lower-case");
        assert!(!is_id_prefix("ab%_") && !is_id_prefix("abcg"), "no wildcards, no other letters");
        assert!(!is_id(&id[..15]) && !is_id_prefix(&format!("{id}0")));
    }
}
