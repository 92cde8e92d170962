//! nftables rulesets (pure text generation; [`crate::apply`] runs `nft -f -`).
//!
//! One table per daemon, `inet strata_<pool tag>`, holding:
//!
//! * base chains on the forward, input, prerouting (nat) and postrouting (nat)
//!   hooks, which dispatch packets from and to sandbox veths through verdict
//!   maps keyed by interface name (`out_dispatch`, `in_dispatch`) and drop
//!   what no sandbox chain claims;
//! * per sandbox (key = first 12 hex characters of its id): a chain `o_KEY`
//!   for what it sends, `i_KEY` for what comes back, `deny_KEY` (record and
//!   drop), counters `ok_KEY`, `no_KEY`, `rx_KEY`, a dynamic set `d_KEY` of
//!   recently denied destinations, and one set `h_KEY_HASH` per host rule
//!   holding the addresses the DNS filter pinned for it (with timeouts).
//!
//! Every change is one `nft -f` transaction: it applies whole or not at all.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::pool::Pool;
use crate::rules::{reserved, Rule, Target};

/// Per-daemon settings of the table.
#[derive(Debug, Clone)]
pub struct TableConfig {
    /// Table name (family inet).
    pub table: String,
    /// Address pool of the sandboxes.
    pub pool: Pool,
    /// Port of the DNS filter on the host; sandboxes' port-53 traffic is redirected to it.
    pub resolver_port: u16,
}

impl TableConfig {
    /// The table name for `pool`.
    pub fn table_name(pool: &Pool) -> String {
        format!("strata_{}", pool.tag())
    }
}

/// One sandbox's network as the ruleset sees it.
#[derive(Debug, Clone)]
pub struct SandboxNet<'a> {
    /// Key naming its chains and sets.
    pub key: &'a str,
    /// Host-side interface name.
    pub ifname: &'a str,
    /// Its address (the only source address accepted from it).
    pub address: Ipv4Addr,
    /// Allow rules.
    pub rules: &'a [Rule],
}

/// Timeout of entries in the denied-destinations set.
pub const DENIED_TTL_SECS: u32 = 60;
/// Size of the denied-destinations set.
pub const DENIED_SET_SIZE: u32 = 64;

/// Name of the set pinning answers for host rule `rule` of sandbox `key`.
pub fn host_set(key: &str, rule: &Rule) -> String {
    // FNV-1a of the rule's canonical text: stable across updates, so a rule that
    // stays keeps its pinned addresses.
    let mut h: u32 = 0x811c9dc5;
    for b in rule.to_string().bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    format!("h_{key}_{h:08x}")
}

fn ports_expr(rule: &Rule) -> String {
    match rule.ports {
        None => String::new(),
        Some(p) => format!(" meta l4proto {{ tcp, udp }} th dport {p}"),
    }
}

/// The base table: created if missing, base chains re-filled (sandbox chains,
/// sets and map elements are kept, so running sandboxes stay connected across
/// a daemon restart).
pub fn base_script(cfg: &TableConfig) -> String {
    let t = format!("inet {}", cfg.table);
    let pool = cfg.pool.cidr;
    let port = cfg.resolver_port;
    let mut s = String::new();
    let _ = writeln!(s, "add table {t}");
    let _ = writeln!(s, "add set {t} veths {{ type ifname; }}");
    let _ = writeln!(s, "add map {t} out_dispatch {{ type ifname : verdict; }}");
    let _ = writeln!(s, "add map {t} in_dispatch {{ type ifname : verdict; }}");
    let _ = writeln!(s, "add chain {t} forward {{ type filter hook forward priority filter - 1; policy accept; }}");
    let _ = writeln!(s, "add chain {t} input {{ type filter hook input priority filter - 1; policy accept; }}");
    let _ = writeln!(s, "add chain {t} prerouting {{ type nat hook prerouting priority dstnat - 1; policy accept; }}");
    let _ =
        writeln!(s, "add chain {t} postrouting {{ type nat hook postrouting priority srcnat - 1; policy accept; }}");
    for c in ["forward", "input", "prerouting", "postrouting"] {
        let _ = writeln!(s, "flush chain {t} {c}");
    }
    // Forward: each sandbox's own chains decide; whatever they leave is dropped.
    let _ = writeln!(s, "add rule {t} forward iifname vmap @out_dispatch");
    let _ = writeln!(s, "add rule {t} forward iifname @veths drop");
    let _ = writeln!(s, "add rule {t} forward oifname vmap @in_dispatch");
    let _ = writeln!(s, "add rule {t} forward oifname @veths drop");
    // Input (the host itself): replies to the host's own connections, and the DNS filter; nothing else.
    let _ = writeln!(s, "add rule {t} input iifname @veths ct state established,related accept");
    let _ = writeln!(s, "add rule {t} input iifname @veths ip daddr {pool} meta l4proto {{ tcp, udp }} th dport {port} ct status dnat accept");
    let _ = writeln!(s, "add rule {t} input iifname @veths drop");
    // DNS to anywhere goes to strata's filter (also queries aimed at other resolvers).
    let _ = writeln!(
        s,
        "add rule {t} prerouting iifname @veths meta l4proto {{ tcp, udp }} th dport 53 redirect to :{port}"
    );
    let _ = writeln!(s, "add rule {t} postrouting ip saddr {pool} oifname != @veths masquerade");
    s
}

