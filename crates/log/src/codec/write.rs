//! Encoding: Avro binary written straight from the Rust types, in the field
//! order of the schemas (no intermediate `Value`, no schema lookups: this sits
//! on the writer's hot path). Tests check byte for byte that apache-avro,
//! given the registered schema, reads it and re-encodes it to the same bytes.

use super::*;
/// Encodes an entry as a framed value.
pub fn encode(entry: &LogEntry) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(128);
    encode_into(entry, &mut out)?;
    Ok(out)
}

/// Appends an entry's framed value to `out` (which may already hold bytes).
pub fn encode_into(entry: &LogEntry, out: &mut Vec<u8>) -> Result<(), CodecError> {
    match entry {
        LogEntry::Record(r) => encode_record_into(r, out),
        LogEntry::Claim(c) => framed(out, CLAIM_ID, |out| write_claim(out, c)),
    }
}

/// [`encode_into`] for a record the caller keeps (no `LogEntry` to build).
pub fn encode_record_into(record: &Record, out: &mut Vec<u8>) -> Result<(), CodecError> {
    framed(out, ENVELOPE_ID, |out| write_envelope(out, record))
}

/// Frame header, then the datum; on any error `out` is left as it was.
fn framed(
    out: &mut Vec<u8>,
    schema_id: u32,
    datum: impl FnOnce(&mut Vec<u8>) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    let start = out.len();
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&schema_id.to_be_bytes());
    let result = datum(out);
    let len = out.len() - start;
    if let Err(e) = result {
        out.truncate(start);
        return Err(e);
    }
    if len > MAX_VALUE_BYTES {
        out.truncate(start);
        return Err(CodecError::TooLarge {
            len,
            max: MAX_VALUE_BYTES,
        });
    }
    Ok(())
}

/// Zig-zag varint, assembled on the stack and appended in one copy.
fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut buf = [0u8; 10];
    let mut len = 0;
    while z >= 0x80 {
        buf[len] = (z as u8) | 0x80;
        z >>= 7;
        len += 1;
    }
    buf[len] = z as u8;
    out.extend_from_slice(&buf[..=len]);
}

