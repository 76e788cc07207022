//! decide + apply throughput for full reserve → start → settle cycles on one
//! thread: the single-writer hot path of a partition owner, without I/O.
//!
//! `cargo bench -p reservoir-core --bench cycle`. Throughput is in commands (three
//! per cycle). Commands are built before the timed loop; the partition is swapped
//! for a freshly opened one (untimed) every `pool` cycles, so the record map
//! holds 0..pool records (finished records stay for the idempotency window,
//! the policy's default 10 minutes, capped at
//! `MAX_FINISHED_IN_MEMORY_PER_PARTITION`). Lookups in that map dominate the
//! profile, so the main variant uses a realistic 100,000.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use reservoir_core::policy::MAX_UNITS;
use reservoir_core::retention::MAX_FINISHED_IN_MEMORY_PER_PARTITION;
use reservoir_core::*;

const POOL: usize = 100_000;
const SMALL_POOL: usize = 10_000;
const _: () = assert!(POOL <= MAX_FINISHED_IN_MEMORY_PER_PARTITION);

fn policy(refill_units_per_ms: Units) -> Policy {
    Policy {
        burst_units: MAX_UNITS,
        opening_units: MAX_UNITS,
        refill: RefillRule {
            units: refill_units_per_ms,
            interval_ms: 1,
        },
        ..Policy::example("tenant-7", "chat.generate", 31)
    }
}

fn opened(policy: Policy) -> Partition {
    let key = PartitionKey::new("tenant-7", "chat.generate", "2026-07-19T14:00Z", 31).unwrap();
    let mut p = Partition::default();
    for e in decide(&p, &Command::OpenPartition { key, policy }, 0).unwrap() {
        apply(&mut p, &e);
    }
    p
}

/// One cycle's three commands, with realistic id lengths (a ULID-like id).
fn cycles(pool: usize) -> Vec<[Command; 3]> {
    (0..pool)
        .map(|i| {
            let id = ReservationId::new(format!("rl-01J{i:022}")).unwrap();
            let operation_id = OperationId::new(format!("op-{i:020}")).unwrap();
            [
                Command::Reserve {
                    further_units: Vec::new(),
                    id: id.clone(),
                    digest: RequestDigest([7; 32]),
                    units: 100,
                    sizing: None,
                },
                Command::Start {
                    id: id.clone(),
                    operation_id: operation_id.clone(),
                },
                Command::Settle {
                    further_actual_units: Vec::new(),
                    id,
                    operation_id: Some(operation_id),
                    actual_units: 60,
                    usage: None,
                },
            ]
        })
        .collect()
}

/// Runs `iters` cycles; `ms_per_cycle` > 0 makes every reserve carry a refill.
fn bench_cycles(
    c: &mut Criterion,
    name: &str,
    pool: usize,
    refill_units_per_ms: Units,
    ms_per_cycle: u64,
) {
    let commands = cycles(pool);
    let fresh = opened(policy(refill_units_per_ms));
    let mut partition = fresh.clone();
    let (mut next, mut now) = (0usize, 1u64);
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(3));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut began = Instant::now();
            for _ in 0..iters {
                if next == pool {
                    timed += began.elapsed();
                    partition = fresh.clone(); // the old map is dropped untimed
                    (next, now) = (0, 1);
                    began = Instant::now();
                }
                now += ms_per_cycle;
                for command in &commands[next] {
                    let events =
                        decide(&partition, command, now).expect("the cycle is always admitted");
                    for event in &events {
                        apply(&mut partition, event);
                    }
                    black_box(&events);
                }
                next += 1;
            }
            timed + began.elapsed()
        })
    });
    group.finish();
    partition
        .check_invariants()
        .expect("conservation holds after the benchmark");
}

fn reserve_start_settle(c: &mut Criterion) {
    // All commands in one writer millisecond: no refill events.
    bench_cycles(c, "reserve_start_settle", POOL, 0, 0);
    // The clock moves 1 ms per cycle: every reserve also carries a Refilled event.
    bench_cycles(c, "reserve_start_settle_with_refill", POOL, 60, 1);
    // A partition that never holds more than 10,000 records (a short idempotency window).
    bench_cycles(c, "reserve_start_settle_10k_records", SMALL_POOL, 0, 0);
}

criterion_group!(benches, reserve_start_settle);
criterion_main!(benches);
