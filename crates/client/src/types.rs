//! The wire contract as the client sees it: what a reserve asks for, the
//! receipts the ledger answers, the usage a settle records, and the route
//! settings a gateway reads (default `max_tokens`, priority, capacity unit).
//!
//! Answers are read tolerantly: no `deny_unknown_fields`, and anything the
//! client does not need is optional, so a server that adds fields (per-dimension
//! amounts, `limiting_dimension`) does not break a deployed gateway.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest id the ledger accepts (bytes of `[A-Za-z0-9._:/@-]`).
pub const MAX_ID_BYTES: usize = 128;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Checks the ledger's id rules, so a bad id fails here rather than as a 422.
            pub fn new(raw: impl Into<String>) -> Result<Self, crate::Error> {
                let raw = raw.into();
                let ok = !raw.is_empty()
                    && raw.len() <= MAX_ID_BYTES
                    && raw
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._:/@-".contains(&b));
                if ok {
                    Ok($name(raw))
                } else {
                    Err(crate::Error::InvalidInput(format!(
                        "{} `{raw}` is not 1..={MAX_ID_BYTES} bytes of [A-Za-z0-9._:/@-]",
                        stringify!($name)
                    )))
                }
            }

            /// A fresh random id (128 bits), chosen once per call and kept across its retries.
            pub fn random() -> Self {
                $name(format!(concat!($prefix, "-{:032x}"), fastrand::u128(..)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A reservation's client-chosen id: the idempotency key of its reserve.
    ReservationId,
    "rl"
);
id_type!(
    /// The id a start binds to a reservation (the operation receipt's name).
    OperationId,
    "op"
);

/// How big a reservation is: units the gateway computed, or the sizing inputs
/// for the server's estimator (counted input × drift + `max_tokens`, else the
/// route default, else the route's distribution).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizing {
    Units(u64),
    Tokens {
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    },
}

/// One reserve: who, which route, how big, and the model (kept for the settle's
/// usage record; the ledger's reserve does not take it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveRequest {
    pub subject: String,
    pub route: String,
    pub sizing: Sizing,
    pub model: Option<String>,
}

impl ReserveRequest {
    pub fn units(subject: &str, route: &str, units: u64) -> Self {
        ReserveRequest {
            subject: subject.to_string(),
            route: route.to_string(),
            sizing: Sizing::Units(units),
            model: None,
        }
    }

    pub fn tokens(
        subject: &str,
        route: &str,
        counted_input_tokens: u64,
        max_tokens: Option<u64>,
    ) -> Self {
        ReserveRequest {
            subject: subject.to_string(),
            route: route.to_string(),
            sizing: Sizing::Tokens {
                counted_input_tokens,
                max_tokens,
            },
            model: None,
        }
    }

    pub fn with_model(mut self, model: &str) -> Self {
        self.model = Some(model.to_string());
        self
    }

    /// Input tokens the gateway counted (0 when it gave units).
    pub fn counted_input_tokens(&self) -> u64 {
        match self.sizing {
            Sizing::Units(_) => 0,
            Sizing::Tokens {
                counted_input_tokens,
                ..
            } => counted_input_tokens,
        }
    }

    /// The body of `POST /v1/reservations`: identical on every retry, so the
    /// ledger's request digest matches and a retry finds the original.
    pub(crate) fn body(&self, id: &ReservationId) -> serde_json::Value {
        let mut body = serde_json::json!({"id": id, "subject": self.subject, "route": self.route});
        match self.sizing {
            Sizing::Units(units) => body["units"] = units.into(),
            Sizing::Tokens {
                counted_input_tokens,
                max_tokens,
            } => {
                body["counted_input_tokens"] = counted_input_tokens.into();
                if let Some(m) = max_tokens {
                    body["max_tokens"] = m.into();
                }
            }
        }
        body
    }
}

/// A reservation's state as the ledger names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReservationState {
    Requested,
    Reserved,
    Started,
    Settled,
    SettledWithDebt,
    Released,
    Expiring,
    Expired,
    UsageUnknown,
    /// A state this client does not know yet (a newer server).
    #[serde(other)]
    Other,
}

impl ReservationState {
    /// Settled, released or expired: nothing more will move.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Settled | Self::SettledWithDebt | Self::Released | Self::Expired
        )
    }
}

/// Where the ledger committed the answer (a query can wait for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    pub log_partition: u32,
    pub offset: u64,
}

