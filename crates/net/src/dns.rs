//! DNS message handling of the filtering resolver (pure): read the question,
//! build refusals and empty answers, collect the IPv4 answers to pin.

use std::net::Ipv4Addr;

use simple_dns::rdata::RData;
pub use simple_dns::RCODE;
use simple_dns::{Packet, PacketFlag, QTYPE, TYPE};

/// Shortest time an answer stays pinned (seconds), whatever its TTL.
pub const MIN_PIN_SECS: u32 = 30;
/// Longest time an answer stays pinned (seconds).
pub const MAX_PIN_SECS: u32 = 3600;

/// The question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// Name asked for, lower case, without the trailing dot.
    pub name: String,
    /// Record type asked for.
    pub kind: QueryKind,
}

/// What a query asks for, as far as the filter cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryKind {
    /// IPv4 addresses.
    A,
    /// IPv6 addresses (answered empty: sandboxes have no IPv6 egress).
    Aaaa,
    /// Anything else (CNAME, TXT, MX, ...): forwarded for allowed names.
    Other,
}

/// Reads the (single) question of a query.
pub fn parse_query(msg: &[u8]) -> Result<Question, String> {
    let p = Packet::parse(msg).map_err(|e| format!("malformed DNS message: {e}"))?;
    if p.has_flags(PacketFlag::RESPONSE) {
        return Err("a response, not a query".into());
    }
    if p.questions.len() != 1 {
        return Err(format!("{} questions (one is supported)", p.questions.len()));
    }
    let q = &p.questions[0];
    let name = q.qname.to_string().trim_end_matches('.').to_ascii_lowercase();
    let kind = match q.qtype {
        QTYPE::TYPE(TYPE::A) => QueryKind::A,
        QTYPE::TYPE(TYPE::AAAA) => QueryKind::Aaaa,
        _ => QueryKind::Other,
    };
    Ok(Question { name, kind })
}

/// A reply to `query` with `rcode` and no records (the question echoed).
pub fn reply(query: &[u8], rcode: RCODE) -> Option<Vec<u8>> {
    let q = Packet::parse(query).ok()?;
    let mut r = Packet::new_reply(q.id());
    r.set_flags(PacketFlag::RECURSION_AVAILABLE);
    if q.has_flags(PacketFlag::RECURSION_DESIRED) {
        r.set_flags(PacketFlag::RECURSION_DESIRED);
    }
    *r.rcode_mut() = rcode;
    r.questions = q.questions.clone();
    r.build_bytes_vec().ok()
}

/// NXDOMAIN for `query` (a name no rule allows).
pub fn refuse(query: &[u8]) -> Option<Vec<u8>> {
    reply(query, RCODE::NameError)
}

/// The IPv4 addresses in a response's answer section with their pin time
/// (TTL clamped to [`MIN_PIN_SECS`]..=[`MAX_PIN_SECS`]). Errors for messages
/// that are not a response to `id`.
pub fn answers(resp: &[u8], id: u16) -> Result<Vec<(Ipv4Addr, u32)>, String> {
    let p = Packet::parse(resp).map_err(|e| format!("malformed DNS response: {e}"))?;
    if !p.has_flags(PacketFlag::RESPONSE) || p.id() != id {
        return Err("not a response to the query".into());
    }
    Ok(p.answers
        .iter()
        .filter_map(|rr| match &rr.rdata {
            RData::A(a) => Some((Ipv4Addr::from(a.address), rr.ttl.clamp(MIN_PIN_SECS, MAX_PIN_SECS))),
            _ => None,
        })
        .collect())
}

/// The id of a DNS message (first two bytes).
pub fn message_id(msg: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*msg.first()?, *msg.get(1)?]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use simple_dns::{Name, Question as Q, ResourceRecord, CLASS, QCLASS};

    fn query(name: &str, t: TYPE) -> Vec<u8> {
        let mut p = Packet::new_query(0x4242);
        p.set_flags(PacketFlag::RECURSION_DESIRED);
        p.questions.push(Q::new(Name::new_unchecked(name), QTYPE::TYPE(t), QCLASS::CLASS(CLASS::IN), false));
        p.build_bytes_vec().unwrap()
    }

    #[test]
    fn reads_questions() {
        assert_eq!(
            parse_query(&query("PyPI.org", TYPE::A)).unwrap(),
            Question { name: "pypi.org".into(), kind: QueryKind::A }
        );
        assert_eq!(parse_query(&query("x.example.com", TYPE::AAAA)).unwrap().kind, QueryKind::Aaaa);
        assert_eq!(parse_query(&query("x.example.com", TYPE::TXT)).unwrap().kind, QueryKind::Other);
        assert!(parse_query(b"\x00\x01garbage").is_err());
    }

    #[test]
    fn refusals_echo_the_question_with_nxdomain() {
        let q = query("evil.example", TYPE::A);
        let r = refuse(&q).unwrap();
        let p = Packet::parse(&r).unwrap();
        assert_eq!(p.id(), 0x4242);
        assert!(p.has_flags(PacketFlag::RESPONSE));
        assert_eq!(p.rcode(), RCODE::NameError);
        assert_eq!(p.questions.len(), 1);
        assert!(p.answers.is_empty());
    }

    #[test]
    fn collects_a_records_with_clamped_ttls() {
        let q = query("pypi.org", TYPE::A);
        let mut p = Packet::parse(&q).unwrap().into_reply();
        p.answers.push(ResourceRecord::new(
            Name::new_unchecked("pypi.org"),
            CLASS::IN,
            5,
            RData::A(simple_dns::rdata::A { address: u32::from(Ipv4Addr::new(198, 51, 100, 1)) }),
        ));
        p.answers.push(ResourceRecord::new(
            Name::new_unchecked("pypi.org"),
            CLASS::IN,
            86400,
            RData::A(simple_dns::rdata::A { address: u32::from(Ipv4Addr::new(198, 51, 100, 2)) }),
        ));
        let bytes = p.build_bytes_vec().unwrap();
        assert_eq!(
            answers(&bytes, 0x4242).unwrap(),
            vec![(Ipv4Addr::new(198, 51, 100, 1), MIN_PIN_SECS), (Ipv4Addr::new(198, 51, 100, 2), MAX_PIN_SECS)]
        );
        assert!(answers(&bytes, 1).is_err());
        assert_eq!(message_id(&bytes), Some(0x4242));
    }
}
