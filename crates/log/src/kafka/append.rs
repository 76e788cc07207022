//! The append path: what an append may go under (a partition's [`Standing`],
//! checked when `append` is called), the order appends are acknowledged in,
//! and the read-back that says whether a batch counts.
//!
//! `append` is two halves. Called, it checks the standing of every log
//! partition the batch touches, hands the records to the producer (so their
//! place in the log is fixed by the call) and takes its place in each
//! partition's chain of appends. Awaited, it waits for the broker's
//! acknowledgements, then for the append before it in each partition's chain
//! (a later append was decided on top of the earlier one, so it must not be
//! acknowledged if that one was not), then reads the partition back up to
//! everything acknowledged so far and answers only if no foreign claim took
//! the partition before its last record. The read-back is skipped when the
//! broker placed the append's records right after the last entry already
//! checked, one after the other: then nothing foreign lies between, which is
//! the steady state of a writer that holds its partition (a sole writer reads
//! nothing back at all). Any gap, a claim or anything else another producer
//! wrote, is read.
//!
//! Known limit: the producer cannot take back records behind one that failed.
//! If an in-flight request times out, librdkafka bumps the producer's epoch
//! and may then write later records without the failed ones. Those later
//! appends fail in doubt and the writer rebuilds from the log; a record whose
//! events no longer apply without the missing ones stops recovery (a corrupt
//! log, never served from). Records within one batch had the same exposure
//! before appends were pipelined.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use tokio::sync::oneshot;

use super::*;

/// What appends to one log partition may go under, and the latest append
/// called on it. Behind a plain mutex: `append` reads and updates it during
/// the call, before the returned future is first polled.
#[derive(Debug, Default)]
pub(super) struct Standing {
    admits: Admits,
    /// Told whether the latest append called on this partition was
    /// acknowledged; the next append waits for it, and fails if it was not.
    latest: Option<oneshot::Receiver<bool>>,
    /// One past the highest offset the broker acknowledged since the claim:
    /// a read-back reads this far, so appends in flight together are read
    /// back together.
    acknowledged_to: u64,
    /// Whether the partition's reader was paused since the claim (see
    /// [`Inner::rest_reader`]): the claim's scan and the recovery read leave
    /// it fetching in the background.
    reader_resting: bool,
}

#[derive(Debug, Default)]
enum Admits {
    /// This writer never claimed the partition (or lost the race for it).
    #[default]
    Unclaimed,
    Claim(Claim),
    /// A foreign claim took the partition: refused for good under this claim.
    Fenced,
    /// An append failed after records may have been written: refused until
    /// the writer claims again and rebuilds its state.
    InDoubt(String),
}

impl Standing {
    pub(super) fn claimed(&mut self, claim: Claim, claim_offset: u64) {
        *self = Standing {
            admits: Admits::Claim(claim),
            latest: None,
            acknowledged_to: claim_offset + 1,
            reader_resting: false,
        };
    }

    /// One past the highest offset acknowledged to this writer under its
    /// current claim (0 without one).
    pub(super) fn acknowledged_to(&self) -> u64 {
        self.acknowledged_to
    }

    pub(super) fn unclaimed(&mut self) {
        *self = Standing::default();
    }

    fn fenced(&mut self) {
        if !matches!(self.admits, Admits::Unclaimed) {
            self.admits = Admits::Fenced;
        }
    }

    /// Whether this put a held partition in doubt (fenced stays fenced).
    fn in_doubt(&mut self, reason: &str) -> bool {
        if matches!(self.admits, Admits::Claim(_)) {
            self.admits = Admits::InDoubt(reason.to_string());
            return true;
        }
        false
    }
}

/// An append's place in one log partition's chain.
struct Link {
    log_partition: u32,
    /// The claim its records were written under.
    claim: Claim,
    /// The append called before it on this partition, if it may still fail.
    earlier: Option<oneshot::Receiver<bool>>,
    /// Tells the next append whether this one was acknowledged (dropped
    /// unsent, it reads as not acknowledged).
    done: oneshot::Sender<bool>,
}

