//! What the simulated world is made of: tenants with weights, the routes
//! each of them has, and the policies an operator publishes for them.

use reservoir_core::{
    CapacityUnit, Dimension, DimensionLimit, EmergencyMode, EpochLength, Policy, RefillRule, Units,
};

/// A tenant and its weight: every limit of its policies is the base limit
/// times the weight, so its fair share of what is admitted is its weight
/// over the sum of weights (see `report`).
#[derive(Clone, Copy, Debug)]
pub struct Tenant {
    pub name: &'static str,
    pub weight: u64,
}

pub const TENANTS: [Tenant; 3] = [
    Tenant {
        name: "t-a",
        weight: 1,
    },
    Tenant {
        name: "t-b",
        weight: 2,
    },
    Tenant {
        name: "t-c",
        weight: 3,
    },
];

/// The routes every tenant has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Route {
    /// Three dimensions (requests, input tokens, output tokens), a named
    /// accounting epoch, generations published and rolled back by the
    /// operator while reservations are in flight, and now and then an
    /// emergency shard (of requests: the primary dimension).
    Chat,
    /// One dimension (tokens) whose accounting epochs roll every hour, with
    /// emergency shards.
    Embed,
}

pub const ROUTES: [Route; 2] = [Route::Chat, Route::Embed];

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Embed => "embed",
        }
    }

    /// The accounting epoch a publish names (`None`: the policy's epochs roll).
    pub fn named_epoch(self) -> Option<String> {
        match self {
            Route::Chat => Some(CHAT_EPOCH.to_string()),
            Route::Embed => None,
        }
    }
}

pub const CHAT_EPOCH: &str = "e1";

/// Lease of an unstarted reservation: short, so clock jumps expire leases
/// while gateways are about to start them.
pub const HOLD_TTL_MS: u64 = 15_000;
/// Hard execution limit: a started call unsettled past it is USAGE_UNKNOWN.
pub const HARD_EXECUTION_LIMIT_MS: u64 = 40_000;
/// Short, so finished records leave memory within a run and retries are
/// answered from the on-disk idempotency index.
pub const IDEMPOTENCY_WINDOW_MS: u64 = 20_000;

/// The simulated clock's start: 50 minutes into an hour, so the hourly
/// epochs of `embed` roll within a run.
pub const START_MS: u64 = 1_784_469_600_000 + 50 * 60_000;

fn per_minute(units: Units) -> RefillRule {
    RefillRule {
        units,
        interval_ms: 60_000,
    }
}

fn limit(dimension: Dimension, burst_units: Units, max_reservation: Units) -> DimensionLimit {
    DimensionLimit {
        dimension,
        refill: per_minute(burst_units),
        burst_units,
        opening_units: burst_units,
        max_reservation_units: max_reservation,
        max_overdraft_units: burst_units,
    }
}

/// The policy of `tenant`'s `route` at `generation`. `variant` changes the
/// output-token bucket only, so that successive generations differ (a
/// generation is a new policy) and every dimension still moves across.
pub fn policy(tenant: Tenant, route: Route, generation: u64, variant: u64) -> Policy {
    let w = tenant.weight;
    let mut p = Policy::example(tenant.name, route.name(), generation);
    p.hold_ttl_ms = HOLD_TTL_MS;
    p.hard_execution_limit_ms = HARD_EXECUTION_LIMIT_MS;
    p.idempotency_window_ms = IDEMPOTENCY_WINDOW_MS;
    match route {
        Route::Chat => {
            p.capacity_unit = CapacityUnit::Requests;
            p.refill = per_minute(6 * w);
            p.burst_units = 6 * w;
            p.opening_units = 6 * w;
            p.max_reservation_units = 1;
            p.max_overdraft_units = 0;
            p.dimensions = vec![
                limit(Dimension::InputTokens, 8_000 * w, 4_000),
                limit(
                    Dimension::OutputTokens,
                    (2_000 + 1_000 * variant) * w,
                    2_000,
                ),
            ];
            // Shards of it are asked for only with `RunConfig::chat_shards`.
            p.emergency_mode = EmergencyMode::Enabled;
        }
        Route::Embed => {
            p.capacity_unit = CapacityUnit::Tokens;
            p.refill = per_minute(4_000 * w);
            p.burst_units = 4_000 * w;
            p.opening_units = 4_000 * w;
            p.max_reservation_units = 2_000;
            p.max_overdraft_units = 3_000 * w;
            p.epoch_length = EpochLength::Hourly;
            // Gateways carry emergency shards of it (see `run::shards`).
            p.emergency_mode = EmergencyMode::Enabled;
        }
    }
    p
}