fn put_u64(out: &mut Vec<u8>, field: &'static str, v: u64) -> Result<(), CodecError> {
    let v = i64::try_from(v).map_err(|_| CodecError::OutOfRange { field, value: v })?;
    put_long(out, v);
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

fn put_opt_u64(out: &mut Vec<u8>, field: &'static str, v: Option<u64>) -> Result<(), CodecError> {
    match v {
        None => put_long(out, 0),
        Some(v) => {
            put_long(out, 1);
            put_u64(out, field, v)?;
        }
    }
    Ok(())
}

fn write_key(out: &mut Vec<u8>, key: &PartitionKey) -> Result<(), CodecError> {
    put_str(out, &key.subject);
    put_str(out, &key.route);
    put_str(out, &key.accounting_epoch);
    put_u64(out, "policyGeneration", key.policy_generation)
}

fn write_claim(out: &mut Vec<u8>, c: &Claim) -> Result<(), CodecError> {
    put_str(out, &c.writer_id);
    put_u64(out, "epoch", c.epoch)
}

fn write_envelope(out: &mut Vec<u8>, r: &Record) -> Result<(), CodecError> {
    if r.events.is_empty() || r.events.len() > MAX_EVENTS_PER_RECORD {
        return Err(CodecError::Invalid {
            field: "events",
            reason: format!(
                "{} events, expected 1..={MAX_EVENTS_PER_RECORD}",
                r.events.len()
            ),
        });
    }
    write_key(out, &r.key)?;
    put_str(out, &r.writer_id);
    put_u64(out, "claimEpoch", r.claim_epoch)?;
    // One array block holding every event, then the terminating empty block.
    put_long(out, r.events.len() as i64);
    let key_text_len = key_text_len(&r.key);
    for e in &r.events {
        put_u64(out, "sequence", e.sequence)?;
        put_u64(out, "atMs", e.at_ms)?;
        // eventId = "<key>/<sequence>", rendered straight into the buffer (this
        // is the hot path of every append; no String, no fmt).
        put_long(out, (key_text_len + 1 + decimal_len(e.sequence)) as i64);
        put_key_text(out, &r.key);
        out.push(b'/');
        put_decimal(out, e.sequence);
        write_body(out, &e.body)?;
        write_further(out, &e.further)?;
    }
    put_long(out, 0);
    Ok(())
}

/// `Event.further`: one block with every item (union branch, then fields), then
/// the terminating empty block; a lone empty block when there are none.
fn write_further(out: &mut Vec<u8>, further: &[DimensionAmounts]) -> Result<(), CodecError> {
    if !further.is_empty() {
        put_long(out, further.len() as i64);
        for amounts in further {
            match *amounts {
                DimensionAmounts::Opened { opening_units } => {
                    put_long(out, 0);
                    put_u64(out, "OpenedAmounts.openingUnits", opening_units)?;
                }
                DimensionAmounts::Refilled {
                    minted_units,
                    repaid_units,
                    remainder,
                } => {
                    put_long(out, 1);
                    put_u64(out, "RefilledAmounts.mintedUnits", minted_units)?;
                    put_u64(out, "RefilledAmounts.repaidUnits", repaid_units)?;
                    put_u64(out, "RefilledAmounts.remainder", remainder)?;
                }
                DimensionAmounts::Reserved {
                    reserved_units,
                    held_units,
                } => {
                    put_long(out, 2);
                    put_u64(out, "ReservedAmounts.reservedUnits", reserved_units)?;
                    put_u64(out, "ReservedAmounts.heldUnits", held_units)?;
                }
                DimensionAmounts::Settled {
                    actual_units,
                    refunded_units,
                    from_available_units,
                    overdraft_units,
                    overdraft_limit_breached,
                } => {
                    put_long(out, 3);
                    put_u64(out, "SettledAmounts.actualUnits", actual_units)?;
                    put_u64(out, "SettledAmounts.refundedUnits", refunded_units)?;
                    put_u64(
                        out,
                        "SettledAmounts.fromAvailableUnits",
                        from_available_units,
                    )?;
                    put_u64(out, "SettledAmounts.overdraftUnits", overdraft_units)?;
                    put_bool(out, overdraft_limit_breached);
                }
                DimensionAmounts::Refunded { refunded_units } => {
                    put_long(out, 4);
                    put_u64(out, "RefundedAmounts.refundedUnits", refunded_units)?;
                }
                DimensionAmounts::Moved { units, debt_units } => {
                    put_long(out, 5);
                    put_u64(out, "MovedAmounts.units", units)?;
                    put_u64(out, "MovedAmounts.debtUnits", debt_units)?;
                }
            }
        }
    }
    put_long(out, 0);
    Ok(())
}

/// Length of [`partition_key_string`] without building it.
fn key_text_len(key: &PartitionKey) -> usize {
    key.subject.len()
        + key.route.len()
        + key.accounting_epoch.len()
        + 4
        + decimal_len(key.policy_generation)
}

/// Writes [`partition_key_string`] (`subject|route|epoch|g<generation>`).
fn put_key_text(out: &mut Vec<u8>, key: &PartitionKey) {
    out.extend_from_slice(key.subject.as_bytes());
    out.push(b'|');
    out.extend_from_slice(key.route.as_bytes());
    out.push(b'|');
    out.extend_from_slice(key.accounting_epoch.as_bytes());
    out.extend_from_slice(b"|g");
    put_decimal(out, key.policy_generation);
}

fn decimal_len(mut v: u64) -> usize {
    let mut digits = 1;
    while v >= 10 {
        v /= 10;
        digits += 1;
    }
    digits
}

fn put_decimal(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(Decimal::of(v).as_bytes());
}

/// A number's decimal digits as `Display` writes them, without allocating.
pub(crate) struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn of(mut v: u64) -> Self {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        Self { buf, start }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

fn branch_index(body: &EventBody) -> i64 {
    match body {
        EventBody::PartitionOpened { .. } => 0,
        EventBody::Refilled { .. } => 1,
        EventBody::Reserved { .. } => 2,
        EventBody::AdmissionRefused { .. } => 3,
        EventBody::Started { .. } => 4,
        EventBody::Settled { .. } => 5,
        EventBody::Released { .. } => 6,
        EventBody::ExpiryBegan { .. } => 7,
        EventBody::Expired { .. } => 8,
        EventBody::UsageUnknown { .. } => 9,
        EventBody::ShardIssued { .. } => 10,
        EventBody::ShardReminted { .. } => 11,
        EventBody::Closed => 12,
        EventBody::MovedOut { .. } => 13,
        EventBody::MovedIn { .. } => 14,
    }
}

fn write_body(out: &mut Vec<u8>, body: &EventBody) -> Result<(), CodecError> {
    put_long(out, branch_index(body));
    match body {
        EventBody::PartitionOpened {
            key,
            policy,
            opening_units,
        } => {
            write_key(out, key)?;
            write_policy(out, policy)?;
            put_u64(out, "openingUnits", *opening_units)?;
        }
        EventBody::Refilled {
            minted_units,
            repaid_units,
            remainder,
        } => {
            put_u64(out, "mintedUnits", *minted_units)?;
            put_u64(out, "repaidUnits", *repaid_units)?;
            put_u64(out, "remainder", *remainder)?;
        }
        EventBody::Reserved {
            id,
            digest,
            reserved_units,
            held_units,
            expires_at_ms,
            shadow,
            shadow_dimension,
            sizing,
        } => {
            put_str(out, id.as_str());
            out.extend_from_slice(&digest.0);
            put_u64(out, "reservedUnits", *reserved_units)?;
            put_u64(out, "heldUnits", *held_units)?;
            put_u64(out, "expiresAtMs", *expires_at_ms)?;
            match shadow {
                None => put_long(out, 0),
                Some(v) => {
                    put_long(out, 1);
                    put_long(out, shadow_index(*v));
                }
            }
            match sizing {
                None => put_long(out, 0),
                Some(s) => {
                    put_long(out, 1);
                    put_u64(out, "sizing.units", s.units)?;
                    put_u64(out, "sizing.inputUnits", s.input_units)?;
                    put_u64(out, "sizing.outputUnits", s.output_units)?;
                    put_long(out, sizing_rule_index(s.rule));
                }
            }
            match shadow_dimension {
                None => put_long(out, 0),
                Some(d) => {
                    put_long(out, 1);
                    put_str(out, d.name());
                }
            }
        }
        EventBody::AdmissionRefused {
            id,
            requested_units,
            reason,
            retry_after_ms,
            dimension,
        } => {
            put_str(out, id.as_str());
            put_u64(out, "requestedUnits", *requested_units)?;
            put_long(out, refusal_index(*reason));
            put_opt_u64(out, "retryAfterMs", *retry_after_ms)?;
            match dimension {
                None => put_long(out, 0),
                Some(d) => {
                    put_long(out, 1);
                    put_str(out, d.name());
                }
            }
        }
        EventBody::Started {
            id,
            operation_id,
            execution_deadline_ms,
        } => {
            put_str(out, id.as_str());
            put_str(out, operation_id.as_str());
            put_u64(out, "executionDeadlineMs", *execution_deadline_ms)?;
        }
        EventBody::Settled {
            id,
            actual_units,
            refunded_units,
            from_available_units,
            overdraft_units,
            overdraft_limit_breached,
            from_usage_unknown,
            usage,
        } => {
            put_str(out, id.as_str());
            put_u64(out, "actualUnits", *actual_units)?;
            put_u64(out, "refundedUnits", *refunded_units)?;
            put_u64(out, "fromAvailableUnits", *from_available_units)?;
            put_u64(out, "overdraftUnits", *overdraft_units)?;
            put_bool(out, *overdraft_limit_breached);
            put_bool(out, *from_usage_unknown);
            match usage {
                None => put_long(out, 0),
                Some(u) => {
                    put_long(out, 1);
                    match &u.model {
                        None => put_long(out, 0),
                        Some(m) => {
                            put_long(out, 1);
                            put_str(out, m);
                        }
                    }
                    put_opt_u64(out, "usage.outputTokens", u.output_tokens)?;
                    put_opt_u64(out, "usage.countedInputTokens", u.counted_input_tokens)?;
                    put_opt_u64(out, "usage.reportedInputTokens", u.reported_input_tokens)?;
                    put_opt_u64(out, "usage.cacheReadInputTokens", u.cache_read_input_tokens)?;
                }
            }
        }
        EventBody::Released { id, refunded_units } | EventBody::Expired { id, refunded_units } => {
            put_str(out, id.as_str());
            put_u64(out, "refundedUnits", *refunded_units)?;
        }
        EventBody::ExpiryBegan { id } | EventBody::UsageUnknown { id } => put_str(out, id.as_str()),
        EventBody::ShardIssued {
            shard_id,
            units,
            gateway_id,
            boot_epoch,
            expires_at_ms,
            fence_epoch,
            signature,
        } => {
            put_str(out, shard_id.as_str());
            put_u64(out, "units", *units)?;
            put_str(out, gateway_id);
            put_u64(out, "bootEpoch", *boot_epoch)?;
            put_u64(out, "expiresAtMs", *expires_at_ms)?;
            put_u64(out, "fenceEpoch", *fence_epoch)?;
            put_str(out, signature);
        }
        EventBody::ShardReminted {
            shard_id,
            source,
            units,
            issued_units,
            spent_units,
            unknown_units,
            excess_units,
        } => {
            put_str(out, shard_id.as_str());
            write_key(out, source)?;
            put_u64(out, "units", *units)?;
            put_u64(out, "issuedUnits", *issued_units)?;
            put_u64(out, "spentUnits", *spent_units)?;
            put_u64(out, "unknownUnits", *unknown_units)?;
            put_u64(out, "excessUnits", *excess_units)?;
        }
        EventBody::Closed => {}
        EventBody::MovedOut {
            move_id,
            to: key,
            units,
            debt_units,
        }
        | EventBody::MovedIn {
            move_id,
            from: key,
            units,
            debt_units,
        } => {
            put_str(out, move_id.as_str());
            write_key(out, key)?;
            put_u64(out, "units", *units)?;
            put_u64(out, "debtUnits", *debt_units)?;
        }
    }
    Ok(())
}

fn write_policy(out: &mut Vec<u8>, p: &Policy) -> Result<(), CodecError> {
    put_str(out, &p.subject);
    put_str(out, &p.route);
    put_str(out, &p.region);
    put_long(
        out,
        match p.capacity_unit {
            CapacityUnit::Tokens => 0,
            CapacityUnit::Requests => 1,
        },
    );
    put_u64(out, "refill.units", p.refill.units)?;
    put_u64(out, "refill.intervalMs", p.refill.interval_ms)?;
    put_u64(out, "burstUnits", p.burst_units)?;
    put_u64(out, "openingUnits", p.opening_units)?;
    put_str(out, &p.estimator_digest);
    put_u64(out, "maxReservationUnits", p.max_reservation_units)?;
    put_u64(out, "holdTtlMs", p.hold_ttl_ms)?;
    put_u64(out, "hardExecutionLimitMs", p.hard_execution_limit_ms)?;
    put_u64(out, "maxOverdraftUnits", p.max_overdraft_units)?;
    put_long(out, i64::from(p.priority));
    put_long(
        out,
        match p.emergency_mode {
            EmergencyMode::Disabled => 0,
            EmergencyMode::Enabled => 1,
        },
    );
    put_bool(out, p.shadow_mode);
    put_u64(out, "generation", p.generation)?;
    put_u64(out, "idempotencyWindowMs", p.idempotency_window_ms)?;
    if !p.dimensions.is_empty() {
        put_long(out, p.dimensions.len() as i64);
        for l in &p.dimensions {
            put_str(out, l.dimension.name());
            put_u64(out, "dimensions.refill.units", l.refill.units)?;
            put_u64(out, "dimensions.refill.intervalMs", l.refill.interval_ms)?;
            put_u64(out, "dimensions.burstUnits", l.burst_units)?;
            put_u64(out, "dimensions.openingUnits", l.opening_units)?;
            put_u64(
                out,
                "dimensions.maxReservationUnits",
                l.max_reservation_units,
            )?;
            put_u64(out, "dimensions.maxOverdraftUnits", l.max_overdraft_units)?;
        }
    }
    put_long(out, 0);
    put_bool(out, p.exclude_cache_read_input_tokens);
    match &p.estimator {
        None => put_long(out, 0),
        Some(e) => {
            put_long(out, 1);
            put_u64(out, "estimator.quantilePpm", e.quantile_ppm)?;
            put_u64(out, "estimator.floorUnits", e.floor_units)?;
            put_u64(out, "estimator.ceilingUnits", e.ceiling_units)?;
            put_u64(out, "estimator.minSamples", e.min_samples)?;
            put_opt_u64(out, "estimator.defaultMaxTokens", e.default_max_tokens)?;
            match &e.sibling_route {
                None => put_long(out, 0),
                Some(route) => {
                    put_long(out, 1);
                    put_str(out, route);
                }
            }
        }
    }
    put_str(out, p.epoch_length.name());
    match &p.rollout {
        None => put_long(out, 0),
        Some(r) => {
            put_long(out, 1);
            put_long(out, i64::from(r.enforced_per_million));
            put_str(out, &r.salt);
        }
    }
    Ok(())
}

fn shadow_index(v: ShadowVerdict) -> i64 {
    match v {
        ShadowVerdict::WouldAdmit => 0,
        ShadowVerdict::WouldRefuseInsufficientCapacity => 1,
        ShadowVerdict::WouldRefuseDebtOutstanding => 2,
        ShadowVerdict::WouldRefuseRequestTooLarge => 3,
    }
}

fn sizing_rule_index(v: SizingRule) -> i64 {
    match v {
        SizingRule::MaxTokens => 0,
        SizingRule::RouteDefaultMaxTokens => 1,
        SizingRule::RouteQuantile => 2,
        SizingRule::SiblingQuantile => 3,
        SizingRule::ColdCeiling => 4,
    }
}

fn refusal_index(v: RefusalReason) -> i64 {
    match v {
        RefusalReason::InsufficientCapacity => 0,
        RefusalReason::DebtOutstanding => 1,
        RefusalReason::RequestTooLarge => 2,
    }
}
