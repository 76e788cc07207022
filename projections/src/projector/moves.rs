//! The projector's check of capacity moves across partitions: each half of
//! a move is kept until its counterpart is projected (the halves may sit in
//! different log partitions, read in any order), then the two are compared.

use reservoir_core::{Event, EventBody, PartitionKey};
use reservoir_log::Position;
use rocksdb::DB;

use super::Work;
use crate::model::{Finding, MoveSide};
use crate::store::{self, decode, encode, get};
use crate::ProjectionError;

/// Checks a `MovedOut`/`MovedIn` against its other half once both are
/// projected: the same move id, each naming the other's partition, the same
/// units and debt in every dimension (by name: `moved_by_dimension`). A mismatch is a finding (the tamper replay `verify` and
/// `audit` locate too); an unpaired half can only be told at the end of the
/// log, which is replay's to say.
pub(super) fn check_move_half(
    db: &DB,
    work: &mut Work,
    position: Position,
    index: u32,
    key: &PartitionKey,
    policy: Option<&reservoir_core::Policy>,
    event: &Event,
) -> Result<(), ProjectionError> {
    let (move_id, side, other, mine) = match &event.body {
        EventBody::MovedOut {
            move_id,
            to,
            units,
            debt_units,
        } => (move_id, "out", "in", (to, *units, *debt_units)),
        EventBody::MovedIn {
            move_id,
            from,
            units,
            debt_units,
        } => (move_id, "in", "out", (from, *units, *debt_units)),
        _ => return Ok(()),
    };
    let amounts = policy.map_or_else(Vec::new, |p| {
        reservoir_core::moved_by_dimension(p, mine.1, mine.2, &event.further)
    });
    let mine = MoveSide {
        key: key.clone(),
        counterpart: mine.0.clone(),
        units: mine.1,
        debt_units: mine.2,
        amounts,
    };
    let other_key = format!("{move_id}|{other}");
    let pending = work.puts.get(&(store::MOVES, other_key.clone())).cloned();
    let counterpart: Option<MoveSide> = match pending {
        Some(bytes) => Some(decode(store::MOVES, other_key.as_bytes(), &bytes)?),
        None => get(db, store::MOVES, &other_key)?,
    };
    if let Some(c) = counterpart {
        let same_amounts = match c.amounts.is_empty() || mine.amounts.is_empty() {
            true => (c.units, c.debt_units) == (mine.units, mine.debt_units),
            false => c.amounts == mine.amounts,
        };
        let paired = c.key == mine.counterpart && c.counterpart == mine.key && same_amounts;
        if !paired {
            let finding = Finding {
                key: key.clone(),
                log_partition: position.log_partition,
                offset: position.offset,
                event_index: index,
                sequence: event.sequence,
                error: format!(
                    "move {move_id}: this half ({} units, {} debt, with {}) does not match its other half in {} ({} units, {} debt, with {})",
                    mine.units, mine.debt_units, mine.counterpart, c.key, c.units, c.debt_units, c.counterpart
                ),
            };
            tracing::warn!(?finding, "move halves do not match");
            work.put(
                store::FINDINGS,
                store::finding_key(position.log_partition, position.offset, index),
                encode(&finding),
            );
        }
    }
    work.put(store::MOVES, format!("{move_id}|{side}"), encode(&mine));
    Ok(())
}
