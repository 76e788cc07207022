//! An unstarted reservation's lease: starting the call it holds for,
//! releasing it, or expiring it once the lease has passed.

use super::{record, wrong_state, Decision, Fact, Records};
use crate::dimension::DimensionAmounts;
use crate::event::EventBody;
use crate::policy::Policy;
use crate::rejection::{InvalidInput, Rejection, Transition};
use crate::reservation::{Reservation, ReservationState};
use crate::types::{OperationId, ReservationId, TimestampMs};

/// `Start`: binds the operation id, before the lease expires.
pub(super) fn start(
    records: &Records<'_>,
    policy: &Policy,
    id: &ReservationId,
    operation_id: &OperationId,
    now: TimestampMs,
) -> Decision {
    let r = record(records, id)?;
    match (&r.operation_id, r.state) {
        (Some(bound), _) if bound == operation_id => Ok(vec![]),
        (Some(_), _) => Err(Rejection::ExistsWithDifferentOperationId { id: id.clone() }),
        (None, ReservationState::Reserved) if now >= r.expires_at_ms => {
            Err(Rejection::LeaseExpired {
                id: id.clone(),
                expires_at_ms: r.expires_at_ms,
            })
        }
        (None, ReservationState::Reserved) => Ok(vec![EventBody::Started {
            id: id.clone(),
            operation_id: operation_id.clone(),
            execution_deadline_ms: now
                .checked_add(policy.hard_execution_limit_ms)
                .ok_or(InvalidInput::Overflow)?,
        }
        .into()]),
        (None, _) => Err(wrong_state(r, Transition::Start)),
    }
}

/// `Release`: gives back an unstarted reservation's hold.
pub(super) fn release(records: &Records<'_>, id: &ReservationId) -> Decision {
    let r = record(records, id)?;
    match r.state {
        ReservationState::Released => Ok(vec![]),
        ReservationState::Reserved => Ok(vec![refund(
            r,
            EventBody::Released {
                id: id.clone(),
                refunded_units: r.held_units,
            },
        )]),
        _ => Err(wrong_state(r, Transition::Release)),
    }
}

/// `Expire`: frees the hold of an unstarted reservation whose lease has passed.
pub(super) fn expire(records: &Records<'_>, id: &ReservationId, now: TimestampMs) -> Decision {
    let r = record(records, id)?;
    match r.state {
        ReservationState::Expired => Ok(vec![]),
        // A log cut between ExpiryBegan and Expired (an older writer, a
        // hand-repaired log) must not leave the hold stuck: finish the expiry.
        ReservationState::Expiring => Ok(vec![refund(
            r,
            EventBody::Expired {
                id: id.clone(),
                refunded_units: r.held_units,
            },
        )]),
        ReservationState::Reserved if now < r.expires_at_ms => Err(Rejection::NotYetDue {
            id: id.clone(),
            due_at_ms: r.expires_at_ms,
        }),
        ReservationState::Reserved => Ok(vec![
            EventBody::ExpiryBegan { id: id.clone() }.into(),
            refund(
                r,
                EventBody::Expired {
                    id: id.clone(),
                    refunded_units: r.held_units,
                },
            ),
        ]),
        _ => Err(wrong_state(r, Transition::Expire)),
    }
}

/// A release or expiry: the body's refund, and every further dimension's
/// held units back to `available`.
fn refund(r: &Reservation, body: EventBody) -> Fact {
    Fact {
        body,
        further: r
            .further
            .iter()
            .map(|h| DimensionAmounts::Refunded {
                refunded_units: h.held_units,
            })
            .collect(),
    }
}
