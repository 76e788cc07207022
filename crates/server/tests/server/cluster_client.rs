//! The client crate against two cluster nodes on Apache Kafka. Given the
//! cluster's nodes, the client learns the owner of a subject/route from the
//! first answer a node forwarded, and sends the later reserves of that route
//! and every later step of those reservations to the owner directly: the
//! node it was configured with forwards nothing more. When the owner is
//! SIGKILLed, the client forgets it, goes back through the configured node,
//! and its reserve completes once the partition is taken over. Every
//! acknowledged step is in the topic afterwards, and conservation holds.

use std::time::Duration;

use reservoir_client::{
    OperationId, ReservationId, ReservationState, ReserveRequest, RetryPolicy, Settlement,
};

use crate::cluster::*;
use crate::kafka::brokers;
use crate::support::*;

/// `reservoir_cluster_forwarded_total` on the node at `base`.
async fn forwarded(http: &reqwest::Client, base: &str) -> u64 {
    metric(http, base, "reservoir_cluster_forwarded_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_given_the_nodes_goes_to_the_owner_and_back_when_it_dies() {
    let Some(brokers) = brokers() else { return };
    let (topic, bases, mut nodes) = start_cluster(&brokers, "cluster-client", &["c1", "c2"]).await;
    let http = client();

    // A subject whose partition c2 serves; the client is configured with c1.
    let view = cluster_view(&http, &bases[0]).await;
    let c2 = served_by(&view, "c2");
    let subject = subject_where(|placed| c2.contains(&placed("chat")));
    publish(&http, &bases[0], &policy(&subject, "chat", 1, 100_000, 0)).await;

    let ledger = reservoir_client::Client::builder(&bases[0])
        .cluster_nodes(bases.clone())
        .retry(RetryPolicy {
            deadline: Duration::from_secs(60),
            ..RetryPolicy::default()
        })
        .build();
    let unlisted = reservoir_client::Client::new(&bases[0]);
    let mut acked = Acked::new();
    let cycle = |client: reservoir_client::Client, id: String| {
        let subject = subject.clone();
        async move {
            let rid = ReservationId::new(id.clone()).unwrap();
            let request = ReserveRequest::units(&subject, "chat", 10);
            let r = client.reserve_receipt(&rid, &request).await.unwrap();
            assert_eq!(r.state, ReservationState::Reserved, "{id}");
            let op = OperationId::new(format!("op-{id}")).unwrap();
            client.start(&rid, &op).await.unwrap();
            let settled = Settlement {
                actual_units: 4,
                operation_id: None,
                usage: None,
            };
            let r = client.settle(&rid, &settled).await.unwrap();
            assert_eq!(r.state, ReservationState::Settled, "{id}");
            (id, ("SETTLED".to_string(), Some(4)))
        }
    };

    // Without the nodes, every step through c1 is forwarded to c2.
    let before = forwarded(&http, &bases[0]).await;
    let (id, step) = cycle(unlisted.clone(), "u-0".into()).await;
    acked.insert(id, step);
    // (A retry after a 503 would be forwarded again: at least 3.)
    let unlisted_forwards = forwarded(&http, &bases[0]).await - before;
    assert!(unlisted_forwards >= 3, "{unlisted_forwards}");

    // With them, only the first reserve is; the answer names c2.
    let before = forwarded(&http, &bases[0]).await;
    for i in 0..5 {
        let (id, step) = cycle(ledger.clone(), format!("f-{i}")).await;
        acked.insert(id, step);
    }
    // Exactly 1 in a quiet cluster; a 503 on the way makes the client
    // forget c2 and ask c1 again, once.
    let listed_forwards = forwarded(&http, &bases[0]).await - before;
    assert!((1..=2).contains(&listed_forwards), "{listed_forwards}");
    assert_eq!(
        ledger.owner_of_route(&subject, "chat").as_deref(),
        Some(bases[1].as_str())
    );

    // The owner dies: the client forgets it and goes back through c1,
    // which serves the partition once it took it over.
    let _c2_port = nodes[1].take().unwrap().kill();
    let (id, step) = cycle(ledger.clone(), "k-0".into()).await;
    acked.insert(id, step);
    assert_eq!(ledger.owner_of_route(&subject, "chat"), None);
    // c1 holds every reservation now, the ones it recovered included.
    let held = acked.len() as f64;
    steadily("c1's reservations in memory", held, || {
        metric_sum(&http, &bases[0], "reservoir_reservations_in_memory")
    })
    .await;

    let replay = replay_and_check(&brokers, &topic, &acked).await;
    for id in acked.keys() {
        assert_eq!(replay.found[id].0, "SETTLED", "{id}");
    }
    drop(nodes);
}
