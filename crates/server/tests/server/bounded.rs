//! Bounded state, through the real `reservoir` binary: one partition serves
//! more than a million reservations (the old limit counted every record ever
//! made and locked the tenant out at 1,000,000) with a 1 s idempotency window;
//! memory holds what is open plus the window; a retry of one of the first ids,
//! long evicted, is answered from the on-disk index with its original record
//! and no second debit, before and after a SIGKILL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::crash::spawn_server_with;
use crate::support::*;

/// Reservations made: past the old lifetime limit of 1,000,000.
const RESERVATIONS: u64 = 1_000_100;
/// Concurrent clients driving them.
const CLIENTS: u64 = 64;

async fn post(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let r = client
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    split(r).await
}

async fn get(client: &reqwest::Client, base: &str, path: &str) -> (StatusCode, Value) {
    split(client.get(format!("{base}{path}")).send().await.unwrap()).await
}

async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    let r = client.get(format!("{base}/metrics")).send().await.unwrap();
    r.text().await.unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn reserve_body(id: &str, units: u64) -> Value {
    json!({"id": id, "subject": "tenant-big", "route": "chat", "units": units})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_admits_past_a_million_reservations_and_answers_evicted_ids() {
    let dir = crate::support::tempdir().unwrap();
    let mut server = spawn_server_with(dir.path(), &[]).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS as usize)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // Reserve-only traffic: the sweeper expires each lease after 1 s, and the
    // record leaves memory 1 s after that.
    let mut p = policy("tenant-big", "chat", 1, 1 << 40, 0);
    p.hold_ttl_ms = 1_000;
    p.idempotency_window_ms = 1_000;
    let (status, body) = post(
        &client,
        &server.base,
        "/v1/policies",
        json!({"accounting_epoch": "e", "policy": p}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, first) = post(
        &client,
        &server.base,
        "/v1/reservations",
        reserve_body("r-0", 7),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");

    let next = Arc::new(AtomicU64::new(1));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (client, base, next) = (client.clone(), server.base.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= RESERVATIONS {
                    return;
                }
                let (status, body) = post(
                    &client,
                    &base,
                    "/v1/reservations",
                    reserve_body(&format!("r-{i}"), 1),
                )
                .await;
                assert_eq!(status, StatusCode::CREATED, "reservation {i}: {body}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    eprintln!(
        "{RESERVATIONS} reservations in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Every lease expires and every record but the last window's leaves memory.
    let parts = eventually(Duration::from_secs(60), || async {
        let (_, parts) = get(&client, &server.base, "/v1/partitions").await;
        let p = parts.as_array()?.first()?.clone();
        (p["open_reservations"] == 0
            && p["evicted_reservations"].as_u64()? >= RESERVATIONS - 50_000)
            .then_some(p)
    })
    .await;
    assert_eq!(parts["reservations"], RESERVATIONS, "{parts}");
    assert!(
        parts["reservations_in_memory"].as_u64().unwrap() < 50_000,
        "{parts}"
    );
    let metrics = metrics_text(&client, &server.base).await;
    assert!(
        metric(&metrics, "reservoir_reservations_evicted_total") >= (RESERVATIONS - 50_000) as f64
    );
    // The gauge counts what the partition holds, not what was admitted.
    assert_eq!(
        metric(&metrics, "reservoir_reservations_in_memory"),
        parts["reservations_in_memory"].as_u64().unwrap() as f64
    );

    retried(&client, &server.base, &first).await;
    let metrics = metrics_text(&client, &server.base).await;
    assert!(metric(&metrics, "reservoir_retired_lookups_total{result=\"hit\"}") >= 1.0);

    // A SIGKILL: recovery (snapshot plus the log after it) still answers it.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let server = spawn_server_with(dir.path(), &[]).await;
    retried(&client, &server.base, &first).await;
    let (status, body) = post(
        &client,
        &server.base,
        "/v1/reservations",
        reserve_body("r-new", 1),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_conserved_at(&client, &server.base).await;
    // After recovery too: the records rebuilt from the snapshot and the log.
    let (_, parts) = get(&client, &server.base, "/v1/partitions").await;
    let metrics = metrics_text(&client, &server.base).await;
    assert_eq!(
        metric(&metrics, "reservoir_reservations_in_memory"),
        parts[0]["reservations_in_memory"].as_u64().unwrap() as f64,
        "{parts}"
    );
    let mut child = server.child;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A retry of the first reservation, long evicted, and what else may be asked
/// of it: answered from its record, and not a unit moves.
async fn retried(client: &reqwest::Client, base: &str, first: &Value) {
    let before = assert_conserved_at(client, base).await;
    // The first id, evicted long ago: its own record, not a new reservation.
    let (status, again) = post(client, base, "/v1/reservations", reserve_body("r-0", 7)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    for field in ["id", "reserved_units", "held_units", "expires_at_ms"] {
        assert_eq!(again[field], first[field], "{field}: {again} vs {first}");
    }
    assert_eq!(again["state"], "EXPIRED", "{again}");
    // Another request under the same id is refused, as within the window.
    let (status, other) = post(client, base, "/v1/reservations", reserve_body("r-0", 8)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    assert_eq!(problem_type(&other), "exists_with_different_digest");
    let (status, read) = get(client, base, "/v1/reservations/r-0").await;
    assert_eq!(
        (status, &read["state"]),
        (StatusCode::OK, &json!("EXPIRED"))
    );
    let (status, start) = post(
        client,
        base,
        "/v1/reservations/r-0/start",
        json!({"operation_id": "op-late"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{start}");
    // No second debit: every term as it was.
    let after = assert_conserved_at(client, base).await;
    assert_eq!(before, after);
}
