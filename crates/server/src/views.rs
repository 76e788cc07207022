//! What the HTTP API answers, shaped from the writer's domain answers: the
//! receipt of a reservation, the log position it was committed at, how it was
//! sized, and a partition's terms for operators. The command handlers
//! (`crate::api`) and the query handlers (`crate::queries`) both answer these.

use reservoir_core::{Ledger, PartitionKey, Reservation, ReservationState, SizingRule, Term};
use reservoir_log::Position;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::writer::PartitionStatus;

/// Where a record was committed, as answered to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LogPosition {
    pub log_partition: u32,
    pub offset: u64,
}

impl From<Position> for LogPosition {
    fn from(p: Position) -> Self {
        LogPosition {
            log_partition: p.log_partition,
            offset: p.offset,
        }
    }
}

/// The identity of a ledger partition.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct PartitionKeyView {
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
}

impl From<&PartitionKey> for PartitionKeyView {
    fn from(k: &PartitionKey) -> Self {
        PartitionKeyView {
            subject: k.subject.clone(),
            route: k.route.clone(),
            accounting_epoch: k.accounting_epoch.clone(),
            policy_generation: k.policy_generation,
        }
    }
}

/// The receipt of a reservation: its record, its partition, and the log position
/// of the last event that changed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Receipt {
    pub id: String,
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
    /// One of RESERVED, STARTED, SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRING, EXPIRED, USAGE_UNKNOWN.
    #[schema(example = "RESERVED")]
    pub state: String,
    pub reserved_units: u64,
    pub held_units: u64,
    pub actual_units: Option<u64>,
    pub operation_id: Option<String>,
    pub expires_at_ms: u64,
    /// How the server sized the reservation when the request gave no units
    /// (absent when it did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<SizingReceipt>,
    /// The amounts in the policy's further dimensions (absent for a
    /// one-dimension policy; the fields above are the primary dimension's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dimensions: Vec<DimensionReceipt>,
    /// `enforce`, or `shadow` when the policy (its `shadow_mode`, or a
    /// staged rollout that leaves this route out) only records verdicts.
    #[schema(example = "enforce")]
    #[serde(default = "enforce")]
    pub mode: String,
    /// In shadow mode, what enforcement would have refused (absent when it
    /// would have admitted, and outside shadow mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_refuse: Option<WouldRefuse>,
    pub log_position: LogPosition,
}

fn enforce() -> String {
    "enforce".to_string()
}

/// A shadow verdict that enforcement would have refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WouldRefuse {
    /// `insufficient_capacity`, `debt_outstanding` or `request_too_large`:
    /// the problem type enforcement would have answered.
    pub reason: String,
    /// The dimension it would have refused in (absent in records logged
    /// before it was kept).
    pub dimension: Option<String>,
}

impl WouldRefuse {
    pub fn of(r: &Reservation) -> Option<WouldRefuse> {
        let reason = r.shadow?.would_refuse()?;
        Some(WouldRefuse {
            reason: reason.to_string(),
            dimension: r.shadow_dimension.map(|d| d.name().to_string()),
        })
    }
}

/// A reservation's amounts in one further dimension.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DimensionReceipt {
    /// `requests`, `input_tokens`, `output_tokens` or `tokens`.
    pub dimension: String,
    pub reserved_units: u64,
    pub held_units: u64,
    pub actual_units: Option<u64>,
    pub overdraft_units: u64,
}

impl Receipt {
    pub fn new(key: &PartitionKey, r: &Reservation, position: Position) -> Receipt {
        Receipt {
            id: r.id.to_string(),
            subject: key.subject.clone(),
            route: key.route.clone(),
            accounting_epoch: key.accounting_epoch.clone(),
            policy_generation: key.policy_generation,
            state: state_name(r.state).to_string(),
            reserved_units: r.reserved_units,
            held_units: r.held_units,
            actual_units: r.actual_units,
            operation_id: r.operation_id.as_ref().map(|o| o.to_string()),
            expires_at_ms: r.expires_at_ms,
            sizing: r.sizing.map(SizingReceipt::from),
            dimensions: Vec::new(),
            mode: match r.shadow {
                Some(_) => "shadow",
                None => "enforce",
            }
            .to_string(),
            would_refuse: WouldRefuse::of(r),
            log_position: position.into(),
        }
    }

    /// Names the further dimensions' amounts (`dimensions`: the policy's,
    /// primary first).
    pub fn add_dimensions(
        &mut self,
        r: &Reservation,
        dimensions: impl Iterator<Item = reservoir_core::Dimension>,
    ) {
        self.dimensions = dimensions
            .skip(1)
            .zip(&r.further)
            .map(|(d, hold)| DimensionReceipt {
                dimension: d.name().to_string(),
                reserved_units: hold.reserved_units,
                held_units: hold.held_units,
                actual_units: hold.actual_units,
                overdraft_units: hold.overdraft_units,
            })
            .collect();
    }
}

/// The sizing rule that produced a reservation's units, as recorded in its
/// `Reserved` event: `units = input_units + output_units`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SizingReceipt {
    /// One of max_tokens, route_default_max_tokens, route_quantile, sibling_quantile, cold_ceiling.
    #[schema(example = "route_quantile")]
    pub rule: String,
    pub units: u64,
    /// Counted input tokens times the route's drift multiplier.
    pub input_units: u64,
    /// The output estimate the rule gave.
    pub output_units: u64,
}