/// An append whose records are with the producer.
pub(super) struct QueuedAppend {
    enqueued: Enqueued,
    links: Vec<Link>,
}

impl KafkaLog {
    fn standing(&self, log_partition: u32) -> MutexGuard<'_, Standing> {
        self.inner.standing[log_partition as usize]
            .lock()
            .expect("standing lock")
    }

    pub(super) fn set_claimed(&self, log_partition: u32, claim: Claim, claim_offset: u64) {
        self.standing(log_partition).claimed(claim, claim_offset);
    }

    pub(super) fn set_unclaimed(&self, log_partition: u32) {
        self.standing(log_partition).unclaimed();
    }

    /// The claim appends to a log partition go under: refused if this writer
    /// never claimed it, fenced if it lost it, in doubt after an ambiguous failure.
    fn admitted(&self, log_partition: u32, standing: &Standing) -> Result<Claim, LogError> {
        match &standing.admits {
            Admits::Claim(claim) => Ok(claim.clone()),
            Admits::InDoubt(reason) => Err(LogError::InDoubt {
                log_partition,
                reason: reason.clone(),
            }),
            Admits::Fenced => Err(self.fenced(log_partition)),
            Admits::Unclaimed => Err(LogError::Invalid(format!(
                "log partition {log_partition} is not claimed by this writer"
            ))),
        }
    }

    /// After an append failed past the point where records may have been written,
    /// this writer's state may lack records that count: refuse further appends
    /// until it claims again (and rebuilds its state from the log).
    fn put_in_doubt(&self, log_partition: u32, error: &LogError) {
        if self.standing(log_partition).in_doubt(&error.to_string()) {
            warn!(log_partition, %error, "append failed with records possibly written; partition in doubt until re-claimed");
        }
    }

    /// The called half of `append`: refuses the batch with nothing written if
    /// a record is not ours under a claim we still hold (a fenced writer must
    /// not add more to the log), else hands every record to the producer and
    /// takes the batch's place in each partition's chain. The standings of the
    /// partitions it touches are locked together (in partition order, so two
    /// appenders cannot deadlock), so the chain order is the producer's order.
    fn enqueue_append(&self, batch: Vec<Record>) -> Result<QueuedAppend, LogError> {
        if batch.len() > APPEND_RECORDS_MAX {
            return Err(LogError::Invalid(format!(
                "batch of {} records exceeds {APPEND_RECORDS_MAX}",
                batch.len()
            )));
        }
        let entries: Vec<(u32, LogEntry)> = batch
            .into_iter()
            .map(|record| {
                (
                    self.log_partition_for(&record.key),
                    LogEntry::Record(record),
                )
            })
            .collect();
        let partitions: BTreeSet<u32> = entries.iter().map(|(p, _)| *p).collect();
        let mut standings: Vec<(u32, MutexGuard<'_, Standing>)> =
            partitions.iter().map(|&p| (p, self.standing(p))).collect();
        let mut claims: BTreeMap<u32, Claim> = BTreeMap::new();
        for (log_partition, standing) in &standings {
            claims.insert(*log_partition, self.admitted(*log_partition, standing)?);
        }
        for (log_partition, entry) in &entries {
            let (LogEntry::Record(record), Some(claim)) = (entry, claims.get(log_partition)) else {
                unreachable!("records only, each partition admitted above");
            };
            if record.writer_id != claim.writer_id || record.claim_epoch != claim.epoch {
                return Err(LogError::Invalid(format!(
                    "record written as {}@{} but this writer holds {}@{} on log partition {log_partition}",
                    record.writer_id, record.claim_epoch, claim.writer_id, claim.epoch
                )));
            }
        }
        for (log_partition, standing) in &mut standings {
            if !standing.reader_resting {
                standing.reader_resting = self.inner.rest_reader(*log_partition);
            }
        }
        let targets: Vec<(u32, &LogEntry)> = entries.iter().map(|(p, e)| (*p, e)).collect();
        let enqueued = self.enqueue(&targets)?;
        let mut links = Vec::with_capacity(standings.len());
        for (log_partition, standing) in &mut standings {
            if let Some(error) = &enqueued.failure {
                // Some records may be with the producer (and would count).
                standing.in_doubt(&error.to_string());
            }
            let (done, latest) = oneshot::channel();
            links.push(Link {
                log_partition: *log_partition,
                claim: claims.remove(log_partition).expect("admitted"),
                earlier: standing.latest.replace(latest),
                done,
            });
        }
        Ok(QueuedAppend { enqueued, links })
    }

    /// The awaited half of `append` (see the module docs).
    async fn settle(&self, queued: QueuedAppend) -> Result<Vec<Position>, LogError> {
        let QueuedAppend {
            enqueued,
            mut links,
        } = queued;
        let result = self.settle_links(enqueued, &mut links).await;
        for link in links {
            let _ = link.done.send(result.is_ok());
        }
        result
    }

    async fn settle_links(
        &self,
        enqueued: Enqueued,
        links: &mut [Link],
    ) -> Result<Vec<Position>, LogError> {
        let positions = match enqueued.acknowledged(self).await {
            Ok(positions) => positions,
            Err(error) => {
                // Some records may have been written (and would count).
                for link in links.iter() {
                    self.put_in_doubt(link.log_partition, &error);
                }
                return Err(error);
            }
        };
        let mut by_partition: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for position in &positions {
            by_partition
                .entry(position.log_partition)
                .or_default()
                .push(position.offset);
        }
        for (log_partition, offsets) in &by_partition {
            let last = *offsets.last().expect("at least one offset");
            let mut standing = self.standing(*log_partition);
            standing.acknowledged_to = standing.acknowledged_to.max(last + 1);
        }
        for link in links.iter_mut() {
            let Some(earlier) = link.earlier.take() else {
                continue;
            };
            if !matches!(earlier.await, Ok(true)) {
                let error = LogError::InDoubt {
                    log_partition: link.log_partition,
                    reason: "an earlier append to this partition failed, and this one was decided after it".into(),
                };
                self.put_in_doubt(link.log_partition, &error);
                let refusal = self.admitted(link.log_partition, &self.standing(link.log_partition));
                return Err(refusal.err().unwrap_or(error));
            }
        }
        for link in links.iter() {
            let offsets = &by_partition[&link.log_partition];
            self.verify(link.log_partition, &link.claim, offsets)
                .await?;
        }
        Ok(positions)
    }

    /// Checks, by reading the partition back, that our records at `offsets` (all
    /// in `log_partition`, ascending, written under `claim`) count. Fenced if a
    /// foreign claim took the partition before any of them; in doubt if the
    /// read-back fails. Reads on to every
    /// offset acknowledged so far: the appends in flight behind this one then
    /// find their records read back already.
    async fn verify(
        &self,
        log_partition: u32,
        claim: &Claim,
        offsets: &[u64],
    ) -> Result<(), LogError> {
        let mut ownership = self.inner.ownership[log_partition as usize].lock().await;
        let fenced = self.fenced(log_partition);
        let Ownership::Held {
            claim: held,
            claim_offset,
            validity,
            scanned_to,
            lost_at,
        } = &mut *ownership
        else {
            return Err(fenced);
        };
        if held != claim {
            // This writer claimed the partition again while the append was in
            // flight; its state is rebuilt from the log up to the new claim.
            return Err(LogError::Unavailable(format!(
                "log partition {log_partition} was claimed again while this append was in flight"
            )));
        }
        let last = *offsets.last().expect("verify is given at least one offset");
        if *scanned_to == offsets[0] && follow_each_other(offsets) {
            // Every entry from where the read-back stopped to our last record
            // is one of ours: no foreign claim can be among them, and there is
            // nothing to read. (Appends are verified in call order, so the one
            // before this ended where this one starts unless something else
            // was written between them.)
            *scanned_to = last + 1;
        }
        if *scanned_to <= last && lost_at.is_none() {
            let until = self.standing(log_partition).acknowledged_to.max(last + 1);
            if let Err(error) = self
                .scan_claims(log_partition, validity, scanned_to, lost_at, until)
                .await
            {
                // Written and acknowledged, but whether they count is unknown.
                self.put_in_doubt(log_partition, &error);
                return Err(error);
            }
        }
        let first = offsets[0];
        assert!(first > *claim_offset, "our records come after our claim");
        match *lost_at {
            Some(lost) if lost < last => Err(fenced),
            _ => Ok(()),
        }
    }
}

