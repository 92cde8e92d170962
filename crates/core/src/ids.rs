//! Sandbox ids and names.

/// Errors of name validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name has characters outside `[A-Za-z0-9_.-]`, is empty, too long, or starts with a symbol.
    #[error("invalid name {0:?}: use 1-63 characters [A-Za-z0-9_.-], starting with a letter or digit")]
    Invalid(String),
}

/// A new random sandbox id: 16 lower-case hex characters.
pub fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Checks a user-chosen sandbox or image name. Image names may contain `/` and `:`
/// (registry-style); pass `allow_ref = true` for those.
pub fn validate_name(name: &str, allow_ref: bool) -> Result<(), NameError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') || (allow_ref && matches!(c, '/' | ':' | '@'));
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
    let h: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(63)
        .collect();
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
}
