//! memfabric-bench: throughput, latency, YCSB, the memcached comparison and the RAM + flash
//! (hybrid) comparison, the client libraries, the burst buffer (bursty) and thousands of clients (scale). This file holds the command line's top level and dispatch; each
//! subcommand's arguments and driver live in its `*_cmd` module, shared arguments in `args`,
//! file output in `output`.

mod args;
mod bursty_cmd;
mod clients_cmd;
mod compare_cmd;
mod hybrid_cmd;
mod latency_cmd;
mod output;
mod resilience_cmd;
mod scale_cmd;
mod throughput_cmd;
mod ycsb_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

use bursty_cmd::{bursty_cmd, BurstyArgs};
use clients_cmd::{clients_cmd, ClientsArgs};
use compare_cmd::{compare_cmd, CompareArgs};
use hybrid_cmd::{hybrid_cmd, HybridArgs};
use latency_cmd::{latency_cmd, LatencyArgs};
use resilience_cmd::{resilience_cmd, ResilienceArgs};
use scale_cmd::{scale_cmd, scale_worker_cmd, ScaleArgs, ScaleWorkerArgs};
use throughput_cmd::{throughput_cmd, ThroughputArgs};
use ycsb_cmd::{ycsb_cmd, YcsbArgs};

#[derive(Parser)]
#[command(
    name = "memfabric-bench",
    version,
    about = "memfabric's benchmark suite"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Closed-loop throughput against a running server.
    Throughput(ThroughputArgs),
    /// One op at a time per size (ohb_memlat style) against a running server.
    Latency(LatencyArgs),
    /// YCSB core workloads A-F adapted to a cache: a load phase, then each run phase.
    Ycsb(YcsbArgs),
    /// Start memcached and memfabricd with the same flags and measure memcached-TCP,
    /// memfabricd-TCP and memfabricd-UCX under the same load: ratios to memcached.
    Compare(Box<CompareArgs>),
    /// Start a fleet of memfabricd and compare an erasure-coded pool with a replicated
    /// one: memory, SET/GET latency per size and transport, pipelining, degraded reads.
    Resilience(Box<ResilienceArgs>),
    /// RAM-only and RAM + flash servers (memcached extstore, memfabricd's flash tier) under
    /// a working set larger than both (ohb_memhybrid style): hits, misses, total time with
    /// a penalty per miss.
    Hybrid(Box<HybridArgs>),
    /// Existing client libraries unmodified on libmemfabric (pylibmc, C through
    /// libmemcached's API and memfabric.h's iget) against memfabricd over UCX, and on
    /// libmemcached against memcached over TCP, in one run.
    Clients(Box<ClientsArgs>),
    /// A checkpoint written and read back through the burst buffer and straight to the
    /// backing directory with fsync, then flushed there (Boldio's bursty I/O): speed-ups
    /// and the flush against the directory's raw write speed, in one run.
    Bursty(Box<BurstyArgs>),
    /// Thousands of UCX client endpoints on one memfabricd: server memory, descriptors
    /// and maps per client, hot and cold latency, churn between tiers, reclaim after
    /// SIGKILL; every client dedicated, every client cold and hybrid, in one run.
    Scale(Box<ScaleArgs>),
    /// A client process of `scale` (started by it).
    #[command(hide = true)]
    ScaleWorker(ScaleWorkerArgs),
}

/// What a subcommand returns: its error is printed on stderr and exits with status 2.
pub(crate) type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Throughput(a) => throughput_cmd(a).map(|()| true),
        Cmd::Latency(a) => latency_cmd(a).map(|()| true),
        Cmd::Ycsb(a) => ycsb_cmd(a).map(|()| true),
        Cmd::Resilience(a) => resilience_cmd(*a).map(|()| true),
        Cmd::Hybrid(a) => hybrid_cmd(*a).map(|()| true),
        Cmd::Clients(a) => clients_cmd(*a).map(|()| true),
        Cmd::Bursty(a) => bursty_cmd(*a).map(|()| true),
        Cmd::Scale(a) => scale_cmd(*a).map(|()| true),
        Cmd::ScaleWorker(a) => scale_worker_cmd(a).map(|()| true),
        Cmd::Compare(a) => {
            let check = a.check;
            compare_cmd(*a).map(|pass| pass || !check)
        }
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("memfabric-bench: {e}");
            ExitCode::from(2)
        }
    }
}
