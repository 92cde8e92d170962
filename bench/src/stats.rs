//! Percentiles over sorted samples (nearest-rank), and duration/size formatting.

use std::time::Duration;

/// Summary of a set of latency samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub min: Duration,
    pub max: Duration,
    pub mean: Duration,
}

/// Nearest-rank percentile of an ascending slice: the smallest sample such that
/// at least `q` of all samples are <= it.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarizes samples (any order).
pub fn summarize(samples: &[Duration]) -> Summary {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let total: Duration = s.iter().sum();
    Summary {
        n: s.len(),
        p50: percentile(&s, 0.50),
        p90: percentile(&s, 0.90),
        p99: percentile(&s, 0.99),
        min: s[0],
        max: s[s.len() - 1],
        mean: total / s.len() as u32,
    }
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Seconds with two decimals.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Kibibytes as KiB or MiB.
pub fn kib(k: f64) -> String {
    if k.abs() >= 1024.0 {
        format!("{:.2} MiB", k / 1024.0)
    } else {
        format!("{k:.0} KiB")
    }
}

/// Bytes in a human unit (and exact).
pub fn bytes(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB ({b} B)", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{b} B")
    }
}

/// `a / b` as "1.23x".
pub fn ratio(a: f64, b: f64) -> String {
    if b <= 0.0 || a < 0.0 {
        return "n/a".into();
    }
    format!("{:.2}x", a / b)
}

impl Summary {
    /// "p50 / p99" text.
    pub fn p50_p99(&self) -> String {
        format!("{} / {}", ms(self.p50), ms(self.p99))
    }

    /// One detail line.
    pub fn line(&self) -> String {
        format!(
            "n={} min={} p50={} p90={} p99={} max={} mean={}",
            self.n,
            ms(self.min),
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max),
            ms(self.mean)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_millis(x)).collect()
    }

    #[test]
    fn nearest_rank() {
        let s = d(&(1..=200).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 0.5), Duration::from_millis(100));
        assert_eq!(percentile(&s, 0.99), Duration::from_millis(198));
        assert_eq!(percentile(&s, 1.0), Duration::from_millis(200));
        assert_eq!(percentile(&d(&[7]), 0.99), Duration::from_millis(7));
        let sum = summarize(&d(&[5, 1, 3]));
        assert_eq!(sum.p50, Duration::from_millis(3));
        assert_eq!(sum.min, Duration::from_millis(1));
        assert_eq!(sum.max, Duration::from_millis(5));
    }
}
