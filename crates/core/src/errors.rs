//! Error messages for people: an error and its causes on one line.

/// Formats an error and its sources as `a: b: c`, skipping a source whose
/// message the line already holds (wrappers that repeat their cause).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let msg = e.to_string();
        if !s.contains(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct E(&'static str, #[source] Option<Box<E>>);

    #[test]
    fn causes_follow_the_error_and_repeats_are_skipped() {
        let inner = E("connection refused", None);
        let mid = E("connect: connection refused", Some(Box::new(inner)));
        let top = E("open the database", Some(Box::new(mid)));
        assert_eq!(super::chain(&top), "open the database: connect: connection refused");
    }
}
