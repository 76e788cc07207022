//! The embedded log's newest entries, kept as the values they were appended
//! as, for their first reader.
//!
//! `reservoir serve` projects every entry right after its writer appended it:
//! the in-process projector reads the log's tail. Reading it back from RocksDB
//! and decoding it cost the server about 11,000 instructions per request of
//! the benchmark's cycle (9 % of all; bench-results/request-cost.md), to
//! rebuild values the log had in hand a moment before. So the log keeps the
//! records of small appends, and the claims, after their synced write, and a
//! read that starts where the tail starts takes them out instead: each entry
//! is handed over once, and whatever is read again (a second reader, a
//! projector reopened after a failure, recovery) comes from the disk as
//! before. The entries are equal either way: the codec round-trips every entry
//! (`every_entry_round_trips` in the log's tests), and `reservoir serve`'s
//! projection is checked byte for byte against a rebuild from the disk
//! (`the_served_projection_equals_a_rebuild_from_the_log` in the server's
//! tests).
//!
//! Only durable entries enter (pushed after the synced write, before the new
//! end is published), the offsets held are contiguous, and at most
//! [`TAIL_ENTRIES_MAX`] are held: a reader that falls further behind reads the
//! disk, so a log nobody reads holds a bounded amount of memory.

use std::collections::VecDeque;

use crate::{LogEntry, Position};

/// Entries the tail holds at most (a few megabytes of records). The server's
/// projector lingers 50 ms between steps; at 30,000 records a second that is
/// 1,500 entries.
pub const TAIL_ENTRIES_MAX: usize = 8_192;

#[derive(Default)]
pub(crate) struct Tail {
    /// Contiguous offsets, oldest first.
    entries: VecDeque<(u64, LogEntry)>,
}

impl Tail {
    /// Keeps the entry written at `offset`. Entries it pushes out (the oldest
    /// past the bound, or all of them when `offset` does not follow the
    /// newest) go into `dropped`, to be freed after the writer has answered.
    pub(crate) fn push(&mut self, offset: u64, entry: LogEntry, dropped: &mut Vec<LogEntry>) {
        if self
            .entries
            .back()
            .is_some_and(|(last, _)| last + 1 != offset)
        {
            dropped.extend(self.entries.drain(..).map(|(_, e)| e));
        }
        if self.entries.len() == TAIL_ENTRIES_MAX {
            dropped.extend(self.entries.pop_front().map(|(_, e)| e));
        }
        self.entries.push_back((offset, entry));
    }

    /// Forgets everything held: the next entry written does not follow them.
    pub(crate) fn clear(&mut self, dropped: &mut Vec<LogEntry>) {
        dropped.extend(self.entries.drain(..).map(|(_, e)| e));
    }

    /// Takes the entries `[from, until)` out of the tail, or as many of them
    /// as it holds from `from` on; empty if it does not hold `from`. Entries
    /// older than `from` go into `dropped`: a reader is past them.
    pub(crate) fn take(
        &mut self,
        from: u64,
        until: u64,
        dropped: &mut Vec<LogEntry>,
    ) -> Vec<(Position, LogEntry)> {
        while self
            .entries
            .front()
            .is_some_and(|(offset, _)| *offset < from)
        {
            dropped.extend(self.entries.pop_front().map(|(_, e)| e));
        }
        if self
            .entries
            .front()
            .is_none_or(|(offset, _)| *offset != from)
        {
            return Vec::new();
        }
        let held = self.entries.partition_point(|(offset, _)| *offset < until);
        self.entries
            .drain(..held)
            .map(|(offset, entry)| {
                let position = Position {
                    log_partition: 0,
                    offset,
                };
                (position, entry)
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    fn offsets(&self) -> Vec<u64> {
        self.entries.iter().map(|(o, _)| *o).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Claim;

    fn entry(epoch: u64) -> LogEntry {
        LogEntry::Claim(Claim {
            writer_id: "w".into(),
            epoch,
        })
    }

    /// A tail holding `offsets`, each with its own entry.
    fn holding(offsets: std::ops::Range<u64>) -> Tail {
        let mut tail = Tail::default();
        let mut dropped = Vec::new();
        for offset in offsets {
            tail.push(offset, entry(offset), &mut dropped);
        }
        assert!(dropped.is_empty(), "contiguous and within the bound");
        tail
    }

    fn offsets(taken: &[(Position, LogEntry)]) -> Vec<u64> {
        taken.iter().map(|(p, _)| p.offset).collect()
    }

    #[test]
    fn a_read_takes_what_it_asks_for_once_and_skips_what_it_is_past() {
        let mut tail = holding(10..20);
        let mut dropped = Vec::new();
        let taken = tail.take(10, 13, &mut dropped);
        assert_eq!(offsets(&taken), [10, 11, 12]);
        assert_eq!(taken[1].1, entry(11), "each offset's own entry");
        // Taken once: a second read of them finds nothing here.
        assert!(tail.take(10, 13, &mut dropped).is_empty());
        // A read further on drops what it skipped.
        assert_eq!(
            offsets(&tail.take(15, 30, &mut dropped)),
            [15, 16, 17, 18, 19]
        );
        assert_eq!(dropped.len(), 2, "13 and 14");
        assert!(tail.offsets().is_empty());
    }

    #[test]
    fn a_read_before_the_tail_takes_nothing_and_keeps_it() {
        let mut tail = holding(10..12);
        let mut dropped = Vec::new();
        assert!(tail.take(5, 11, &mut dropped).is_empty());
        assert_eq!(tail.offsets(), [10, 11]);
    }

    #[test]
    fn offsets_stay_contiguous_and_bounded() {
        let mut tail = Tail::default();
        let mut dropped = Vec::new();
        tail.push(1, entry(1), &mut dropped);
        tail.push(2, entry(2), &mut dropped);
        // A gap (an append not kept): what came before is let go.
        tail.push(5, entry(5), &mut dropped);
        assert_eq!(tail.offsets(), [5]);
        assert_eq!(dropped.len(), 2);
        let first = 6;
        for offset in first..first + TAIL_ENTRIES_MAX as u64 {
            tail.push(offset, entry(offset), &mut dropped);
        }
        let held = tail.offsets();
        assert_eq!(held.len(), TAIL_ENTRIES_MAX);
        assert_eq!(held[0], first, "the oldest went first");
        assert!(held.windows(2).all(|w| w[1] == w[0] + 1));
        tail.clear(&mut dropped);
        assert!(tail.offsets().is_empty());
    }
}