impl From<reservoir_core::Sizing> for SizingReceipt {
    fn from(s: reservoir_core::Sizing) -> Self {
        let rule = match s.rule {
            SizingRule::MaxTokens => "max_tokens",
            SizingRule::RouteDefaultMaxTokens => "route_default_max_tokens",
            SizingRule::RouteQuantile => "route_quantile",
            SizingRule::SiblingQuantile => "sibling_quantile",
            SizingRule::ColdCeiling => "cold_ceiling",
        };
        SizingReceipt {
            rule: rule.to_string(),
            units: s.units,
            input_units: s.input_units,
            output_units: s.output_units,
        }
    }
}

pub fn state_name(s: ReservationState) -> &'static str {
    match s {
        ReservationState::Requested => "REQUESTED",
        ReservationState::Reserved => "RESERVED",
        ReservationState::Started => "STARTED",
        ReservationState::Settled => "SETTLED",
        ReservationState::SettledWithDebt => "SETTLED_WITH_DEBT",
        ReservationState::Released => "RELEASED",
        ReservationState::Expiring => "EXPIRING",
        ReservationState::Expired => "EXPIRED",
        ReservationState::UsageUnknown => "USAGE_UNKNOWN",
    }
}

/// Every term of the conservation equation (each under its
/// [`Term::name`], e.g. `opening_units`), and the check over them.
///
/// The terms are the core [`Ledger`] flattened, so the JSON names every term
/// the ledger has; the OpenAPI schema is built from [`Term::ALL`] below.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerView {
    #[serde(flatten)]
    pub terms: Ledger,
    /// `ok` when the sources equal the destinations, else what is wrong.
    pub conservation: String,
}

impl From<&Ledger> for LedgerView {
    fn from(l: &Ledger) -> Self {
        LedgerView {
            terms: *l,
            conservation: if l.sources() == l.destinations() {
                "ok".to_string()
            } else {
                format!(
                    "sources {} != destinations {}",
                    l.sources(),
                    l.destinations()
                )
            },
        }
    }
}

impl utoipa::PartialSchema for LedgerView {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let mut object = ObjectBuilder::new().description(Some(
            "Every term of the conservation equation, and the check over them.",
        ));
        for term in Term::ALL {
            object = object
                .property(term.name(), <u64 as utoipa::PartialSchema>::schema())
                .required(term.name());
        }
        object
            .property(
                "conservation",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some(
                        "`ok` when the sources equal the destinations, else what is wrong.",
                    )),
            )
            .required("conservation")
            .into()
    }
}

impl ToSchema for LedgerView {}

/// One partition's state for operators and tests (`GET /v1/partitions`):
/// every ledger term (flattened, each under its [`Term::name`]) and the full
/// invariant check.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct PartitionView {
    pub subject: String,
    pub route: String,
    pub accounting_epoch: String,
    pub policy_generation: u64,
    pub closed: bool,
    /// Closed, with nothing reserved, no debt and no shard issued: nothing
    /// more will move out of it ([`reservoir_core::Partition::drained`]).
    pub drained: bool,
    /// Capacity moves recorded, each direction (generation switches,
    /// rollbacks, draining).
    pub moves_out: u64,
    pub moves_in: u64,
    /// Emergency shards issued from this partition, and shards reconciled
    /// into it (their unused units reminted here).
    pub shards_issued: u64,
    pub shards_reminted: u64,
    pub last_sequence: u64,
    /// The terms; `conservation` here is the full check (the equation and
    /// reserved = Σ held over open reservations): `ok` or the error.
    #[serde(flatten)]
    pub ledger: LedgerView,
    pub debt_units: u64,
    pub open_reservations: u64,
    /// Reservations ever made in the partition (in memory plus evicted).
    pub reservations: u64,
    /// Records the writer holds: the open ones and the finished ones inside
    /// the idempotency window.
    pub reservations_in_memory: u64,
    /// Finished records that left memory for the idempotency index.
    pub evicted_reservations: u64,
    pub refusals: u64,
    /// The further dimensions of the policy, each with its own terms and
    /// conservation check (absent for a one-dimension policy; the terms above
    /// are the primary dimension's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dimensions: Vec<DimensionLedgerView>,
}

/// One further dimension's terms in a partition.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct DimensionLedgerView {
    /// `requests`, `input_tokens`, `output_tokens` or `tokens`.
    pub dimension: String,
    #[serde(flatten)]
    pub ledger: LedgerView,
    pub debt_units: u64,
}

impl From<&PartitionStatus> for PartitionView {
    fn from(s: &PartitionStatus) -> Self {
        let p = &s.partition;
        let key = &s.key;
        PartitionView {
            subject: key.subject.clone(),
            route: key.route.clone(),
            accounting_epoch: key.accounting_epoch.clone(),
            policy_generation: key.policy_generation,
            closed: p.closed,
            drained: p.drained(),
            moves_out: p.moves_out.len() as u64,
            moves_in: p.moves_in.len() as u64,
            shards_issued: p.shards_issued.len() as u64,
            shards_reminted: p.shards_reminted.len() as u64,
            last_sequence: p.last_sequence,
            ledger: LedgerView {
                terms: p.ledger,
                conservation: match &s.invariants {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.to_string(),
                },
            },
            debt_units: p.debt_units(),
            open_reservations: p.open_reservations as u64,
            reservations: s.reservations as u64 + p.evicted_reservations,
            reservations_in_memory: s.reservations as u64,
            evicted_reservations: p.evicted_reservations,
            refusals: p.refusals,
            dimensions: p
                .policy
                .iter()
                .flat_map(|policy| policy.dimensions.iter())
                .zip(&p.further)
                .map(|(limit, state)| DimensionLedgerView {
                    dimension: limit.dimension.name().to_string(),
                    ledger: LedgerView::from(&state.ledger),
                    debt_units: state.ledger.debt_units().unwrap_or(0),
                })
                .collect(),
        }
    }
}
