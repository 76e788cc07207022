//! Decoding: apache-avro reads the datum with the registered writer schema of
//! the value's id (resolving to the current schema when the id is an older
//! registered version), then the generic `Value` becomes Rust types. Every
//! malformed input is a [`CodecError`], never a panic.

use super::*;
/// Reads the frame header: (schema id, Avro datum).
pub fn split_frame(bytes: &[u8]) -> Result<(u32, &[u8]), CodecError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(CodecError::TooShort { len: bytes.len() });
    }
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(CodecError::TooLarge {
            len: bytes.len(),
            max: MAX_VALUE_BYTES,
        });
    }
    if bytes[0] != MAGIC_BYTE {
        return Err(CodecError::BadMagic(bytes[0]));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[FRAME_HEADER_BYTES..]))
}

/// Decodes a framed value into the generic Avro value as written (under its
/// id's schema), plus its registered schema. For tools and tests; [`decode`] is
/// the typed path.
pub fn decode_value(bytes: &[u8]) -> Result<(&'static RegisteredSchema, Value), CodecError> {
    decode_value_with(registry(), bytes)
}

/// [`decode_value`] against another registry (tests of schema evolution).
pub fn decode_value_with<'r>(
    registry: &'r Registry,
    bytes: &[u8],
) -> Result<(&'r RegisteredSchema, Value), CodecError> {
    let (id, mut datum) = split_frame(bytes)?;
    let writer = registry.get(id).ok_or(CodecError::UnknownSchemaId(id))?;
    let value = apache_avro::from_avro_datum(&writer.schema, &mut datum, None)
        .map_err(|e| CodecError::Avro(e.to_string()))?;
    if !datum.is_empty() {
        return Err(CodecError::TrailingBytes(datum.len()));
    }
    Ok((writer, value))
}

/// Decodes a framed value into a log entry: by the fast reader when the value
/// is in the current layout, by [`decode_canonical`] otherwise. Both give the
/// same answer for every input (the fast reader declines anything it does not
/// recognise exactly); tests check that on every entry kind and on corruptions.
pub fn decode(bytes: &[u8]) -> Result<LogEntry, CodecError> {
    match crate::fast_decode::decode(bytes) {
        Some(entry) => Ok(entry),
        None => decode_canonical(bytes),
    }
}

/// The fast reader alone: `None` when it declines the value (for tests and
/// benchmarks; [`decode`] is what callers use).
pub fn decode_fast(bytes: &[u8]) -> Option<LogEntry> {
    crate::fast_decode::decode(bytes)
}

/// The canonical decoder: apache-avro's generic reader under the value's
/// registered schema, then typed, resolving older versions field by field.
pub fn decode_canonical(bytes: &[u8]) -> Result<LogEntry, CodecError> {
    decode_with(registry(), bytes)
}

/// Best effort: the ledger partition named at the start of an envelope, even
/// when the rest of the value does not decode (to say where a corrupt entry
/// belongs).
pub fn peek_key(bytes: &[u8]) -> Option<PartitionKey> {
    crate::fast_decode::peek_key(bytes)
}

/// [`decode`] against another registry. A value written under an older id is
/// read with that id's schema and resolved to the registry's current schema of
/// its subject: record by record, with `Event.body` branches matched by name.
/// (apache-avro's whole-value `resolve` matches union branches by shape, and
/// `Released` and `Expired`, say, have the same shape.)
pub fn decode_with(registry: &Registry, bytes: &[u8]) -> Result<LogEntry, CodecError> {
    let (writer, value) = decode_value_with(registry, bytes)?;
    let current = registry
        .current(&writer.subject)
        .ok_or(CodecError::UnknownSchemaId(writer.id))?;
    let evolved = (current.id != writer.id).then_some(current);
    match writer
        .subject
        .strip_prefix(NAMESPACE)
        .and_then(|s| s.strip_prefix('.'))
    {
        Some("Envelope") => {
            read_envelope(Fields::of(value, "Envelope")?, writer, evolved).map(LogEntry::Record)
        }
        Some("Claim") => {
            // No unions in a claim: whole-value resolution is safe.
            let value = match evolved {
                Some(current) => value
                    .resolve(&current.schema)
                    .map_err(|e| CodecError::Avro(e.to_string()))?,
                None => value,
            };
            let mut f = Fields::of(value, "Claim")?;
            Ok(LogEntry::Claim(Claim {
                writer_id: f.string("Claim.writerId")?,
                epoch: f.u64("Claim.epoch")?,
            }))
        }
        _ => Err(CodecError::NotAnEntry {
            id: writer.id,
            subject: writer.subject.clone(),
        }),
    }
}

