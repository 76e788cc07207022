//! What one record changes in the read models: the partition folded by
//! core's own `try_apply`, then every derived row (reservation records,
//! balances and roll-ups, digests of output tokens, efficiency, input drift).

use super::*;

/// Folds one record (one command's events for one ledger partition) into its
/// partition and the derived models.
pub(super) fn apply_record(
    db: &DB,
    work: &mut Work,
    proj: &mut PartitionProjection,
    position: Position,
    record: &Record,
) -> Result<(), ProjectionError> {
    let key = &record.key;
    work.old_balances
        .entry(key.clone())
        .or_insert_with(|| PartitionBalance::of(proj));
    if proj.quarantine.is_some() {
        proj.skipped_events += record.events.len() as u64;
        return Ok(());
    }
    for (index, event) in record.events.iter().enumerate() {
        let result = match &event.body {
            EventBody::PartitionOpened { key: opened, .. } if opened != key => {
                Err("PartitionOpened names another partition than its record".to_string())
            }
            _ => {
                let mut evicted = Vec::new();
                let applied = try_apply_evicting(&mut proj.partition, event, &mut evicted)
                    .map_err(|e| e.to_string());
                // Left memory, not the projection: a record touched earlier in
                // this step is still written from here.
                for r in evicted {
                    work.evicted.insert((key.clone(), r.id.clone()), r);
                }
                applied
            }
        };
        if let Err(error) = result {
            let finding = Finding {
                key: key.clone(),
                log_partition: position.log_partition,
                offset: position.offset,
                event_index: index as u32,
                sequence: event.sequence,
                error,
            };
            tracing::warn!(
                ?finding,
                "event refused by try_apply; partition quarantined"
            );
            work.put(
                store::FINDINGS,
                store::finding_key(position.log_partition, position.offset, index as u32),
                encode(&finding),
            );
            proj.quarantine = Some(finding);
            proj.skipped_events += (record.events.len() - index) as u64;
            return Ok(());
        }
        derive(db, work, proj, position, key, event)?;
        let policy = proj.partition.policy.as_ref();
        moves::check_move_half(db, work, position, index as u32, key, policy, event)?;
    }
    Ok(())
}

/// The read models an applied event feeds besides the partition itself.
fn derive(
    db: &DB,
    work: &mut Work,
    proj: &mut PartitionProjection,
    position: Position,
    key: &PartitionKey,
    event: &Event,
) -> Result<(), ProjectionError> {
    match &event.body {
        EventBody::PartitionOpened { .. } => proj.opened_at_ms = event.at_ms,
        EventBody::Reserved {
            id,
            shadow: Some(verdict),
            shadow_dimension,
            ..
        } => {
            let record = encode(&ShadowRecord {
                subject: key.subject.clone(),
                route: key.route.clone(),
                at_ms: event.at_ms,
                reservation_id: id.to_string(),
                verdict: *verdict,
                dimension: *shadow_dimension,
            });
            for (scope, owner) in [("route", &key.route), ("tenant", &key.subject)] {
                let k = store::shadow_key(scope, owner, event.at_ms, key, event.sequence);
                work.put(store::SHADOW, k, record.clone());
            }
        }
        EventBody::AdmissionRefused {
            dimension,
            id,
            requested_units,
            reason,
            retry_after_ms,
        } => {
            // The limiting dimension's numbers (the primary's by default).
            let index = proj
                .partition
                .policy
                .as_ref()
                .and_then(|p| p.dimension_index((*dimension)?))
                .unwrap_or(0);
            let refusal = Refusal {
                key: key.clone(),
                at_ms: event.at_ms,
                sequence: event.sequence,
                reservation_id: id.to_string(),
                requested_units: *requested_units,
                reason: *reason,
                retry_after_ms: *retry_after_ms,
                available_units: proj.partition.ledger_of(index).available_units,
                burst_units: proj
                    .partition
                    .policy
                    .as_ref()
                    .map_or(0, |p| p.limit(index).burst_units),
                dimension: *dimension,
            };
            work.put(
                store::REFUSALS,
                store::refusal_key(key, event.at_ms, event.sequence),
                encode(&refusal),
            );
        }
        EventBody::Settled {
            id,
            actual_units,
            usage,
            ..
        } => {
            let record = proj
                .partition
                .reservation(id)
                .expect("try_apply accepted a settle of this reservation");
            work.models
                .histogram(db, store::EFFICIENCY_BY_ROUTE, &key.route)?
                .observe(*actual_units, record.reserved_units);
            work.models
                .histogram(db, store::EFFICIENCY_BY_TENANT, &key.subject)?
                .observe(*actual_units, record.reserved_units);
            // Each further dimension under `<route or tenant>|<dimension>`
            // (`|` cannot occur in an id).
            let dimensions = proj.partition.policy.iter().flat_map(|p| &p.dimensions);
            for (limit, hold) in dimensions.zip(&record.further) {
                let actual = hold.actual_units.unwrap_or(0);
                for (cf, owner) in [
                    (store::EFFICIENCY_BY_ROUTE, &key.route),
                    (store::EFFICIENCY_BY_TENANT, &key.subject),
                ] {
                    let slot = store::dimension_key(owner, limit.dimension);
                    work.models
                        .histogram(db, cf, &slot)?
                        .observe(actual, hold.reserved_units);
                }
            }
            let policy = proj.partition.policy.as_ref();
            if let Some((model, sample)) =
                output_sample(policy, record, *actual_units, usage.as_ref())
            {
                let digest_key = store::digest_key(&key.route, model, position.log_partition);
                work.models.digest(db, digest_key)?.observe(sample);
            }
        }
        _ => {}
    }
    if let Some((counted, reported)) = input_drift_sample(&event.body) {
        work.models
            .drift(db, &key.route)?
            .observe(counted, reported);
    }
    if let Some(id) = event.body.reservation_id() {
        if !matches!(event.body, EventBody::AdmissionRefused { .. }) {
            work.reservations.insert((key.clone(), id.clone()));
        }
        if matches!(event.body, EventBody::Reserved { .. }) {
            work.created.insert((key.clone(), id.clone()));
        }
    }
    Ok(())
}

