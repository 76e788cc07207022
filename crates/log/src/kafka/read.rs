//! Reading the topic: each log partition's reader (one librdkafka consumer),
//! the read loop, the partition's ends, how stored values are decoded, and
//! [`EventReader`] for the Kafka log.

use super::*;

/// Most entries a read allocates room for before it has seen them.
const READ_PREALLOC_ENTRIES_MAX: usize = 16_384;

/// How long a read waits for a first sign of data before it concludes it sits
/// inside a batch the broker will not serve from there (see `read_each`).
pub(super) const READ_PROBE: Duration = Duration::from_millis(100);

/// What a read makes of each stored value.
pub(super) type Decode<T> = fn(Position, &[u8]) -> Result<T, LogError>;

pub(super) fn decode_entry(position: Position, value: &[u8]) -> Result<LogEntry, LogError> {
    codec::decode(value).map_err(|e| LogError::Corrupt {
        position,
        reason: e.to_string(),
    })
}

/// Claims only: a record never changes validity state, so the writer's own
/// checks (claiming, reading back) look at the frame header and decode claims
/// alone. A value that is not even framed is still reported corrupt.
pub(super) fn decode_claim(position: Position, value: &[u8]) -> Result<Option<Claim>, LogError> {
    let corrupt = |reason: String| LogError::Corrupt { position, reason };
    let (id, _datum) = codec::split_frame(value).map_err(|e| corrupt(e.to_string()))?;
    let schema = codec::registry()
        .get(id)
        .ok_or_else(|| corrupt(format!("unknown schema id {id}")))?;
    if schema.subject.strip_prefix(codec::NAMESPACE) != Some(".Claim") {
        return Ok(None);
    }
    match codec::decode(value).map_err(|e| corrupt(e.to_string()))? {
        LogEntry::Claim(claim) => Ok(Some(claim)),
        LogEntry::Record(_) => Err(corrupt(format!(
            "schema id {id} is a claim but decoded as a record"
        ))),
    }
}

/// How far a read goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadTo {
    /// Entries known to exist (acknowledged): wait for every one before this offset.
    Acknowledged(u64),
    /// To the end of the log, as the broker's fetch responses report it.
    EndOfLog,
}

/// One read of a log partition: up to `max` entries from `from`, as far as
/// `to` says.
#[derive(Clone, Copy, Debug)]
pub(super) struct Read {
    pub log_partition: u32,
    pub from: u64,
    pub max: usize,
    pub to: ReadTo,
}

impl Read {
    /// One past the last offset the read may return.
    fn limit(&self) -> u64 {
        let limit = self.from.saturating_add(self.max as u64);
        match self.to {
            ReadTo::Acknowledged(until) => limit.min(until),
            ReadTo::EndOfLog => limit,
        }
    }
}

impl KafkaLog {
    /// The stored values of up to `max` entries of one log partition from
    /// `from_offset`, undecoded, handed to `each` in offset order as they
    /// arrive; fewer (possibly none) at the end of the log.
    ///
    /// For readers that decode on threads of their own (replay's decoder
    /// pool): [`EventReader::read`] decodes on the reading thread. Blocks the
    /// calling thread: call it from a thread, not a runtime worker.
    pub fn read_values_blocking(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
        mut each: impl FnMut(Position, &[u8]),
    ) -> Result<(), LogError> {
        self.check_partition(log_partition)?;
        let read = Read {
            log_partition,
            from: from_offset,
            max,
            to: ReadTo::EndOfLog,
        };
        self.inner.with_reader(log_partition, |reader| {
            self.inner.read_each(reader, read, |position, value| {
                each(position, value);
                Ok(())
            })
        })
    }
}

impl EventReader for KafkaLog {
    fn log_partition_for(&self, key: &PartitionKey) -> u32 {
        log_partition_of_route(&key.subject, &key.route, self.inner.log_partitions)
    }

    fn log_partitions(&self) -> u32 {
        self.inner.log_partitions
    }

