//! How the Kafka log is configured: brokers, topic, timeouts, and the named
//! workarounds for a broker's bugs ([`BrokerQuirks`]).

use super::*;

/// Workarounds for known bugs of a particular broker, off unless asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BrokerQuirks {
    /// A broker that follows the Kafka protocol (Apache Kafka, Redpanda, ...).
    #[default]
    None,
    /// tansu 0.6: a fetch from an offset inside a multi-record batch returns
    /// only the batches that start at or after it (the read steps back to find
    /// the batch), and ListOffsets answers one past the *first* offset of the
    /// last batch (the end of the log is read from fetches). In cluster mode the
    /// server also runs its rejoin watchdog (tansu can hand back a previous
    /// generation's assignment; see `reservoir_server::cluster::membership`).
    Tansu,
}

impl BrokerQuirks {
    /// Environment variable naming the broker's quirks: unset, empty or `none`,
    /// or `tansu`. Read by [`KafkaConfig::new`], so every binary and test that
    /// talks to one broker agrees on it.
    pub const ENV: &'static str = "RESERVOIR_BROKER_QUIRKS";

    pub fn parse(name: &str) -> Result<Self, String> {
        match name.trim() {
            "" | "none" => Ok(Self::None),
            "tansu" => Ok(Self::Tansu),
            other => Err(format!("{}={other:?}: expected none or tansu", Self::ENV)),
        }
    }

    fn from_env() -> Result<Self, String> {
        Self::parse(&std::env::var(Self::ENV).unwrap_or_default())
    }
}

/// Where and how the Kafka log connects.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// `bootstrap.servers`, e.g. `127.0.0.1:9092`.
    pub brokers: String,
    pub topic: String,
    /// Partition count used when the topic has to be created; an existing topic
    /// keeps its own count.
    pub partitions_for_new_topic: u32,
    pub replication_factor: i32,
    /// This writer's stable identity (node id + boot id). Records appended must
    /// carry it; claims are made in its name.
    pub writer_id: String,
    /// Upper bound for one broker round trip we wait on (metadata, watermarks, a
    /// read), and for a read-back to find its records.
    pub request_timeout: Duration,
    /// `message.timeout.ms`: how long the producer keeps retrying a record before
    /// the append fails.
    pub delivery_timeout: Duration,
    /// `fetch.min.bytes` of the readers: how much a fetch waits to gather (up
    /// to `fetch.wait.max.ms`, 100 ms on a broker that follows the protocol)
    /// before the broker answers. 1 (the default) for a writer, whose
    /// read-back waits on every append; a follower that only projects (see
    /// [`KafkaConfig::FOLLOWER_FETCH_MIN_BYTES`]) trades up to that wait of
    /// freshness for a broker not woken by every record.
    pub reader_fetch_min_bytes: u32,
    /// Extra librdkafka settings for every client (tests use this for mock
    /// clusters and tighter timeouts).
    pub client_overrides: Vec<(String, String)>,
    /// Workarounds for the broker's bugs; from [`BrokerQuirks::ENV`] (an
    /// invalid value makes [`KafkaLog::connect`] fail).
    pub quirks: Result<BrokerQuirks, String>,
    /// Whether connect describes the topic and refuses one whose settings
    /// would delete records (see `topic.rs`). On, except for rdkafka's mock
    /// cluster in tests, which cannot describe a topic.
    pub check_topic_settings: bool,
}

impl KafkaConfig {
    /// [`KafkaConfig::reader_fetch_min_bytes`] for projectors. With every
    /// node's projector woken by every record, their fetches alone kept
    /// Apache Kafka busier than the writers' (bench-results/cluster.md).
    pub const FOLLOWER_FETCH_MIN_BYTES: u32 = 64 * 1024;

    pub fn new(brokers: impl Into<String>, writer_id: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: TOPIC_DEFAULT.to_string(),
            partitions_for_new_topic: 8,
            replication_factor: 1,
            writer_id: writer_id.into(),
            request_timeout: Duration::from_secs(10),
            delivery_timeout: Duration::from_secs(30),
            reader_fetch_min_bytes: 1,
            client_overrides: Vec::new(),
            quirks: BrokerQuirks::from_env(),
            check_topic_settings: true,
        }
    }

    /// The broker quirks in effect (none when the setting was invalid; connect
    /// refuses such a config).
    pub fn broker_quirks(&self) -> BrokerQuirks {
        self.quirks.clone().unwrap_or_default()
    }

    pub(super) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("client.id", format!("reservoir-{}", self.writer_id))
            .set(
                "socket.timeout.ms",
                self.request_timeout.as_millis().max(10).to_string(),
            )
            .set("log_level", "4");
        for (key, value) in &self.client_overrides {
            config.set(key, value);
        }
        config
    }
}
