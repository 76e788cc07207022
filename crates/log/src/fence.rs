//! The one validity rule every reader applies: a record counts only if its writer
//! holds the latest claim before it in that log partition.
//!
//! Writer recovery, the projector and the replay tool all feed entries of one log
//! partition, in offset order, through one [`Validity`] and skip what it rejects.
//! Nothing else decides; so the log alone says what happened, whatever the broker.

use crate::{Claim, LogEntry};

/// Why an entry does not count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A claim that takes over the log partition (epoch above every earlier one).
    ClaimAccepted,
    /// A claim whose epoch is not above the current one: ignored.
    StaleClaim,
    /// A record from the current claim holder: it counts.
    Counts,
    /// A record from a writer that does not hold the latest claim (a zombie), or
    /// written before any claim.
    Fenced,
}

/// Validity state of one log partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validity {
    current: Option<Claim>,
}

impl Validity {
    pub fn current_claim(&self) -> Option<&Claim> {
        self.current.as_ref()
    }

    /// Feeds the next entry of the log partition and says whether it counts.
    pub fn observe(&mut self, entry: &LogEntry) -> Verdict {
        match entry {
            LogEntry::Claim(claim) => match &self.current {
                Some(current) if claim.epoch <= current.epoch => Verdict::StaleClaim,
                _ => {
                    self.current = Some(claim.clone());
                    Verdict::ClaimAccepted
                }
            },
            LogEntry::Record(record) => match &self.current {
                Some(c) if c.writer_id == record.writer_id && c.epoch == record.claim_epoch => Verdict::Counts,
                _ => Verdict::Fenced,
            },
        }
    }
}