/// The fields of one decoded Avro record, taken by name.
struct Fields(Vec<(String, Value)>);

fn shape(path: &'static str, detail: impl Into<String>) -> CodecError {
    CodecError::Shape {
        path,
        detail: detail.into(),
    }
}

impl Fields {
    fn of(value: Value, path: &'static str) -> Result<Self, CodecError> {
        match value {
            Value::Record(fields) => Ok(Fields(fields)),
            other => Err(shape(path, format!("expected a record, found {other:?}"))),
        }
    }

    /// `path` is `Record.field`; the field name is the part after the last dot.
    fn take(&mut self, path: &'static str) -> Result<Value, CodecError> {
        let name = path.rsplit('.').next().unwrap_or(path);
        let at = self
            .0
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| shape(path, "missing field"))?;
        Ok(std::mem::replace(&mut self.0[at].1, Value::Null))
    }

    /// A field that values under older ids lack (outside the body, which is
    /// resolved to the current schema and so always has every field).
    fn take_optional(&mut self, name: &str) -> Option<Value> {
        let at = self.0.iter().position(|(n, _)| n == name)?;
        Some(std::mem::replace(&mut self.0[at].1, Value::Null))
    }

    fn u64(&mut self, path: &'static str) -> Result<u64, CodecError> {
        as_u64(self.take(path)?, path)
    }

    fn opt_u64(&mut self, path: &'static str) -> Result<Option<u64>, CodecError> {
        match unwrap_union(self.take(path)?) {
            Value::Null => Ok(None),
            v => as_u64(v, path).map(Some),
        }
    }

    fn string(&mut self, path: &'static str) -> Result<String, CodecError> {
        match self.take(path)? {
            Value::String(s) => Ok(s),
            other => Err(shape(path, format!("expected a string, found {other:?}"))),
        }
    }

    fn boolean(&mut self, path: &'static str) -> Result<bool, CodecError> {
        match self.take(path)? {
            Value::Boolean(b) => Ok(b),
            other => Err(shape(path, format!("expected a boolean, found {other:?}"))),
        }
    }

    fn symbol(&mut self, path: &'static str) -> Result<String, CodecError> {
        match unwrap_union(self.take(path)?) {
            Value::Enum(_, s) => Ok(s),
            other => Err(shape(path, format!("expected an enum, found {other:?}"))),
        }
    }

    fn record(&mut self, path: &'static str) -> Result<Fields, CodecError> {
        Fields::of(self.take(path)?, path)
    }

    fn reservation_id(&mut self, path: &'static str) -> Result<ReservationId, CodecError> {
        ReservationId::new(self.string(path)?).map_err(|e| invalid(path, e))
    }

    fn key(&mut self, path: &'static str) -> Result<PartitionKey, CodecError> {
        let mut k = self.record(path)?;
        PartitionKey::new(
            k.string("PartitionKey.subject")?,
            k.string("PartitionKey.route")?,
            k.string("PartitionKey.accountingEpoch")?,
            k.u64("PartitionKey.policyGeneration")?,
        )
        .map_err(|e| invalid(path, e))
    }
}

fn invalid(field: &'static str, e: impl std::fmt::Display) -> CodecError {
    CodecError::Invalid {
        field,
        reason: e.to_string(),
    }
}

fn unwrap_union(v: Value) -> Value {
    match v {
        Value::Union(_, inner) => *inner,
        other => other,
    }
}

