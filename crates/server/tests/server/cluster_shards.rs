//! Emergency shards in cluster mode, two nodes on Apache Kafka sharing one
//! `--shard-key-file`. Both serve the same public key; a shard asked of
//! either node is issued by the owner of its subject/route (signed with the
//! shared key, so a gateway verifies it whichever node answered); a listing
//! without a route gathers the subject's shards from both nodes; and a shard
//! issued by a node that is then SIGKILLed reconciles on the node that took
//! its partition over, once (the repeat reminting nothing); meanwhile a
//! gathered list names the partitions nobody serves. Afterwards the
//! topic is replayed: conservation holds in every partition, and what was
//! reminted is what the reconcile confirmed unused. A node whose key file
//! others can read does not start.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reservoir_client::shards::{ShardBook, ShardDocument};
use reservoir_core::EmergencyMode;
use serde_json::{json, Value};

use crate::cluster::*;
use crate::generations::{assert_moves_pair, sum};
use crate::kafka::brokers;
use crate::support::*;

/// The shared key's seed (any 32 bytes; fixed, so the test knows the public key).
const SEED: [u8; 32] = [7; 32];

/// `POST /v1/shards` through `base` for gateway gw-1, boot epoch 7.
async fn issue(
    http: &reqwest::Client,
    base: &str,
    (subject, route): (&str, &str),
    id: &str,
    units: u64,
) -> (StatusCode, Value) {
    let body = json!({"subject": subject, "route": route, "units": units, "gateway_id": "gw-1",
                      "gateway_boot_epoch": 7, "ttl_ms": 600_000, "shard_id": id});
    post(http, base, "/v1/shards", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_are_issued_by_the_owner_and_reconciled_after_a_take_over() {
    let Some(brokers) = brokers() else { return };
    let keys = tempdir().unwrap();
    let key_file = keys.path().join("shard.key");
    write_new_file(&key_file, &hex::encode(SEED), 0o600);
    let extra = [
        "--shard-key-file".to_string(),
        key_file.display().to_string(),
    ];
    let (topic, bases, mut nodes) =
        start_cluster_with(&brokers, "cluster-shards", &["s1", "s2"], &extra).await;
    let http = client();

    // One key on both nodes: the file's.
    let expected = reservoir_server::shards::ShardSigner::from_seed(SEED).public_key_hex();
    for base in &bases {
        let (s, key) = get(&http, base, "/v1/shards/public-key").await;
        assert_eq!(s, StatusCode::OK, "{base}: {key}");
        assert_eq!(key["public_key"], expected, "{base}");
    }

    // A subject whose `chat` partition s2 serves and whose `embed` s1 does.
    let view = cluster_view(&http, &bases[0]).await;
    let (s1, s2) = (served_by(&view, "s1"), served_by(&view, "s2"));
    let subject =
        subject_where(|placed| s2.contains(&placed("chat")) && s1.contains(&placed("embed")));
    for route in ["chat", "embed"] {
        let mut p = policy(&subject, route, 1, 1_000, 0);
        p.emergency_mode = EmergencyMode::Enabled;
        publish(&http, &bases[0], &p).await;
    }

    // Each shard asked of the node that does not own its partition.
    let (s, chat) = issue(&http, &bases[0], (&subject, "chat"), "sh-chat", 300).await;
    assert_eq!(s, StatusCode::CREATED, "{chat}");
    let (s, embed) = issue(&http, &bases[1], (&subject, "embed"), "sh-embed", 200).await;
    assert_eq!(s, StatusCode::CREATED, "{embed}");
    // A gateway verifies both with the key any node serves.
    let book = ShardBook::new("gw-1", 7, &expected).unwrap();
    for doc in [&chat, &embed] {
        let doc: ShardDocument = serde_json::from_value(doc.clone()).unwrap();
        book.install(doc).unwrap();
    }
    // A retried issue through the other node is the same shard.
    let (s, again) = issue(&http, &bases[1], (&subject, "chat"), "sh-chat", 300).await;
    assert!(s.is_success(), "{s} {again}");
    assert_eq!(again["signature"], chat["signature"]);

    // Listed by route through either node, and without one from both.
    for base in &bases {
        let (s, list) = get(
            &http,
            base,
            &format!("/v1/shards?subject={subject}&route=chat"),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{list}");
        assert_eq!(list["outstanding_units"], 300, "{base}: {list}");
        let (s, list) = get(&http, base, &format!("/v1/shards?subject={subject}")).await;
        assert_eq!(s, StatusCode::OK, "{list}");
        assert_eq!(list["outstanding_units"], 500, "{base}: {list}");
        assert_eq!(list["shards"].as_array().unwrap().len(), 2, "{list}");
    }

    // Each node's shard gauges count its own partitions' shards.
    let outstanding = || async {
        let mut sum = 0.0;
        for base in &bases {
            sum += metric_sum(&http, base, "reservoir_shard_units_outstanding").await;
        }
        sum
    };
    steadily("shard units outstanding", 500.0, outstanding).await;

    // The owner of `chat` dies; s1 takes its partitions over and
    // reconciles the shard s2 issued.
    let _s2_port = nodes[1].take().unwrap().kill();
    // Until s1 has taken them over, nobody serves s2's partitions: a
    // gathered list names the ones it lacks.
    let mut named: BTreeSet<u32> = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let r = http
            .get(format!("{}/v1/partitions", bases[0]))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            match r.headers().get("x-reservoir-unserved-partitions") {
                Some(v) => named.extend(
                    v.to_str()
                        .unwrap()
                        .split(',')
                        .map(|p| p.parse::<u32>().unwrap()),
                ),
                None if !named.is_empty() => break,
                None => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !named.is_empty() && named.is_subset(&s2),
        "unserved {named:?}, s2 served {s2:?}"
    );
    wait_served(&http, &bases[0], &["s1"], true, Duration::from_secs(60)).await;
    // Served again: the list says which partitions answered, all of them.
    let r = http
        .get(format!("{}/v1/partitions", bases[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let all: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
    assert_eq!(
        r.headers()["x-reservoir-served-partitions"],
        all.join(",").as_str()
    );
    assert!(!r.headers().contains_key("x-reservoir-unserved-partitions"));
    let reconcile = json!({"shard": chat, "gateway_id": "gw-1", "gateway_boot_epoch": 7,
    "receipts": [
        {"reservation_id": "local-1", "state": "SETTLED", "used_units": 40},
        {"reservation_id": "local-2", "state": "RELEASED", "used_units": 0},
    ]});
    let path = "/v1/shards/sh-chat/reconcile";
    let (s, done) = post(&http, &bases[0], path, reconcile.clone()).await;
    assert_eq!(s, StatusCode::CREATED, "{done}");
    assert_eq!(done["spent_units"], 40, "{done}");
    assert_eq!(done["reminted_units"], 260, "{done}");
    let (s, repeat) = post(&http, &bases[0], path, reconcile).await;
    assert_eq!(s, StatusCode::OK, "{repeat}");
    assert_eq!(repeat["reminted_units"], 260, "{repeat}");
    assert_eq!(repeat["created"], false, "{repeat}");
    let (s, list) = get(&http, &bases[0], &format!("/v1/shards?subject={subject}")).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["outstanding_units"], 200, "{list}");
    steadily("shard units outstanding on s1", 200.0, || {
        metric_sum(&http, &bases[0], "reservoir_shard_units_outstanding")
    })
    .await;

    // Conservation in every partition of the topic; the remint counted once.
    replay_and_check(&brokers, &topic, &Acked::new()).await;
    let (s, parts) = get(&http, &bases[0], "/v1/partitions").await;
    assert_eq!(s, StatusCode::OK, "{parts}");
    let parts = parts.as_array().unwrap();
    for route in ["chat", "embed"] {
        assert_moves_pair(parts, &subject, route);
    }
    let of = |route, term| sum(parts, &subject, route, term);
    assert_eq!(of("chat", "retired_for_emergency_units"), 300);
    assert_eq!(of("chat", "reminted_units"), 260);
    assert_eq!(of("embed", "retired_for_emergency_units"), 200);
    assert_eq!(of("embed", "reminted_units"), 0);
    drop(nodes);
}

#[test]
fn a_cluster_node_whose_shard_key_others_can_read_does_not_start() {
    let Some(brokers) = brokers() else { return };
    let dir = tempdir().unwrap();
    let key_file = dir.path().join("shard.key");
    write_new_file(&key_file, &hex::encode(SEED), 0o644);
    let stderr = refused_at_start(
        &brokers,
        "reservoir.cluster-shards-key",
        &["--shard-key-file".into(), key_file.into()],
    );
    assert!(stderr.contains("readable by group or others"), "{stderr}");
}
