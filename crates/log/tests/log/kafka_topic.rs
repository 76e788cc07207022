//! The topic keeps every record. A topic the Kafka log creates is created
//! with `KEEP_EVERY_RECORD`; one found with settings that would delete or
//! lose records (a finite retention, compaction, unclean leader election)
//! is refused on connect, and the
//! command the refusal names, run with Kafka's own tool, fixes it.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use reservoir_log::kafka::{
    log_partition_of_route, settings_that_delete, KafkaLog, KEEP_EVERY_RECORD,
};
use reservoir_log::LogError;
use reservoir_log::{EventLog, EventReader};
use reservoir_testkit::output_bounded;

use crate::fixtures;
use crate::kafka::{claimed_writer, config, kafka_tools, unique_topic, TOOL_LIMIT};

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client")
}

/// The topic's settings as the broker describes them.
async fn settings(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> BTreeMap<String, String> {
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .expect("describe");
    let resource = described
        .into_iter()
        .next()
        .expect("one topic")
        .expect("described");
    resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

async fn create(admin: &AdminClient<DefaultClientContext>, topic: &str, settings: &[(&str, &str)]) {
    let mut new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for (key, value) in settings {
        new = new.set(key, value);
    }
    for result in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topic")
    {
        result.expect("topic created");
    }
}

async fn refusal(brokers: &str, topic: &str) -> String {
    match KafkaLog::connect(config(brokers, topic, "w", 1)).await {
        Err(LogError::Invalid(message)) => message,
        Err(other) => panic!("refused, but not as invalid: {other}"),
        Ok(_) => panic!("topic {topic} was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_log_creates_keeps_every_record() {
    let brokers = require_broker!();
    let topic = unique_topic("keeps");
    KafkaLog::connect(config(&brokers, &topic, "w", 2))
        .await
        .expect("connect");
    let found = settings(&admin(&brokers), &topic).await;
    for (key, value) in KEEP_EVERY_RECORD {
        assert_eq!(found.get(key).map(String::as_str), Some(value), "{key}");
    }
    assert_eq!(
        settings_that_delete(|name| found.get(name).map(String::as_str)),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_that_would_delete_records_is_refused_until_fixed() {
    let brokers = require_broker!();
    let admin = admin(&brokers);
    // Each setting alone is refused, and named.
    for (bad, named) in [
        (
            ("retention.ms", "604800000"),
            "retention.ms=604800000 (7 days)",
        ),
        (
            ("retention.bytes", "1073741824"),
            "retention.bytes=1073741824",
        ),
        (
            ("cleanup.policy", "compact"),
            "cleanup.policy=compact: compaction keeps only",
        ),
        (
            ("unclean.leader.election.enable", "true"),
            "unclean.leader.election.enable=true: a failover may elect",
        ),
    ] {
        let topic = unique_topic("deleting");
        let mut given = vec![("retention.ms", "-1"), ("retention.bytes", "-1")];
        given.retain(|(key, _)| *key != bad.0);
        given.push(bad);
        create(&admin, &topic, &given).await;
        let message = refusal(&brokers, &topic).await;
        assert!(message.contains(named), "{named}: {message}");
    }

    // A topic with a 7-day retention (Apache Kafka's default) that is also
    // compacted: both are named, and the command in the refusal fixes it.
    let Some(home) = kafka_tools() else { return };
    let topic = unique_topic("defaults");
    create(
        &admin,
        &topic,
        &[
            ("retention.ms", "604800000"),
            ("cleanup.policy", "compact,delete"),
        ],
    )
    .await;
    let message = refusal(&brokers, &topic).await;
    for named in ["retention.ms=604800000", "cleanup.policy=compact,delete"] {
        assert!(message.contains(named), "{named}: {message}");
    }
    let (_, command) = message
        .split_once("kafka-configs.sh ")
        .expect("the refusal names the command");
    let mut tool = Command::new("java");
    tool.args(["-Xmx256m", "-cp", &format!("{home}/*")])
        .arg("kafka.admin.ConfigCommand")
        .args(command.split_whitespace());
    let output = output_bounded(&mut tool, "kafka-configs", TOOL_LIMIT);
    assert!(
        output.status.success(),
        "kafka-configs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The change reaches every broker's view shortly after the tool returns.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match KafkaLog::connect(config(&brokers, &topic, "w", 1)).await {
            Ok(_) => break,
            Err(err) if Instant::now() < deadline => {
                eprintln!("not yet: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("still refused after the fix: {err}"),
        }
    }
    let found = settings(&admin, &topic).await;
    assert_eq!(
        settings_that_delete(|name| found.get(name).map(String::as_str)),
        Vec::<String>::new()
    );
}

/// Partitions added to a topic after records were written: Kafka moves no
/// record, and placement is by the count, so most subject/routes would be
/// looked for where their history is not. A writer refuses the topic on
/// connect, naming the count; before the change it takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_whose_partition_count_changed_is_refused() {
    let brokers = require_broker!();
    let topic = unique_topic("repartitioned");
    // A subject whose records go to another partition once a third is added.
    let subject = (0..)
        .map(|i| format!("tenant-{i}"))
        .find(|s| {
            let placed = |n| log_partition_of_route(s, "chat.generate", n);
            placed(2) != placed(3)
        })
        .unwrap();
    let log = claimed_writer(config(&brokers, &topic, "w1", 2)).await;
    let p = log.log_partition_for(&fixtures::key(&subject));
    let epoch = log.held_claim(p).await.unwrap().epoch;
    log.append(vec![fixtures::record(&subject, "w1", epoch, 1, 2)])
        .await
        .expect("append");
    log.check_placement()
        .await
        .expect("placed by its own count");
    drop(log);

    let admin = admin(&brokers);
    for result in admin
        .create_partitions([&NewPartitions::new(&topic, 3)], &AdminOptions::new())
        .await
        .expect("add a partition")
    {
        result.expect("partition added");
    }
    let log = KafkaLog::connect(config(&brokers, &topic, "w2", 3))
        .await
        .expect("connect");
    assert_eq!(log.log_partitions(), 3);
    let refused = log.check_placement().await;
    let Err(LogError::Invalid(why)) = &refused else {
        panic!("a repartitioned topic was taken: {refused:?}")
    };
    assert!(why.contains("has 3 partitions"), "{why}");
    assert!(why.contains(&subject), "{why}");
}