fn as_u64(v: Value, path: &'static str) -> Result<u64, CodecError> {
    let n = match v {
        Value::Long(n) | Value::TimestampMillis(n) => n,
        Value::Int(n) => i64::from(n),
        other => return Err(shape(path, format!("expected a long, found {other:?}"))),
    };
    u64::try_from(n).map_err(|_| shape(path, format!("negative value {n}")))
}

fn read_envelope(
    mut f: Fields,
    writer: &RegisteredSchema,
    evolved: Option<&RegisteredSchema>,
) -> Result<Record, CodecError> {
    let key = f.key("Envelope.partitionKey")?;
    let writer_id = f.string("Envelope.writerId")?;
    let claim_epoch = f.u64("Envelope.claimEpoch")?;
    let items = match f.take("Envelope.events")? {
        Value::Array(items) => items,
        other => {
            return Err(shape(
                "Envelope.events",
                format!("expected an array, found {other:?}"),
            ))
        }
    };
    if items.is_empty() || items.len() > MAX_EVENTS_PER_RECORD {
        return Err(invalid(
            "Envelope.events",
            format!(
                "{} events, expected 1..={MAX_EVENTS_PER_RECORD}",
                items.len()
            ),
        ));
    }
    let key_text = partition_key_string(&key);
    let mut events = Vec::with_capacity(items.len());
    for item in items {
        let mut e = Fields::of(item, "Event")?;
        let sequence = e.u64("Event.sequence")?;
        let at_ms = e.u64("Event.atMs")?;
        let event_id = e.string("Event.eventId")?;
        // Checked without allocating: "<key>/<sequence>".
        let id_ok = event_id
            .strip_prefix(key_text.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|seq| seq.parse::<u64>() == Ok(sequence));
        if !id_ok {
            return Err(invalid(
                "Event.eventId",
                format!("{event_id:?} is not {key_text}/{sequence}"),
            ));
        }
        let body = read_body(e.take("Event.body")?, writer, evolved)?;
        // Absent from values under ids before dimensions: none.
        let further = match e.take_optional("further") {
            None => Vec::new(),
            Some(v) => read_further(v)?,
        };
        events.push(Event {
            sequence,
            at_ms,
            body,
            further,
        });
    }
    Ok(Record {
        key,
        writer_id,
        claim_epoch,
        events,
    })
}

