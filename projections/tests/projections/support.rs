//! A log built by driving the real core (`decide` / `apply`) and appending its
//! records to a real `EmbeddedLog` under a claim, like the server's writer does.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use reservoir_core::{
    apply, decide, refusal_event, Command, Event, EventBody, OperationId, Partition, PartitionKey,
    Policy, RefillRule, Rejection, RequestDigest, ReservationId, Usage,
};
use reservoir_log::embedded::EmbeddedLog;
use reservoir_log::kafka::{KafkaConfig, KafkaLog};
use reservoir_log::{Claim, EventLog, EventReader, Position, Record};
use reservoir_projections::{dump, store, Projections, Projector, ProjectorConfig};

pub struct Driver<L: EventLog = EmbeddedLog> {
    pub log: Arc<L>,
    /// The writer's claim on each log partition.
    claims: Vec<Claim>,
    pub partitions: BTreeMap<PartitionKey, Partition>,
    pending: Vec<Record>,
    /// Last appended position per log partition.
    pub last_positions: BTreeMap<u32, Position>,
}

impl Driver<EmbeddedLog> {
    pub async fn open(path: &Path, writer_id: &str) -> Self {
        let log = EmbeddedLog::open(path, writer_id).unwrap();
        let claim = log.claim(0).await.unwrap();
        Driver::with_claims(Arc::new(log), vec![claim])
    }

    /// Closes the log and reopens it as another writer, which claims it anew.
    pub async fn reopen(self, path: &Path, writer_id: &str) -> Self {
        assert!(self.pending.is_empty());
        let partitions = self.partitions;
        let last_positions = self.last_positions;
        drop(Arc::into_inner(self.log).expect("nobody else holds the log"));
        let mut driver = Self::open(path, writer_id).await;
        driver.partitions = partitions;
        driver.last_positions = last_positions;
        driver
    }
}

impl Driver<KafkaLog> {
    /// A fresh topic with `partitions` log partitions, every one claimed.
    pub async fn kafka(brokers: &str, partitions: u32) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let mut config = KafkaConfig::new(brokers, "writer-k");
        config.topic = format!("reservoir.test.projections.{}.{nanos}", std::process::id());
        config.partitions_for_new_topic = partitions;
        let log = KafkaLog::connect(config).await.unwrap();
        let mut claims = Vec::new();
        for lp in 0..log.log_partitions() {
            claims.push(log.claim(lp).await.unwrap());
        }
        Driver::with_claims(Arc::new(log), claims)
    }
}

impl<L: EventLog> Driver<L> {
    pub fn with_claims(log: Arc<L>, claims: Vec<Claim>) -> Self {
        Self {
            log,
            claims,
            partitions: BTreeMap::new(),
            pending: Vec::new(),
            last_positions: BTreeMap::new(),
        }
    }

    /// Decides and applies `command` like the writer; a limit refusal is logged.
    pub fn submit(
        &mut self,
        key: &PartitionKey,
        command: Command,
        now: u64,
    ) -> Result<(), Rejection> {
        let p = self.partitions.entry(key.clone()).or_default();
        let events = match decide(p, &command, now) {
            Ok(events) => Ok(events),
            Err(rejection) => match refusal_event(p, &command, &rejection, now) {
                Some(refusal) => {
                    apply(p, &refusal);
                    self.push(key, vec![refusal]);
                    return Err(rejection);
                }
                None => Err(rejection),
            },
        }?;
        let p = self.partitions.get_mut(key).unwrap();
        for e in &events {
            apply(p, e);
        }
        if !events.is_empty() {
            self.push(key, events);
        }
        Ok(())
    }

    /// Appends events nobody decided (a corrupt log), without applying them.
    pub fn push(&mut self, key: &PartitionKey, events: Vec<Event>) {
        let claim = &self.claims[self.log.log_partition_for(key) as usize];
        self.pending.push(Record {
            key: key.clone(),
            writer_id: claim.writer_id.clone(),
            claim_epoch: claim.epoch,
            events,
        });
    }

    pub async fn flush(&mut self) {
        let batch = std::mem::take(&mut self.pending);
        if batch.is_empty() {
            return;
        }
        for position in self.log.append(batch).await.unwrap() {
            self.last_positions.insert(position.log_partition, position);
        }
    }

    pub fn open_partition(&mut self, key: &PartitionKey, policy: Policy, now: u64) {
        self.submit(
            key,
            Command::OpenPartition {
                key: key.clone(),
                policy,
            },
            now,
        )
        .unwrap();
    }
}

pub fn key(tenant: &str, route: &str) -> PartitionKey {
    PartitionKey::new(tenant, route, "2026-07-19T14:00Z", 1).unwrap()
}

