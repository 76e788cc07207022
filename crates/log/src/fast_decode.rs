//! The fast path of [`codec::decode`](crate::codec::decode): a reader written
//! straight against the Avro binary layout of the *current* registered
//! schemas (the mirror image of the hand-written encoder in [`crate::codec`]).
//!
//! The canonical decoder goes through apache-avro's generic `Value` tree and
//! resolves the writer schema on every call, which costs several microseconds
//! per record — most of the projector's time when it follows a busy log. This
//! reader allocates only the strings the types need. It is an accelerator,
//! never an authority: any value it does not recognise exactly (another
//! schema id, an unexpected union branch, a negative or oversized number,
//! trailing bytes, a bad identifier) returns `None` and goes to the canonical
//! decoder, whose answer — entry or error — is what counts. Tests decode every
//! entry kind, every truncation and thousands of corruptions both ways and
//! require the same answer.

use reservoir_core::{
    CapacityUnit, Dimension, DimensionAmounts, DimensionLimit, EmergencyMode, EpochLength,
    EstimatorConfig, Event, EventBody, MoveId, OperationId, PartitionKey, Policy, RefillRule,
    RefusalReason, RequestDigest, ReservationId, Rollout, ShadowVerdict, ShardId, Sizing,
    SizingRule, Usage,
};

use crate::codec::{self, CLAIM_ID, ENVELOPE_ID, MAGIC_BYTE};
use crate::{Claim, LogEntry, Record};

/// True when the fast path applies to values framed with `id`: the id must be
/// the subject's current registered schema (the layout this file mirrors).
fn fast_ids() -> (bool, bool) {
    static IDS: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *IDS.get_or_init(|| {
        let registry = codec::registry();
        let current = |subject: &str, id: u32| {
            registry
                .current(&format!("{}.{subject}", codec::NAMESPACE))
                .is_some_and(|s| s.id == id)
        };
        (current("Envelope", ENVELOPE_ID), current("Claim", CLAIM_ID))
    })
}

/// `text` without its leading [`codec::partition_key_string`] of `key`, if
/// it starts with exactly that: the same answer as `strip_prefix` of the
/// formatted key, without formatting it (an allocation per record, a
/// twentieth of a Kafka replay's reading thread).
fn strip_key_prefix<'t>(text: &'t str, key: &PartitionKey) -> Option<&'t str> {
    let rest = text
        .strip_prefix(key.subject.as_str())?
        .strip_prefix('|')?
        .strip_prefix(key.route.as_str())?
        .strip_prefix('|')?
        .strip_prefix(key.accounting_epoch.as_str())?
        .strip_prefix("|g")?;
    let generation = codec::Decimal::of(key.policy_generation);
    let digits = generation.as_bytes();
    rest.as_bytes()
        .starts_with(digits)
        .then(|| &rest[digits.len()..])
}