fn read_body(
    value: Value,
    writer: &RegisteredSchema,
    evolved: Option<&RegisteredSchema>,
) -> Result<EventBody, CodecError> {
    let (index, inner) = match value {
        Value::Union(i, inner) => (i, *inner),
        other => {
            return Err(shape(
                "Event.body",
                format!("expected a union, found {other:?}"),
            ))
        }
    };
    let branch = writer
        .body_branches
        .get(index as usize)
        .map(|(name, _)| name.as_str())
        .ok_or_else(|| shape("Event.body", format!("union branch {index}")))?;
    let inner = match evolved {
        None => inner,
        Some(current) => {
            let (_, schema) = current
                .body_branches
                .iter()
                .find(|(name, _)| name == branch)
                .ok_or_else(|| shape("Event.body", format!("{branch} left the union")))?;
            inner
                .resolve_schemata(schema, vec![&current.schema])
                .map_err(|e| CodecError::Avro(e.to_string()))?
        }
    };
    let mut f = Fields::of(inner, "Event.body")?;
    let body = match branch {
        "PartitionOpened" => EventBody::PartitionOpened {
            key: f.key("PartitionOpened.key")?,
            policy: read_policy(f.record("PartitionOpened.policy")?)?,
            opening_units: f.u64("PartitionOpened.openingUnits")?,
        },
        "Refilled" => EventBody::Refilled {
            minted_units: f.u64("Refilled.mintedUnits")?,
            repaid_units: f.u64("Refilled.repaidUnits")?,
            remainder: f.u64("Refilled.remainder")?,
        },
        "Reserved" => EventBody::Reserved {
            id: f.reservation_id("Reserved.id")?,
            digest: match f.take("Reserved.digest")? {
                Value::Fixed(32, bytes) => RequestDigest(
                    bytes
                        .try_into()
                        .map_err(|_| shape("Reserved.digest", "not 32 bytes"))?,
                ),
                other => {
                    return Err(shape(
                        "Reserved.digest",
                        format!("expected fixed(32), found {other:?}"),
                    ))
                }
            },
            reserved_units: f.u64("Reserved.reservedUnits")?,
            held_units: f.u64("Reserved.heldUnits")?,
            expires_at_ms: f.u64("Reserved.expiresAtMs")?,
            shadow: match unwrap_union(f.take("Reserved.shadow")?) {
                Value::Null => None,
                Value::Enum(_, s) => Some(shadow_from(&s)?),
                other => return Err(shape("Reserved.shadow", format!("{other:?}"))),
            },
            // Absent from values under older ids: resolution fills in null.
            sizing: match unwrap_union(f.take("Reserved.sizing")?) {
                Value::Null => None,
                Value::Record(fields) => Some(read_sizing(Fields(fields))?),
                other => return Err(shape("Reserved.sizing", format!("{other:?}"))),
            },
            shadow_dimension: match unwrap_union(f.take("Reserved.shadowDimension")?) {
                Value::Null => None,
                Value::String(name) => Some(dimension_from("Reserved.shadowDimension", &name)?),
                other => return Err(shape("Reserved.shadowDimension", format!("{other:?}"))),
            },
        },
        "AdmissionRefused" => EventBody::AdmissionRefused {
            id: f.reservation_id("AdmissionRefused.id")?,
            requested_units: f.u64("AdmissionRefused.requestedUnits")?,
            reason: match f.symbol("AdmissionRefused.reason")?.as_str() {
                "INSUFFICIENT_CAPACITY" => RefusalReason::InsufficientCapacity,
                "DEBT_OUTSTANDING" => RefusalReason::DebtOutstanding,
                "REQUEST_TOO_LARGE" => RefusalReason::RequestTooLarge,
                s => return Err(shape("AdmissionRefused.reason", s.to_string())),
            },
            retry_after_ms: f.opt_u64("AdmissionRefused.retryAfterMs")?,
            dimension: match unwrap_union(f.take("AdmissionRefused.dimension")?) {
                Value::Null => None,
                Value::String(name) => Some(dimension_from("AdmissionRefused.dimension", &name)?),
                other => return Err(shape("AdmissionRefused.dimension", format!("{other:?}"))),
            },
        },
        "Started" => EventBody::Started {
            id: f.reservation_id("Started.id")?,
            operation_id: OperationId::new(f.string("Started.operationId")?)
                .map_err(|e| invalid("Started.operationId", e))?,
            execution_deadline_ms: f.u64("Started.executionDeadlineMs")?,
        },
        "Settled" => EventBody::Settled {
            id: f.reservation_id("Settled.id")?,
            actual_units: f.u64("Settled.actualUnits")?,
            refunded_units: f.u64("Settled.refundedUnits")?,
            from_available_units: f.u64("Settled.fromAvailableUnits")?,
            overdraft_units: f.u64("Settled.overdraftUnits")?,
            overdraft_limit_breached: f.boolean("Settled.overdraftLimitBreached")?,
            from_usage_unknown: f.boolean("Settled.fromUsageUnknown")?,
            usage: match unwrap_union(f.take("Settled.usage")?) {
                Value::Null => None,
                Value::Record(fields) => Some(read_usage(Fields(fields))?),
                other => return Err(shape("Settled.usage", format!("{other:?}"))),
            },
        },
        "Released" => EventBody::Released {
            id: f.reservation_id("Released.id")?,
            refunded_units: f.u64("Released.refundedUnits")?,
        },
        "ExpiryBegan" => EventBody::ExpiryBegan {
            id: f.reservation_id("ExpiryBegan.id")?,
        },
        "Expired" => EventBody::Expired {
            id: f.reservation_id("Expired.id")?,
            refunded_units: f.u64("Expired.refundedUnits")?,
        },
        "UsageUnknown" => EventBody::UsageUnknown {
            id: f.reservation_id("UsageUnknown.id")?,
        },
        "ShardIssued" => EventBody::ShardIssued {
            shard_id: ShardId::new(f.string("ShardIssued.shardId")?)
                .map_err(|e| invalid("ShardIssued.shardId", e))?,
            units: f.u64("ShardIssued.units")?,
            gateway_id: f.string("ShardIssued.gatewayId")?,
            boot_epoch: f.u64("ShardIssued.bootEpoch")?,
            expires_at_ms: f.u64("ShardIssued.expiresAtMs")?,
            fence_epoch: f.u64("ShardIssued.fenceEpoch")?,
            signature: f.string("ShardIssued.signature")?,
        },
        "ShardReminted" => EventBody::ShardReminted {
            shard_id: ShardId::new(f.string("ShardReminted.shardId")?)
                .map_err(|e| invalid("ShardReminted.shardId", e))?,
            source: f.key("ShardReminted.source")?,
            units: f.u64("ShardReminted.units")?,
            issued_units: f.u64("ShardReminted.issuedUnits")?,
            spent_units: f.u64("ShardReminted.spentUnits")?,
            unknown_units: f.u64("ShardReminted.unknownUnits")?,
            excess_units: f.u64("ShardReminted.excessUnits")?,
        },
        "Closed" => EventBody::Closed,
        "MovedOut" => EventBody::MovedOut {
            move_id: MoveId::new(f.string("MovedOut.moveId")?)
                .map_err(|e| invalid("MovedOut.moveId", e))?,
            to: f.key("MovedOut.to")?,
            units: f.u64("MovedOut.units")?,
            debt_units: f.u64("MovedOut.debtUnits")?,
        },
        "MovedIn" => EventBody::MovedIn {
            move_id: MoveId::new(f.string("MovedIn.moveId")?)
                .map_err(|e| invalid("MovedIn.moveId", e))?,
            from: f.key("MovedIn.from")?,
            units: f.u64("MovedIn.units")?,
            debt_units: f.u64("MovedIn.debtUnits")?,
        },
        other => return Err(shape("Event.body", format!("unknown branch {other}"))),
    };
    Ok(body)
}

