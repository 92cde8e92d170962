//! Time as the engine records it: RFC 3339 with milliseconds ([`now`]), and
//! reading it back (`parse_time`). A leaf: it names no other module.

use std::time::SystemTime;

/// Now, RFC 3339 with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

pub(crate) fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}
