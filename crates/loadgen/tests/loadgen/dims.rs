//! The three-dimension Redis + Lua baseline (`reserve_dims.lua`,
//! `settle_dims.lua`) against a real `redis-server`: one EVALSHA holds in the
//! three buckets or in none, the refusal names the limiting dimension, settle
//! refunds or charges each dimension from its usage (debt where available
//! lacks it, which then refuses), retries are idempotent, and every bucket's
//! books balance against the lease records: opening + minted = tokens + held + spent.

use super::redis;
use reservoir_loadgen::redis_dims::{DimKeys, THREE};
use reservoir_loadgen::redis_ledger::{BucketPolicy, RedisLedger, Reply};
use reservoir_loadgen::run::{run, Dims, RunConfig, Stop, Target};
use std::time::Duration;

/// Lease field of dimension `i` (0-based): `amount`/`used` for the first.
fn field(base: &str, i: usize) -> String {
    if i == 0 {
        base.to_string()
    } else {
        format!("{base}_{}", i + 1)
    }
}

/// Every bucket balances, and its held and spent counters are the sums over
/// the lease records, dimension by dimension.
async fn assert_dims_conserved(r: &mut RedisLedger, keys: &DimKeys) {
    let leases: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", keys.keys.lease_prefix()))
        .query_async(r.conn())
        .await
        .unwrap();
    for (i, bucket) in keys.buckets.iter().enumerate() {
        let books = r.books_of(bucket).await.unwrap();
        assert!(
            books.balanced(),
            "{bucket}: books do not balance: {books:?}"
        );
        let (mut held, mut spent) = (0i64, 0i64);
        for k in &leases {
            let (state, amount, used): (String, i64, Option<i64>) = redis::cmd("HMGET")
                .arg(k)
                .arg(&["state".to_string(), field("amount", i), field("used", i)])
                .query_async(r.conn())
                .await
                .unwrap();
            match state.as_str() {
                "held" | "started" => held += amount,
                "settled" => spent += used.unwrap(),
                _ => {}
            }
        }
        assert_eq!(books.held, held, "{bucket}: held vs lease records");
        assert_eq!(books.spent, spent, "{bucket}: spent vs lease records");
    }
}

/// `(tokens, held, spent, overdraft)` of every dimension.
async fn balances(r: &mut RedisLedger, keys: &DimKeys) -> Vec<(i64, i64, i64, i64)> {
    let mut all = Vec::new();
    for b in &keys.buckets {
        let books = r.books_of(b).await.unwrap();
        all.push((books.tokens, books.held, books.spent, books.overdraft));
    }
    all
}

