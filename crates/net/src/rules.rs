//! Allow rules: parsing and validation (pure).
//!
//! Grammar (one rule per string, see docs/network.md):
//!
//! ```text
//! rule   = target [ ":" ports ]
//! target = IPV4 [ "/" PREFIX ]          e.g. 10.0.0.0/8, 198.51.100.7
//!        | [ "*." ] DOMAIN              e.g. pypi.org, *.pythonhosted.org
//! ports  = PORT [ "-" PORT ]            1..=65535, e.g. 443, 8000-8100
//! ```
//!
//! Without ports every TCP and UDP port (and other protocols) of the target is
//! allowed; with ports, TCP and UDP to those ports.

use std::fmt;
use std::net::Ipv4Addr;

/// Why a rule does not parse. The message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network rule {rule:?}: {reason}")]
pub struct RuleError {
    /// The rule as given.
    pub rule: String,
    /// What is wrong with it.
    pub reason: String,
}

fn err(rule: &str, reason: impl Into<String>) -> RuleError {
    RuleError { rule: rule.to_string(), reason: reason.into() }
}

/// An IPv4 network (host bits zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// Network address.
    pub addr: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub prefix: u8,
}

impl Cidr {
    /// The network `addr/prefix`; `None` when host bits are set or prefix > 32.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Cidr> {
        if prefix > 32 {
            return None;
        }
        let c = Cidr { addr, prefix };
        (u32::from(addr) & !c.mask() == 0).then_some(c)
    }

    /// Parses `A.B.C.D[/N]` (host bits must be zero).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: Ipv4Addr = a.parse().map_err(|_| format!("{a:?} is not an IPv4 address"))?;
        let prefix: u8 = match p {
            None => 32,
            Some(p) => {
                p.parse().ok().filter(|n| *n <= 32).ok_or_else(|| format!("prefix length {p:?} is not 0 to 32"))?
            }
        };
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        if u32::from(addr) & !mask != 0 {
            return Err(format!(
                "host bits are set (the network is {}/{prefix})",
                Ipv4Addr::from(u32::from(addr) & mask)
            ));
        }
        Ok(Cidr { addr, prefix })
    }

    /// The netmask as a number.
    pub fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        }
    }

    /// Whether `ip` lies in this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.addr)
    }

    /// Whether `other` lies entirely inside this network.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.covers(other) || other.covers(self)
    }

    /// Number of addresses.
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Ranges that are never reachable from a sandbox unless a CIDR rule inside
/// them allows it explicitly (a broader rule such as `0.0.0.0/0` does not),
/// and that DNS answers never open: "this network", private (RFC 1918), shared
/// address space (CGNAT, RFC 6598), loopback, link-local (cloud metadata at
/// 169.254.169.254), IETF protocol assignments, benchmarking, multicast,
/// reserved and broadcast.
pub const RESERVED: [(&str, &str); 11] = [
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (RFC 6598)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local and cloud metadata"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking (RFC 2544)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved and broadcast"),
];

/// [`RESERVED`] as networks.
pub fn reserved() -> Vec<Cidr> {
    RESERVED.iter().map(|(c, _)| Cidr::parse(c).expect("valid constant")).collect()
}

/// Whether `ip` is in a [`RESERVED`] range.
pub fn is_reserved(ip: Ipv4Addr) -> bool {
    reserved().iter().any(|c| c.contains(ip))
}

/// A port or an inclusive range of ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ports {
    /// First port.
    pub lo: u16,
    /// Last port (== `lo` for one port).
    pub hi: u16,
}

impl Ports {
    fn parse(s: &str) -> Result<Ports, String> {
        let one = |p: &str| -> Result<u16, String> {
            p.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| format!("port {p:?} is not 1 to 65535"))
        };
        match s.split_once('-') {
            None => {
                let p = one(s)?;
                Ok(Ports { lo: p, hi: p })
            }
            Some((a, b)) => {
                let (lo, hi) = (one(a)?, one(b)?);
                if lo > hi {
                    return Err(format!("port range {s:?} ends before it starts"));
                }
                Ok(Ports { lo, hi })
            }
        }
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// A domain name pattern: exact, or `*.` + a domain (its subdomains, not itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    /// The domain, lower case, without a trailing dot.
    pub domain: String,
    /// `*.domain`: any name below the domain.
    pub wildcard: bool,
}