/// `Event.further`: the union branches in schema order.
fn read_further(value: Value) -> Result<Vec<DimensionAmounts>, CodecError> {
    let Value::Array(items) = value else {
        return Err(shape("Event.further", "expected an array"));
    };
    items
        .into_iter()
        .map(|item| {
            let Value::Union(index, inner) = item else {
                return Err(shape("Event.further", "expected a union"));
            };
            let mut f = Fields::of(*inner, "Event.further")?;
            Ok(match index {
                0 => DimensionAmounts::Opened {
                    opening_units: f.u64("OpenedAmounts.openingUnits")?,
                },
                1 => DimensionAmounts::Refilled {
                    minted_units: f.u64("RefilledAmounts.mintedUnits")?,
                    repaid_units: f.u64("RefilledAmounts.repaidUnits")?,
                    remainder: f.u64("RefilledAmounts.remainder")?,
                },
                2 => DimensionAmounts::Reserved {
                    reserved_units: f.u64("ReservedAmounts.reservedUnits")?,
                    held_units: f.u64("ReservedAmounts.heldUnits")?,
                },
                3 => DimensionAmounts::Settled {
                    actual_units: f.u64("SettledAmounts.actualUnits")?,
                    refunded_units: f.u64("SettledAmounts.refundedUnits")?,
                    from_available_units: f.u64("SettledAmounts.fromAvailableUnits")?,
                    overdraft_units: f.u64("SettledAmounts.overdraftUnits")?,
                    overdraft_limit_breached: f.boolean("SettledAmounts.overdraftLimitBreached")?,
                },
                4 => DimensionAmounts::Refunded {
                    refunded_units: f.u64("RefundedAmounts.refundedUnits")?,
                },
                5 => DimensionAmounts::Moved {
                    units: f.u64("MovedAmounts.units")?,
                    debt_units: f.u64("MovedAmounts.debtUnits")?,
                },
                i => return Err(shape("Event.further", format!("union branch {i}"))),
            })
        })
        .collect()
}