/// Objects of sandbox `key` (chains, sets, counters) for removal.
pub fn sandbox_objects(key: &str, existing: &Objects) -> Objects {
    let own = |n: &String| {
        n.strip_prefix("o_")
            .or_else(|| n.strip_prefix("i_"))
            .or_else(|| n.strip_prefix("deny_"))
            .is_some_and(|k| k == key)
            || n.strip_prefix("d_").is_some_and(|k| k == key)
            || n.strip_prefix("h_").is_some_and(|k| k.starts_with(key) && k.as_bytes().get(key.len()) == Some(&b'_'))
            || ["ok_", "no_", "rx_"].iter().any(|p| n.strip_prefix(p) == Some(key))
    };
    Objects {
        chains: existing.chains.iter().filter(|n| own(n)).cloned().collect(),
        sets: existing.sets.iter().filter(|n| own(n)).cloned().collect(),
        counters: existing.counters.iter().filter(|n| own(n)).cloned().collect(),
        out_dispatch: existing
            .out_dispatch
            .iter()
            .filter(|(_, c)| c.strip_prefix("o_") == Some(key))
            .cloned()
            .collect(),
        in_dispatch: existing.in_dispatch.iter().filter(|(_, c)| c.strip_prefix("i_") == Some(key)).cloned().collect(),
        veths: Vec::new(),
    }
}

/// Named objects of the table, as listed by `nft -j list table`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    /// Chains.
    pub chains: Vec<String>,
    /// Sets.
    pub sets: Vec<String>,
    /// Named counters.
    pub counters: Vec<String>,
    /// `out_dispatch` elements: (interface, chain jumped to).
    pub out_dispatch: Vec<(String, String)>,
    /// `in_dispatch` elements.
    pub in_dispatch: Vec<(String, String)>,
    /// `veths` elements.
    pub veths: Vec<String>,
}

impl Objects {
    /// Sandbox keys that have chains in the table.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.chains.iter().filter_map(|c| c.strip_prefix("o_").map(str::to_string)).collect();
        k.sort();
        k.dedup();
        k
    }
}

/// Deletes `objs` (map elements first, then rules, chains, sets, counters).
pub fn remove_script(table: &str, objs: &Objects, ifname: Option<&str>) -> String {
    let t = format!("inet {table}");
    let mut s = String::new();
    for (i, _) in &objs.out_dispatch {
        let _ = writeln!(s, "delete element {t} out_dispatch {{ \"{i}\" }}");
    }
    for (i, _) in &objs.in_dispatch {
        let _ = writeln!(s, "delete element {t} in_dispatch {{ \"{i}\" }}");
    }
    for i in objs.veths.iter().map(String::as_str).chain(ifname) {
        let _ = writeln!(s, "delete element {t} veths {{ \"{i}\" }}");
    }
    for c in &objs.chains {
        let _ = writeln!(s, "flush chain {t} {c}");
    }
    for c in &objs.chains {
        let _ = writeln!(s, "delete chain {t} {c}");
    }
    for c in &objs.sets {
        let _ = writeln!(s, "delete set {t} {c}");
    }
    for c in &objs.counters {
        let _ = writeln!(s, "delete counter {t} {c}");
    }
    s
}

