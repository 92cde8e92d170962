//! The agents' Rule of Two: which of {untrusted input, sensitive access,
//! external communication} a sandbox holds, declared or derived from its
//! configuration, and whether a request would give it all three.
//!
//! Derivation (docs/security.md, "Rule of Two"):
//! * `sensitive_access` from secrets;
//! * `external_comms` from network egress with at least one allow rule, from
//!   live previews of its ports, and from exporting its files;
//! * `untrusted_input` only by declaration (strata cannot tell what a workload
//!   reads), on the sandbox or on the checkpoint it started from.

use strata_api::{Capability, CapabilityGrant, NetworkMode, NetworkSpec};

/// Everything about a sandbox (as it is, or as a request would make it) that
/// decides its capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct Exposure<'a> {
    /// Declared on the sandbox.
    pub declared: &'a [Capability],
    /// Declared on the checkpoint it starts from: (checkpoint name, capabilities).
    pub inherited: Option<(&'a str, &'a [Capability])>,
    /// Names of its secrets.
    pub secrets: &'a [String],
    /// Its network.
    pub network: Option<&'a NetworkSpec>,
    /// Ports it exposes as previews (0: every port).
    pub previews: &'a [u16],
    /// The request exports its files.
    pub export: bool,
}

/// The capabilities `e` gives, each with its reason, sorted and without duplicates.
pub fn grants(e: &Exposure<'_>) -> Vec<CapabilityGrant> {
    let mut out = Vec::new();
    let mut add = |capability, because: String| out.push(CapabilityGrant { capability, because });
    for c in e.declared {
        add(*c, "declared".into());
    }
    if let Some((from, caps)) = e.inherited {
        for c in caps {
            add(*c, format!("inherited from checkpoint {from}"));
        }
    }
    if !e.secrets.is_empty() {
        let mut names = e.secrets.to_vec();
        names.sort();
        add(Capability::SensitiveAccess, format!("secrets: {}", names.join(", ")));
    }
    if let Some(n) = e.network.filter(|n| n.mode == NetworkMode::Egress && !n.allow.is_empty()) {
        add(Capability::ExternalComms, format!("network egress: allow {}", n.allow.join(", ")));
    }
    if !e.previews.is_empty() {
        let mut ports = e.previews.to_vec();
        ports.sort_unstable();
        ports.dedup();
        let ports: Vec<String> =
            ports.iter().map(|p| if *p == 0 { "every port".to_string() } else { p.to_string() }).collect();
        add(Capability::ExternalComms, format!("preview of port {}", ports.join(", ")));
    }
    if e.export {
        add(Capability::ExternalComms, "export of its files".into());
    }
    out.sort();
    out.dedup();
    out
}

/// The distinct capabilities among `grants`.
pub fn capabilities(grants: &[CapabilityGrant]) -> Vec<Capability> {
    let mut caps: Vec<Capability> = grants.iter().map(|g| g.capability).collect();
    caps.sort();
    caps.dedup();
    caps
}

/// Whether `grants` hold all three capabilities (the case that needs an approval).
pub fn holds_all_three(grants: &[CapabilityGrant]) -> bool {
    capabilities(grants).len() == Capability::ALL.len()
}

/// The canonical text an approval is bound to: the action, its target and
/// every grant. A request asking for anything else needs its own approval.
pub fn fingerprint_input(action: &str, target: &str, grants: &[CapabilityGrant]) -> String {
    let mut s = format!("{action}\n{target}\n");
    for g in grants {
        s.push_str(g.capability.as_str());
        s.push('\t');
        s.push_str(&g.because);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str]) -> NetworkSpec {
        NetworkSpec { mode: NetworkMode::Egress, allow: allow.iter().map(|s| s.to_string()).collect(), deny: vec![] }
    }

    #[test]
    fn configuration_implies_sensitive_access_and_external_comms() {
        let secrets = vec!["GH_TOKEN".to_string(), "AWS".to_string()];
        let net = egress(&["pypi.org"]);
        let g = grants(&Exposure { secrets: &secrets, network: Some(&net), ..Default::default() });
        assert_eq!(capabilities(&g), vec![Capability::SensitiveAccess, Capability::ExternalComms]);
        assert!(g.iter().any(|x| x.because == "secrets: AWS, GH_TOKEN"), "{g:?}");
        assert!(g.iter().any(|x| x.because == "network egress: allow pypi.org"), "{g:?}");
        assert!(!holds_all_three(&g));
    }

    #[test]
    fn egress_without_rules_and_no_network_communicate_with_nothing() {
        let none = NetworkSpec::default();
        let closed = egress(&[]);
        for n in [&none, &closed] {
            assert!(grants(&Exposure { network: Some(n), ..Default::default() }).is_empty());
        }
    }

    #[test]
    fn untrusted_input_comes_from_declaration_or_the_checkpoint() {
        let declared = [Capability::UntrustedInput];
        let secrets = vec!["K".to_string()];
        let g = grants(&Exposure {
            inherited: Some(("setup-1", &declared)),
            secrets: &secrets,
            previews: &[8080, 3000, 8080],
            ..Default::default()
        });
        assert!(holds_all_three(&g), "{g:?}");
        assert!(g.iter().any(|x| x.because == "inherited from checkpoint setup-1"));
        assert!(g.iter().any(|x| x.because == "preview of port 3000, 8080"));
        let every = grants(&Exposure { previews: &[0], ..Default::default() });
        assert_eq!(every[0].because, "preview of port every port");
        let g2 = grants(&Exposure { declared: &declared, export: true, ..Default::default() });
        assert_eq!(capabilities(&g2), vec![Capability::UntrustedInput, Capability::ExternalComms]);
    }

    #[test]
    fn the_fingerprint_changes_with_action_target_and_every_grant() {
        let d = [Capability::UntrustedInput, Capability::UntrustedInput];
        let g = grants(&Exposure { declared: &d, ..Default::default() });
        assert_eq!(g.len(), 1, "duplicates collapse");
        let base = fingerprint_input("create sandbox", "busybox", &g);
        assert_ne!(base, fingerprint_input("fork", "busybox", &g));
        assert_ne!(base, fingerprint_input("create sandbox", "alpine", &g));
        let net = egress(&["10.0.0.0/8:443"]);
        let g2 = grants(&Exposure { declared: &d, network: Some(&net), ..Default::default() });
        assert_ne!(base, fingerprint_input("create sandbox", "busybox", &g2));
    }
}