impl KafkaLog {
    /// This writer was fenced out of `log_partition`.
    fn fenced(&self, log_partition: u32) -> LogError {
        LogError::Fenced {
            writer_id: self.inner.config.writer_id.clone(),
            log_partition,
        }
    }

    /// Reads the claims of `log_partition` from `scanned_to` up to `until`
    /// into `validity`; the first newer claim it accepts sets `lost_at`.
    async fn scan_claims(
        &self,
        log_partition: u32,
        validity: &mut fence::Validity,
        scanned_to: &mut u64,
        lost_at: &mut Option<u64>,
        until: u64,
    ) -> Result<(), LogError> {
        let mut entries_seen = *scanned_to;
        while entries_seen < until {
            let want = usize::try_from(until - entries_seen)
                .unwrap_or(usize::MAX)
                .min(fence::ValidReader::READ_ENTRIES_MAX);
            let read = self.read_claims(log_partition, entries_seen, want).await?;
            self.inner
                .read_back_entries
                .fetch_add(read.len() as u64, Ordering::Relaxed);
            for (position, claim) in read {
                entries_seen = position.offset + 1;
                let Some(claim) = claim else { continue };
                let verdict = validity.observe(&LogEntry::Claim(claim));
                if verdict == Verdict::ClaimAccepted && lost_at.is_none() {
                    warn!(log_partition, offset = position.offset, by = ?validity.current_claim(), "fenced by a newer claim");
                    *lost_at = Some(position.offset);
                    self.standing(log_partition).fenced();
                }
            }
        }
        *scanned_to = entries_seen;
        self.inner.rest_reader(log_partition);
        Ok(())
    }

