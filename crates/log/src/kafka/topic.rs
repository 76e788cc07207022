//! The topic the log lives in. The log is the ledger: recovery, a cluster
//! node's take-over, the projector's rebuild and every audit replay it from
//! its first record, so the topic must keep every record for ever.
//!
//! A topic this log creates is created so ([`KEEP_EVERY_RECORD`]). A topic
//! found already there (made by an operator, or by an earlier version that
//! took the broker's defaults) is described on connect, and one whose
//! settings would delete records is refused with the command that fixes
//! it: a finite `retention.ms` or `retention.bytes` (Apache Kafka's default
//! is 7 days) deletes the log's beginning, compaction keeps only the last
//! record of each subject/route (the record key), and unclean leader
//! election may lose acknowledged records on a failover.
//!
//! A writer also checks that the topic's partition count is the one its
//! records were placed by ([`KafkaLog::check_placement`]).

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

use super::*;

/// The settings that keep every record, set on a topic this log creates and
/// required of one it finds.
pub const KEEP_EVERY_RECORD: [(&str, &str); 4] = [
    ("retention.ms", "-1"),
    ("retention.bytes", "-1"),
    ("cleanup.policy", "delete"),
    ("unclean.leader.election.enable", "false"),
];

/// Makes sure the topic exists and keeps every record, with a leader for
/// every partition, and returns its partition count.
pub(super) async fn ensure_topic(config: &KafkaConfig) -> Result<u32, LogError> {
    let admin = admin_client(config)?;
    let checked = async {
        let count = find_or_create(config, &admin).await?;
        if config.check_topic_settings {
            check_keeps_every_record(config, &admin).await?;
        }
        Ok(count)
    }
    .await;
    release(admin);
    checked
}

/// Records read from the start of each partition by [`KafkaLog::check_placement`].
const PLACEMENT_SAMPLE: usize = 64;

impl KafkaLog {
    /// Refuses a topic whose partition count is not the one its records
    /// were placed by. A subject/route's records go to the partition its
    /// key hashes to among the topic's partitions, and Kafka adds
    /// partitions without moving a record: after an increase most
    /// subject/routes would be looked for, and opened afresh, where their
    /// history is not (their capacity granted again, their debt left
    /// behind). So the first records of every partition must be placed
    /// where they are. For writers (a node before it claims anything);
    /// readers place nothing. Each partition's reader is rested after its
    /// read, as after a claim: a node reads most partitions only if it
    /// takes them over.
    pub async fn check_placement(&self) -> Result<(), LogError> {
        let partitions = self.inner.log_partitions;
        for p in 0..partitions {
            let sample = self.read(p, 0, PLACEMENT_SAMPLE).await;
            self.inner.rest_reader(p);
            for (position, entry) in sample? {
                let LogEntry::Record(record) = entry else {
                    continue;
                };
                let (subject, route) = (&record.key.subject, &record.key.route);
                let placed = log_partition_of_route(subject, route, partitions);
                if placed != p {
                    return Err(LogError::Invalid(format!(
                        "topic {} has {partitions} partitions, but the record at partition {p} offset {} ({subject}/{route}) belongs in partition {placed} by that count: partitions were added after records were written (Kafka moves none), and every subject/route's history must stay where its requests go. Use a topic with the partition count its records were written with",
                        self.inner.config.topic, position.offset
                    )));
                }
            }
        }
        Ok(())
    }
}

fn admin_client(config: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>, LogError> {
    config
        .client_config()
        .create()
        .map_err(|e| log_error("create admin client", &e))
}

/// Describes the topic's settings and refuses it if they would delete a record.
async fn check_keeps_every_record(
    config: &KafkaConfig,
    admin: &AdminClient<DefaultClientContext>,
) -> Result<(), LogError> {
    let options = AdminOptions::new().request_timeout(Some(config.request_timeout));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(&config.topic)], &options)
        .await
        .map_err(|e| log_error("describe the topic's settings", &e))?;
    let resource = match described.into_iter().next() {
        Some(Ok(resource)) => resource,
        Some(Err(code)) => {
            return Err(log_error(
                "describe the topic's settings",
                &KafkaError::AdminOp(code),
            ))
        }
        None => {
            return Err(LogError::Unavailable(
                "describe the topic's settings: no answer".into(),
            ))
        }
    };
    let entries = resource.entry_map();
    let deleting = settings_that_delete(|name| entries.get(name).and_then(|e| e.value.as_deref()));
    if deleting.is_empty() {
        return Ok(());
    }
    let fix = KEEP_EVERY_RECORD
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    Err(LogError::Invalid(format!(
        "topic {topic} would delete ledger records ({found}); the log must keep every \
         record (recovery, take-overs and audits read it from the start). Fix the topic \
         with Kafka's tools: kafka-configs.sh --bootstrap-server {brokers} --alter \
         --entity-type topics --entity-name {topic} --add-config {fix}",
        topic = config.topic,
        found = deleting.join(", "),
        brokers = config.brokers,
    )))
}

