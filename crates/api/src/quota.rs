//! Per-tenant quotas and their usage (see docs/security.md, "Defaults,
//! admission and quotas").
//!
//! Every tenant is held to the daemon's default quota (`strata daemon
//! --tenant-quota`) unless the operator set an override for it
//! (`PUT /v1/tenants/{tenant}/quota`). A request that would exceed a quota is
//! refused with 429 `quota_exceeded` and creates nothing. The operator acting
//! in no tenant is not held to any quota.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, SchemaType, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::ToSchema;

/// The value of one quota in an override: a number (a count, or bytes) or
/// `"unlimited"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaValue {
    /// At most this many (sandboxes, bytes, forks).
    Limit(u64),
    /// No limit.
    Unlimited,
}

impl QuotaValue {
    /// The limit, `None` for unlimited.
    pub fn limit(self) -> Option<u64> {
        match self {
            QuotaValue::Limit(n) => Some(n),
            QuotaValue::Unlimited => None,
        }
    }
}

impl From<Option<u64>> for QuotaValue {
    fn from(v: Option<u64>) -> Self {
        v.map_or(QuotaValue::Unlimited, QuotaValue::Limit)
    }
}

impl Serialize for QuotaValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            QuotaValue::Limit(n) => s.serialize_u64(*n),
            QuotaValue::Unlimited => s.serialize_str("unlimited"),
        }
    }
}

impl<'de> Deserialize<'de> for QuotaValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = QuotaValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer or \"unlimited\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<QuotaValue, E> {
                Ok(QuotaValue::Limit(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<QuotaValue, E> {
                u64::try_from(v).map(QuotaValue::Limit).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<QuotaValue, E> {
                if v == "unlimited" {
                    Ok(QuotaValue::Unlimited)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl utoipa::PartialSchema for QuotaValue {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::new(Type::Integer))
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64)))
                    .minimum(Some(0)),
            )
            .item(ObjectBuilder::new().schema_type(SchemaType::new(Type::String)).enum_values(Some(["unlimited"])))
            .description(Some("A count or a number of bytes, or \"unlimited\"."))
            .into()
    }
}

impl ToSchema for QuotaValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("QuotaValue")
    }
}

/// A tenant's quota override (the body of `PUT /v1/tenants/{tenant}/quota`,
/// which replaces the whole override). A field left out takes the daemon's
/// default (`strata daemon --tenant-quota`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaOverride {
    /// Live sandboxes (every state but destroyed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<QuotaValue>,
    /// Sum of the memory limits of the tenant's sandboxes that hold memory
    /// (creating, running, paused), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<QuotaValue>,
    /// Sum of the nominal disk sizes (`disk_bytes`) of the tenant's sandboxes, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<QuotaValue>,
    /// Fork and fan-out children made in any 60-second window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forks_per_minute: Option<QuotaValue>,
}

/// The limits of a quota in force; `null` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaLimits {
    /// Live sandboxes.
    pub sandboxes: Option<u64>,
    /// Bytes: sum of memory limits of sandboxes that hold memory.
    pub memory_bytes: Option<u64>,
    /// Bytes: sum of nominal disk sizes.
    pub disk_bytes: Option<u64>,
    /// Fork and fan-out children per 60 seconds.
    pub forks_per_minute: Option<u64>,
}

impl QuotaLimits {
    /// These limits with the fields of `o` that are set replacing them.
    pub fn with_override(mut self, o: &QuotaOverride) -> QuotaLimits {
        let pick = |d: Option<u64>, v: Option<QuotaValue>| v.map_or(d, QuotaValue::limit);
        self.sandboxes = pick(self.sandboxes, o.sandboxes);
        self.memory_bytes = pick(self.memory_bytes, o.memory_bytes);
        self.disk_bytes = pick(self.disk_bytes, o.disk_bytes);
        self.forks_per_minute = pick(self.forks_per_minute, o.forks_per_minute);
        self
    }
}

/// Response of `GET|PUT|DELETE /v1/tenants/{tenant}/quota`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantQuota {
    /// The tenant.
    pub tenant: String,
    /// The quota in force: the defaults with the overrides applied.
    pub effective: QuotaLimits,
    /// What the operator set for this tenant (empty: the defaults hold).
    pub overrides: QuotaOverride,
    /// The daemon's default quota of every tenant.
    pub defaults: QuotaLimits,
    /// RFC 3339 time the override was last set, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
}

/// The usage of one quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuotaUsage {
    /// In use now (for forks: children made in the last 60 seconds).
    pub used: u64,
    /// The limit in force; `null` is unlimited.
    pub limit: Option<u64>,
}

/// Response of `GET /v1/tenants/{tenant}/usage`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    /// The tenant.
    pub tenant: String,
    /// Live sandboxes.
    pub sandboxes: QuotaUsage,
    /// Sum of the memory limits of sandboxes holding memory, in bytes.
    pub memory_bytes: QuotaUsage,
    /// Sum of nominal disk sizes, in bytes.
    pub disk_bytes: QuotaUsage,
    /// Fork and fan-out children in the last 60 seconds.
    pub forks_per_minute: QuotaUsage,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_values_are_numbers_or_unlimited() {
        let o: QuotaOverride = serde_json::from_str(r#"{"sandboxes": 3, "memory_bytes": "unlimited"}"#).unwrap();
        assert_eq!(
            (o.sandboxes, o.memory_bytes, o.disk_bytes),
            (Some(QuotaValue::Limit(3)), Some(QuotaValue::Unlimited), None)
        );
        assert_eq!(serde_json::to_string(&o).unwrap(), r#"{"sandboxes":3,"memory_bytes":"unlimited"}"#);
        for bad in [r#"{"sandboxes": -1}"#, r#"{"sandboxes": "lots"}"#, r#"{"sandboxes": 1.5}"#, r#"{"sandbox": 1}"#] {
            let e = serde_json::from_str::<QuotaOverride>(bad).unwrap_err().to_string();
            assert!(e.contains("unlimited") || e.contains("unknown field"), "{bad}: {e}");
        }
    }

    #[test]
    fn overrides_replace_defaults_field_by_field() {
        let defaults =
            QuotaLimits { sandboxes: Some(100), memory_bytes: Some(8), disk_bytes: None, forks_per_minute: Some(120) };
        let o = QuotaOverride {
            sandboxes: Some(QuotaValue::Limit(2)),
            memory_bytes: Some(QuotaValue::Unlimited),
            disk_bytes: Some(QuotaValue::Limit(5)),
            forks_per_minute: None,
        };
        assert_eq!(
            defaults.with_override(&o),
            QuotaLimits { sandboxes: Some(2), memory_bytes: None, disk_bytes: Some(5), forks_per_minute: Some(120) }
        );
        assert_eq!(defaults.with_override(&QuotaOverride::default()), defaults);
    }
}