    /// [`EventLog::confirm_claim`]: reads the partition from where the last
    /// read-back stopped to its end, for a claim newer than ours.
    async fn confirm(&self, log_partition: u32, claim: &Claim) -> Result<(), LogError> {
        let until = self.end_offset(log_partition).await?;
        let mut ownership = self.inner.ownership[log_partition as usize].lock().await;
        let fenced = self.fenced(log_partition);
        let Ownership::Held {
            claim: held,
            validity,
            scanned_to,
            lost_at,
            ..
        } = &mut *ownership
        else {
            return Err(fenced);
        };
        if held != claim {
            return Err(LogError::Unavailable(format!(
                "log partition {log_partition} was claimed again since this answer was decided"
            )));
        }
        if lost_at.is_none() && *scanned_to < until {
            self.scan_claims(log_partition, validity, scanned_to, lost_at, until)
                .await?;
        }
        match lost_at {
            Some(_) => Err(fenced),
            None => Ok(()),
        }
    }
}

/// Whether `offsets` (ascending) are consecutive: nothing else was written
/// between the first and the last.
fn follow_each_other(offsets: &[u64]) -> bool {
    offsets.windows(2).all(|pair| pair[1] == pair[0] + 1)
}

impl EventLog for KafkaLog {
    /// Ordered (see the module docs): records are with the producer when
    /// `append` returns, and an append is acknowledged only after the one
    /// called before it on the same partition was.
    fn ordered_appends(&self) -> bool {
        true
    }

    /// A new claim clears the in-doubt state of the partition.
    async fn reclaim(&self, log_partition: u32) -> Result<Claim, LogError> {
        self.claim(log_partition).await
    }

    async fn confirm_claim(&self, log_partition: u32, claim: &Claim) -> Result<(), LogError> {
        self.check_partition(log_partition)?;
        self.confirm(log_partition, claim).await
    }

    fn append(
        &self,
        batch: Vec<Record>,
    ) -> impl std::future::Future<Output = Result<Vec<Position>, LogError>> + Send {
        let queued = (!batch.is_empty()).then(|| self.enqueue_append(batch));
        async move {
            match queued {
                None => Ok(Vec::new()),
                Some(queued) => self.settle(queued?).await,
            }
        }
    }
}
