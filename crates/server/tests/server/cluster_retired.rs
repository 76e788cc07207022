//! A cluster node's partitions share one idempotency index. A reservation
//! that left memory (its idempotency window passed) is found there, and must
//! be placed in its own partition: `GET /v1/cluster/locate/{id}` (what a
//! peer asks when its own cache misses) answered the first local partition
//! whose writers found the id, any partition for a record on disk, and a
//! retried step sent there was decided by writers that do not hold the
//! subject/route. Here a node serving several partitions is asked for one
//! such reservation in each; then every one is retried through both nodes
//! and answered from the index, and the topic replays with conservation.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::cluster::*;
use crate::kafka::brokers;
use crate::support::*;

/// Lookups that found a record in the idempotency index of the node at `base`.
async fn retired_hits(http: &reqwest::Client, base: &str) -> u64 {
    metric(
        http,
        base,
        "reservoir_retired_lookups_total{result=\"hit\"}",
    )
    .await
}

/// reserve 10 → start → settle 4 of `id` on `subject`/chat through `base`.
async fn cycle(http: &reqwest::Client, base: &str, subject: &str, id: &str) -> Value {
    let (s, r) = post(
        http,
        base,
        "/v1/reservations",
        json!({"id": id, "subject": subject, "route": "chat", "units": 10}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    let path = format!("/v1/reservations/{id}/start");
    let (s, r) = post(
        http,
        base,
        &path,
        json!({"operation_id": format!("op-{id}")}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let path = format!("/v1/reservations/{id}/settle");
    let (s, r) = post(http, base, &path, json!({"actual_units": 4})).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_on_disk_is_found_in_its_own_partition() {
    let Some(brokers) = brokers() else { return };
    let (topic, bases, nodes) = start_cluster(&brokers, "cluster-retired", &["r1", "r2"]).await;
    let http = client();

    let view = cluster_view(&http, &bases[0]).await;
    let served = served_by(&view, "r1");
    assert!(served.len() >= 2, "r1 serves several partitions: {view:#}");
    // A subject placed in each partition r1 serves, its window short.
    let subjects: Vec<(u32, String)> = served
        .iter()
        .map(|&p| (p, subject_where(|placed| placed("chat") == p)))
        .collect();
    for (_, subject) in &subjects {
        let mut p = policy(subject, "chat", 1, 1_000, 0);
        p.idempotency_window_ms = 200;
        publish(&http, &bases[0], &p).await;
    }
    let mut settled = Vec::new();
    for (p, subject) in &subjects {
        let receipt = cycle(&http, &bases[0], subject, &format!("old-{p}")).await;
        settled.push((*p, subject.clone(), receipt));
    }
    // Past the window, the next event of each partition moves the old
    // record out of memory into the index.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // (The replay at the end sees the records in memory only: these.)
    let mut acked = Acked::new();
    for (p, subject) in &subjects {
        cycle(&http, &bases[0], subject, &format!("new-{p}")).await;
        acked.insert(format!("new-{p}"), ("SETTLED".to_string(), Some(4)));
    }

    let hits = retired_hits(&http, &bases[0]).await;
    for (p, _, _) in &settled {
        let (s, at) = get(&http, &bases[0], &format!("/v1/cluster/locate/old-{p}")).await;
        assert_eq!(s, StatusCode::OK, "old-{p}: {at}");
        assert_eq!(at["log_partition"], *p, "old-{p}");
    }
    // Found on disk, not in memory.
    assert!(
        retired_hits(&http, &bases[0]).await >= hits + settled.len() as u64,
        "the old records left memory"
    );

    // A retried settle through either node is answered from the index:
    // the same receipt, nothing decided again.
    for (p, _, receipt) in &settled {
        for base in &bases {
            let path = format!("/v1/reservations/old-{p}/settle");
            let (s, again) = post(&http, base, &path, json!({"actual_units": 4})).await;
            assert_eq!(s, StatusCode::OK, "{base} old-{p}: {again}");
            assert_eq!(again["state"], "SETTLED", "{again}");
            assert_eq!(again["log_position"], receipt["log_position"], "{again}");
        }
    }
    replay_and_check(&brokers, &topic, &acked).await;
    drop(nodes);
}
