//! A cluster's topic keeps the partition count its records were placed by.
//! Kafka adds partitions without moving records; a node started on a topic
//! that gained partitions would look for most subject/routes where their
//! history is not, and open them afresh. It refuses to start instead.

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::cluster::*;
use crate::kafka::brokers;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_a_topic_that_gained_partitions() {
    let Some(brokers) = brokers() else { return };
    let (topic, bases, mut nodes) = start_cluster(&brokers, "cluster-topic", &["t1"]).await;
    let http = client();
    // Policies of a dozen subjects: records in most partitions.
    for t in 0..12 {
        let subject = format!("tenant-{t}");
        publish(&http, &bases[0], &policy(&subject, "chat", 1, 1_000, 0)).await;
    }
    drop(nodes.remove(0));

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .expect("admin client");
    let grown = PARTITIONS + 2;
    for result in admin
        .create_partitions(
            [&NewPartitions::new(&topic, grown as usize)],
            &AdminOptions::new(),
        )
        .await
        .expect("add partitions")
    {
        result.expect("partitions added");
    }
    let stderr = refused_at_start(&brokers, &topic, &[]);
    assert!(
        stderr.contains(&format!("has {grown} partitions")),
        "{stderr}"
    );
}