/// Creates or updates sandbox `sb`'s chains and sets (one transaction). With
/// `attach`, its interface is also entered into the dispatch maps. Host sets
/// of rules that stay keep their pinned addresses; `stale_sets` (host sets of
/// rules no longer present) are deleted.
pub fn sandbox_script(table: &str, pool: &Pool, sb: &SandboxNet<'_>, attach: bool, stale_sets: &[String]) -> String {
    let t = format!("inet {table}");
    let k = sb.key;
    let mut s = String::new();
    for c in [format!("o_{k}"), format!("i_{k}"), format!("deny_{k}")] {
        let _ = writeln!(s, "add chain {t} {c}");
    }
    for c in ["ok", "no", "rx"] {
        let _ = writeln!(s, "add counter {t} {c}_{k}");
    }
    let _ = writeln!(s, "add set {t} d_{k} {{ type ipv4_addr . inet_proto . inet_service; size {DENIED_SET_SIZE}; flags dynamic,timeout; timeout {DENIED_TTL_SECS}s; }}");
    for r in sb.rules.iter().filter(|r| matches!(r.target, Target::Host(_))) {
        let _ = writeln!(s, "add set {t} {} {{ type ipv4_addr; flags timeout; }}", host_set(k, r));
    }
    for c in ["o", "i", "deny"] {
        let _ = writeln!(s, "flush chain {t} {c}_{k}");
    }
    // deny: remember the destination (best effort: a full set skips it), count, drop.
    let _ = writeln!(s, "add rule {t} deny_{k} update @d_{k} {{ ip daddr . meta l4proto . th dport }}");
    let _ = writeln!(s, "add rule {t} deny_{k} counter name no_{k} drop");
    let o = format!("add rule {t} o_{k}");
    // Only its own address, IPv4 only.
    let _ = writeln!(s, "{o} meta nfproto ipv6 counter name no_{k} drop");
    let _ = writeln!(s, "{o} ip saddr != {} counter name no_{k} drop", sb.address);
    let _ = writeln!(s, "{o} ct state established,related counter name ok_{k} accept");
    // Other sandboxes: never.
    let _ = writeln!(s, "{o} ip daddr {} goto deny_{k}", pool.cidr);
    let reserved = reserved();
    let (inside, public): (Vec<&Rule>, Vec<&Rule>) =
        sb.rules.iter().filter(|r| !r.deny && !r.is_catch_all() && matches!(r.target, Target::Cidr(_))).partition(
            |r| match &r.target {
                Target::Cidr(c) => reserved.iter().any(|z| z.covers(c)),
                Target::Host(_) => false,
            },
        );
    // Reserved ranges open only to rules inside them.
    for r in &inside {
        if let Target::Cidr(c) = &r.target {
            let _ = writeln!(s, "{o} ip daddr {c}{} counter name ok_{k} accept", ports_expr(r));
        }
    }
    let set: Vec<String> = reserved.iter().map(|c| c.to_string()).collect();
    let _ = writeln!(s, "{o} ip daddr {{ {} }} goto deny_{k}", set.join(", "));
    for r in &public {
        if let Target::Cidr(c) = &r.target {
            let _ = writeln!(s, "{o} ip daddr {c}{} counter name ok_{k} accept", ports_expr(r));
        }
    }
    for r in sb.rules.iter().filter(|r| matches!(r.target, Target::Host(_))) {
        let _ = writeln!(s, "{o} ip daddr @{}{} counter name ok_{k} accept", host_set(k, r), ports_expr(r));
    }
    // Deny rules: exceptions to the catch-all below (every narrower allow above wins).
    for r in sb.rules.iter().filter(|r| r.deny) {
        if let Target::Cidr(c) = &r.target {
            let _ = writeln!(s, "{o} ip daddr {c}{} goto deny_{k}", ports_expr(r));
        }
    }
    for r in sb.rules.iter().filter(|r| r.is_catch_all()) {
        let _ = writeln!(s, "{o} ip daddr 0.0.0.0/0{} counter name ok_{k} accept", ports_expr(r));
    }
    let _ = writeln!(s, "{o} goto deny_{k}");
    let _ = writeln!(s, "add rule {t} i_{k} ct state established,related counter name rx_{k} accept");
    let _ = writeln!(s, "add rule {t} i_{k} drop");
    for st in stale_sets {
        let _ = writeln!(s, "delete set {t} {st}");
    }
    if attach {
        let i = sb.ifname;
        let _ = writeln!(s, "add element {t} veths {{ \"{i}\" }}");
        let _ = writeln!(s, "add element {t} out_dispatch {{ \"{i}\" : jump o_{k} }}");
        let _ = writeln!(s, "add element {t} in_dispatch {{ \"{i}\" : jump i_{k} }}");
    }
    s
}