/// Which of the topic's settings would delete records, each as `name=value`
/// (with what it means); empty when it keeps every record. `setting` gives a
/// setting's value as the broker reported it.
pub fn settings_that_delete<'a>(setting: impl Fn(&str) -> Option<&'a str>) -> Vec<String> {
    let mut deleting = Vec::new();
    for name in ["retention.ms", "retention.bytes"] {
        match setting(name) {
            Some("-1") => {}
            Some(value) => deleting.push(format!("{name}={value}{}", readable(name, value))),
            None => deleting.push(format!("{name} not reported")),
        }
    }
    match setting("cleanup.policy") {
        Some(policy) if policy.split(',').any(|p| p.trim() == "compact") => deleting.push(format!(
            "cleanup.policy={policy}: compaction keeps only the last record of each subject/route"
        )),
        Some(_) => {}
        None => deleting.push("cleanup.policy not reported".to_string()),
    }
    if setting("unclean.leader.election.enable") == Some("true") {
        deleting.push(
            "unclean.leader.election.enable=true: a failover may elect a replica that lacks \
             acknowledged records"
                .to_string(),
        );
    }
    deleting
}

/// ` (7 days)` for a retention in whole days, else nothing.
fn readable(name: &str, value: &str) -> String {
    const DAY_MS: u64 = 24 * 60 * 60 * 1000;
    match value.parse::<u64>() {
        Ok(ms) if name == "retention.ms" && ms > 0 && ms % DAY_MS == 0 => {
            format!(" ({} days)", ms / DAY_MS)
        }
        _ => String::new(),
    }
}

/// Finds the topic or creates it (keeping every record), waits until every
/// partition has a leader, and returns its partition count.
async fn find_or_create(
    config: &KafkaConfig,
    admin: &AdminClient<DefaultClientContext>,
) -> Result<u32, LogError> {
    let probe_config = config.clone();
    // A consumer, not the admin client: a metadata request naming a missing
    // topic from a producer-side client (the admin client is one) lets the
    // broker auto-create it with the broker's deleting defaults (seen on
    // Apache Kafka 4.2.2, whose `auto.create.topics.enable` is on by default).
    let probe = move || -> Result<Option<u32>, LogError> {
        let consumer = build_consumer(&probe_config)?;
        let count = partition_count(&consumer, &probe_config);
        release(consumer);
        count
    };
    if let Some(count) = blocking(probe.clone()).await?? {
        return Ok(count);
    }
    let mut topic = NewTopic::new(
        &config.topic,
        i32::try_from(config.partitions_for_new_topic)
            .map_err(|_| LogError::Invalid("partition count".into()))?,
        TopicReplication::Fixed(config.replication_factor),
    );
    for (key, value) in KEEP_EVERY_RECORD {
        topic = topic.set(key, value);
    }
    let options = AdminOptions::new().operation_timeout(Some(config.request_timeout));
    let results = admin
        .create_topics([&topic], &options)
        .await
        .map_err(|e| log_error("create topic", &e))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(log_error(
                    &format!("create topic {name}"),
                    &KafkaError::AdminOp(code),
                ))
            }
        }
    }
    // Metadata and leader election can lag a fresh topic for a moment.
    let deadline = Instant::now() + config.request_timeout;
    loop {
        if let Some(count) = blocking(probe.clone()).await?? {
            info!(topic = %config.topic, count, "created topic");
            return Ok(count);
        }
        if Instant::now() >= deadline {
            return Err(LogError::Timeout(format!(
                "topic {} not visible after creating it",
                config.topic
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn partition_count(
    client: &BaseConsumer,
    config: &KafkaConfig,
) -> Result<Option<u32>, LogError> {
    let metadata = client
        .fetch_metadata(Some(&config.topic), config.request_timeout)
        .map_err(|e| log_error("metadata", &e))?;
    let Some(topic) = metadata.topics().iter().find(|t| t.name() == config.topic) else {
        return Ok(None);
    };
    // Usable only once every partition has a leader: right after creation
    // the broker names the partitions before it has elected their leaders,
    // and a claim's read-back then fails with NotLeaderForPartition.
    let led = topic
        .partitions()
        .iter()
        .all(|p| p.leader() >= 0 && p.error().is_none());
    match topic.error() {
        None if !topic.partitions().is_empty() && led => Ok(Some(topic.partitions().len() as u32)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deleting(settings: &[(&str, &str)]) -> Vec<String> {
        settings_that_delete(|name| {
            settings
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| *value)
        })
    }

    #[test]
    fn only_infinite_retention_no_compaction_and_clean_elections_pass() {
        assert!(deleting(&KEEP_EVERY_RECORD).is_empty());
        assert_eq!(
            deleting(&[
                ("retention.ms", "604800000"),
                ("retention.bytes", "-1"),
                ("cleanup.policy", "delete")
            ]),
            ["retention.ms=604800000 (7 days)"]
        );
        assert_eq!(
            deleting(&[
                ("retention.ms", "-1"),
                ("retention.bytes", "1000"),
                ("cleanup.policy", "delete, compact")
            ]),
            [
                "retention.bytes=1000",
                "cleanup.policy=delete, compact: compaction keeps only the last record of each subject/route"
            ]
        );
        let mut unclean = KEEP_EVERY_RECORD;
        unclean[3].1 = "true";
        assert_eq!(
            deleting(&unclean),
            ["unclean.leader.election.enable=true: a failover may elect a replica that lacks acknowledged records"]
        );
        assert_eq!(
            deleting(&[("retention.ms", "-1")]),
            [
                "retention.bytes not reported",
                "cleanup.policy not reported"
            ]
        );
        assert_eq!(
            deleting(&[
                ("retention.ms", "3600001"),
                ("retention.bytes", "-1"),
                ("cleanup.policy", "delete")
            ]),
            ["retention.ms=3600001"]
        );
    }
}