    async fn read(
        &self,
        log_partition: u32,
        from_offset: u64,
        max: usize,
    ) -> Result<Vec<(Position, LogEntry)>, LogError> {
        self.check_partition(log_partition)?;
        let inner = self.inner.clone();
        let read = Read {
            log_partition,
            from: from_offset,
            max,
            to: ReadTo::EndOfLog,
        };
        blocking(move || {
            inner.with_reader(log_partition, |reader| {
                inner.read_locked(reader, read, decode_entry)
            })
        })
        .await?
    }

    async fn end_offset(&self, log_partition: u32) -> Result<u64, LogError> {
        self.check_partition(log_partition)?;
        let inner = self.inner.clone();
        blocking(move || inner.end_offset_blocking(log_partition)).await?
    }

    async fn wait_for(
        &self,
        log_partition: u32,
        offset: u64,
        timeout: Duration,
    ) -> Result<bool, LogError> {
        const POLL_INTERVAL: Duration = Duration::from_millis(20);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.end_offset(log_partition).await? > offset {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
        }
    }
}

/// A consumer assigned to one log partition, remembering where its fetch
/// position is so sequential reads do not move it (and re-fetch).
///
/// Its assignment is set once, by the first read, and never changed: later
/// reads move it with a seek, and resting pauses it. librdkafka 2.12 aborts
/// the process (librdkafka#5573) when a partition's assignment changes again
/// while the fetch stop of the previous change is still in flight, and a read
/// that answers at once (at the end of the log) can be followed by another
/// change within that window. A seek or a pause is not an assignment change.
/// A consumer a seek fails on (librdkafka refuses a seek while the fetcher is
/// not started, or the seek times out) is replaced by a fresh one; no test
/// makes a seek fail (a read past the end, then a read before it, seeks
/// fine), so that path is defensive.
pub(super) struct PartitionReader {
    consumer: BaseConsumer,
    fetch: Fetch,
    next_offset: Option<u64>,
    /// The highest end of the partition ListOffsets reported through this
    /// reader: entries before it exist, whatever a fetch said earlier.
    listed_end: u64,
}

/// Where a [`PartitionReader`]'s consumer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetch {
    /// Not assigned yet: the first read assigns it.
    Unassigned,
    /// Assigned, fetching in the background.
    Running,
    /// Paused by [`Inner::rest_reader`]; the next read resumes it.
    Paused,
}

