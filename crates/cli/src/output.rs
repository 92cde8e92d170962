//! Human and JSON output.

use serde::Serialize;

/// Prints a value as pretty JSON.
pub fn json<T: Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).expect("serializes"));
}

/// Prints rows as an aligned table with a header.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        let s: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| if i + 1 == n { c } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        println!("{}", s.join("   "));
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for r in rows {
        line(r);
    }
}

/// Bytes as a human size.
pub fn size(b: u64) -> String {
    strata_core::units::format_size(b)
}

/// "3 minutes ago" style age of an RFC 3339 time.
pub fn age(rfc3339: &str) -> String {
    let Ok(t) = humantime::parse_rfc3339_weak(rfc3339) else { return rfc3339.to_string() };
    let secs = std::time::SystemTime::now().duration_since(t).map(|d| d.as_secs()).unwrap_or(0);
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}