/// Pins `addrs` into `set` for `ttl_secs` each (refreshing existing entries).
pub fn pin_script(table: &str, set: &str, addrs: &[(Ipv4Addr, u32)]) -> String {
    let t = format!("inet {table}");
    let mut s = String::new();
    for (a, ttl) in addrs {
        // add (no-op when present), delete, add again: sets the new timeout in one transaction.
        let _ = writeln!(s, "add element {t} {set} {{ {a} }}");
        let _ = writeln!(s, "delete element {t} {set} {{ {a} }}");
        let _ = writeln!(s, "add element {t} {set} {{ {a} timeout {ttl}s }}");
    }
    s
}

/// Parses `nft -j list table` output into [`Objects`].
pub fn parse_objects(json: &str) -> Objects {
    let mut o = Objects::default();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return o };
    let Some(items) = v.get("nftables").and_then(|x| x.as_array()) else { return o };
    for it in items {
        if let Some(c) = it.get("chain") {
            if let Some(n) = c.get("name").and_then(|n| n.as_str()) {
                o.chains.push(n.to_string());
            }
        } else if let Some(c) = it.get("counter") {
            if let Some(n) = c.get("name").and_then(|n| n.as_str()) {
                o.counters.push(n.to_string());
            }
        } else if let Some(m) = it.get("map") {
            let name = m.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            let elems = m.get("elem").and_then(|e| e.as_array()).cloned().unwrap_or_default();
            for e in elems {
                // [ "ifname", { "jump": { "target": "o_KEY" } } ]
                let Some(pair) = e.as_array() else { continue };
                let (Some(i), Some(target)) = (
                    pair.first().and_then(|x| x.as_str()),
                    pair.get(1)
                        .and_then(|x| x.get("jump").or_else(|| x.get("goto")))
                        .and_then(|j| j.get("target"))
                        .and_then(|t| t.as_str()),
                ) else {
                    continue;
                };
                match name {
                    "out_dispatch" => o.out_dispatch.push((i.to_string(), target.to_string())),
                    "in_dispatch" => o.in_dispatch.push((i.to_string(), target.to_string())),
                    _ => {}
                }
            }
        } else if let Some(set) = it.get("set") {
            let name = set.get("name").and_then(|n| n.as_str()).unwrap_or_default();
            if name == "veths" {
                for e in set.get("elem").and_then(|e| e.as_array()).cloned().unwrap_or_default() {
                    if let Some(i) = e.as_str() {
                        o.veths.push(i.to_string());
                    }
                }
            } else {
                o.sets.push(name.to_string());
            }
        }
    }
    o
}

/// Counter values by name from `nft -j list counters table ...` output.
pub fn parse_counters(json: &str) -> std::collections::HashMap<String, (u64, u64)> {
    let mut m = std::collections::HashMap::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return m };
    for it in v.get("nftables").and_then(|x| x.as_array()).cloned().unwrap_or_default() {
        if let Some(c) = it.get("counter") {
            if let Some(n) = c.get("name").and_then(|n| n.as_str()) {
                let p = c.get("packets").and_then(|x| x.as_u64()).unwrap_or(0);
                let b = c.get("bytes").and_then(|x| x.as_u64()).unwrap_or(0);
                m.insert(n.to_string(), (p, b));
            }
        }
    }
    m
}