/// The fast path; `None` means "ask the canonical decoder".
pub(crate) fn decode(bytes: &[u8]) -> Option<LogEntry> {
    if bytes.len() < 5 || bytes.len() > codec::MAX_VALUE_BYTES || bytes[0] != MAGIC_BYTE {
        return None;
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let (envelope_ok, claim_ok) = fast_ids();
    let mut r = Reader {
        bytes: &bytes[5..],
        at: 0,
    };
    let entry = match id {
        ENVELOPE_ID if envelope_ok => LogEntry::Record(r.envelope()?),
        CLAIM_ID if claim_ok => LogEntry::Claim(Claim {
            writer_id: r.string()?,
            epoch: r.u64()?,
        }),
        _ => return None,
    };
    (r.at == r.bytes.len()).then_some(entry)
}

/// Best effort: the ledger partition named at the start of an envelope, even
/// when the rest of the value does not decode (to locate a finding).
pub(crate) fn peek_key(bytes: &[u8]) -> Option<PartitionKey> {
    if bytes.len() < 5 || bytes[0] != MAGIC_BYTE {
        return None;
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    // Every Envelope version starts with the partition key.
    let envelope = format!("{}.Envelope", codec::NAMESPACE);
    if codec::registry().get(id)?.subject != envelope {
        return None;
    }
    Reader {
        bytes: &bytes[5..],
        at: 0,
    }
    .key()
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn long(&mut self) -> Option<i64> {
        let mut value: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *self.bytes.get(self.at)?;
            self.at += 1;
            if shift == 63 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
        Some(((value >> 1) as i64) ^ -((value & 1) as i64))
    }

    fn u64(&mut self) -> Option<u64> {
        u64::try_from(self.long()?).ok()
    }

    fn raw(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn str(&mut self) -> Option<&str> {
        let n = usize::try_from(self.long()?).ok()?;
        std::str::from_utf8(self.raw(n)?).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.str().map(str::to_string)
    }

    fn boolean(&mut self) -> Option<bool> {
        match self.raw(1)?[0] {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn index(&mut self, branches: i64) -> Option<i64> {
        let i = self.long()?;
        (0..branches).contains(&i).then_some(i)
    }

    fn key(&mut self) -> Option<PartitionKey> {
        let subject = self.string()?;
        let route = self.string()?;
        let epoch = self.string()?;
        let generation = self.u64()?;
        PartitionKey::new(subject, route, epoch, generation).ok()
    }

    fn reservation_id(&mut self) -> Option<ReservationId> {
        ReservationId::new(self.string()?).ok()
    }

    fn envelope(&mut self) -> Option<Record> {
        let key = self.key()?;
        let writer_id = self.string()?;
        let claim_epoch = self.u64()?;
        let mut events = Vec::new();
        loop {
            let mut count = self.long()?;
            if count == 0 {
                break;
            }
            if count < 0 {
                count = count.checked_neg()?;
                self.long()?; // block size in bytes
            }
            // Room for the block at once (most records hold one event): a
            // vector grown push by push allocated and copied it again, a
            // sixth of a Kafka replay's reading thread in `perf`.
            let room = codec::MAX_EVENTS_PER_RECORD.saturating_sub(events.len());
            events.reserve(usize::try_from(count).ok()?.min(room));
            for _ in 0..count {
                if events.len() >= codec::MAX_EVENTS_PER_RECORD {
                    return None;
                }
                events.push(self.event(&key)?);
            }
        }
        if events.is_empty() {
            return None;
        }
        Some(Record {
            key,
            writer_id,
            claim_epoch,
            events,
        })
    }

    fn event(&mut self, key: &PartitionKey) -> Option<Event> {
        let sequence = self.u64()?;
        let at_ms = self.u64()?;
        let event_id = self.str()?;
        let id_ok = strip_key_prefix(event_id, key)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|seq| seq.parse::<u64>() == Ok(sequence));
        if !id_ok {
            return None;
        }
        let body = self.body()?;
        let further = self.array(Self::amounts)?;
        Some(Event {
            sequence,
            at_ms,
            body,
            further,
        })
    }

    /// An array as the encoder writes it: no block, or one block of `n > 0`
    /// items then the empty one. Any other block layout (valid Avro, but not
    /// ours) goes to the canonical decoder.
    fn array<T>(&mut self, item: fn(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let n = self.long()?;
        if n == 0 {
            return Some(Vec::new());
        }
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= codec::MAX_EVENTS_PER_RECORD)?;
        let items = (0..n).map(|_| item(self)).collect::<Option<Vec<T>>>()?;
        (self.long()? == 0).then_some(items)
    }

    fn amounts(&mut self) -> Option<DimensionAmounts> {
        Some(match self.index(6)? {
            0 => DimensionAmounts::Opened {
                opening_units: self.u64()?,
            },
            1 => DimensionAmounts::Refilled {
                minted_units: self.u64()?,
                repaid_units: self.u64()?,
                remainder: self.u64()?,
            },
            2 => DimensionAmounts::Reserved {
                reserved_units: self.u64()?,
                held_units: self.u64()?,
            },
            3 => DimensionAmounts::Settled {
                actual_units: self.u64()?,
                refunded_units: self.u64()?,
                from_available_units: self.u64()?,
                overdraft_units: self.u64()?,
                overdraft_limit_breached: self.boolean()?,
            },
            4 => DimensionAmounts::Refunded {
                refunded_units: self.u64()?,
            },
            _ => DimensionAmounts::Moved {
                units: self.u64()?,
                debt_units: self.u64()?,
            },
        })
    }

    fn dimension(&mut self) -> Option<Dimension> {
        Dimension::from_name(self.str()?)
    }

    fn dimension_limit(&mut self) -> Option<DimensionLimit> {
        Some(DimensionLimit {
            dimension: self.dimension()?,
            refill: RefillRule {
                units: self.u64()?,
                interval_ms: self.u64()?,
            },
            burst_units: self.u64()?,
            opening_units: self.u64()?,
            max_reservation_units: self.u64()?,
            max_overdraft_units: self.u64()?,
        })
    }

    /// A `Usage`; a value the core would refuse goes to the canonical decoder.
    fn usage(&mut self) -> Option<Usage> {
        let usage = Usage {
            model: match self.index(2)? {
                0 => None,
                _ => Some(self.string()?),
            },
            output_tokens: self.opt_u64()?,
            counted_input_tokens: self.opt_u64()?,
            reported_input_tokens: self.opt_u64()?,
            cache_read_input_tokens: self.opt_u64()?,
        };
        usage.validate().ok()?;
        Some(usage)
    }

    fn opt_u64(&mut self) -> Option<Option<u64>> {
        Some(match self.index(2)? {
            0 => None,
            _ => Some(self.u64()?),
        })
    }

    fn body(&mut self) -> Option<EventBody> {
        Some(match self.index(15)? {
            0 => EventBody::PartitionOpened {
                key: self.key()?,
                policy: self.policy()?,
                opening_units: self.u64()?,
            },
            1 => EventBody::Refilled {
                minted_units: self.u64()?,
                repaid_units: self.u64()?,
                remainder: self.u64()?,
            },
            2 => EventBody::Reserved {
                id: self.reservation_id()?,
                digest: RequestDigest(self.raw(32)?.try_into().ok()?),
                reserved_units: self.u64()?,
                held_units: self.u64()?,
                expires_at_ms: self.u64()?,
                shadow: match self.index(2)? {
                    0 => None,
                    _ => Some(match self.index(4)? {
                        0 => ShadowVerdict::WouldAdmit,
                        1 => ShadowVerdict::WouldRefuseInsufficientCapacity,
                        2 => ShadowVerdict::WouldRefuseDebtOutstanding,
                        _ => ShadowVerdict::WouldRefuseRequestTooLarge,
                    }),
                },
                sizing: match self.index(2)? {
                    0 => None,
                    _ => Some(Sizing {
                        units: self.u64()?,
                        input_units: self.u64()?,
                        output_units: self.u64()?,
                        rule: match self.index(5)? {
                            0 => SizingRule::MaxTokens,
                            1 => SizingRule::RouteDefaultMaxTokens,
                            2 => SizingRule::RouteQuantile,
                            3 => SizingRule::SiblingQuantile,
                            _ => SizingRule::ColdCeiling,
                        },
                    }),
                },
                shadow_dimension: match self.index(2)? {
                    0 => None,
                    _ => Some(self.dimension()?),
                },
            },
            3 => EventBody::AdmissionRefused {
                id: self.reservation_id()?,
                requested_units: self.u64()?,
                reason: match self.index(3)? {
                    0 => RefusalReason::InsufficientCapacity,
                    1 => RefusalReason::DebtOutstanding,
                    _ => RefusalReason::RequestTooLarge,
                },
                retry_after_ms: match self.index(2)? {
                    0 => None,
                    _ => Some(self.u64()?),
                },
                dimension: match self.index(2)? {
                    0 => None,
                    _ => Some(self.dimension()?),
                },
            },
            4 => EventBody::Started {
                id: self.reservation_id()?,
                operation_id: OperationId::new(self.string()?).ok()?,
                execution_deadline_ms: self.u64()?,
            },
            5 => EventBody::Settled {
                id: self.reservation_id()?,
                actual_units: self.u64()?,
                refunded_units: self.u64()?,
                from_available_units: self.u64()?,
                overdraft_units: self.u64()?,
                overdraft_limit_breached: self.boolean()?,
                from_usage_unknown: self.boolean()?,
                usage: match self.index(2)? {
                    0 => None,
                    _ => Some(self.usage()?),
                },
            },
            6 => EventBody::Released {
                id: self.reservation_id()?,
                refunded_units: self.u64()?,
            },
            7 => EventBody::ExpiryBegan {
                id: self.reservation_id()?,
            },
            8 => EventBody::Expired {
                id: self.reservation_id()?,
                refunded_units: self.u64()?,
            },
            9 => EventBody::UsageUnknown {
                id: self.reservation_id()?,
            },
            10 => EventBody::ShardIssued {
                shard_id: ShardId::new(self.string()?).ok()?,
                units: self.u64()?,
                gateway_id: self.string()?,
                boot_epoch: self.u64()?,
                expires_at_ms: self.u64()?,
                fence_epoch: self.u64()?,
                signature: self.string()?,
            },
            11 => EventBody::ShardReminted {
                shard_id: ShardId::new(self.string()?).ok()?,
                source: self.key()?,
                units: self.u64()?,
                issued_units: self.u64()?,
                spent_units: self.u64()?,
                unknown_units: self.u64()?,
                excess_units: self.u64()?,
            },
            12 => EventBody::Closed,
            13 => EventBody::MovedOut {
                move_id: MoveId::new(self.string()?).ok()?,
                to: self.key()?,
                units: self.u64()?,
                debt_units: self.u64()?,
            },
            _ => EventBody::MovedIn {
                move_id: MoveId::new(self.string()?).ok()?,
                from: self.key()?,
                units: self.u64()?,
                debt_units: self.u64()?,
            },
        })
    }

    fn policy(&mut self) -> Option<Policy> {
        Some(Policy {
            subject: self.string()?,
            route: self.string()?,
            region: self.string()?,
            capacity_unit: match self.index(2)? {
                0 => CapacityUnit::Tokens,
                _ => CapacityUnit::Requests,
            },
            refill: RefillRule {
                units: self.u64()?,
                interval_ms: self.u64()?,
            },
            burst_units: self.u64()?,
            opening_units: self.u64()?,
            estimator_digest: self.string()?,
            max_reservation_units: self.u64()?,
            hold_ttl_ms: self.u64()?,
            hard_execution_limit_ms: self.u64()?,
            max_overdraft_units: self.u64()?,
            priority: u32::try_from(self.u64()?).ok()?,
            emergency_mode: match self.index(2)? {
                0 => EmergencyMode::Disabled,
                _ => EmergencyMode::Enabled,
            },
            shadow_mode: self.boolean()?,
            generation: self.u64()?,
            idempotency_window_ms: self.u64()?,
            dimensions: self.array(Self::dimension_limit)?,
            exclude_cache_read_input_tokens: self.boolean()?,
            estimator: match self.index(2)? {
                0 => None,
                _ => Some(Box::new(EstimatorConfig {
                    quantile_ppm: self.u64()?,
                    floor_units: self.u64()?,
                    ceiling_units: self.u64()?,
                    min_samples: self.u64()?,
                    default_max_tokens: self.opt_u64()?,
                    sibling_route: match self.index(2)? {
                        0 => None,
                        _ => Some(self.string()?),
                    },
                })),
            },
            epoch_length: EpochLength::from_name(self.str()?)?,
            rollout: match self.index(2)? {
                0 => None,
                _ => Some(Rollout {
                    enforced_per_million: u32::try_from(self.long()?).ok()?,
                    salt: self.string()?,
                }),
            },
        })
    }
}