impl HostPattern {
    /// Whether `name` (any case, trailing dot allowed) matches.
    pub fn matches(&self, name: &str) -> bool {
        let n = name.trim_end_matches('.').to_ascii_lowercase();
        if self.wildcard {
            n.len() > self.domain.len() + 1
                && n.ends_with(&self.domain)
                && n.as_bytes()[n.len() - self.domain.len() - 1] == b'.'
        } else {
            n == self.domain
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            write!(f, "*.{}", self.domain)
        } else {
            f.write_str(&self.domain)
        }
    }
}

/// What a rule allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// Addresses.
    Cidr(Cidr),
    /// Whatever strata's resolver answers for matching names.
    Host(HostPattern),
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Destination.
    pub target: Target,
    /// Ports (TCP and UDP); `None`: any.
    pub ports: Option<Ports>,
    /// A deny rule (an exception to a `0.0.0.0/0` allow rule).
    pub deny: bool,
}

impl Rule {
    /// An allow rule for every address (`0.0.0.0/0`, with or without ports):
    /// it comes after the deny rules.
    pub fn is_catch_all(&self) -> bool {
        !self.deny && matches!(&self.target, Target::Cidr(c) if c.prefix == 0)
    }
}

/// Whether `rules` open every public address on every port: then every name
/// may resolve (its answers need no pinning).
pub fn opens_every_name(rules: &[Rule]) -> bool {
    rules.iter().any(|r| r.is_catch_all() && r.ports.is_none())
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Cidr(c) if c.prefix == 32 => write!(f, "{}", c.addr)?,
            Target::Cidr(c) => write!(f, "{c}")?,
            Target::Host(h) => write!(f, "{h}")?,
        }
        if let Some(p) = self.ports {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Longest rule accepted, in bytes.
pub const MAX_RULE_LEN: usize = 260;

fn parse_domain(d: &str) -> Result<String, String> {
    let d = d.strip_suffix('.').unwrap_or(d).to_ascii_lowercase();
    if d.is_empty() {
        return Err("empty domain name".into());
    }
    if d.len() > 253 {
        return Err("domain name longer than 253 characters".into());
    }
    let labels: Vec<&str> = d.split('.').collect();
    if labels.len() < 2 {
        return Err(format!("{d:?} is not a fully qualified domain name (it needs a dot)"));
    }
    for l in &labels {
        if l.is_empty() || l.len() > 63 {
            return Err(format!("label {l:?} must be 1 to 63 characters"));
        }
        if !l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("label {l:?} may hold only letters, digits, '-' and '_'"));
        }
        if l.starts_with('-') || l.ends_with('-') {
            return Err(format!("label {l:?} starts or ends with '-'"));
        }
    }
    if labels.last().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit())) {
        return Err(format!("{d:?} is neither an IPv4 address nor a domain name"));
    }
    Ok(d)
}

/// Parses one rule.
pub fn parse_rule(raw: &str) -> Result<Rule, RuleError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(err(raw, "empty rule"));
    }
    if s.len() > MAX_RULE_LEN {
        return Err(err(raw, format!("longer than {MAX_RULE_LEN} bytes")));
    }
    if s.matches(':').count() > 1 || s.starts_with('[') {
        return Err(err(raw, "IPv6 rules are not supported (sandboxes have IPv4 egress only)"));
    }
    let (target, ports) = match s.rsplit_once(':') {
        Some((t, p)) => (t, Some(Ports::parse(p).map_err(|e| err(raw, e))?)),
        None => (s, None),
    };
    let looks_ip = target.contains('/') || target.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let target = if looks_ip {
        Target::Cidr(Cidr::parse(target).map_err(|e| err(raw, e))?)
    } else if let Some(rest) = target.strip_prefix("*.") {
        if !rest.trim_end_matches('.').contains('.') {
            return Err(err(raw, "a wildcard needs at least two labels after \"*.\""));
        }
        let domain = parse_domain(rest).map_err(|e| err(raw, e))?;
        Target::Host(HostPattern { domain, wildcard: true })
    } else if target.contains('*') {
        return Err(err(raw, "'*' is allowed only as a whole first label (\"*.example.com\")"));
    } else {
        Target::Host(HostPattern { domain: parse_domain(target).map_err(|e| err(raw, e))?, wildcard: false })
    };
    Ok(Rule { target, ports, deny: false })
}