fn dimension_from(path: &'static str, name: &str) -> Result<Dimension, CodecError> {
    Dimension::from_name(name).ok_or_else(|| shape(path, format!("unknown dimension {name:?}")))
}

fn read_sizing(mut f: Fields) -> Result<Sizing, CodecError> {
    Ok(Sizing {
        units: f.u64("Sizing.units")?,
        input_units: f.u64("Sizing.inputUnits")?,
        output_units: f.u64("Sizing.outputUnits")?,
        rule: match f.symbol("Sizing.rule")?.as_str() {
            "MAX_TOKENS" => SizingRule::MaxTokens,
            "ROUTE_DEFAULT_MAX_TOKENS" => SizingRule::RouteDefaultMaxTokens,
            "ROUTE_QUANTILE" => SizingRule::RouteQuantile,
            "SIBLING_QUANTILE" => SizingRule::SiblingQuantile,
            "COLD_CEILING" => SizingRule::ColdCeiling,
            s => return Err(shape("Sizing.rule", s.to_string())),
        },
    })
}

fn read_usage(mut f: Fields) -> Result<Usage, CodecError> {
    let usage = Usage {
        model: match unwrap_union(f.take("Usage.model")?) {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => return Err(shape("Usage.model", format!("{other:?}"))),
        },
        output_tokens: f.opt_u64("Usage.outputTokens")?,
        counted_input_tokens: f.opt_u64("Usage.countedInputTokens")?,
        reported_input_tokens: f.opt_u64("Usage.reportedInputTokens")?,
        cache_read_input_tokens: f.opt_u64("Usage.cacheReadInputTokens")?,
    };
    usage.validate().map_err(|e| invalid("Usage", e))?;
    Ok(usage)
}

fn shadow_from(s: &str) -> Result<ShadowVerdict, CodecError> {
    Ok(match s {
        "WOULD_ADMIT" => ShadowVerdict::WouldAdmit,
        "WOULD_REFUSE_INSUFFICIENT_CAPACITY" => ShadowVerdict::WouldRefuseInsufficientCapacity,
        "WOULD_REFUSE_DEBT_OUTSTANDING" => ShadowVerdict::WouldRefuseDebtOutstanding,
        "WOULD_REFUSE_REQUEST_TOO_LARGE" => ShadowVerdict::WouldRefuseRequestTooLarge,
        other => return Err(shape("ShadowVerdict", other.to_string())),
    })
}

