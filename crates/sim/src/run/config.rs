//! What a run is asked to do: its rounds, the bug it plants on purpose
//! ([`Plant`]), and the parts of the world it leaves out (each a
//! command-line flag, so a seed runs the interleaving it ran before that part
//! joined the simulator).

/// A bug the simulator plants on purpose, to show that the checker fails.
/// All live in the simulator, at the boundaries it owns (see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// A release in a closed generation is credited a second time into the
    /// active one (a `MoveIn` that never left): a refund applied twice.
    DoubleRefund,
    /// The moves of a generation switch reach the log without their debt (a
    /// codec that drops a field): debt not carried on a generation switch.
    DebtNotCarried,
    /// Every 23rd append is acknowledged but never written (a log that
    /// answers before its write is durable): acknowledged steps are lost.
    LostWrite,
    /// The writers' id index forgets the reservations of closed
    /// generations (what the writer *reads*): a reserve retried there is
    /// decided anew in the active generation, a second debit.
    IndexForgets,
    /// A restarted gateway keeps its predecessor's boot epoch and installs
    /// its shards again, without their receipts (what the gateway *keeps*):
    /// a shard usable after a restart, spent twice.
    ShardAfterRestart,
    /// A settle's body loses the gateway's counted input (a translation
    /// that drops a field): a stream cancelled before the provider reported
    /// its input settles with no input at all (needs cancelled streams).
    InputUncounted,
    /// The client gateway's transport reports a reserve whose answer was
    /// lost as never sent (a connection error after the bytes went out),
    /// so the client, cut off before it hears again, admits the call from
    /// a shard while the ledger holds it too (needs the client gateway).
    FallbackAfterSend,
    /// The projector that follows the log reads it without one entry (a
    /// reader that lost one, or a cursor moved one too far): its database is
    /// no longer the rebuild's (needs a run with the projector).
    ProjectorSkips,
    /// The client gateway's start scheduler is given the tenants' weights
    /// the wrong way round (t-a weighs 3, t-c 1: a table keyed by the wrong
    /// names): it starts the lighter tenant's calls ahead of the heavier's
    /// (needs the client gateway).
    SchedulerWeightsSwapped,
    /// `reservoir-replay verify` reads the log without one entry (as
    /// `projector-skips`, on the audit tool's side): its engine finds a gap,
    /// or its partitions differ from the projection (needs a run with the
    /// projector).
    ReplaySkips,
    /// A second gateway runs under the identity of the gateway a shard was
    /// issued to (its id and boot epoch copied, as a cloned machine image
    /// would): its book takes the other's shard when it is offered.
    IdentityCloned,
    /// A reconcile names the identity its shard document is bound to, not
    /// the presenting gateway's (a gateway SDK or proxy that copies the
    /// document's `gateway_id` and boot epoch into the body): the ledger,
    /// told the bound identity, takes a shard from a gateway it is not bound
    /// to.
    BindingFromDocument,
}

impl Plant {
    pub const ALL: [Plant; 12] = [
        Plant::DoubleRefund,
        Plant::DebtNotCarried,
        Plant::LostWrite,
        Plant::IndexForgets,
        Plant::ShardAfterRestart,
        Plant::InputUncounted,
        Plant::FallbackAfterSend,
        Plant::ProjectorSkips,
        Plant::SchedulerWeightsSwapped,
        Plant::ReplaySkips,
        Plant::IdentityCloned,
        Plant::BindingFromDocument,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Plant::DoubleRefund => "double-refund",
            Plant::DebtNotCarried => "debt-not-carried",
            Plant::LostWrite => "lost-write",
            Plant::IndexForgets => "index-forgets",
            Plant::ShardAfterRestart => "shard-after-restart",
            Plant::InputUncounted => "input-uncounted",
            Plant::FallbackAfterSend => "fallback-after-send",
            Plant::ProjectorSkips => "projector-skips",
            Plant::SchedulerWeightsSwapped => "scheduler-weights-swapped",
            Plant::ReplaySkips => "replay-skips",
            Plant::IdentityCloned => "identity-cloned",
            Plant::BindingFromDocument => "binding-from-document",
        }
    }
}