fn at(r: &Reply) -> (&str, Vec<&str>) {
    (
        r.status.as_str(),
        r.fields.iter().map(String::as_str).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_three_dimensions_hold_together_and_settle_each_from_its_usage() {
    let Some(server) = redis().await else { return };
    let mut r = RedisLedger::connect(&server.url).await.unwrap();
    let keys = DimKeys::new("tenant-d", "chat", &THREE);
    assert_eq!(
        at(&r
            .reserve_dims(&keys, "a", "tenant-d", &[1, 1, 1])
            .await
            .unwrap()),
        ("NO_POLICY", vec!["1"])
    );
    // 10 requests, 10,000 input and 5,000 output tokens; refill 1 a day (none in the test).
    let bucket = |units, max_reservation_units| BucketPolicy {
        burst_units: units,
        opening_units: units,
        refill_units: 1,
        interval_ms: 86_400_000,
        max_reservation_units,
        ..BucketPolicy::default()
    };
    let policies = [bucket(10, 1), bucket(10_000, 10_000), bucket(5_000, 4_000)];
    let published = r.publish_dims(&keys, &policies).await.unwrap();
    assert!(
        published.iter().all(|p| p.status == "CREATED"),
        "{published:?}"
    );

    let too_large = r.reserve_dims(&keys, "big", "tenant-d", &[1, 10, 4_001]);
    assert_eq!(
        at(&too_large.await.unwrap()),
        ("TOO_LARGE", vec!["3", "4000"])
    );
    let held = r
        .reserve_dims(&keys, "a", "tenant-d", &[1, 500, 1_500])
        .await;
    let held = held.unwrap();
    assert_eq!(held.status, "HELD");
    assert_eq!(held.fields[1..], ["9", "9500", "3500"]);
    let after_a = vec![(9, 1, 0, 0), (9_500, 500, 0, 0), (3_500, 1_500, 0, 0)];
    assert_eq!(balances(&mut r, &keys).await, after_a);
    // Retries: the same amounts answer from the lease; other amounts conflict.
    let again = r
        .reserve_dims(&keys, "a", "tenant-d", &[1, 500, 1_500])
        .await;
    assert_eq!(at(&again.unwrap()), ("DUPLICATE", vec!["held"]));
    let other = r
        .reserve_dims(&keys, "a", "tenant-d", &[1, 500, 1_000])
        .await;
    assert_eq!(at(&other.unwrap()), ("CONFLICT", vec!["3", "1500"]));

    // Output alone is short: refused naming it, and nothing is debited anywhere.
    let refused = r
        .reserve_dims(&keys, "b", "tenant-d", &[1, 100, 3_600])
        .await;
    let refused = refused.unwrap();
    assert_eq!((refused.status.as_str(), refused.int(0)), ("REFUSED", 3));
    assert!(refused.int(1) > 0, "retry-after {refused:?}");
    // Input and output both short: the one whose refill takes longest is named.
    let both = r
        .reserve_dims(&keys, "c", "tenant-d", &[1, 9_600, 3_501])
        .await;
    assert_eq!(at(&both.unwrap()).1[0], "2");
    assert_eq!(balances(&mut r, &keys).await, after_a);

    assert_eq!(
        r.start(&keys.keys, "a", "op-a").await.unwrap().status,
        "STARTED"
    );
    // Input below its hold is refunded, output above it is drawn from available.
    let settled = r.settle_dims(&keys, "a", &[1, 480, 1_700]).await.unwrap();
    assert_eq!(at(&settled), ("SETTLED", vec!["0", "0", "20", "-200"]));
    let after_settle = vec![(9, 0, 1, 0), (9_520, 0, 480, 0), (3_300, 0, 1_700, 0)];
    assert_eq!(balances(&mut r, &keys).await, after_settle);
    let replay = r.settle_dims(&keys, "a", &[1, 480, 1_700]).await.unwrap();
    assert_eq!(at(&replay), ("SETTLED", vec!["1", "0", "20", "-200"]));
    let conflict = r.settle_dims(&keys, "a", &[1, 480, 1_701]).await.unwrap();
    assert_eq!(at(&conflict), ("CONFLICT", vec!["3", "1700"]));
    assert_eq!(balances(&mut r, &keys).await, after_settle);
    assert_dims_conserved(&mut r, &keys).await;

    // Output overshoots beyond what is available: debt in that dimension only,
    // and admission is frozen, even for a reserve asking nothing of it.
    let d = r.reserve_dims(&keys, "d", "tenant-d", &[1, 100, 100]).await;
    assert_eq!(d.unwrap().status, "HELD");
    let over = r.settle_dims(&keys, "d", &[1, 100, 3_500]).await.unwrap();
    assert_eq!(at(&over), ("SETTLED", vec!["0", "0", "0", "-3400"]));
    let in_debt = vec![(8, 0, 2, 0), (9_420, 0, 580, 0), (-200, 0, 5_200, 200)];
    assert_eq!(balances(&mut r, &keys).await, in_debt);
    let frozen = r.reserve_dims(&keys, "e", "tenant-d", &[1, 10, 0]).await;
    let frozen = frozen.unwrap();
    assert_eq!((frozen.status.as_str(), frozen.int(0)), ("REFUSED", 3));
    assert_eq!(balances(&mut r, &keys).await, in_debt);
    let unknown = r.settle_dims(&keys, "nope", &[1, 1, 1]).await.unwrap();
    assert_eq!(unknown.status, "UNKNOWN");
    assert_dims_conserved(&mut r, &keys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_three_dimension_contended_run_conserves_every_dimension() {
    let Some(server) = redis().await else { return };
    // Every bucket 20,000 with a fast refill: 24 clients holding 1,500 output
    // tokens each outrun the output bucket, so the run hits refusals and refills.
    let policy = BucketPolicy {
        burst_units: 20_000,
        refill_units: 100_000,
        interval_ms: 1000,
        opening_units: 20_000,
        ..BucketPolicy::default()
    };
    let dims = Dims {
        counted_input_tokens: 500,
        max_tokens: 1_500,
        reported_input_tokens: 480,
        output_tokens: 450,
    };
    let cfg = RunConfig {
        target: Target::Redis {
            url: server.url.clone(),
        },
        label: "test-3d".into(),
        clients: 24,
        subjects: 3,
        subject_prefix: "d-".into(),
        owned_only: false,
        subject_names: Vec::new(),
        route: "chat".into(),
        epoch: "2026-11".into(),
        units: 600,
        actual_units: 180,
        dims: Some(dims),
        stop: Stop::Cycles(1_500),
        warmup: Duration::ZERO,
        max_time: Duration::from_secs(30),
        max_errors: u64::MAX,
        policy,
        publish: true,
        run_id: "dims".into(),
        server_pid: None,
    };
    let summary = run(cfg.clone()).await.expect("run");
    assert!(summary.cycles > 0, "{summary:?}");
    assert_eq!(summary.dimensions, 3);
    assert!(
        summary.error_detail.keys().all(|k| k == "reserve: REFUSED"),
        "only refusals expected: {:?}",
        summary.error_detail
    );

    let mut r = RedisLedger::connect(&server.url).await.unwrap();
    let (mut spent, mut minted) = ([0i64; 3], [0i64; 3]);
    for s in 0..cfg.subjects {
        let keys = cfg.redis_keys(&cfg.subject(s));
        assert_eq!(keys.buckets.len(), 3);
        assert_dims_conserved(&mut r, &keys).await;
        for (i, b) in keys.buckets.iter().enumerate() {
            let books = r.books_of(b).await.unwrap();
            assert!(books.tokens + books.held <= 20_000, "{b}: above the burst");
            spent[i] += books.spent;
            minted[i] += books.minted;
        }
    }
    assert!(
        minted[2] > 0,
        "the run was meant to outlast the output opening"
    );
    // Every completed cycle spent 1 request, 480 input and 450 output tokens.
    let cycles = summary.cycles as i64;
    assert_eq!(spent, [cycles, cycles * 480, cycles * 450]);
}