/// Parses one deny rule: an address or network with optional ports (names
/// cannot be denied: an allowed name may share their addresses).
pub fn parse_deny_rule(raw: &str) -> Result<Rule, RuleError> {
    let mut rule = parse_rule(raw)?;
    if !matches!(rule.target, Target::Cidr(_)) {
        return Err(err(raw, "deny rules are IPv4 addresses or networks (CIDR), not names"));
    }
    rule.deny = true;
    Ok(rule)
}

/// Parses a network's allow and deny rules together (at most
/// [`strata_api::MAX_NETWORK_RULES`] in all, duplicates dropped).
pub fn parse_spec(allow: &[String], deny: &[String]) -> Result<Vec<Rule>, RuleError> {
    let mut out = parse_rules(allow)?;
    for r in deny {
        if out.len() >= strata_api::MAX_NETWORK_RULES {
            return Err(err(r, format!("more than {} rules", strata_api::MAX_NETWORK_RULES)));
        }
        let rule = parse_deny_rule(r)?;
        if !out.contains(&rule) {
            out.push(rule);
        }
    }
    Ok(out)
}

/// Parses a rule list: every rule valid, at most [`strata_api::MAX_NETWORK_RULES`],
/// duplicates dropped (first kept).
pub fn parse_rules(raw: &[String]) -> Result<Vec<Rule>, RuleError> {
    if raw.len() > strata_api::MAX_NETWORK_RULES {
        return Err(err(
            &raw[strata_api::MAX_NETWORK_RULES],
            format!("more than {} rules", strata_api::MAX_NETWORK_RULES),
        ));
    }
    let mut out: Vec<Rule> = Vec::new();
    for r in raw {
        let rule = parse_rule(r)?;
        if !out.contains(&rule) {
            out.push(rule);
        }
    }
    Ok(out)
}