impl LogPosition {
    /// As `?min_position=` wants it.
    pub fn query(&self) -> String {
        format!("{}:{}", self.log_partition, self.offset)
    }
}

/// How the server sized a reservation given no units: `units = input_units + output_units`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizingReceipt {
    /// max_tokens, route_default_max_tokens, route_quantile, sibling_quantile or cold_ceiling.
    pub rule: String,
    pub units: u64,
    pub input_units: u64,
    pub output_units: u64,
}

/// The ledger's receipt of a reservation (every write and `GET` answers one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: ReservationId,
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
    pub state: ReservationState,
    pub reserved_units: u64,
    pub held_units: u64,
    #[serde(default)]
    pub actual_units: Option<u64>,
    #[serde(default)]
    pub operation_id: Option<OperationId>,
    pub expires_at_ms: u64,
    #[serde(default)]
    pub sizing: Option<SizingReceipt>,
    pub log_position: LogPosition,
}

/// What a call used, recorded with its settle so route estimates and input
/// drift learn from it. Every part optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_input_tokens: Option<u64>,
    /// The provider's input count, cache reads not included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_input_tokens: Option<u64>,
    /// Prompt tokens the provider read from its cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
}

/// A settle: its amount is fixed before the first attempt, so every retry
/// sends the same one (a different amount for the same id is refused).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Settlement {
    pub actual_units: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<OperationId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl Settlement {
    /// The settle of a started call whose provider call never ran (a start
    /// answered too late, given back): 0 units, and a usage of no input and
    /// no output, which a route limiting tokens beside requests needs to
    /// settle at all (without it the ledger refuses with `usage_missing`).
    /// Named by the start's operation id, if known, so it also settles a
    /// call the sweeper already marked USAGE_UNKNOWN.
    pub fn never_ran(operation_id: Option<OperationId>) -> Settlement {
        Settlement {
            actual_units: 0,
            operation_id,
            usage: Some(Usage {
                output_tokens: Some(0),
                reported_input_tokens: Some(0),
                ..Usage::default()
            }),
        }
    }
}

/// What the ledger counts on a route, from its policy's `capacity_unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityUnit {
    /// Input plus output tokens.
    Tokens,
    /// One per call.
    Requests,
}

impl CapacityUnit {
    /// Units a call with this usage spent.
    pub fn units(self, input_tokens: u64, output_tokens: u64) -> u64 {
        match self {
            CapacityUnit::Tokens => input_tokens.saturating_add(output_tokens),
            CapacityUnit::Requests => 1,
        }
    }
}

/// The route settings a gateway acts on, from `GET /v1/policies/{subject}/{route}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    pub subject: String,
    pub route: String,
    pub policy_generation: u64,
    /// The route's default output limit: inject it into requests without one.
    pub default_max_tokens: Option<u64>,
    /// The policy's priority (higher starts first within a tenant).
    pub priority: u32,
    pub capacity_unit: CapacityUnit,
    /// Dimensions the policy limits beside the primary one (its
    /// `dimensions`). A shard carves the primary only: while cut off, such
    /// a route's calls are bounded by the shard's primary units, not by
    /// these (see the README's emergency shards).
    pub further_dimensions: usize,
}

#[derive(Deserialize)]
pub(crate) struct ActivePolicyBody {
    pub policy: PolicyBody,
    #[serde(default)]
    pub estimator: Option<EstimatorBody>,
}

#[derive(Deserialize)]
pub(crate) struct PolicyBody {
    pub subject: String,
    pub route: String,
    #[serde(default)]
    pub generation: u64,
    #[serde(default)]
    pub priority: u32,
    #[serde(default)]
    pub capacity_unit: Option<String>,
    /// Counted only (absent for a one-dimension policy).
    #[serde(default)]
    pub dimensions: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
pub(crate) struct EstimatorBody {
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
}

impl From<ActivePolicyBody> for RouteInfo {
    fn from(b: ActivePolicyBody) -> Self {
        RouteInfo {
            subject: b.policy.subject,
            route: b.policy.route,
            policy_generation: b.policy.generation,
            default_max_tokens: b.estimator.and_then(|e| e.default_max_tokens),
            priority: b.policy.priority,
            capacity_unit: match b.policy.capacity_unit.as_deref() {
                Some("requests") => CapacityUnit::Requests,
                _ => CapacityUnit::Tokens,
            },
            further_dimensions: b.policy.dimensions.len(),
        }
    }
}

/// An RFC 9457 problem as the ledger answers it; unknown members are kept in `extra`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type", default)]
    pub problem_type: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub status: u16,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub policy_generation: Option<u64>,
    /// The dimension that refused (429s).
    #[serde(default)]
    pub limiting_dimension: Option<String>,
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
    #[serde(default)]
    pub retryable: bool,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    /// The last segment of `type`, e.g. `insufficient_capacity`.
    pub fn code(&self) -> &str {
        self.problem_type.rsplit('/').next().unwrap_or("")
    }
}

