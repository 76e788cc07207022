//! Entries for the tests: one of every event type, and records of a given shape.

use reservoir_core::{
    Event, EventBody, MoveId, OperationId, PartitionKey, Policy, RefusalReason, RequestDigest,
    ReservationId, ShadowVerdict, ShardId, Sizing, SizingRule, Usage,
};
use reservoir_log::{Claim, LogEntry, Record};

pub fn key(subject: &str) -> PartitionKey {
    PartitionKey::new(subject, "chat.generate", "2026-07-19T14:00Z", 31).unwrap()
}

fn rid(s: &str) -> ReservationId {
    ReservationId::new(s).unwrap()
}

/// One body of every `EventBody` variant, with non-trivial values (options set
/// and unset, extreme-but-legal numbers). The match in `variant_guard` fails to
/// compile when core gains a variant, pointing here.
pub fn every_body() -> Vec<EventBody> {
    let bodies = vec![
        EventBody::PartitionOpened {
            key: key("tenant-7"),
            // Not the default window, so the round trips carry the field.
            policy: Policy {
                idempotency_window_ms: 45_000,
                ..Policy::example("tenant-7", "chat.generate", 31)
            },
            opening_units: 10_000,
        },
        EventBody::Refilled {
            minted_units: 167,
            repaid_units: 17,
            remainder: 59_999,
        },
        EventBody::Reserved {
            id: rid("rl-01J"),
            digest: RequestDigest([0x71; 32]),
            reserved_units: 600,
            held_units: 600,
            expires_at_ms: 1_784_469_780_000,
            shadow: None,
            shadow_dimension: None,
            sizing: None,
        },
        EventBody::Reserved {
            id: rid("rl-02"),
            digest: RequestDigest(core::array::from_fn(|i| i as u8)),
            reserved_units: 9_000,
            held_units: 0,
            expires_at_ms: i64::MAX as u64,
            shadow: Some(ShadowVerdict::WouldRefuseInsufficientCapacity),
            shadow_dimension: Some(reservoir_core::Dimension::OutputTokens),
            sizing: Some(Sizing {
                units: 9_000,
                input_units: 517,
                output_units: 8_483,
                rule: SizingRule::SiblingQuantile,
            }),
        },
        EventBody::Reserved {
            id: rid("rl-02b"),
            digest: RequestDigest([0x72; 32]),
            reserved_units: 4_500,
            held_units: 4_500,
            expires_at_ms: 1_784_469_780_000,
            shadow: None,
            shadow_dimension: None,
            sizing: Some(Sizing {
                units: 4_500,
                input_units: 500,
                output_units: 4_000,
                rule: SizingRule::MaxTokens,
            }),
        },
        EventBody::AdmissionRefused {
            dimension: None,
            id: rid("rl-03"),
            requested_units: 12_000,
            reason: RefusalReason::RequestTooLarge,
            retry_after_ms: None,
        },
        EventBody::AdmissionRefused {
            dimension: None,
            id: rid("rl-04"),
            requested_units: 1,
            reason: RefusalReason::DebtOutstanding,
            retry_after_ms: Some(2_500),
        },
        EventBody::Started {
            id: rid("rl-01J"),
            operation_id: OperationId::new("op-1").unwrap(),
            execution_deadline_ms: 1_784_470_200_000,
        },
        EventBody::Settled {
            id: rid("rl-01J"),
            actual_units: 800,
            refunded_units: 0,
            from_available_units: 150,
            overdraft_units: 50,
            overdraft_limit_breached: true,
            from_usage_unknown: false,
            usage: None,
        },
        EventBody::Settled {
            id: rid("rl-02b"),
            actual_units: 2_340,
            refunded_units: 2_160,
            from_available_units: 0,
            overdraft_units: 0,
            overdraft_limit_breached: false,
            from_usage_unknown: true,
            usage: Some(Usage {
                cache_read_input_tokens: None,
                model: Some("claude-sonnet-4@2025".into()),
                output_tokens: Some(1_823),
                counted_input_tokens: Some(500),
                reported_input_tokens: Some(517),
            }),
        },
        EventBody::Settled {
            id: rid("rl-02c"),
            actual_units: 7,
            refunded_units: 0,
            from_available_units: 0,
            overdraft_units: 0,
            overdraft_limit_breached: false,
            from_usage_unknown: false,
            usage: Some(Usage::default()),
        },
        EventBody::Released {
            id: rid("rl-05"),
            refunded_units: 300,
        },
        EventBody::ExpiryBegan { id: rid("rl-06") },
        EventBody::Expired {
            id: rid("rl-06"),
            refunded_units: 200,
        },
        EventBody::UsageUnknown { id: rid("rl-07") },
        EventBody::ShardIssued {
            shard_id: ShardId::new("shard-1").unwrap(),
            units: 500,
            gateway_id: "gw-eu-1".to_string(),
            boot_epoch: 4,
            expires_at_ms: 1_784_470_000_000,
            fence_epoch: 3,
            signature: "ed25519:00ff".to_string(),
        },
        EventBody::ShardReminted {
            shard_id: ShardId::new("shard-1").unwrap(),
            source: PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T14:00Z", 30)
                .unwrap(),
            units: 120,
            issued_units: 500,
            spent_units: 300,
            unknown_units: 50,
            excess_units: 0,
        },
        EventBody::Closed,
        EventBody::MovedOut {
            move_id: MoveId::new("mv-1").unwrap(),
            to: PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T15:00Z", 31).unwrap(),
            units: 4_000,
            debt_units: 0,
        },
        EventBody::MovedIn {
            move_id: MoveId::new("mv-0").unwrap(),
            from: PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T13:00Z", 31).unwrap(),
            units: 3_000,
            debt_units: 25,
        },
    ];
    for b in &bodies {
        variant_guard(b);
    }
    bodies
}