/// The rules that let `name` be resolved (host rules matching it).
pub fn host_rules_for<'a>(rules: &'a [Rule], name: &str) -> Vec<&'a Rule> {
    rules.iter().filter(|r| matches!(&r.target, Target::Host(h) if h.matches(name))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Rule {
        parse_rule(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn bad(s: &str) -> String {
        let e = parse_rule(s).expect_err(s);
        assert_eq!(e.rule, s);
        assert!(e.to_string().contains(&format!("{s:?}")), "{e}");
        e.reason
    }

    #[test]
    fn parses_cidrs_hosts_and_ports() {
        assert_eq!(
            ok("10.0.0.0/8:443"),
            Rule {
                target: Target::Cidr(Cidr::parse("10.0.0.0/8").unwrap()),
                ports: Some(Ports { lo: 443, hi: 443 }),
                deny: false
            }
        );
        assert_eq!(ok("198.51.100.7").to_string(), "198.51.100.7");
        assert_eq!(ok("198.51.100.7/32:80").to_string(), "198.51.100.7:80");
        assert_eq!(ok("203.0.113.0/24:8000-8100").ports, Some(Ports { lo: 8000, hi: 8100 }));
        assert_eq!(ok("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(ok("PyPI.org.").to_string(), "pypi.org");
        assert_eq!(ok("*.pythonhosted.org:443").to_string(), "*.pythonhosted.org:443");
        assert_eq!(ok("  files.example_x.com ").to_string(), "files.example_x.com");
    }

    #[test]
    fn rejects_malformed_rules_with_a_reason() {
        assert!(bad("10.0.0.1/8").contains("host bits"));
        assert!(bad("10.0.0.0/33").contains("prefix"));
        assert!(bad("300.1.1.1").contains("IPv4"));
        assert!(bad("10.0.0.0/8:0").contains("port"));
        assert!(bad("10.0.0.0/8:70000").contains("port"));
        assert!(bad("10.0.0.0/8:90-80").contains("ends before"));
        assert!(bad("example.com:").contains("port"));
        assert!(bad("2001:db8::/32").contains("IPv6"));
        assert!(bad("localhost").contains("fully qualified"));
        assert!(bad("*.com").contains("two labels"));
        assert!(bad("a*.example.com").contains("'*'"));
        assert!(bad("-bad.example.com").contains("'-'"));
        assert!(bad("exa mple.com").contains("letters"));
        assert!(bad("a..b").contains("1 to 63"));
        assert!(bad("").contains("empty"));
        assert!(bad(&format!("{}.com", "a".repeat(300))).contains("longer"));
    }

    #[test]
    fn rule_lists_are_limited_and_deduplicated() {
        let v: Vec<String> = vec!["pypi.org".into(), "PYPI.org".into(), "10.0.0.0/8".into()];
        assert_eq!(parse_rules(&v).unwrap().len(), 2);
        let many: Vec<String> = (0..=strata_api::MAX_NETWORK_RULES).map(|i| format!("10.0.{}.0/24", i)).collect();
        assert!(parse_rules(&many).unwrap_err().reason.contains("more than"));
        let e = parse_rules(&["pypi.org".into(), "nope..x".into()]).unwrap_err();
        assert_eq!(e.rule, "nope..x");
    }

    #[test]
    fn host_patterns_match_exact_names_and_subdomains() {
        let exact = HostPattern { domain: "pypi.org".into(), wildcard: false };
        assert!(
            exact.matches("pypi.org")
                && exact.matches("PyPI.org.")
                && !exact.matches("evil-pypi.org")
                && !exact.matches("a.pypi.org")
        );
        let wild = HostPattern { domain: "pythonhosted.org".into(), wildcard: true };
        assert!(wild.matches("files.pythonhosted.org") && wild.matches("a.b.pythonhosted.org"));
        assert!(
            !wild.matches("pythonhosted.org")
                && !wild.matches("evilpythonhosted.org")
                && !wild.matches("pythonhosted.org.evil.com")
        );
    }

    #[test]
    fn reserved_ranges_cover_metadata_private_and_loopback() {
        for ip in [
            "169.254.169.254",
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "127.0.0.1",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
        ] {
            assert!(is_reserved(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["198.51.100.1", "203.0.113.9", "8.8.8.8", "151.101.0.223"] {
            assert!(!is_reserved(ip.parse().unwrap()), "{ip}");
        }
        let c = Cidr::parse("10.213.0.0/16").unwrap();
        assert!(Cidr::parse("10.0.0.0/8").unwrap().covers(&c) && !c.covers(&Cidr::parse("10.0.0.0/8").unwrap()));
        assert!(
            c.overlaps(&Cidr::parse("10.213.4.0/30").unwrap()) && !c.overlaps(&Cidr::parse("10.214.0.0/16").unwrap())
        );
    }

    #[test]
    fn deny_rules_are_addresses_and_a_catch_all_opens_every_name() {
        let rules = parse_spec(&["0.0.0.0/0".into(), "pypi.org".into()], &["203.0.113.0/24:443".into()]).unwrap();
        assert!(rules[0].is_catch_all() && !rules[1].is_catch_all());
        assert!(rules[2].deny && !rules[2].is_catch_all());
        assert!(opens_every_name(&rules));
        assert!(!opens_every_name(&parse_spec(&["0.0.0.0/0:443".into()], &[]).unwrap()), "ports: not every name");
        let e = parse_spec(&[], &["evil.example".into()]).unwrap_err();
        assert!(e.reason.contains("not names"), "{e}");
        assert!(parse_spec(&[], &["10.0.0.1/8".into()]).is_err(), "host bits");
    }
}
