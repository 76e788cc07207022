//! The client's errors: what the ledger refused (with its problem+json), what
//! could not be decided (RESERVATION_UNKNOWN), and transport trouble, each
//! saying whether the same call may succeed later.

use std::time::Duration;

use crate::types::{Problem, ReservationId};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A limit refusal (429): not admitted now; `retry_after` is the ledger's
    /// conservative hint.
    #[error("refused ({}): {}", problem.code(), problem.detail)]
    Refused {
        problem: Box<Problem>,
        retry_after: Option<Duration>,
    },
    /// A definitive answer that retrying cannot change (404, 409, 422, 500).
    #[error("rejected {status} ({}): {}", problem.code(), problem.detail)]
    Rejected { status: u16, problem: Box<Problem> },
    /// A reserve was sent but no answer arrived before the deadline: the ledger
    /// may hold it. Resolve by asking again with the same id
    /// ([`crate::Client::resolve`]); never reserve it under a new id, and
    /// never treat it as not reserved.
    #[error("reservation {id} unknown: no answer before the deadline ({last})")]
    ReservationUnknown { id: ReservationId, last: String },
    /// The ledger could not be reached, or answered 503, until the deadline.
    /// For a write other than reserve the step may have happened: repeat it
    /// with the same arguments.
    #[error("ledger unavailable until the deadline: {0}")]
    Unavailable(String),
    /// The start scheduler already holds its limit of waiting reservations
    /// (this one was released).
    #[error("start queue full ({limit} waiting)")]
    QueueFull { limit: usize },
    /// The caller's input is wrong before anything was sent.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The ledger answered something this client cannot read.
    #[error("unreadable answer: {0}")]
    Protocol(String),
}

impl Error {
    /// Whether the same call, with the same id, may succeed later.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Refused { .. }
            | Error::ReservationUnknown { .. }
            | Error::Unavailable(_)
            | Error::QueueFull { .. } => true,
            Error::Rejected { .. } | Error::InvalidInput(_) | Error::Protocol(_) => false,
        }
    }

    /// The problem's code (`insufficient_capacity`, `wrong_state`, …), if the ledger answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Refused { problem, .. } | Error::Rejected { problem, .. } => {
                Some(problem.code())
            }
            _ => None,
        }
    }
}
