//! `reservoir-sim`'s command line, and the run it asks for
//! ([`Cli::config`]). In the library so the tests can hold it to the
//! command a failing seed prints ([`RunConfig::flags`]).

use std::path::PathBuf;

use clap::Parser;

use crate::{Plant, RunConfig};

/// The most client gateways a run has (`--client-gateways`).
pub const MAX_CLIENT_GATEWAYS: i64 = 4;

#[derive(Parser)]
#[command(
    name = "reservoir-sim",
    version,
    about = "Deterministic simulation of Reservoir's write path under faults"
)]
pub struct Cli {
    /// Runs this many interleavings (seeds `seed`, `seed`+1, …) and prints
    /// the gate table. At least one: a gate passed by no run says nothing.
    #[arg(long, value_parser = at_least_one::<u64>)]
    pub interleavings: Option<u64>,
    /// The (first) seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Rounds per interleaving, before the quiet drain (at least one).
    #[arg(long, default_value_t = 200, value_parser = at_least_one::<usize>)]
    pub steps: usize,
    /// Plants a known bug (the simulator must find it).
    #[arg(long, value_enum)]
    pub plant: Option<Plant>,
    /// One run: prints its whole trace, not only the last lines.
    #[arg(long)]
    pub trace: bool,
    /// Never take the log over while the old process runs on (zombie
    /// writers are on by default).
    #[arg(long)]
    pub no_zombies: bool,
    /// No emergency shards of `chat`: the interleavings seeds ran before
    /// they were simulated (not for the release gate's chunks).
    #[arg(long, conflicts_with = "save")]
    pub no_chat_shards: bool,
    /// No cancelled streams: the interleavings seeds ran before they were
    /// simulated (not for the release gate's chunks).
    #[arg(long, conflicts_with = "save")]
    pub no_stream_cancel: bool,
    /// No client gateway (the client crate's request loop over the
    /// server's router): the interleavings seeds ran before it was
    /// simulated (not for the release gate's chunks).
    #[arg(long, conflicts_with_all = ["save", "client_gateways"])]
    pub no_client_gateway: bool,
    /// Client gateways, each its own client crate `Client` with its own
    /// scheduler, shard book and restarts: one by default; more run other
    /// interleavings (not for the release gate's chunks).
    #[arg(long, conflicts_with = "save", value_parser = clap::value_parser!(u8).range(1..=MAX_CLIENT_GATEWAYS))]
    pub client_gateways: Option<u8>,
    /// No projector following the log (the interleavings are the same; only
    /// its gate, `projection_disagrees`, is not checked).
    #[arg(long, conflicts_with = "save")]
    pub no_projector: bool,
    /// Now and then a gateway presents another gateway's shard to the
    /// ledger, which must refuse it: other interleavings (not for the
    /// release gate's chunks).
    #[arg(long, conflicts_with = "save")]
    pub stolen_shards: bool,
    /// Now and then an append keeps only its first records and is answered
    /// in doubt, as a Kafka append can: other interleavings (not for the
    /// release gate's chunks).
    #[arg(long, conflicts_with = "save")]
    pub torn_appends: bool,
    /// Threads running interleavings (each run stays on one thread).
    #[arg(long, default_value_t = 1, value_parser = at_least_one::<usize>)]
    pub threads: usize,
    /// With --interleavings (or --import-table): writes the run as a chunk
    /// of the release gate (JSON) to this file.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Where a saved chunk came from (the commit its binary was built at).
    #[arg(long, default_value = concat!("reservoir-sim ", env!("CARGO_PKG_VERSION")))]
    pub source: String,
    /// Merges these chunk files into one gate table (exits 1 on any finding).
    #[arg(long, num_args = 1.., conflicts_with_all = ["interleavings", "import_table"])]
    pub merge: Vec<PathBuf>,
    /// Reads a gate table printed by an earlier `--interleavings` run into a
    /// chunk (written with --save).
    #[arg(long, requires = "save", conflicts_with = "interleavings")]
    pub import_table: Option<PathBuf>,
}

/// A count of at least one (`--interleavings`, `--steps`, `--threads`).
fn at_least_one<T: TryFrom<u64>>(raw: &str) -> Result<T, String>
where
    T::Error: std::fmt::Display,
{
    match raw.parse::<u64>().map_err(|e| e.to_string())? {
        0 => Err("must be at least 1 (a run of nothing checks nothing)".into()),
        n => T::try_from(n).map_err(|e| e.to_string()),
    }
}

impl Cli {
    /// The run the flags ask for. [`RunConfig::flags`] writes them back
    /// (the command a failing seed prints); the simulator's tests hold the
    /// two together.
    pub fn config(&self) -> RunConfig {
        RunConfig {
            steps: self.steps,
            plant: self.plant,
            keep_trace: self.trace && self.interleavings.is_none(),
            zombies: !self.no_zombies,
            chat_shards: !self.no_chat_shards,
            stream_cancel: !self.no_stream_cancel,
            client_gateways: match (self.no_client_gateway, self.client_gateways) {
                (true, _) => 0,
                (false, n) => usize::from(n.unwrap_or(1)),
            },
            projector: !self.no_projector,
            stolen_shards: self.stolen_shards,
            torn_appends: self.torn_appends,
        }
    }
}