/// The output-token sample a settlement feeds, and the model digest it goes
/// to: the provider-reported output tokens under the reported model (or
/// [`store::DEFAULT_MODEL`] when the settle named none). A settle that
/// reports no output tokens falls back, under the default model, to what its
/// output-token dimension used where the policy limits one, else to the
/// whole `actual_units` where the primary dimension counts tokens (as every
/// settle did before usage was recorded), else to nothing: under a policy
/// counting requests, `actual_units` is a number of requests, and a route's
/// output estimate fed with 1s would size every reserve at one token.
fn output_sample<'a>(
    policy: Option<&reservoir_core::Policy>,
    record: &reservoir_core::Reservation,
    actual_units: u64,
    usage: Option<&'a Usage>,
) -> Option<(&'a str, u64)> {
    if let Some(Usage {
        output_tokens: Some(output),
        model,
        ..
    }) = usage
    {
        return Some((model.as_deref().unwrap_or(store::DEFAULT_MODEL), *output));
    }
    let Some(policy) = policy else {
        return Some((store::DEFAULT_MODEL, actual_units));
    };
    let output_dimension = policy
        .dimensions
        .iter()
        .zip(&record.further)
        .find(|(limit, _)| limit.dimension == reservoir_core::Dimension::OutputTokens);
    match (output_dimension, policy.capacity_unit) {
        (Some((_, hold)), _) => hold.actual_units.map(|used| (store::DEFAULT_MODEL, used)),
        (None, reservoir_core::CapacityUnit::Tokens) => Some((store::DEFAULT_MODEL, actual_units)),
        (None, _) => None,
    }
}

/// Input-token drift sample of an event: (counted input, provider-reported
/// input), from a settle whose usage reports both (and counted something).
/// The provider's input is the whole prompt the gateway counted: what it
/// billed plus what it read from its prompt cache (reported apart).
fn input_drift_sample(body: &EventBody) -> Option<(u64, u64)> {
    match body {
        EventBody::Settled {
            usage:
                Some(Usage {
                    counted_input_tokens: Some(counted),
                    reported_input_tokens: Some(reported),
                    cache_read_input_tokens: cached,
                    ..
                }),
            ..
        } if *counted > 0 => Some((*counted, reported.saturating_add(cached.unwrap_or(0)))),
        _ => None,
    }
}