/// Percent-encodes the characters of an id or route that a path segment cannot hold.
pub(crate) fn path_segment(raw: &str) -> String {
    raw.replace('%', "%25").replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_ledger_rules() {
        // (raw, accepted)
        let table = [
            ("rl-1", true),
            ("a.b:c/d@e_f-g", true),
            ("", false),
            ("has space", false),
            ("ünicode", false),
            (&"x".repeat(MAX_ID_BYTES), true),
            (&"x".repeat(MAX_ID_BYTES + 1), false),
        ];
        for (raw, accepted) in table {
            assert_eq!(ReservationId::new(raw).is_ok(), accepted, "{raw:?}");
        }
        let a = ReservationId::random();
        assert!(ReservationId::new(a.as_str()).is_ok());
        assert_ne!(a, ReservationId::random());
    }

    #[test]
    fn receipts_tolerate_fields_a_newer_server_adds() {
        let json = serde_json::json!({
            "id": "rl-1", "subject": "t", "route": "r", "accounting_epoch": "e",
            "policy_generation": 1, "state": "RESERVED", "reserved_units": 600,
            "held_units": 600, "actual_units": null, "operation_id": null,
            "expires_at_ms": 5, "log_position": {"log_partition": 0, "offset": 3},
            "dimensions": {"requests": 1, "output_tokens": 500}, "new_thing": true
        });
        let r: Receipt = serde_json::from_value(json).unwrap();
        assert_eq!(r.state, ReservationState::Reserved);
        let odd: ReservationState = serde_json::from_str("\"HIBERNATING\"").unwrap();
        assert_eq!(odd, ReservationState::Other);
        let p: Problem = serde_json::from_value(serde_json::json!({
            "type": "https://reservoir.dev/problems/insufficient_capacity", "status": 429,
            "limiting_dimension": "output_tokens", "retry_after_ms": 1500, "retryable": true,
            "dimensions": ["output_tokens"]
        }))
        .unwrap();
        assert_eq!(p.code(), "insufficient_capacity");
        assert!(p.extra.contains_key("dimensions"));
    }

    #[test]
    fn the_reserve_body_is_the_same_for_every_retry() {
        let id = ReservationId::new("rl-7").unwrap();
        let req = ReserveRequest::tokens("t", "r", 120, None).with_model("m");
        assert_eq!(
            req.body(&id),
            serde_json::json!({"id": "rl-7", "subject": "t", "route": "r", "counted_input_tokens": 120})
        );
        assert_eq!(req.body(&id), req.body(&id));
        let units = ReserveRequest::units("t", "r", 600).body(&id);
        assert_eq!(units["units"], 600);
    }

    #[test]
    fn route_settings_count_the_policys_further_dimensions() {
        let read = |policy: serde_json::Value| {
            let body: ActivePolicyBody = serde_json::from_value(serde_json::json!({
                "partition_key": {}, "accounting_epoch": "e", "policy": policy,
                "estimator": {"default_max_tokens": 700}
            }))
            .unwrap();
            let info = RouteInfo::from(body);
            (info.capacity_unit, info.further_dimensions)
        };
        let one = serde_json::json!({"subject": "t", "route": "r", "generation": 2,
            "capacity_unit": "requests"});
        let mut three = one.clone();
        three["dimensions"] = serde_json::json!([
            {"dimension": "input_tokens", "burst_units": 5},
            {"dimension": "output_tokens", "burst_units": 5}
        ]);
        assert_eq!(read(one), (CapacityUnit::Requests, 0));
        assert_eq!(read(three), (CapacityUnit::Requests, 2));
    }

    #[test]
    fn capacity_units_count_what_the_policy_limits() {
        assert_eq!(CapacityUnit::Tokens.units(120, 900), 1020);
        assert_eq!(CapacityUnit::Requests.units(120, 900), 1);
        assert_eq!(CapacityUnit::Tokens.units(u64::MAX, 1), u64::MAX);
    }
}
