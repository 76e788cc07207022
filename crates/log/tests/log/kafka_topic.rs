//! The topic keeps every record. A topic the Kafka log creates is created
//! with `KEEP_EVERY_RECORD`; one found with settings that would delete or
//! lose records (a finite retention, compaction, unclean leader election)
//! is refused on connect, and the
//! command the refusal names, run with Kafka's own tool, fixes it.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use reservoir_log::kafka::{settings_that_delete, KafkaLog, KEEP_EVERY_RECORD};
use reservoir_log::LogError;
use reservoir_testkit::output_bounded;

use crate::kafka::{config, kafka_tools, unique_topic, TOOL_LIMIT};

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