impl Inner {
    fn reader<'a>(
        &self,
        slot: &'a mut Option<PartitionReader>,
    ) -> Result<&'a mut PartitionReader, LogError> {
        if slot.is_none() {
            *slot = Some(PartitionReader {
                consumer: build_consumer(&self.config)?,
                fetch: Fetch::Unassigned,
                next_offset: None,
                listed_end: 0,
            });
        }
        Ok(slot.as_mut().expect("reader just created"))
    }

    /// Stops the background fetching of a log partition's reader, if no read
    /// holds it (`false` if one does). An assigned librdkafka consumer keeps
    /// fetching into its queue (up to `queued.min.messages` entries) whether
    /// or not anyone polls it; a writer reads its partitions only on demand
    /// (the claim, recovery, a read-back over a gap), so after those its
    /// reader would fetch, and hold, everything appended since: broker work
    /// and memory for nothing. The reader is paused, which also makes what it
    /// had queued stale (librdkafka's version barrier discards it); the next
    /// read seeks and resumes it.
    pub(super) fn rest_reader(&self, log_partition: u32) -> bool {
        let Ok(mut slot) = self.readers[log_partition as usize].try_lock() else {
            return false;
        };
        if let Some(reader) = slot.as_mut().filter(|r| r.fetch == Fetch::Running) {
            match reader.consumer.pause(&self.partition_list(log_partition)) {
                Ok(()) => {
                    reader.fetch = Fetch::Paused;
                    reader.next_offset = None;
                }
                Err(error) => {
                    warn!(log_partition, %error, "could not pause a reader; it is replaced");
                    *slot = None;
                }
            }
        }
        true
    }

    /// Offset one past the last acknowledged entry.
    fn high_watermark(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
    ) -> Result<u64, LogError> {
        let (_low, high) = self.watermarks(reader, log_partition)?;
        Ok(u64::try_from(high).unwrap_or(0))
    }

    /// The partition's low and high watermarks. A broker that has just
    /// elected a leader can still answer NotLeaderForPartition for a moment
    /// (its own metadata lags what it told us), so leadership errors are
    /// retried until the request timeout has passed.
    fn watermarks(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
    ) -> Result<(i64, i64), LogError> {
        let deadline = Instant::now() + self.config.request_timeout;
        loop {
            match reader.consumer.fetch_watermarks(
                &self.config.topic,
                log_partition as i32,
                self.config.request_timeout,
            ) {
                Ok(marks) => return Ok(marks),
                Err(e) if leadership_moving(&e) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(log_error("watermarks", &e)),
            }
        }
    }

    /// Runs `read` with the reader of `log_partition`, held throughout (one
    /// read at a time per partition: a read moves the reader).
    pub(super) fn with_reader<R>(
        &self,
        log_partition: u32,
        read: impl FnOnce(&mut PartitionReader) -> Result<R, LogError>,
    ) -> Result<R, LogError> {
        let mut slot = self.readers[log_partition as usize]
            .lock()
            .expect("reader lock");
        read(self.reader(&mut slot)?)
    }

    /// [`Inner::read_each`], each value decoded into a vector.
    pub(super) fn read_locked<T>(
        &self,
        reader: &mut PartitionReader,
        read: Read,
        decode: Decode<T>,
    ) -> Result<Vec<(Position, T)>, LogError> {
        // Sized for the read up front: growing a vector of entries copies
        // every entry again (a tenth of a drained read's time in `perf`).
        let wanted = read.limit().saturating_sub(read.from);
        let mut entries = Vec::with_capacity(
            usize::try_from(wanted).map_or(READ_PREALLOC_ENTRIES_MAX, |n| {
                n.min(READ_PREALLOC_ENTRIES_MAX)
            }),
        );
        self.read_each(reader, read, |position, value| {
            entries.push((position, decode(position, value)?));
            Ok(())
        })?;
        Ok(entries)
    }

    /// The read loop: hands each stored value `read` covers to `each`, in
    /// offset order. The end of the log is where a fetch says so
    /// (PartitionEOF, or the high watermark of the last fetch response).
    ///
    /// With [`BrokerQuirks::Tansu`] only: a fetch from an offset inside a
    /// multi-record batch returns only the batches that *start* at or after it:
    /// the rest of the batch never comes, and no PartitionEOF either. So when
    /// nothing arrives for a probe interval, or the first offset that arrives is
    /// past the one we need, the read steps back (1, 2, 4, ... offsets) until a
    /// batch covers it, skipping what it already has. A broker that follows the
    /// protocol returns the whole batch and librdkafka skips the offsets before
    /// the one asked for, so neither case arises there.
    pub(super) fn read_each(
        &self,
        reader: &mut PartitionReader,
        read: Read,
        mut each: impl FnMut(Position, &[u8]) -> Result<(), LogError>,
    ) -> Result<(), LogError> {
        let Read {
            log_partition,
            from: from_offset,
            to,
            ..
        } = read;
        let timeout = self.config.request_timeout;
        let step_back_to_batch = self.config.broker_quirks() == BrokerQuirks::Tansu;
        let deadline = Instant::now() + timeout;
        let limit = read.limit();
        if from_offset >= limit {
            return Ok(());
        }
        let continuing = reader.next_offset == Some(from_offset);
        reader.next_offset = None;
        let mut moved_to = from_offset;
        let mut step_back = 1;
        if !continuing {
            self.move_to(reader, log_partition, from_offset)?;
        }
        // What is known to exist when the read is called (acknowledged to this
        // process's own producer, or reported by ListOffsets through this
        // reader) is there, whatever the last fetch response said: the end
        // below is never taken before it. Otherwise a read right after an
        // append, or after `end_offset`, would answer short from a fetch that
        // predates them.
        let known_end = self.standing[log_partition as usize]
            .lock()
            .expect("standing lock")
            .acknowledged_to()
            .max(reader.listed_end);
        let mut heard_since_move = continuing;
        let mut moved = Instant::now();
        let mut expected = from_offset;
        let mut last_transient: Option<LogError> = None;
        while expected < limit {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(LogError::Timeout(format!(
                    "reading log partition {log_partition} at offset {expected}: nothing within {timeout:?}{}",
                    last_transient.map(|e| format!(" (last error: {e})")).unwrap_or_default()
                )));
            }
            let at_end = |reader: &PartitionReader| {
                to == ReadTo::EndOfLog
                    && expected >= known_end
                    && self
                        .fetched_high_watermark(reader, log_partition)
                        .is_some_and(|high| expected >= high)
            };
            // What is queued first. With nothing queued and the read at the
            // end the last fetch response reported, answer now rather than
            // wait a probe for records that may never come (a projector step
            // paid READ_PROBE for every partition with nothing new). Not on
            // tansu, whose ListOffsets end `end_offset_blocking` corrects by
            // waiting for a fetch here.
            let polled = match reader.consumer.poll(Duration::ZERO) {
                Some(queued) => Some(queued),
                None if at_end(reader) && !step_back_to_batch => break,
                None => reader.consumer.poll(remaining.min(READ_PROBE)),
            };
            let message = match polled {
                None => {
                    if at_end(reader) {
                        break; // at the end, as the last fetch response says
                    }
                    if step_back_to_batch
                        && !heard_since_move
                        && moved.elapsed() >= READ_PROBE
                        && moved_to > 0
                    {
                        (moved_to, step_back) = (expected.saturating_sub(step_back), step_back * 2);
                        self.move_to(reader, log_partition, moved_to)?;
                        moved = Instant::now();
                    }
                    continue;
                }
                Some(Ok(message)) => message,
                // An end-of-partition event may have waited in the queue since
                // a fetch before entries known to exist were written.
                Some(Err(KafkaError::PartitionEOF(_))) => match to {
                    ReadTo::EndOfLog if expected >= known_end => break,
                    _ => continue,
                },
                Some(Err(error)) => {
                    let code = error.rdkafka_error_code();
                    if matches!(
                        code,
                        Some(
                            RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange
                        )
                    ) && to == ReadTo::EndOfLog
                    {
                        return self.beyond_end(reader, log_partition, from_offset);
                    }
                    let error = log_error("fetch", &error);
                    if !error.transient() {
                        return Err(error);
                    }
                    // librdkafka reconnects and refetches by itself; keep polling
                    // until the deadline.
                    last_transient = Some(error);
                    continue;
                }
            };
            heard_since_move = true;
            let offset = u64::try_from(message.offset()).expect("fetched offsets are not negative");
            if offset < expected {
                continue; // before what we need: left over, or stepped back over it
            }
            if step_back_to_batch && offset > expected && moved_to > 0 {
                // The batch holding `expected` starts before where we moved.
                (moved_to, step_back) = (expected.saturating_sub(step_back), step_back * 2);
                self.move_to(reader, log_partition, moved_to)?;
                (heard_since_move, moved) = (false, Instant::now());
                continue;
            }
            let position = Position {
                log_partition,
                offset,
            };
            each(position, message.payload().unwrap_or_default())?;
            expected = offset + 1;
        }
        reader.next_offset = Some(expected);
        Ok(())
    }

    /// Moves `reader` to fetch `log_partition` from `offset`, dropping what
    /// it had queued: the consumer's one assignment the first time, a seek
    /// after that (see [`PartitionReader`]).
    fn move_to(
        &self,
        reader: &mut PartitionReader,
        log_partition: u32,
        offset: u64,
    ) -> Result<(), LogError> {
        reader.next_offset = None;
        let at = Offset::Offset(kafka_offset(offset));
        if reader.fetch != Fetch::Unassigned {
            match reader.consumer.seek(
                &self.config.topic,
                log_partition as i32,
                at,
                self.config.request_timeout,
            ) {
                Ok(()) => {
                    if reader.fetch == Fetch::Paused {
                        reader
                            .consumer
                            .resume(&self.partition_list(log_partition))
                            .map_err(|e| log_error("resume", &e))?;
                        reader.fetch = Fetch::Running;
                    }
                    return Ok(());
                }
                Err(error) => {
                    debug!(log_partition, %error, "a reader could not seek; a fresh one is assigned");
                    release(std::mem::replace(
                        &mut reader.consumer,
                        build_consumer(&self.config)?,
                    ));
                    reader.fetch = Fetch::Unassigned;
                }
            }
        }
        let mut assignment = self.partition_list(log_partition);
        assignment
            .set_all_offsets(at)
            .map_err(|e| log_error("assign", &e))?;
        reader
            .consumer
            .assign(&assignment)
            .map_err(|e| log_error("assign", &e))?;
        reader.fetch = Fetch::Running;
        Ok(())
    }

    /// This log's topic and one of its partitions.
    fn partition_list(&self, log_partition: u32) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.config.topic, log_partition as i32);
        list
    }

    /// The high watermark of the last fetch response (`None` before any), as
    /// librdkafka caches it (`rd_kafka_get_watermark_offsets`, which the rdkafka
    /// crate does not wrap). No broker round trip.
    fn fetched_high_watermark(&self, reader: &PartitionReader, log_partition: u32) -> Option<u64> {
        let topic =
            std::ffi::CString::new(self.config.topic.as_str()).expect("topic names hold no NUL");
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer is valid while `reader` is borrowed; the
        // topic string outlives the call; low/high are valid out-pointers.
        let error = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                reader.consumer.client().native_ptr(),
                topic.as_ptr(),
                log_partition as i32,
                &mut low,
                &mut high,
            )
        };
        if error != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        u64::try_from(high).ok()
    }

    /// An end-of-log read asked for an offset the broker does not have: nothing
    /// there yet if it is at or past the end, an error if it is before the start
    /// (deleted by retention: this log never deletes).
    fn beyond_end(
        &self,
        reader: &PartitionReader,
        log_partition: u32,
        from_offset: u64,
    ) -> Result<(), LogError> {
        let (low, _high) = self.watermarks(reader, log_partition)?;
        if from_offset < u64::try_from(low).unwrap_or(0) {
            return Err(LogError::Storage(format!(
                "log partition {log_partition} starts at {low}, after the requested offset {from_offset}"
            )));
        }
        Ok(())
    }

    /// One past the last entry: the high watermark ListOffsets reports. With
    /// [`BrokerQuirks::Tansu`] that answer is a lower bound (tansu 0.6 answers
    /// one past the *first* offset of the last record batch) while the high
    /// watermark in fetch responses is exact, so it reads from there to the end.
    fn end_offset_blocking(&self, log_partition: u32) -> Result<u64, LogError> {
        self.with_reader(log_partition, |reader| {
            let listed = self.high_watermark(reader, log_partition)?;
            reader.listed_end = reader.listed_end.max(listed);
            if self.config.broker_quirks() != BrokerQuirks::Tansu {
                return Ok(listed);
            }
            // One before it is the last batch's first offset on tansu, the last
            // entry on Kafka: a fetch from there sees the true end either way.
            let tail = self.read_locked(
                reader,
                Read {
                    log_partition,
                    from: listed.saturating_sub(1),
                    max: usize::MAX,
                    to: ReadTo::EndOfLog,
                },
                decode_claim,
            )?;
            Ok(tail
                .last()
                .map_or(listed, |(position, _)| position.offset + 1)
                .max(listed))
        })
    }
}