/// `--plant`'s values are the names above: the help lists every plant, and
/// clap refuses any other name with the list.
impl clap::ValueEnum for Plant {
    fn value_variants<'a>() -> &'a [Self] {
        &Plant::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Rounds with faults, before the quiet drain.
    pub steps: usize,
    pub plant: Option<Plant>,
    /// Keep the whole trace in the outcome (else its last lines only).
    pub keep_trace: bool,
    /// Take-overs that leave the old process running (a zombie), on by
    /// default (see "What it found" in the crate docs).
    pub zombies: bool,
    /// Emergency shards of `chat` (three dimensions) beside those of
    /// `embed`, on by default. Off, a seed runs the interleaving it ran
    /// before they were simulated (`--no-chat-shards`).
    pub chat_shards: bool,
    /// Now and then a `chat` call's streamed answer is cut off and settled
    /// at what the client crate's meter counted (`run`'s `stream`), on by
    /// default. Off, a seed runs the interleaving it ran before
    /// (`--no-stream-cancel`).
    pub stream_cancel: bool,
    /// Gateways whose calls are the client crate's own request loop over
    /// the server's HTTP router (`run`'s `client_gateway`), each with its
    /// own client, scheduler, shard book and restarts, after the three of
    /// the simulator's own. One by default (the release gate's). None: a
    /// seed runs the interleaving it ran before there was one
    /// (`--no-client-gateway`); more (`--client-gateways N`): other
    /// interleavings, not the release gate's.
    pub client_gateways: usize,
    /// The real projector following the log, checked against a rebuild and
    /// the ledger at the end (`run`'s `projection`), on by default. It draws
    /// nothing from the world's generator: a seed runs the same
    /// interleaving either way (`--no-projector` skips it).
    pub projector: bool,
    /// Now and then a gateway offered another's shard, whose book refused
    /// it, presents it to the ledger anyway (a reconcile under its own id
    /// and boot epoch), which must refuse it. Off by default: it sends
    /// requests the release gate's interleavings never sent
    /// (`--stolen-shards` runs other interleavings).
    pub stolen_shards: bool,
    /// Now and then the log keeps only the first records of an append of
    /// several and answers it in doubt, as a Kafka append can (its records
    /// are produced one by one: one that fails part way, or that a newer
    /// claim lands in, keeps a prefix). Off by default: the release gate's
    /// interleavings never drew it (`--torn-appends` runs other ones).
    pub torn_appends: bool,
}

impl RunConfig {
    pub fn new(steps: usize) -> RunConfig {
        RunConfig {
            steps,
            plant: None,
            keep_trace: false,
            zombies: true,
            chat_shards: true,
            stream_cancel: true,
            client_gateways: 1,
            projector: true,
            stolen_shards: false,
            torn_appends: false,
        }
    }

    /// The command-line flags that select this configuration beside
    /// `--steps` (empty for the default one).
    pub fn flags(&self) -> String {
        let mut flags = self
            .plant
            .map_or(String::new(), |p| format!(" --plant {}", p.name()));
        if !self.zombies {
            flags.push_str(" --no-zombies");
        }
        if !self.chat_shards {
            flags.push_str(" --no-chat-shards");
        }
        if !self.stream_cancel {
            flags.push_str(" --no-stream-cancel");
        }
        match self.client_gateways {
            0 => flags.push_str(" --no-client-gateway"),
            1 => {}
            n => flags.push_str(&format!(" --client-gateways {n}")),
        }
        if !self.projector {
            flags.push_str(" --no-projector");
        }
        if self.stolen_shards {
            flags.push_str(" --stolen-shards");
        }
        if self.torn_appends {
            flags.push_str(" --torn-appends");
        }
        flags
    }
}
