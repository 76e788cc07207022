//! The one validity rule every reader applies: a record counts only if its writer
//! holds the latest claim before it in that log partition.
//!
//! Writer recovery, the projector and the replay tool all feed entries of one log
//! partition, in offset order, through one [`Validity`] and skip what it rejects.
//! Nothing else decides; so the log alone says what happened, whatever the broker.
//! [`valid_records`] (pure) and [`ValidReader`] / [`read_valid`] (over any
//! [`EventReader`]) are the shared way to do that.

use crate::{Claim, EventReader, LogEntry, LogError, Position, Record};

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
                Some(c) if c.writer_id == record.writer_id && c.epoch == record.claim_epoch => {
                    Verdict::Counts
                }
                _ => Verdict::Fenced,
            },
        }
    }
}

/// Keeps the records that count from entries of one log partition, in offset
/// order, feeding every entry (claims too) through `validity`. The pure half of
/// every reader: call it with the same `validity` for consecutive slices.
pub fn valid_records(
    validity: &mut Validity,
    entries: impl IntoIterator<Item = (Position, LogEntry)>,
) -> Vec<(Position, Record)> {
    entries
        .into_iter()
        .filter_map(|(position, entry)| match validity.observe(&entry) {
            Verdict::Counts => match entry {
                LogEntry::Record(record) => Some((position, record)),
                LogEntry::Claim(_) => unreachable!("a claim never counts as a record"),
            },
            Verdict::ClaimAccepted | Verdict::StaleClaim | Verdict::Fenced => None,
        })
        .collect()
}

/// Reads one log partition from its start and yields only the records that count.
/// Every reader (writer recovery, projector, replay) reads through this, so all of
/// them agree with the writer's own read-back check. It always starts at offset 0:
/// whether a record counts depends on every claim before it.
#[derive(Clone, Debug)]
pub struct ValidReader {
    log_partition: u32,
    next_offset: u64,
    validity: Validity,
}

impl ValidReader {
    /// Entries read per `read` call on the log.
    pub const READ_ENTRIES_MAX: usize = 1024;

    pub fn new(log_partition: u32) -> Self {
        Self {
            log_partition,
            next_offset: 0,
            validity: Validity::default(),
        }
    }

    /// Offset of the next entry this reader will look at.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    pub fn validity(&self) -> &Validity {
        &self.validity
    }

    /// The next slice of records that count (possibly empty when only claims or
    /// fenced records were read), or `None` at the current end of the log.
    pub async fn next_batch<L: EventReader>(
        &mut self,
        log: &L,
    ) -> Result<Option<Vec<(Position, Record)>>, LogError> {
        let entries = log
            .read(self.log_partition, self.next_offset, Self::READ_ENTRIES_MAX)
            .await?;
        let Some((last, _)) = entries.last() else {
            return Ok(None);
        };
        assert!(
            entries[0].0.offset >= self.next_offset,
            "log returned entries before the requested offset"
        );
        self.next_offset = last.offset + 1;
        Ok(Some(valid_records(&mut self.validity, entries)))
    }
}

