//! Command-line arguments several subcommands share: the workload, the transport, the
//! output files, and the value enums behind them.

use crate::Fallible;
use clap::{Args, ValueEnum};
use memfabric_bench::load::LoadConfig;
use memfabric_bench::transport::{Connector, TcpConnector};
use memfabric_bench::ucx::UcxConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpMix, Pattern};
use memfabric_bench::ycsb::RequestDist;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Order of operations (`--pattern`).
#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PatternArg {
    /// Random draws from `--mix`.
    Mix,
    /// set, get, set, get, ... (50:50).
    Interleaved,
    /// 10 sets then 90 gets, repeating (10:90).
    NonInterleaved,
}

impl From<PatternArg> for Pattern {
    fn from(p: PatternArg) -> Self {
        match p {
            PatternArg::Mix => Pattern::Mix,
            PatternArg::Interleaved => Pattern::Interleaved,
            PatternArg::NonInterleaved => Pattern::NonInterleaved,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Dist {
    Uniform,
    Zipfian,
}

/// How requests reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TransportKind {
    /// memcached's text protocol over TCP (any memcached-compatible server).
    Tcp,
    /// memfabricd's UCX active-message data path; the address is its `--ucx-port`
    /// bootstrap port, the UCX transports come from UCX_TLS.
    Ucx,
    /// As `ucx`, but GETs read the item from the server's memory with RMA reads
    /// (docs/one-sided.md); the server's CPU is not involved in them.
    Onesided,
}

impl TransportKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Ucx => "ucx",
            TransportKind::Onesided => "onesided",
        }
    }

    pub(crate) fn connector(self, addr: SocketAddr) -> Box<dyn Connector> {
        match self {
            TransportKind::Tcp => Box::new(TcpConnector::plain(addr)),
            TransportKind::Ucx => Box::new(UcxConnector::new(addr)),
            TransportKind::Onesided => Box::new(UcxConnector::onesided(addr)),
        }
    }
}

#[derive(Args, Clone, Debug, Serialize)]
pub(crate) struct WorkloadArgs {
    /// Number of distinct keys (all preloaded).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) keys: u64,
    /// Key name prefix; keys are PREFIX + 10 digits.
    #[arg(long, default_value = "mfb:")]
    pub(crate) key_prefix: String,
    /// Value size(s) in bytes, comma separated; one run per size.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    pub(crate) value_size: Vec<usize>,
    /// get:set ratio of `--pattern mix`.
    #[arg(long, default_value = "90:10")]
    pub(crate) mix: String,
    /// Order of operations: mix (random draws from --mix), interleaved (set, get, set,
    /// get ...: 50:50) or non-interleaved (10 sets then 90 gets, repeating: 10:90).
    #[arg(long, value_enum, default_value_t = PatternArg::Mix)]
    pub(crate) pattern: PatternArg,
    /// Key popularity.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    pub(crate) dist: Dist,
    /// Zipfian exponent.
    #[arg(long, default_value_t = 0.99)]
    pub(crate) theta: f64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Connections per client thread.
    #[arg(long, default_value_t = 4)]
    pub(crate) conns: usize,
    /// Requests in flight per connection (1 = no pipelining).
    #[arg(long, default_value_t = 1)]
    pub(crate) depth: usize,
    /// Open loop: send at this fixed rate (ops/s over all client threads) whatever the
    /// server does, and measure latency from each op's scheduled send time (no coordinated
    /// omission). Without it the loop is closed (send when a reply comes back).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Stop after this many operations in total.
    #[arg(long)]
    pub(crate) ops: Option<u64>,
    /// Stop after this many seconds (default 10 when --ops is not given).
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Seed of the key and op sequences (same seed, same requests).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Skip storing every key before measuring.
    #[arg(long)]
    pub(crate) no_preload: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub(crate) quiet: bool,
}

#[derive(Args)]
pub(crate) struct OutputArgs {
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw a PNG plot to this file.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

/// YCSB's request distribution (`--distribution` overrides the workload's own).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum RequestDistArg {
    Uniform,
    Zipfian,
    Latest,
}

impl From<RequestDistArg> for RequestDist {
    fn from(d: RequestDistArg) -> Self {
        match d {
            RequestDistArg::Uniform => RequestDist::Uniform,
            RequestDistArg::Zipfian => RequestDist::Zipfian,
            RequestDistArg::Latest => RequestDist::Latest,
        }
    }
}

impl WorkloadArgs {
    pub(crate) fn load_config(&self, label: &str) -> Fallible<LoadConfig> {
        let mix = OpMix::parse(&self.mix)?;
        let dist = match self.dist {
            Dist::Uniform => KeyDist::Uniform,
            Dist::Zipfian => KeyDist::Zipfian { theta: self.theta },
        };
        let duration = match (self.ops, self.duration) {
            (None, None) => Some(Duration::from_secs(10)),
            (_, d) => d
                .map(Duration::try_from_secs_f64)
                .transpose()
                .map_err(|e| format!("--duration: {e}"))?,
        };
        if self.value_size.is_empty() {
            return Err("--value-size: give at least one size".into());
        }
        Ok(LoadConfig {
            threads: self.threads,
            conns_per_thread: self.conns,
            depth: self.depth,
            ops: self.ops,
            duration,
            keys: KeySpace::new(&self.key_prefix, self.keys),
            dist,
            mix,
            pattern: self.pattern.into(),
            ycsb: None,
            rate: self.rate,
            value_size: self.value_size.first().copied().unwrap_or(32),
            seed: self.seed,
            progress: !self.quiet,
            label: label.to_string(),
        })
    }
}