fn read_policy(mut f: Fields) -> Result<Policy, CodecError> {
    Ok(Policy {
        subject: f.string("AdmissionBudget.subject")?,
        route: f.string("AdmissionBudget.route")?,
        region: f.string("AdmissionBudget.region")?,
        capacity_unit: match f.symbol("AdmissionBudget.capacityUnit")?.as_str() {
            "TOKENS" => CapacityUnit::Tokens,
            "REQUESTS" => CapacityUnit::Requests,
            s => return Err(shape("AdmissionBudget.capacityUnit", s.to_string())),
        },
        refill: {
            let mut r = f.record("AdmissionBudget.refill")?;
            RefillRule {
                units: r.u64("RefillRule.units")?,
                interval_ms: r.u64("RefillRule.intervalMs")?,
            }
        },
        burst_units: f.u64("AdmissionBudget.burstUnits")?,
        opening_units: f.u64("AdmissionBudget.openingUnits")?,
        estimator_digest: f.string("AdmissionBudget.estimatorDigest")?,
        max_reservation_units: f.u64("AdmissionBudget.maxReservationUnits")?,
        hold_ttl_ms: f.u64("AdmissionBudget.holdTtlMs")?,
        hard_execution_limit_ms: f.u64("AdmissionBudget.hardExecutionLimitMs")?,
        max_overdraft_units: f.u64("AdmissionBudget.maxOverdraftUnits")?,
        priority: u32::try_from(f.u64("AdmissionBudget.priority")?)
            .map_err(|e| invalid("AdmissionBudget.priority", e))?,
        emergency_mode: match f.symbol("AdmissionBudget.emergencyMode")?.as_str() {
            "DISABLED" => EmergencyMode::Disabled,
            "ENABLED" => EmergencyMode::Enabled,
            s => return Err(shape("AdmissionBudget.emergencyMode", s.to_string())),
        },
        shadow_mode: f.boolean("AdmissionBudget.shadowMode")?,
        generation: f.u64("AdmissionBudget.generation")?,
        // Filled with the schema's default for values written before it existed.
        idempotency_window_ms: f.u64("AdmissionBudget.idempotencyWindowMs")?,
        dimensions: match f.take("AdmissionBudget.dimensions")? {
            Value::Array(items) => items
                .into_iter()
                .map(|item| {
                    let mut d = Fields::of(item, "DimensionLimit")?;
                    let mut r = d.record("DimensionLimit.refill")?;
                    Ok(DimensionLimit {
                        dimension: dimension_from(
                            "DimensionLimit.dimension",
                            &d.string("DimensionLimit.dimension")?,
                        )?,
                        refill: RefillRule {
                            units: r.u64("RefillRule.units")?,
                            interval_ms: r.u64("RefillRule.intervalMs")?,
                        },
                        burst_units: d.u64("DimensionLimit.burstUnits")?,
                        opening_units: d.u64("DimensionLimit.openingUnits")?,
                        max_reservation_units: d.u64("DimensionLimit.maxReservationUnits")?,
                        max_overdraft_units: d.u64("DimensionLimit.maxOverdraftUnits")?,
                    })
                })
                .collect::<Result<_, CodecError>>()?,
            other => return Err(shape("AdmissionBudget.dimensions", format!("{other:?}"))),
        },
        exclude_cache_read_input_tokens: f
            .boolean("AdmissionBudget.excludeCacheReadInputTokens")?,
        estimator: match unwrap_union(f.take("AdmissionBudget.estimator")?) {
            Value::Null => None,
            value => Some(Box::new(read_estimator(Fields::of(
                value,
                "EstimatorSettings",
            )?)?)),
        },
        epoch_length: {
            let name = f.string("AdmissionBudget.epochLength")?;
            EpochLength::from_name(&name).ok_or_else(|| {
                shape(
                    "AdmissionBudget.epochLength",
                    format!("unknown epoch length {name:?}"),
                )
            })?
        },
        rollout: match unwrap_union(f.take("AdmissionBudget.rollout")?) {
            Value::Null => None,
            value => {
                let mut r = Fields::of(value, "Rollout")?;
                let enforced = r.u64("Rollout.enforcedPerMillion")?;
                Some(Rollout {
                    enforced_per_million: u32::try_from(enforced)
                        .map_err(|_| shape("Rollout.enforcedPerMillion", "above u32"))?,
                    salt: r.string("Rollout.salt")?,
                })
            }
        },
    })
}

fn read_estimator(mut f: Fields) -> Result<EstimatorConfig, CodecError> {
    Ok(EstimatorConfig {
        quantile_ppm: f.u64("EstimatorSettings.quantilePpm")?,
        floor_units: f.u64("EstimatorSettings.floorUnits")?,
        ceiling_units: f.u64("EstimatorSettings.ceilingUnits")?,
        min_samples: f.u64("EstimatorSettings.minSamples")?,
        default_max_tokens: f.opt_u64("EstimatorSettings.defaultMaxTokens")?,
        sibling_route: match unwrap_union(f.take("EstimatorSettings.siblingRoute")?) {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => {
                return Err(shape(
                    "EstimatorSettings.siblingRoute",
                    format!("{other:?}"),
                ))
            }
        },
    })
}
