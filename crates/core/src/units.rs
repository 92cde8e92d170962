//! Parsing of human-written durations, sizes and CPU counts.

use std::time::Duration;

/// A value that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// Not a duration like `30s`, `5m`, `2h 30m`.
    #[error("invalid duration {0:?} (expected e.g. 30s, 5m, 2h)")]
    Duration(String),
    /// Not a size like `512m`, `2G`, `1048576`.
    #[error("invalid size {0:?} (expected e.g. 512m, 2g, or bytes)")]
    Size(String),
    /// Not a positive CPU count.
    #[error("invalid cpu count {0:?} (expected a positive number, e.g. 0.5 or 2)")]
    Cpus(String),
}

/// Parses a duration: `humantime` syntax (`30s`, `5m`, `1h 30m`, `2days`); a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    match humantime::parse_duration(t) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(UnitError::Duration(s.to_string())),
    }
}

/// Parses a size in bytes: a number with an optional binary suffix k/m/g/t (case-insensitive, optional `b`/`ib`).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").or_else(|| t.strip_suffix('b')).unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num.trim().parse().map_err(|_| UnitError::Size(s.to_string()))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(UnitError::Size(s.to_string()));
    }
    let bytes = n * mult as f64;
    if bytes > u64::MAX as f64 {
        return Err(UnitError::Size(s.to_string()));
    }
    Ok(bytes as u64)
}

/// Parses a CPU count (fractional allowed).
pub fn parse_cpus(s: &str) -> Result<f64, UnitError> {
    match s.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n <= 4096.0 => Ok(n),
        _ => Err(UnitError::Cpus(s.to_string())),
    }
}

/// Bytes as a human-readable size with binary units (`512 B`, `1.5 KiB`, `20.6 MiB`).
pub fn format_size(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2h 30m").unwrap(), Duration::from_secs(9000));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("-1m").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(3 << 30), "3.0 GiB");
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("0.5").unwrap(), 0.5);
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("NaN").is_err());
    }
}