fn variant_guard(body: &EventBody) {
    match body {
        EventBody::PartitionOpened { .. }
        | EventBody::Refilled { .. }
        | EventBody::Reserved { .. }
        | EventBody::AdmissionRefused { .. }
        | EventBody::Started { .. }
        | EventBody::Settled { .. }
        | EventBody::Released { .. }
        | EventBody::ExpiryBegan { .. }
        | EventBody::Expired { .. }
        | EventBody::UsageUnknown { .. }
        | EventBody::ShardIssued { .. }
        | EventBody::ShardReminted { .. }
        | EventBody::Closed
        | EventBody::MovedOut { .. }
        | EventBody::MovedIn { .. } => {}
    }
}

/// A record of `events` small events (Reserved / Released alternating) for one
/// partition, sequences from `first_sequence`.
pub fn record(
    subject: &str,
    writer: &str,
    claim_epoch: u64,
    first_sequence: u64,
    events: usize,
) -> Record {
    let events = (0..events as u64)
        .map(|i| {
            let sequence = first_sequence + i;
            let id = rid(&format!("r-{sequence}"));
            let body = if i % 2 == 0 {
                EventBody::Reserved {
                    id,
                    digest: RequestDigest([sequence as u8; 32]),
                    reserved_units: 600,
                    held_units: 600,
                    expires_at_ms: 1_784_469_780_000 + sequence,
                    shadow: None,
                    shadow_dimension: None,
                    sizing: None,
                }
            } else {
                EventBody::Released {
                    id,
                    refunded_units: 600,
                }
            };
            Event {
                further: Vec::new(),
                sequence,
                at_ms: 1_784_469_600_000 + sequence,
                body,
            }
        })
        .collect();
    Record {
        key: key(subject),
        writer_id: writer.to_string(),
        claim_epoch,
        events,
    }
}

pub fn claim(writer: &str, epoch: u64) -> LogEntry {
    LogEntry::Claim(Claim {
        writer_id: writer.to_string(),
        epoch,
    })
}

/// A three-dimension policy with every optional part set (so serde and the
/// codec write every field), as generation `generation`.
pub fn every_part_policy(generation: u64) -> Policy {
    Policy {
        exclude_cache_read_input_tokens: true,
        estimator: Some(Box::new(reservoir_core::EstimatorConfig {
            default_max_tokens: Some(1_024),
            sibling_route: Some("chat.summarize".to_string()),
            ..reservoir_core::default_estimator(&reservoir_core::Policy::example_three_dimensions(
                "tenant-7",
                "chat.generate",
                31,
            ))
        })),
        epoch_length: reservoir_core::EpochLength::Daily,
        rollout: Some(reservoir_core::Rollout {
            enforced_per_million: 10_000,
            salt: "rollout-2026-12".to_string(),
        }),
        ..Policy::example_three_dimensions("tenant-7", "chat.generate", generation)
    }
}

/// A three-dimension partition's history, decided and applied by the core: an
/// event of every kind that carries further-dimension amounts, a refusal
/// naming its dimension, and usage with cache reads.
pub fn three_dimension_events() -> Vec<Event> {
    use reservoir_core::{
        decide, refusal_event, try_apply, Command, OperationId, Partition, Usage,
    };
    let policy = every_part_policy(40);
    let key = PartitionKey::new("tenant-7", "chat.generate", "2026-12", 40).unwrap();
    let reserve = |id: &str, input, output| Command::Reserve {
        id: rid(id),
        digest: RequestDigest([3; 32]),
        units: 1,
        sizing: None,
        further_units: vec![input, output],
    };
    let commands = [
        (
            0,
            Command::OpenPartition {
                key: key.clone(),
                policy,
            },
        ),
        (1, reserve("a", 1_000, 2_000)),
        (
            2,
            Command::Start {
                id: rid("a"),
                operation_id: OperationId::new("op-a").unwrap(),
            },
        ),
        (
            3,
            Command::Settle {
                id: rid("a"),
                operation_id: None,
                actual_units: 1,
                usage: Some(Usage {
                    model: Some("claude-sonnet-4".into()),
                    output_tokens: Some(25_000),
                    counted_input_tokens: Some(900),
                    reported_input_tokens: Some(950),
                    cache_read_input_tokens: Some(40),
                }),
                further_actual_units: vec![950, 25_000],
            },
        ),
        (4, reserve("b", 10, 10)),
        (6_000, Command::Refill),
        (20_000, reserve("c", 10, 10)),
        (20_001, Command::Release { id: rid("c") }),
        (20_002, reserve("d", 10, 10)),
        (210_000, Command::Expire { id: rid("d") }),
        (
            210_001,
            Command::MoveOut {
                move_id: reservoir_core::MoveId::new("m-1").unwrap(),
                to: PartitionKey::new("tenant-7", "chat.generate", "2026-12", 41).unwrap(),
                units: 1,
                further_units: vec![100, 0],
            },
        ),
    ];
    let mut p = Partition::default();
    let mut events = Vec::new();
    for (now, command) in commands {
        let decided = match decide(&p, &command, now) {
            Ok(decided) => decided,
            // The debt freezes "b": its refusal is logged, naming output_tokens.
            Err(rejection) => {
                vec![refusal_event(&p, &command, &rejection, now).expect("a limit refusal")]
            }
        };
        for e in decided {
            try_apply(&mut p, &e).expect("core accepts its own events");
            events.push(e);
        }
    }
    let kinds: std::collections::HashSet<_> = events
        .iter()
        .flat_map(|e| e.further.iter().map(std::mem::discriminant))
        .collect();
    assert_eq!(kinds.len(), 6, "every kind of further amounts: {events:?}");
    events
}
