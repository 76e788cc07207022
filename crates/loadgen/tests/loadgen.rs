//! Tests of the Redis + Lua baseline against a real `redis-server` started on a
//! free loopback port (one per test), and of the report's ratios. The
//! three-dimension scripts are tested in [`dims`].
//!
//! Without `redis-server` on the PATH the Redis tests are skipped with a loud
//! message, unless `CI` is set, where they fail (`scripts/setup` installs it).

use reservoir_loadgen::redis_ledger::{BucketPolicy, Keys, RedisLedger};
use reservoir_loadgen::report::{
    markdown, native_markdown, native_runs, parse_lines, parse_native, Labels,
};
use reservoir_loadgen::run::{run, subjects_in, RunConfig, Stop, Target};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "loadgen/dims.rs"]
mod dims;

/// A `redis-server` without persistence on 127.0.0.1, killed on drop.
struct Redis {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn redis() -> Option<Redis> {
    let installed = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        if std::env::var_os("CI").is_some() {
            panic!("redis-server is not installed in CI: scripts/setup should install it");
        }
        // Written to fd 2 directly: the test harness captures eprintln! of passing tests.
        use std::io::Write;
        let _ = std::io::stderr().write_all(
            b"\n!!!!!!!!!! SKIPPED: redis-server is not installed; run scripts/setup !!!!!!!!!!\n\n",
        );
        return None;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--dir")
        .arg(dir.path())
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning redis-server");
    let r = Redis {
        child,
        url: format!("redis://127.0.0.1:{port}"),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(c) = redis::Client::open(r.url.as_str()) {
            if let Ok(mut conn) = c.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
                {
                    return Some(r);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not answer within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the books of one bucket against its lease records.
async fn assert_conserved(r: &mut RedisLedger, keys: &Keys, burst: i64) {
    let books = r.books(keys).await.unwrap();
    assert!(books.balanced(), "books do not balance: {books:?}");
    assert!(
        books.tokens + books.held <= burst,
        "above the burst: {books:?}"
    );
    let lease_keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", keys.lease_prefix()))
        .query_async(r.conn())
        .await
        .unwrap();
    let (mut held, mut spent) = (0i64, 0i64);
    for k in &lease_keys {
        let (state, amount, used): (String, i64, Option<i64>) = redis::cmd("HMGET")
            .arg(k)
            .arg(&["state", "amount", "used"])
            .query_async(r.conn())
            .await
            .unwrap();
        match state.as_str() {
            "held" | "started" => held += amount,
            "settled" => spent += used.unwrap(),
            _ => {}
        }
    }
    assert_eq!(books.held, held, "held counter vs lease records");
    assert_eq!(books.spent, spent, "spent counter vs lease records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_books_balance_after_a_bounded_contended_run() {
    let Some(server) = redis().await else { return };
    // A small bucket with a slow refill, so the run also hits refusals and refills.
    let policy = BucketPolicy {
        burst_units: 6_000,
        refill_units: 30_000,
        interval_ms: 1000,
        opening_units: 6_000,
        ..BucketPolicy::default()
    };
    let cfg = RunConfig {
        target: Target::Redis {
            url: server.url.clone(),
        },
        label: "test".into(),
        clients: 24,
        subjects: 3,
        subject_prefix: "t-".into(),
        owned_only: false,
        subject_names: Vec::new(),
        route: "chat".into(),
        epoch: "2026-11".into(),
        units: 600,
        actual_units: 180,
        dims: None,
        stop: Stop::Cycles(1_500),
        warmup: Duration::ZERO,
        max_time: Duration::from_secs(30),
        max_errors: u64::MAX,
        policy: policy.clone(),
        publish: true,
        run_id: "conservation".into(),
        server_pid: None,
    };
    let summary = run(cfg.clone()).await.expect("run");
    assert!(summary.cycles > 0, "{summary:?}");
    assert!(
        summary.error_detail.keys().all(|k| k == "reserve: REFUSED"),
        "only refusals expected: {:?}",
        summary.error_detail
    );

    let mut r = RedisLedger::connect(&server.url).await.unwrap();
    let keys = Keys::new("t-1", "chat");
    // Leave one lease held, one started, and settle one above its reservation.
    assert_eq!(
        r.reserve(&keys, "left-held", "t-1", 100)
            .await
            .unwrap()
            .status,
        "HELD"
    );
    assert_eq!(
        r.reserve(&keys, "left-started", "t-1", 100)
            .await
            .unwrap()
            .status,
        "HELD"
    );
    assert_eq!(
        r.start(&keys, "left-started", "op").await.unwrap().status,
        "STARTED"
    );
    assert_eq!(
        r.reserve(&keys, "over", "t-1", 100).await.unwrap().status,
        "HELD"
    );
    let s = r.settle(&keys, "over", 250).await.unwrap();
    assert_eq!((s.status.as_str(), s.int(2)), ("SETTLED", -150));

    let (mut settled_cycles, mut minted) = (0, 0);
    for i in 0..cfg.subjects {
        let keys = Keys::new(&cfg.subject(i), "chat");
        assert_conserved(&mut r, &keys, policy.burst_units as i64).await;
        let b = r.books(&keys).await.unwrap();
        settled_cycles += b.spent;
        minted += b.minted;
    }
    assert!(
        minted > 0,
        "the run was meant to outlast the opening balance"
    );
    // Every measured cycle spent 180; the extra settle spent 250.
    assert_eq!(settled_cycles, summary.cycles as i64 * 180 + 250);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_reserve_start_settle_are_idempotent_and_refuse_cleanly() {
    let Some(server) = redis().await else { return };
    let mut r = RedisLedger::connect(&server.url).await.unwrap();
    let keys = Keys::new("tenant-x", "chat");
    assert_eq!(
        r.reserve(&keys, "a", "tenant-x", 10).await.unwrap().status,
        "NO_POLICY"
    );
    let policy = BucketPolicy {
        burst_units: 1_000,
        refill_units: 1,
        interval_ms: 60_000,
        opening_units: 1_000,
        max_reservation_units: 800,
        ..BucketPolicy::default()
    };
    assert_eq!(
        r.publish_policy(&keys, &policy).await.unwrap().status,
        "CREATED"
    );
    assert_eq!(
        r.publish_policy(&keys, &policy).await.unwrap().status,
        "STALE"
    );

    assert_eq!(
        r.reserve(&keys, "big", "tenant-x", 801)
            .await
            .unwrap()
            .status,
        "TOO_LARGE"
    );
    let held = r.reserve(&keys, "a", "tenant-x", 700).await.unwrap();
    assert_eq!((held.status.as_str(), held.int(1)), ("HELD", 300));
    // Same id and amount: answered from the lease, debited once.
    assert_eq!(
        r.reserve(&keys, "a", "tenant-x", 700).await.unwrap().status,
        "DUPLICATE"
    );
    assert_eq!(r.books(&keys).await.unwrap().tokens, 300);
    assert_eq!(
        r.reserve(&keys, "a", "tenant-x", 5).await.unwrap().status,
        "CONFLICT"
    );
    // Not enough left: refused with a retry hint, nothing written.
    let refused = r.reserve(&keys, "b", "tenant-x", 400).await.unwrap();
    assert_eq!(refused.status, "REFUSED");
    assert!(refused.int(0) > 0, "retry-after {refused:?}");

    assert_eq!(
        r.start(&keys, "nope", "op").await.unwrap().status,
        "UNKNOWN"
    );
    assert_eq!(r.start(&keys, "a", "op-1").await.unwrap().status, "STARTED");
    assert_eq!(r.start(&keys, "a", "op-1").await.unwrap().status, "STARTED");
    assert_eq!(
        r.start(&keys, "a", "op-2").await.unwrap().status,
        "CONFLICT"
    );

    let s = r.settle(&keys, "a", 200).await.unwrap();
    assert_eq!(s.fields, ["700", "200", "500", "0"]);
    // A retried settle is answered from the tombstone and credits nothing.
    let again = r.settle(&keys, "a", 200).await.unwrap();
    assert_eq!(again.fields, ["700", "200", "500", "1"]);
    assert_eq!(r.settle(&keys, "a", 300).await.unwrap().status, "CONFLICT");
    assert_eq!(r.settle(&keys, "nope", 1).await.unwrap().status, "UNKNOWN");
    let books = r.books(&keys).await.unwrap();
    assert_eq!((books.tokens, books.held, books.spent), (800, 0, 200));
    assert_conserved(&mut r, &keys, 1_000).await;
    assert_eq!(
        r.start(&keys, "a", "op-1").await.unwrap().status,
        "INVALID_STATE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_sweeper_refunds_expired_leases_once() {
    let Some(server) = redis().await else { return };
    let mut r = RedisLedger::connect(&server.url).await.unwrap();
    let keys = Keys::new("tenant-s", "chat");
    let policy = BucketPolicy {
        burst_units: 1_000,
        refill_units: 1,
        interval_ms: 60_000,
        opening_units: 1_000,
        hold_ttl_ms: 50,
        ..BucketPolicy::default()
    };
    r.publish_policy(&keys, &policy).await.unwrap();
    for id in ["x", "y", "z"] {
        assert_eq!(
            r.reserve(&keys, id, "tenant-s", 100).await.unwrap().status,
            "HELD"
        );
    }
    r.start(&keys, "y", "op").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(r.start(&keys, "x", "op").await.unwrap().status, "EXPIRED");
    let swept = r.sweep(&keys, 2).await.unwrap();
    assert_eq!(swept.status, "2", "bounded by the limit");
    let swept = r.sweep(&keys, 100).await.unwrap();
    assert_eq!((swept.status.as_str(), swept.int(0)), ("1", 100));
    assert_eq!(r.sweep(&keys, 100).await.unwrap().status, "0");
    let books = r.books(&keys).await.unwrap();
    assert_eq!((books.tokens, books.held, books.expired), (1_000, 0, 300));
    assert_eq!(
        r.settle(&keys, "y", 10).await.unwrap().status,
        "INVALID_STATE"
    );
    assert_conserved(&mut r, &keys, 1_000).await;
}

#[test]
fn report_gives_both_ratios_and_flags_errors() {
    let line = |label: &str, target: &str, cps: f64, errors: u64| {
        format!(
            r#"{{"label":"{label}","target":"{target}","clients":64,"subjects":8,"units":600,"actual_units":180,"warmup_s":2.0,"measured_s":10.0,"cycles":{c},"cycles_per_s":{cps},"cycle":{{"p50_us":1000,"p99_us":4000,"p999_us":5000,"max_us":6000,"mean_us":1200.0}},"reserve":{{"p50_us":300,"p99_us":1000,"p999_us":2000,"max_us":3000,"mean_us":400.0}},"start":{{"p50_us":300,"p99_us":1000,"p999_us":2000,"max_us":3000,"mean_us":400.0}},"settle":{{"p50_us":300,"p99_us":1000,"p999_us":2000,"max_us":3000,"mean_us":400.0}},"connections":64,"errors":{errors},"error_detail":{{}},"ok":{ok}}}"#,
            c = (cps * 10.0) as u64,
            ok = errors == 0
        )
    };
    let text = [
        line("reservoir", "reservoir", 6000.0, 0),
        line("redis-always", "redis", 4000.0, 0),
        line("redis-none", "redis", 12000.0, 3),
    ]
    .join("\n");
    let runs = parse_lines(&text).unwrap();
    let md = markdown(
        &runs,
        &Labels {
            reservoir: "reservoir",
            redis_always: "redis-always",
            redis_none: "redis-none",
            baseline: None,
        },
    );
    assert!(md.contains("**1.50×**"), "{md}");
    assert!(md.contains("**0.50×**"), "{md}");
    assert!(
        md.contains("bar (reservoir durable ≥ redis appendfsync always, no errors): **met**"),
        "{md}"
    );
    assert!(
        md.contains("runs with errors (numbers not comparable): redis-none"),
        "{md}"
    );

    // With rounds, ratios use the median of each label's runs.
    let text = format!("{text}\n{}", line("reservoir", "reservoir", 8000.0, 0));
    let md = markdown(
        &parse_lines(&text).unwrap(),
        &Labels {
            reservoir: "reservoir",
            redis_always: "redis-always",
            redis_none: "redis-none",
            baseline: None,
        },
    );
    assert!(
        md.contains("**1.75×** throughput (7000 vs 4000 cycles/s, medians of 2 and 1 runs)"),
        "{md}"
    );
}

#[test]
fn native_report_combines_script_windows_harmonically_and_gives_both_ratios() {
    let window = |label: &str, step: &str, requests: u64, full: u64, cpu: f64| {
        format!(
            r#"{{"label":"{label}","round":1,"client":"c","step":"{step}","clients":64,"seconds":10.0,"requests":{requests},"errors":0,"full_path":{full},"server_cpu_s":{cpu},"forks":0}}"#
        )
    };
    let text = [
        // wrk: 300k requests = 100k cycles in 10 s, 6 s of server CPU.
        r#"{"label":"reservoir-wrk","round":1,"client":"wrk","step":"cycle","clients":64,"seconds":10.0,"requests":300000,"cycles":100000,"errors":0,"server_cpu_s":6.0}"#.to_string(),
        // Redis with appendfsync always: 30k, 60k and 60k calls/s -> 15k cycles/s.
        window("redis-always-native", "reserve", 300_000, 300_000, 6.0),
        window("redis-always-native", "start", 600_000, 580_000, 6.0),
        window("redis-always-native", "settle", 600_000, 500_000, 6.0),
        // Without persistence: 20k cycles/s, one script with errors.
        window("redis-none-native", "reserve", 600_000, 600_000, 6.0),
        window("redis-none-native", "start", 600_000, 600_000, 6.0),
        window("redis-none-native", "settle", 600_000, 600_000, 6.0),
    ]
    .join("\n");
    let windows = parse_native(&text).unwrap();
    let runs = native_runs(&windows);
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[0].requests_per_s, 30_000.0);
    assert_eq!(runs[0].cycles_per_s, 10_000.0);
    assert!((runs[0].server_cpu_us_per_request.unwrap() - 20.0).abs() < 1e-9);
    assert!((runs[1].cycles_per_s - 15_000.0).abs() < 1e-6);
    assert!((runs[1].requests_per_s - 45_000.0).abs() < 1e-6);
    // (20 + 10 + 10) / 3 µs per request
    assert!((runs[1].server_cpu_us_per_request.unwrap() - 40.0 / 3.0).abs() < 1e-9);
    assert!(runs.iter().all(|r| r.ok()));

    let labels = Labels {
        reservoir: "reservoir",
        redis_always: "redis-always",
        redis_none: "redis-none",
        baseline: Some("baseline"),
    };
    let md = native_markdown(&windows, &labels);
    assert!(
        md.contains("reservoir-wrk ÷ redis-always-native (redis appendfsync always): **0.67×** cycles/s (10000 vs 15000)"),
        "{md}"
    );
    assert!(md.contains("**0.50×** cycles/s (10000 vs 20000)"), "{md}");
    assert!(md.contains("server CPU 20.0 vs 13.3 µs/request"), "{md}");
    assert!(md.contains("**not met**"), "{md}");
    // settle found a live lease in 83% of the calls: flagged as optimistic
    assert!(
        md.contains(
            "`redis-always-native` (round 1) settle: only 83% of the calls took the full path"
        ),
        "{md}"
    );
    assert!(!md.contains("start: only"), "{md}");
    assert!(!md.contains("FLAGGED"), "{md}");

    // A missing script window leaves the run incomplete and flagged.
    let partial = parse_native(&text.replace("\"step\":\"settle\"", "\"step\":\"other\"")).unwrap();
    let md = native_markdown(&partial, &labels);
    assert!(md.contains("a script's window is missing"), "{md}");
    assert!(md.contains("native runs with errors"), "{md}");

    // Redis appendfsync always with only its reserve window (the seeding of
    // start's leases failed): no cycles/s, and the bar is not met, however
    // fast the wrk run was.
    let reserve_only: String = text
        .lines()
        .filter(|l| !l.contains("redis-always-native") || l.contains("\"reserve\""))
        .collect::<Vec<_>>()
        .join("\n");
    let fast = reserve_only.replace(
        "\"requests\":300000,\"cycles\":100000",
        "\"requests\":3000000,\"cycles\":1000000",
    );
    let md = native_markdown(&parse_native(&fast).unwrap(), &labels);
    assert!(
        md.contains("redis-always-native (redis appendfsync always): n/a"),
        "{md}"
    );
    assert!(
        md.contains("≥ redis-always-native, no errors): **not met**"),
        "{md}"
    );
}

/// `--owned-only` picks the first subjects (by number) whose route lies in
/// the node's partitions (Kafka's murmur2 placement): every one picked is
/// owned, every number skipped below the last is not, and two nodes'
/// disjoint assignments never share a subject.
#[test]
fn owned_subjects_are_the_first_in_the_assigned_partitions() {
    use reservoir_core::placement::log_partition_of_route;
    let (mine, theirs) = (&[1, 4, 6][..], &[0, 2, 3, 5, 7][..]);
    let partition = |n: u32| log_partition_of_route(&format!("k2a-{n}"), "chat", 8);
    let picked = subjects_in("k2a-", "chat", 16, 8, mine).expect("partitions exist");
    let numbers: Vec<u32> = picked
        .iter()
        .map(|s| s.strip_prefix("k2a-").unwrap().parse().unwrap())
        .collect();
    assert_eq!(numbers.len(), 16);
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    for n in 1..=*numbers.last().unwrap() {
        assert_eq!(
            numbers.contains(&n),
            mine.contains(&partition(n)),
            "k2a-{n} lies in partition {}",
            partition(n)
        );
    }
    let other = subjects_in("k2a-", "chat", 16, 8, theirs).expect("partitions exist");
    assert!(picked.iter().all(|s| !other.contains(s)));
    // A node that owns nothing (or only partitions the topic lacks) gets no names.
    assert_eq!(subjects_in("k2a-", "chat", 16, 8, &[]), None);
    assert_eq!(subjects_in("k2a-", "chat", 16, 8, &[8, 9]), None);
}
