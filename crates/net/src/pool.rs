//! The address pool: each egress sandbox gets one /30 of it (the host side's
//! address is the gateway, the sandbox's is the next one), so every sandbox is
//! on a link of its own and reaches others only through the host's filter.

use std::net::Ipv4Addr;

use crate::rules::Cidr;

/// Default pool.
pub const DEFAULT_POOL: &str = "10.213.0.0/16";

/// A pool of /30 links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// The whole range.
    pub cidr: Cidr,
}

/// One sandbox's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Link {
    /// Index in the pool.
    pub slot: u32,
    /// Host side (gateway, DNS server).
    pub gateway: Ipv4Addr,
    /// Sandbox side.
    pub address: Ipv4Addr,
}

/// Prefix length of one link.
pub const LINK_PREFIX: u8 = 30;

impl Pool {
    /// Parses a pool (`A.B.C.D/N`, N between 8 and 28).
    pub fn parse(s: &str) -> Result<Pool, String> {
        let cidr = Cidr::parse(s).map_err(|e| format!("network pool {s:?}: {e}"))?;
        if !(8..=28).contains(&cidr.prefix) {
            return Err(format!("network pool {s:?}: the prefix length must be 8 to 28"));
        }
        Ok(Pool { cidr })
    }

    /// How many sandboxes fit.
    pub fn capacity(&self) -> u32 {
        (self.cidr.size() / 4) as u32
    }

    /// The link of `slot` (`None` past the end).
    pub fn link(&self, slot: u32) -> Option<Link> {
        if slot >= self.capacity() {
            return None;
        }
        let base = u32::from(self.cidr.addr) + slot * 4;
        Some(Link { slot, gateway: Ipv4Addr::from(base + 1), address: Ipv4Addr::from(base + 2) })
    }

    /// The lowest slot not in `used`.
    pub fn first_free(&self, used: &std::collections::HashSet<u32>) -> Option<u32> {
        (0..self.capacity()).find(|s| !used.contains(s))
    }

    /// A short tag naming this pool, used in the nftables table name so that
    /// daemons with different pools never touch each other's rules.
    pub fn tag(&self) -> String {
        let o = self.cidr.addr.octets();
        format!("{}_{}_{}_{}_{}", o[0], o[1], o[2], o[3], self.cidr.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_disjoint_slash_30s() {
        let p = Pool::parse("10.213.0.0/16").unwrap();
        assert_eq!(p.capacity(), 16384);
        let l0 = p.link(0).unwrap();
        assert_eq!((l0.gateway.to_string(), l0.address.to_string()), ("10.213.0.1".into(), "10.213.0.2".into()));
        let l1 = p.link(1).unwrap();
        assert_eq!(l1.gateway.to_string(), "10.213.0.5");
        assert_eq!(p.link(16383).unwrap().address.to_string(), "10.213.255.254");
        assert!(p.link(16384).is_none());
        let used = [0, 1, 3].into_iter().collect();
        assert_eq!(p.first_free(&used), Some(2));
        assert_eq!(p.tag(), "10_213_0_0_16");
    }

    #[test]
    fn rejects_bad_pools() {
        assert!(Pool::parse("10.213.0.0/30").is_err());
        assert!(Pool::parse("10.213.0.1/16").unwrap_err().contains("host bits"));
        assert!(Pool::parse("nope").is_err());
    }
}