/// Denied destinations from `nft -j list set ... d_KEY` output, as `ADDR PROTO/PORT`.
pub fn parse_denied(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return out };
    for it in v.get("nftables").and_then(|x| x.as_array()).cloned().unwrap_or_default() {
        let Some(set) = it.get("set") else { continue };
        for e in set.get("elem").and_then(|e| e.as_array()).cloned().unwrap_or_default() {
            // { "elem": { "val": { "concat": [ "1.2.3.4", "tcp", 80 ] }, "expires": .. } } or { "concat": [...] }
            let concat = e
                .get("elem")
                .and_then(|x| x.get("val"))
                .unwrap_or(&e)
                .get("concat")
                .and_then(|c| c.as_array())
                .cloned()
                .unwrap_or_default();
            if concat.len() != 3 {
                continue;
            }
            let addr = concat[0].as_str().unwrap_or("?");
            let proto = concat[1].as_str().map(str::to_string).unwrap_or_else(|| concat[1].to_string());
            let port = concat[2].as_u64().unwrap_or(0);
            out.push(if proto == "tcp" || proto == "udp" {
                format!("{addr} {proto}/{port}")
            } else {
                format!("{addr} {proto}")
            });
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_rules;

    fn pool() -> Pool {
        Pool::parse("10.213.0.0/16").unwrap()
    }

    #[test]
    fn base_script_dispatches_and_defaults_to_drop() {
        let cfg = TableConfig { table: TableConfig::table_name(&pool()), pool: pool(), resolver_port: 5300 };
        assert_eq!(cfg.table, "strata_10_213_0_0_16");
        let s = base_script(&cfg);
        assert!(s.contains("add rule inet strata_10_213_0_0_16 forward iifname vmap @out_dispatch\nadd rule inet strata_10_213_0_0_16 forward iifname @veths drop"));
        assert!(s.contains("th dport 53 redirect to :5300"));
        assert!(s.contains("input iifname @veths drop"));
        assert!(s.contains("ip saddr 10.213.0.0/16 oifname != @veths masquerade"));
    }

    #[test]
    fn deny_rules_are_exceptions_to_the_catch_all_only() {
        let rules = crate::rules::parse_spec(
            &["0.0.0.0/0".into(), "203.0.113.7".into(), "pypi.org".into()],
            &["203.0.113.0/24".into(), "198.51.100.0/24:443".into()],
        )
        .unwrap();
        let sb = SandboxNet { key: "abc", ifname: "sbabc", address: "10.213.0.2".parse().unwrap(), rules: &rules };
        let s = sandbox_script("T", &pool(), &sb, false, &[]);
        let pos = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} missing in\n{s}"));
        // Reserved ranges first; a narrower allow wins over a deny; the catch-all comes last.
        assert!(pos("169.254.0.0/16") < pos("ip daddr 203.0.113.7/32 counter name ok_abc accept"));
        assert!(pos("ip daddr 203.0.113.7/32 counter") < pos("ip daddr 203.0.113.0/24 goto deny_abc"));
        let pypi = host_set("abc", &rules[2]);
        assert!(
            pos(&format!("ip daddr @{pypi} counter")) < pos("ip daddr 203.0.113.0/24 goto"),
            "host sets before denies"
        );
        assert!(
            pos("ip daddr 198.51.100.0/24 meta l4proto { tcp, udp } th dport 443 goto deny_abc")
                < pos("ip daddr 0.0.0.0/0 counter name ok_abc accept")
        );
        assert!(pos("ip daddr 0.0.0.0/0 counter name ok_abc accept") < s.rfind("goto deny_abc\n").unwrap());
    }

    #[test]
    fn sandbox_script_orders_rules_deny_first() {
        let rules = parse_rules(&[
            "10.0.0.0/8:443".into(),
            "198.51.100.1:80".into(),
            "0.0.0.0/0:22".into(),
            "pypi.org".into(),
            "*.example.com:443".into(),
        ])
        .unwrap();
        let sb = SandboxNet { key: "abc", ifname: "sbabc", address: "10.213.0.2".parse().unwrap(), rules: &rules };
        let s = sandbox_script("T", &pool(), &sb, true, &["h_abc_old".into()]);
        let pos = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} missing in\n{s}"));
        // Spoofing and IPv6 first, then established, then the pool, then reserved.
        assert!(pos("ip saddr != 10.213.0.2") < pos("ct state established"));
        assert!(pos("ct state established") < pos("ip daddr 10.213.0.0/16 goto deny_abc"));
        assert!(pos("ip daddr 10.213.0.0/16 goto") < pos("ip daddr 10.0.0.0/8 meta l4proto { tcp, udp } th dport 443"));
        assert!(pos("th dport 443 counter name ok_abc accept") < pos("169.254.0.0/16"));
        // 0.0.0.0/0 is not "inside" a reserved range, so it comes after their deny.
        assert!(pos("169.254.0.0/16") < pos("ip daddr 0.0.0.0/0 meta l4proto { tcp, udp } th dport 22"));
        assert!(pos("169.254.0.0/16") < pos("ip daddr 198.51.100.1/32 meta l4proto { tcp, udp } th dport 80"));
        let pypi = host_set("abc", &rules[3]);
        assert!(pos(&format!("ip daddr @{pypi} counter name ok_abc accept")) < s.rfind("goto deny_abc").unwrap());
        assert!(s.contains("delete set inet T h_abc_old"));
        assert!(s.contains("add element inet T out_dispatch { \"sbabc\" : jump o_abc }"));
        assert!(!sandbox_script("T", &pool(), &sb, false, &[]).contains("add element"));
        assert_eq!(host_set("abc", &rules[3]), host_set("abc", &parse_rules(&["PYPI.org".into()]).unwrap()[0]));
    }

    #[test]
    fn objects_of_a_sandbox_are_found_for_removal() {
        let json = r#"{"nftables":[{"metainfo":{}},{"table":{"name":"T"}},
            {"set":{"name":"veths","elem":["sbabc","sbdef"]}},
            {"map":{"name":"out_dispatch","elem":[["sbabc",{"jump":{"target":"o_abc"}}],["sbdef",{"jump":{"target":"o_def"}}]]}},
            {"map":{"name":"in_dispatch","elem":[["sbabc",{"jump":{"target":"i_abc"}}]]}},
            {"set":{"name":"d_abc"}},{"set":{"name":"h_abc_0011"}},{"set":{"name":"h_abcd_0011"}},
            {"counter":{"name":"ok_abc","packets":3,"bytes":100}},{"counter":{"name":"no_def"}},
            {"chain":{"name":"forward"}},{"chain":{"name":"o_abc"}},{"chain":{"name":"i_abc"}},{"chain":{"name":"deny_abc"}},{"chain":{"name":"o_def"}}]}"#;
        let all = parse_objects(json);
        assert_eq!(all.veths, vec!["sbabc", "sbdef"]);
        assert_eq!(all.keys(), vec!["abc", "def"]);
        let mine = sandbox_objects("abc", &all);
        assert_eq!(mine.chains, vec!["o_abc", "i_abc", "deny_abc"]);
        assert_eq!(mine.sets, vec!["d_abc", "h_abc_0011"]);
        assert_eq!(mine.counters, vec!["ok_abc"]);
        assert_eq!(mine.out_dispatch, vec![("sbabc".to_string(), "o_abc".to_string())]);
        let rm = remove_script("T", &mine, Some("sbabc"));
        assert!(rm.find("delete element inet T out_dispatch").unwrap() < rm.find("delete chain inet T o_abc").unwrap());
        assert_eq!(parse_counters(json)["ok_abc"], (3, 100));
    }

    #[test]
    fn denied_destinations_are_formatted() {
        let json = r#"{"nftables":[{"set":{"name":"d_abc","elem":[{"elem":{"val":{"concat":["203.0.113.9","tcp",81]},"timeout":60,"expires":59}},{"concat":["169.254.169.254","icmp",0]}]}}]}"#;
        assert_eq!(parse_denied(json), vec!["169.254.169.254 icmp".to_string(), "203.0.113.9 tcp/81".to_string()]);
    }

    #[test]
    fn pins_refresh_timeouts() {
        let s = pin_script("T", "h_abc_1", &[("198.51.100.1".parse().unwrap(), 300)]);
        assert_eq!(s.lines().count(), 3);
        assert!(s.ends_with("add element inet T h_abc_1 { 198.51.100.1 timeout 300s }\n"));
    }
}