/// Deterministic generator (xorshift64*), fixed seed: no runtime randomness.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn digest(n: u64) -> RequestDigest {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&n.to_be_bytes());
    RequestDigest(d)
}

/// The partitions the mixed scenario runs on, and one it corrupts.
pub fn mixed_keys() -> Vec<PartitionKey> {
    vec![key("t1", "chat"), key("t1", "summarize"), key("t2", "chat")]
}

pub fn corrupt_key() -> PartitionKey {
    key("t3", "chat")
}

/// A scenario over several partitions and tenants: reserves of assorted
/// sizes (some refused), settles below and above the reservation, overdraft
/// and the debt freeze, refills repaying debt, releases and expiries. Each
/// reservation's fate is drawn when it is made, from a fixed seed.
pub struct Mixed {
    rng: Rng,
    round: u64,
    next_id: u64,
    schedule: BTreeMap<u64, Vec<(PartitionKey, Command)>>,
}

pub const ROUND_MS: u64 = 1_000;

impl Mixed {
    pub fn new<L: EventLog>(driver: &mut Driver<L>) -> Self {
        for key in mixed_keys().into_iter().chain([corrupt_key()]) {
            let mut policy = Policy::example(&key.subject, &key.route, 1);
            policy.hold_ttl_ms = 5_000;
            driver.open_partition(&key, policy, 0);
        }
        Self {
            rng: Rng::new(0xC0FFEE),
            round: 0,
            next_id: 0,
            schedule: BTreeMap::new(),
        }
    }

    /// Runs `rounds` rounds (one simulated second each) and flushes once.
    pub async fn run<L: EventLog>(&mut self, driver: &mut Driver<L>, rounds: u64) {
        for _ in 0..rounds {
            self.round += 1;
            let now = self.round * ROUND_MS;
            if self.round == 3 {
                // A corrupt record: a sequence gap nobody decided.
                let p = &driver.partitions[&corrupt_key()];
                let bogus = Event {
                    further: Vec::new(),
                    sequence: p.last_sequence + 5,
                    at_ms: now,
                    body: EventBody::Closed,
                };
                driver.push(&corrupt_key(), vec![bogus]);
            }
            for (key, command) in self.schedule.remove(&self.round).unwrap_or_default() {
                let _ = driver.submit(&key, command, now);
            }
            for key in mixed_keys().into_iter().chain([corrupt_key()]) {
                let _ = driver.submit(&key, Command::Refill, now);
                self.reserve(driver, &key, now);
            }
        }
        driver.flush().await;
    }

    fn reserve<L: EventLog>(&mut self, driver: &mut Driver<L>, key: &PartitionKey, now: u64) {
        self.next_id += 1;
        let n = self.next_id;
        let id = ReservationId::new(format!("r{n}")).unwrap();
        let units = 300 + self.rng.below(3_000);
        let command = Command::Reserve {
            further_units: Vec::new(),
            id: id.clone(),
            digest: digest(n),
            units,
            sizing: None,
        };
        if driver.submit(key, command, now).is_err() {
            return;
        }
        let start = Command::Start {
            id: id.clone(),
            operation_id: OperationId::new(format!("op{n}")).unwrap(),
        };
        let settle = |actual_units| Command::Settle {
            further_actual_units: Vec::new(),
            id: id.clone(),
            operation_id: None,
            actual_units,
            usage: mixed_usage(n, actual_units),
        };
        let r = self.round;
        let mut at = |round: u64, command: Command| {
            self.schedule
                .entry(round)
                .or_default()
                .push((key.clone(), command));
        };
        match self.rng.below(8) {
            0..=3 => {
                // Settle below or a little above the reservation.
                let actual = units * (30 + self.rng.below(100)) / 100;
                at(r + 1, start);
                at(r + 3, settle(actual.max(1)));
            }
            4 => at(r + 2, Command::Release { id: id.clone() }),
            5 => at(r + 7, Command::Expire { id: id.clone() }),
            _ => {
                // Far above: takes from available, then overdraft and debt.
                let actual = units * 4;
                at(r + 1, start);
                at(r + 2, settle(actual));
            }
        }
    }
}

/// The usage a mixed-scenario settle reports, by reservation number: none,
/// one of two models with an input/output split (input counted 3% low), or
/// counted input only (no output tokens: the digest falls back to `default`).
fn mixed_usage(n: u64, actual_units: u64) -> Option<Usage> {
    let counted = actual_units / 5;
    let reported = counted + counted * 3 / 100;
    let split = |model: &str| Usage {
        cache_read_input_tokens: None,
        model: Some(model.to_string()),
        output_tokens: Some(actual_units.saturating_sub(reported)),
        counted_input_tokens: Some(counted),
        reported_input_tokens: Some(reported),
    };
    // Four partitions reserve in turn: mix the round in, so each sees all four.
    match (n + n / 4) % 4 {
        0 => None,
        1 => Some(split("model-a")),
        2 => Some(split("model-b")),
        _ => Some(Usage {
            counted_input_tokens: Some(counted),
            ..Usage::default()
        }),
    }
}