/// Every record of one log partition that counts, from offset 0 to the current
/// end, and the validity state after the last entry read.
pub async fn read_valid<L: EventReader>(
    log: &L,
    log_partition: u32,
) -> Result<(Vec<(Position, Record)>, Validity), LogError> {
    let mut reader = ValidReader::new(log_partition);
    let mut records = Vec::new();
    while let Some(batch) = reader.next_batch(log).await? {
        records.extend(batch);
    }
    Ok((records, reader.validity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use reservoir_core::PartitionKey;

    fn claim(writer: u8, epoch: u64) -> LogEntry {
        LogEntry::Claim(Claim {
            writer_id: format!("w{writer}"),
            epoch,
        })
    }

    fn record(writer: u8, epoch: u64) -> LogEntry {
        LogEntry::Record(Record {
            key: PartitionKey::new("tenant", "route", "epoch", 1).unwrap(),
            writer_id: format!("w{writer}"),
            claim_epoch: epoch,
            events: Vec::new(),
        })
    }

    /// The rule restated with quantifiers, independent of `Validity`'s state: a
    /// record at `i` counts iff some claim at `j < i` names its writer and epoch,
    /// that claim's epoch is above every claim before `j`, and no claim between
    /// `j` and `i` has an epoch above it.
    fn reference_counts(entries: &[LogEntry], i: usize) -> bool {
        let LogEntry::Record(r) = &entries[i] else {
            return false;
        };
        let epoch_of = |e: &LogEntry| match e {
            LogEntry::Claim(c) => Some(c.epoch),
            LogEntry::Record(_) => None,
        };
        (0..i).any(|j| match &entries[j] {
            LogEntry::Claim(c) => {
                c.writer_id == r.writer_id
                    && c.epoch == r.claim_epoch
                    && entries[..j]
                        .iter()
                        .filter_map(epoch_of)
                        .all(|e| e < c.epoch)
                    && entries[j + 1..i]
                        .iter()
                        .filter_map(epoch_of)
                        .all(|e| e <= c.epoch)
            }
            LogEntry::Record(_) => false,
        })
    }

    #[test]
    fn table() {
        // (entries in log order, which of them count)
        let rows: Vec<(Vec<LogEntry>, Vec<bool>)> = vec![
            (vec![record(1, 1)], vec![false]),
            (vec![claim(1, 1), record(1, 1)], vec![false, true]),
            (vec![claim(1, 1), record(1, 2)], vec![false, false]),
            (
                vec![claim(1, 1), claim(2, 1), record(2, 1), record(1, 1)],
                vec![false, false, false, true],
            ),
            (
                vec![claim(1, 1), claim(2, 2), record(1, 1), record(2, 2)],
                vec![false, false, false, true],
            ),
            (
                vec![claim(1, 2), claim(2, 1), record(1, 2)],
                vec![false, false, true],
            ),
            (
                vec![claim(1, 1), claim(2, 2), claim(1, 1), record(1, 1)],
                vec![false, false, false, false],
            ),
        ];
        for (entries, expected) in rows {
            let mut validity = Validity::default();
            let counts: Vec<bool> = entries
                .iter()
                .map(|e| validity.observe(e) == Verdict::Counts)
                .collect();
            assert_eq!(counts, expected, "{entries:?}");
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Claim {
            writer: u8,
            epoch: u64,
        },
        /// `epoch: None` writes under the writer's latest own claim (the usual
        /// case); `Some` writes under an arbitrary epoch (a confused zombie).
        Record {
            writer: u8,
            epoch: Option<u64>,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => (0u8..4, 0u64..8).prop_map(|(writer, epoch)| Op::Claim { writer, epoch }),
            3 => (0u8..4, proptest::option::weighted(0.2, 0u64..8)).prop_map(|(writer, epoch)| Op::Record { writer, epoch }),
        ]
    }

    fn entries_of(ops: &[Op]) -> Vec<LogEntry> {
        let mut last_claim = [0u64; 4];
        ops.iter()
            .map(|op| match *op {
                Op::Claim { writer, epoch } => {
                    last_claim[writer as usize] = epoch;
                    claim(writer, epoch)
                }
                Op::Record { writer, epoch } => {
                    record(writer, epoch.unwrap_or(last_claim[writer as usize]))
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn validity_matches_reference(ops in proptest::collection::vec(op(), 0..40)) {
            let entries = entries_of(&ops);
            let mut validity = Validity::default();
            let mut counting_writer_since_claim: Option<String> = None;
            for (i, entry) in entries.iter().enumerate() {
                let verdict = validity.observe(entry);
                prop_assert_eq!(verdict == Verdict::Counts, reference_counts(&entries, i), "entry {} of {:?}", i, entries);
                match (&verdict, entry) {
                    (Verdict::ClaimAccepted, _) => counting_writer_since_claim = None,
                    // Between two accepted claims, at most one writer counts.
                    (Verdict::Counts, LogEntry::Record(r)) => {
                        let w = counting_writer_since_claim.get_or_insert_with(|| r.writer_id.clone());
                        prop_assert_eq!(&*w, &r.writer_id);
                    }
                    _ => {}
                }
            }
            // The shared reader helper agrees with entry-by-entry observation,
            // also when fed in two slices.
            let positioned: Vec<(Position, LogEntry)> = entries
                .iter()
                .enumerate()
                .map(|(i, e)| (Position { log_partition: 0, offset: i as u64 }, e.clone()))
                .collect();
            let split = positioned.len() / 2;
            let mut v = Validity::default();
            let mut kept = valid_records(&mut v, positioned[..split].to_vec());
            kept.extend(valid_records(&mut v, positioned[split..].to_vec()));
            let expected: Vec<u64> = (0..entries.len()).filter(|&i| reference_counts(&entries, i)).map(|i| i as u64).collect();
            prop_assert_eq!(kept.iter().map(|(p, _)| p.offset).collect::<Vec<_>>(), expected);
            prop_assert_eq!(v, validity);
        }
    }
}