pub fn config(read_entries_max: usize) -> ProjectorConfig {
    ProjectorConfig {
        read_entries_max,
        ..ProjectorConfig::default()
    }
}

/// A projection of `log` rebuilt from scratch in `dir`, in one go.
pub async fn rebuild<L: EventLog>(
    log: Arc<L>,
    dir: &Path,
    read_entries_max: usize,
) -> Vec<store::DumpEntry> {
    let db = store::open(dir).unwrap();
    let mut projector = Projector::open(log, db.clone(), config(read_entries_max)).unwrap();
    projector.catch_up().await.unwrap();
    dump(&db).unwrap()
}

/// Every projected partition conserves, and its balances are exactly what the
/// writer's own state says (for partitions the projection did not quarantine).
pub fn check_conservation<L: EventLog>(projections: &Projections, driver: &Driver<L>) {
    let at = projections.at();
    let balances = at.all_balances().unwrap();
    assert!(!balances.is_empty());
    for b in &balances {
        b.ledger.check().unwrap();
        let stored =
            reservoir_projections::projector::stored_partition(projections.db(), &b.key).unwrap();
        stored.partition.check_invariants().unwrap();
        if !b.quarantined {
            let live = &driver.partitions[&b.key];
            assert_eq!(b.ledger, live.ledger, "{}", b.key);
            let further: Vec<_> = b.dimensions.iter().map(|d| d.ledger).collect();
            let live_further: Vec<_> = live.further.iter().map(|d| d.ledger).collect();
            assert_eq!(further, live_further, "{}", b.key);
            assert_eq!(b.debt_units, live.debt_units());
            assert_eq!(b.last_sequence, live.last_sequence);
        }
    }
    // Roll-ups are the sums of their partitions.
    let tenants: std::collections::BTreeSet<_> =
        balances.iter().map(|b| b.key.subject.as_str()).collect();
    for tenant in tenants {
        let rollup = at.tenant_balance(tenant).unwrap().unwrap();
        let parts: Vec<_> = balances
            .iter()
            .filter(|b| b.key.subject == tenant)
            .collect();
        assert_eq!(rollup.partitions, parts.len() as u64);
        assert_eq!(
            rollup.ledger.spent_units,
            parts.iter().map(|b| b.ledger.spent_units).sum::<u64>()
        );
        assert_eq!(
            rollup.debt_units,
            parts.iter().map(|b| b.debt_units).sum::<u64>()
        );
        rollup.ledger.check().unwrap();
    }
}

// ---- the first seed's tenant: 120,000 tokens a minute, ~500-token prompts,
// skewed completions, ~30 s calls (diagnosis and scenario tests).

pub const SECOND_MS: u64 = 1_000;
pub const CALL_MS: u64 = 30_000;
pub const INPUT_UNITS: u64 = 500;
/// Tokens a minute of the contract.
pub const CONTRACT_PER_MINUTE: u64 = 120_000;

/// Output tokens: skewed (log-normal: median ≈ 1,785, mean ≈ 1,850, p90 ≈
/// 2,500, as the seed's route), clipped to [200, 4,000]. `z` is a sum of six
/// uniforms (mean 0, sd 1/√2), scaled to the log-normal's σ ≈ 0.264.
pub fn output_units(rng: &mut Rng) -> u64 {
    let z: f64 = (0..6)
        .map(|_| rng.next() as f64 / (1u64 << 53) as f64)
        .sum::<f64>()
        - 3.0;
    ((7.488 + 0.373 * z).exp().round() as u64).clamp(200, 4_000)
}

/// 120,000 tokens a minute, bucket of one minute.
pub fn contract(tenant: &str, route: &str) -> Policy {
    let mut policy = Policy::example(tenant, route, 1);
    policy.refill = RefillRule {
        units: CONTRACT_PER_MINUTE,
        interval_ms: 60_000,
    };
    policy.burst_units = 120_000;
    policy.opening_units = 120_000;
    policy.max_reservation_units = 120_000;
    policy.max_overdraft_units = 60_000;
    policy
}

/// Arrivals at `per_minute` calls a minute, spread evenly.
pub fn steady(t: u64, per_minute: u64) -> u64 {
    (t + 1) * per_minute / 60 - t * per_minute / 60
}
