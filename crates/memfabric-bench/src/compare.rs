//! `compare`: memcached and memfabricd, same flags, same load, in one run; every number also
//! as a ratio to memcached.
//!
//! What is measured is a list of [`Target`]s: a server and the transport a client reaches it
//! by (memcached over TCP, memfabricd over TCP, memfabricd over UCX, ...). The first target is
//! the reference every ratio is taken against. Both servers stay up for the whole
//! comparison; each load is measured on every target in `rounds` rounds whose order
//! alternates (forward, backward, ...) so slow drifts of a shared machine (another job's
//! build starting) hit every target alike. Rounds are pooled into one result per target;
//! per-round ratios are kept to show how noisy the run was.
//!
//! The sections of a full comparison ([`run_suite`]): latency by value size (one op at a
//! time), throughput by number of client threads, YCSB workloads, and the load generator's
//! own ceiling against the in-process [`Responder`].

use crate::latency::{self, LatencyConfig, LatencyOp, LatencyResult};
use crate::load::{self, LoadConfig, LoadError, MeasuredRun};
use crate::metrics::{LoadStats, Progress, RunSummary};
use crate::responder::Responder;
use crate::server::{ServerError, ServerProcess, ServerSpec};
use crate::transport::{Connector, TcpConnector};
use crate::ucx::UcxConnector;
use crate::ycsb::YcsbSpec;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompareError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{target}: {source}")]
    Load { target: String, source: LoadError },
    #[error("unknown target {0:?} (known: {1})")]
    UnknownTarget(String, String),
    #[error("give at least one target")]
    NoTargets,
    #[error("{0}: its server was not started with that endpoint")]
    NoEndpoint(&'static str),
    #[error("in-process responder: {0}")]
    Responder(std::io::Error),
}

/// Which of the two servers a target runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// The reference (Debian's memcached).
    Memcached,
    /// The candidate (memfabricd).
    Memfabricd,
}

/// Where a started server listens.
#[derive(Clone, Copy, Debug)]
pub struct ServerAddrs {
    /// memcached protocols over TCP.
    pub tcp: SocketAddr,
    /// memfabricd's UCX bootstrap port (`--ucx-port`), when it was given one.
    pub ucx: Option<SocketAddr>,
}

/// Makes the client side of a target from its server's addresses (`None`: the server has no
/// such endpoint).
pub type MakeConnector = fn(&ServerAddrs) -> Option<Box<dyn Connector>>;

/// A server and the way a client reaches it.
#[derive(Clone, Copy)]
pub struct Target {
    /// `<server>-<transport>`, as in reports.
    pub name: &'static str,
    pub server: ServerKind,
    /// The server needs a UCX port for this target.
    pub needs_ucx: bool,
    pub connector: MakeConnector,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn tcp(a: &ServerAddrs) -> Option<Box<dyn Connector>> {
    Some(Box::new(TcpConnector::plain(a.tcp)))
}

fn ucx_am(a: &ServerAddrs) -> Option<Box<dyn Connector>> {
    a.ucx
        .map(|addr| Box::new(UcxConnector::new(addr)) as Box<dyn Connector>)
}

fn ucx_onesided(a: &ServerAddrs) -> Option<Box<dyn Connector>> {
    a.ucx
        .map(|addr| Box::new(UcxConnector::onesided(addr)) as Box<dyn Connector>)
}

/// Every target `compare` knows, the reference first. A new transport is one more line.
#[rustfmt::skip]
pub const TARGETS: &[Target] = &[
    Target { name: "memcached-tcp", server: ServerKind::Memcached, needs_ucx: false, connector: tcp },
    Target { name: "memfabricd-tcp", server: ServerKind::Memfabricd, needs_ucx: false, connector: tcp },
    Target { name: "memfabricd-ucx", server: ServerKind::Memfabricd, needs_ucx: true, connector: ucx_am },
    Target { name: "memfabricd-onesided", server: ServerKind::Memfabricd, needs_ucx: true, connector: ucx_onesided },
];

/// The targets named in `names` (in the order of [`TARGETS`], whose first is the reference).
pub fn targets_named(names: &[String]) -> Result<Vec<Target>, CompareError> {
    for n in names {
        if !TARGETS.iter().any(|t| t.name == n) {
            let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            return Err(CompareError::UnknownTarget(n.clone(), known.join(", ")));
        }
    }
    let picked: Vec<Target> = TARGETS
        .iter()
        .filter(|t| names.iter().any(|n| n == t.name))
        .copied()
        .collect();
    if picked.is_empty() {
        return Err(CompareError::NoTargets);
    }
    Ok(picked)
}

/// The started servers; killed when dropped.
pub struct Servers {
    memcached: Option<(ServerProcess, ServerAddrs)>,
    memfabricd: Option<(ServerProcess, ServerAddrs)>,
}

/// A target ready to measure: its client side and its server's pid.
pub struct Endpoint {
    pub target: Target,
    pub connector: Box<dyn Connector>,
    pub pid: u32,
}

impl Servers {
    /// Start the servers `targets` need; memfabricd gets a free `--ucx-port` when a target
    /// needs UCX.
    pub fn start(
        memcached: &ServerSpec,
        memfabricd: &ServerSpec,
        targets: &[Target],
    ) -> Result<Servers, CompareError> {
        let wants = |k| targets.iter().any(|t| t.server == k);
        let start = |spec: &ServerSpec, ucx: bool| -> Result<_, CompareError> {
            let proc = if ucx {
                spec.start_with_ucx_port()?
            } else {
                spec.start()?
            };
            let addrs = ServerAddrs {
                tcp: proc.addr,
                ucx: proc.ucx_port.map(|p| SocketAddr::from(([127, 0, 0, 1], p))),
            };
            Ok((proc, addrs))
        };
        let needs_ucx = |k| targets.iter().any(|t| t.server == k && t.needs_ucx);
        let memcached = if wants(ServerKind::Memcached) {
            Some(start(memcached, needs_ucx(ServerKind::Memcached))?)
        } else {
            None
        };
        let memfabricd = if wants(ServerKind::Memfabricd) {
            Some(start(memfabricd, needs_ucx(ServerKind::Memfabricd))?)
        } else {
            None
        };
        Ok(Servers {
            memcached,
            memfabricd,
        })
    }

    fn get(&self, k: ServerKind) -> Option<&(ServerProcess, ServerAddrs)> {
        match k {
            ServerKind::Memcached => self.memcached.as_ref(),
            ServerKind::Memfabricd => self.memfabricd.as_ref(),
        }
    }

    /// The TCP address of a server (for reports).
    pub fn tcp_addr(&self, k: ServerKind) -> Option<SocketAddr> {
        self.get(k).map(|(_, a)| a.tcp)
    }

    pub fn endpoint(&self, target: &Target) -> Result<Endpoint, CompareError> {
        let (proc, addrs) = self
            .get(target.server)
            .ok_or(CompareError::NoEndpoint(target.name))?;
        let connector = (target.connector)(addrs).ok_or(CompareError::NoEndpoint(target.name))?;
        Ok(Endpoint {
            target: *target,
            connector,
            pid: proc.pid(),
        })
    }

    /// Store every key of `keys` once in each started server (over TCP: the fastest way in,
    /// and the same for both); returns what each server took.
    pub fn preload(
        &self,
        keys: &crate::workload::KeySpace,
        value_size: usize,
    ) -> Result<Vec<(String, load::PreloadStats)>, CompareError> {
        let mut out = Vec::new();
        for (proc, addrs) in [&self.memcached, &self.memfabricd].into_iter().flatten() {
            let p = load::preload(&TcpConnector::plain(addrs.tcp), keys, value_size, 8, 32)
                .map_err(load_err_named(&proc.name))?;
            out.push((proc.name.clone(), p));
        }
        Ok(out)
    }
}

/// A target's result relative to the reference (the first target).
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    pub target: String,
    pub value_size: usize,
    /// > 1 means the target did more ops/s.
    pub throughput: f64,
    /// < 1 means the target's p99 is lower.
    pub p99: f64,
    /// < 1 means the target used less server CPU per million ops.
    pub cpu_per_mop: Option<f64>,
    /// Throughput ratio of each round, to judge the noise.
    pub throughput_by_round: Vec<f64>,
    /// p99 ratio of each round.
    pub p99_by_round: Vec<f64>,
    /// Medians of the per-round ratios: robust to one round disturbed by another job.
    pub median_throughput: f64,
    pub median_p99: f64,
    pub meets_target: Verdict,
}

/// The acceptance target: throughput >= 1.0x, p99 <= 1.1x, CPU per Mop <= 1.0x.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub throughput: bool,
    pub p99: bool,
    pub cpu_per_mop: bool,
}

impl Verdict {
    pub fn all(&self) -> bool {
        self.throughput && self.p99 && self.cpu_per_mop
    }
}

/// One load measured on every target.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    /// What was measured ("4096 B, 2 client threads", "YCSB A").
    pub label: String,
    /// Client threads of the load.
    pub clients: usize,
    /// Pooled over rounds, one per target, in target order.
    pub totals: Vec<RunSummary>,
    /// Every (round, target) run in execution order.
    pub rounds: Vec<(usize, RunSummary)>,
    /// Each non-reference target against the reference.
    pub ratios: Vec<Ratios>,
    /// Merged latency histograms, same order as `totals` (for plots).
    #[serde(skip)]
    pub hists: Vec<Histogram<u64>>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        b / a
    } else {
        f64::NAN
    }
}

/// Median (mean of the middle two for an even count); NaN for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The order of the targets in round `r`: forward in even rounds, backward in odd ones.
pub fn round_order(targets: usize, r: usize) -> Vec<usize> {
    if r.is_multiple_of(2) {
        (0..targets).collect()
    } else {
        (0..targets).rev().collect()
    }
}

/// Measure `cfg` on every endpoint for `rounds` rounds; `label` names the cell, `value_size`
/// goes into its rows. Each round gets its own seed (the same on every target).
pub fn measure_cell(
    endpoints: &[Endpoint],
    cfg: &LoadConfig,
    rounds: usize,
    label: &str,
    value_size: usize,
) -> Result<CellResult, CompareError> {
    let n = endpoints.len();
    let mut pooled: Vec<Option<MeasuredRun>> = vec![None; n];
    let mut elapsed = vec![0f64; n];
    let mut per_round: Vec<Vec<RunSummary>> = Vec::new();
    let mut rounds_out = Vec::new();
    for r in 0..rounds.max(1) {
        let mut this_round: Vec<Option<RunSummary>> = vec![None; n];
        for i in round_order(n, r) {
            let ep = &endpoints[i];
            let mut lc = cfg.clone();
            lc.label = format!("{} {label} r{}", ep.target.name, r + 1);
            lc.seed = cfg.seed.wrapping_add(r as u64);
            let m =
                load::measured_run(ep.connector.as_ref(), &lc, Some(ep.pid)).map_err(|source| {
                    CompareError::Load {
                        target: ep.target.name.to_string(),
                        source,
                    }
                })?;
            let summary = m.summary(ep.target.name, value_size);
            rounds_out.push((r + 1, summary.clone()));
            this_round[i] = Some(summary);
            elapsed[i] += m.stats.elapsed.as_secs_f64();
            pooled[i] = Some(match pooled[i].take() {
                None => m,
                Some(mut acc) => {
                    acc.stats.merge(&m.stats);
                    acc.server_cpu_s = acc.server_cpu_s.zip(m.server_cpu_s).map(|(a, b)| a + b);
                    acc.client_cpu_s = acc.client_cpu_s.zip(m.client_cpu_s).map(|(a, b)| a + b);
                    acc
                }
            });
        }
        per_round.push(this_round.into_iter().flatten().collect());
    }
    let mut totals = Vec::new();
    let mut hists = Vec::new();
    for (i, p) in pooled.iter_mut().enumerate() {
        let mut m = p.take().unwrap_or(MeasuredRun {
            stats: LoadStats::new(),
            server_cpu_s: None,
            client_cpu_s: None,
        });
        // Rounds ran one after another: their times add up.
        m.stats.elapsed = Duration::from_secs_f64(elapsed[i]);
        hists.push(m.stats.all_hist());
        totals.push(m.summary(endpoints[i].target.name, value_size));
    }
    let ratios = ratios_against_first(&totals, &per_round, value_size);
    Ok(CellResult {
        label: label.to_string(),
        clients: cfg.threads,
        totals,
        rounds: rounds_out,
        ratios,
        hists,
    })
}

/// Every target after the first against the first.
fn ratios_against_first(
    totals: &[RunSummary],
    per_round: &[Vec<RunSummary>],
    value_size: usize,
) -> Vec<Ratios> {
    let Some(base) = totals.first() else {
        return Vec::new();
    };
    totals
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, t)| {
            let by_round = |f: fn(&RunSummary) -> f64| -> Vec<f64> {
                per_round
                    .iter()
                    .filter_map(|r| Some(ratio(f(r.first()?), f(r.get(i)?))))
                    .collect()
            };
            let throughput = ratio(base.ops_per_sec, t.ops_per_sec);
            let p99 = ratio(base.p99_us, t.p99_us);
            let cpu_per_mop = base
                .server_cpu_s_per_mop
                .zip(t.server_cpu_s_per_mop)
                .map(|(x, y)| ratio(x, y));
            let throughput_by_round = by_round(|s| s.ops_per_sec);
            let p99_by_round = by_round(|s| s.p99_us);
            Ratios {
                target: t.server.clone(),
                value_size,
                throughput,
                p99,
                cpu_per_mop,
                median_throughput: median(&throughput_by_round),
                median_p99: median(&p99_by_round),
                throughput_by_round,
                p99_by_round,
                meets_target: Verdict {
                    throughput: throughput >= 1.0,
                    p99: p99 <= 1.1,
                    cpu_per_mop: cpu_per_mop.is_some_and(|c| c <= 1.0),
                },
            }
        })
        .collect()
}

/// Throughput section: one cell per (value size, client threads).
#[derive(Clone, Debug)]
pub struct ThroughputPlan {
    /// Template; threads and value size are set per cell.
    pub load: LoadConfig,
    pub value_sizes: Vec<usize>,
    pub clients: Vec<usize>,
    pub preload: bool,
}

/// YCSB section: one load phase, then one cell per workload.
#[derive(Clone, Debug)]
pub struct YcsbPlan {
    /// Template; keys, value size and the workload are set from each spec.
    pub load: LoadConfig,
    /// Same record count and record layout for all.
    pub specs: Vec<YcsbSpec>,
}

/// What a full comparison measures; a section that is `None` is skipped.
#[derive(Clone, Debug)]
pub struct SuitePlan {
    pub memcached: ServerSpec,
    pub memfabricd: ServerSpec,
    pub targets: Vec<Target>,
    pub rounds: usize,
    pub latency: Option<LatencyConfig>,
    pub throughput: Option<ThroughputPlan>,
    pub ycsb: Option<YcsbPlan>,
    /// Run the throughput template against the in-process responder at these client counts.
    pub ceiling: Option<Vec<usize>>,
}

/// One row of the latency section.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    pub target: String,
    #[serde(flatten)]
    pub result: LatencyResult,
}

/// The YCSB load phase on one server.
#[derive(Clone, Debug, Serialize)]
pub struct YcsbLoad {
    pub server: String,
    pub records: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
}

/// The load generator against the in-process responder with `clients` threads.
#[derive(Clone, Debug, Serialize)]
pub struct CeilingRow {
    pub clients: usize,
    pub run: RunSummary,
}

/// Everything a full comparison measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SuiteResult {
    pub targets: Vec<String>,
    pub memcached_addr: Option<String>,
    pub memfabricd_addr: Option<String>,
    pub latency: Vec<LatencyRow>,
    /// Where the latency section's client and servers ran (`LatencyPlacement`).
    pub latency_placement: String,
    pub throughput: Vec<CellResult>,
    pub ycsb_load: Vec<YcsbLoad>,
    pub ycsb: Vec<CellResult>,
    /// The load generator against the in-process responder, by client threads.
    pub ceiling: Vec<CeilingRow>,
}

/// One target's latency slices so far: histogram (ns), server CPU seconds, transport.
type Pooled = (Histogram<u64>, Option<f64>, String);

/// Measured ops per latency slice (at least `rounds` slices per row).
pub const LATENCY_SLICE_OPS: u64 = 100;

/// Unmeasured operations before `ops` measured ones on a new connection.
pub fn latency_warmup(ops: u64) -> u64 {
    (ops / 10).max(10)
}

/// How many slices a latency row of `iterations` ops is measured in, and their length.
pub fn latency_slices(iterations: u64, rounds: usize) -> (u64, u64) {
    let slices = iterations
        .div_ceil(LATENCY_SLICE_OPS)
        .max(rounds.max(1) as u64);
    (slices, iterations.div_ceil(slices).max(1))
}

/// Where the latency section runs: the client thread on the first CPU, every thread of
/// every server on the last, so that each request crosses between two cores as it would
/// between two hosts, on every target alike. Left to the scheduler, a VM puts a client and
/// a server that sleep between requests on one vCPU for a while (~15 us a request here)
/// or on two (~50 us), a different choice for each server, and one server's row would then
/// be measured in the other mode. A polling UCX pair left to itself also lands on one core
/// now and then (~5 us a GET instead of ~0.8-1). Undone on drop. Needs two CPUs and
/// `taskset` (util-linux); without them, everything runs unpinned.
pub struct LatencyPlacement {
    servers: Vec<u32>,
    /// The client thread, when the placement was made (else nothing is pinned).
    client_tid: Option<u32>,
    all_cpus: String,
    server_cpu: usize,
}

impl LatencyPlacement {
    /// Pin the calling thread to CPU 0 and every thread of `server_pids` to the last CPU.
    pub fn pin(server_pids: &[u32]) -> LatencyPlacement {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut servers: Vec<u32> = server_pids.to_vec();
        servers.sort_unstable();
        servers.dedup();
        let server_cpu = cpus.max(2) - 1;
        let client_tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok())
            .filter(|_| cpus >= 2)
            .filter(|tid| {
                let cpu = server_cpu.to_string();
                servers
                    .iter()
                    .all(|p| taskset(&["-a", "-p", "-c", &cpu, &p.to_string()]))
                    && taskset(&["-p", "-c", "0", &tid.to_string()])
            });
        LatencyPlacement {
            servers,
            client_tid,
            all_cpus: format!("0-{}", cpus.saturating_sub(1)),
            server_cpu,
        }
    }

    /// What the report says about it.
    pub fn description(&self) -> String {
        match self.client_tid {
            Some(_) => format!(
                "the client thread on CPU 0, every server thread on CPU {}; UCX rows first, then the TCP rows",
                self.server_cpu
            ),
            None => "client and servers unpinned".into(),
        }
    }
}

impl Drop for LatencyPlacement {
    fn drop(&mut self) {
        // Unpin what was pinned (a server pinned before a later one failed included).
        for p in &self.servers {
            taskset(&["-a", "-p", "-c", &self.all_cpus, &p.to_string()]);
        }
        if let Some(t) = self.client_tid {
            taskset(&["-p", "-c", &self.all_cpus, &t.to_string()]);
        }
    }
}

fn taskset(args: &[&str]) -> bool {
    std::process::Command::new("taskset")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The latency section: each (op, size) row is measured on every TCP target in slices of
/// about `LATENCY_SLICE_OPS` ops, each on a new connection (UCX rows whole, see below),
/// the targets' order alternating slice by slice, and each target's slices pooled into
/// its row. A shared machine slows
/// down for seconds at a time, and on a VM a connection's latency is bimodal (client and
/// server threads on one vCPU or on two: ~15 against ~50 us here), settled per connection
/// for a while. A target measured in one block would take a slow stretch, or one mode,
/// alone; many short interleaved slices give every target the same mixture.
fn interleaved_latency(
    endpoints: &[Endpoint],
    lat: &LatencyConfig,
    rounds: usize,
) -> Result<(Vec<LatencyRow>, String), CompareError> {
    let (rounds, per_slice) = latency_slices(lat.iterations, rounds);
    let rounds = rounds as usize;
    let cells: Vec<(LatencyOp, usize)> = lat
        .ops
        .iter()
        .flat_map(|&op| lat.sizes.iter().map(move |&size| (op, size)))
        .collect();
    let mut pooled: Vec<Vec<Option<Pooled>>> = cells
        .iter()
        .map(|_| (0..endpoints.len()).map(|_| None).collect())
        .collect();
    let ucx = endpoints.iter().filter(|e| e.target.needs_ucx).count();
    let runs = (cells.len() * (ucx + rounds * (endpoints.len() - ucx))) as u64;
    let started = std::time::Instant::now();
    let mut progress = Progress::new("latency, (op, size, round, target) slices", true);
    let mut done = 0u64;
    let mut run =
        |ep: &Endpoint, op: LatencyOp, size: usize, iterations: u64, slot: &mut Option<Pooled>| {
            progress.tick(started.elapsed(), done, None, Some(runs));
            done += 1;
            let cfg = LatencyConfig {
                sizes: vec![size],
                ops: vec![op],
                iterations,
                warmup: latency_warmup(iterations),
                server_pid: Some(ep.pid),
                ..lat.clone()
            };
            let named = load_err_named(ep.target.name);
            let (result, h) = latency::run_quiet(ep.connector.as_ref(), &cfg)
                .map_err(&named)?
                .into_iter()
                .next()
                .ok_or_else(|| named(LoadError::Config("no latency row")))?;
            let cpu = result
                .server_cpu_s_per_mop
                .map(|c| c * result.ops as f64 / 1e6);
            match slot {
                Some((all, total_cpu, _)) => {
                    all.add(&h)
                        .map_err(|_| named(LoadError::Config("latency histograms do not merge")))?;
                    *total_cpu = total_cpu.zip(cpu).map(|(a, b)| a + b);
                }
                None => *slot = Some((h, cpu, result.transport)),
            }
            Ok::<(), CompareError>(())
        };
    // Everything pinned (`LatencyPlacement`). UCX rows first, whole: a UCX row takes a
    // millisecond or so (no slow stretch to spread out; a new UCX connection every
    // hundred ops would measure its wire-up instead).
    let pids: Vec<u32> = endpoints.iter().map(|e| e.pid).collect();
    let placement = LatencyPlacement::pin(&pids);
    for (c, &(op, size)) in cells.iter().enumerate() {
        for (i, ep) in endpoints.iter().enumerate() {
            if ep.target.needs_ucx {
                run(ep, op, size, lat.iterations, &mut pooled[c][i])?;
            }
        }
    }
    // Then the TCP rows in interleaved slices.
    for (c, &(op, size)) in cells.iter().enumerate() {
        for r in 0..rounds {
            for i in round_order(endpoints.len(), r) {
                let ep = &endpoints[i];
                if !ep.target.needs_ucx {
                    run(ep, op, size, per_slice, &mut pooled[c][i])?;
                }
            }
        }
    }
    let placed = placement.description();
    drop(placement);
    progress.finish();
    let mut rows = Vec::new();
    for (&(op, size), row) in cells.iter().zip(pooled) {
        for (ep, p) in endpoints.iter().zip(row) {
            let Some((h, cpu, transport)) = p else {
                continue;
            };
            rows.push(LatencyRow {
                target: ep.target.name.to_string(),
                result: LatencyResult::of(&transport, op, size, &h, cpu),
            });
        }
    }
    Ok((rows, placed))
}

/// One line on stderr per step of a comparison (its steps are shorter than the load loop's
/// progress threshold, the whole is not).
fn step(started: std::time::Instant, what: &str) {
    eprintln!("[compare {:>5.1}s] {what}", started.elapsed().as_secs_f64());
}

/// Run every section of `plan`: servers up once, sections in order, servers down.
pub fn run_suite(plan: &SuitePlan) -> Result<SuiteResult, CompareError> {
    let started = std::time::Instant::now();
    if plan.targets.is_empty() {
        return Err(CompareError::NoTargets);
    }
    let servers = Servers::start(&plan.memcached, &plan.memfabricd, &plan.targets)?;
    let endpoints = plan
        .targets
        .iter()
        .map(|t| servers.endpoint(t))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = SuiteResult {
        targets: plan.targets.iter().map(|t| t.name.to_string()).collect(),
        memcached_addr: servers
            .tcp_addr(ServerKind::Memcached)
            .map(|a| a.to_string()),
        memfabricd_addr: servers
            .tcp_addr(ServerKind::Memfabricd)
            .map(|a| a.to_string()),
        ..SuiteResult::default()
    };
    if let Some(lat) = &plan.latency {
        step(
            started,
            "latency by size, targets interleaved per (op, size)",
        );
        (out.latency, out.latency_placement) = interleaved_latency(&endpoints, lat, plan.rounds)?;
    }
    if let Some(tp) = &plan.throughput {
        for &size in &tp.value_sizes {
            if tp.preload {
                servers.preload(&tp.load.keys, size)?;
            }
            for &clients in &tp.clients {
                let mut cfg = tp.load.clone();
                cfg.value_size = size;
                cfg.threads = clients;
                let label = format!("{size} B, {clients} client thread{}", plural(clients));
                step(started, &format!("throughput: {label}"));
                out.throughput
                    .push(measure_cell(&endpoints, &cfg, plan.rounds, &label, size)?);
            }
        }
    }
    if let Some(y) = &plan.ycsb {
        if let Some(first) = y.specs.first() {
            step(started, "YCSB load phase");
            for (server, p) in servers.preload(&first.key_space(), first.value_size())? {
                let seconds = p.elapsed.as_secs_f64();
                out.ycsb_load.push(YcsbLoad {
                    server,
                    records: p.stored,
                    seconds,
                    ops_per_sec: if seconds > 0.0 {
                        p.stored as f64 / seconds
                    } else {
                        0.0
                    },
                });
            }
        }
        for spec in &y.specs {
            let mut cfg = y.load.clone();
            cfg.keys = spec.key_space();
            cfg.value_size = spec.value_size();
            cfg.ycsb = Some(spec.clone());
            let label = format!("YCSB {}", spec.workload.letter());
            step(started, &label);
            out.ycsb.push(measure_cell(
                &endpoints,
                &cfg,
                plan.rounds,
                &label,
                spec.value_size(),
            )?);
        }
    }
    drop(endpoints);
    drop(servers);
    if let (Some(clients), Some(tp)) = (&plan.ceiling, &plan.throughput) {
        step(started, "load generator ceiling (in-process responder)");
        out.ceiling = generator_ceiling(
            &tp.load,
            tp.value_sizes.first().copied().unwrap_or(32),
            clients,
        )?;
    }
    Ok(out)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The load generator against the in-process responder (a hash map behind the text
/// protocol): its ops/s and the client's CPU per op bound what the generator can drive.
pub fn generator_ceiling(
    template: &LoadConfig,
    value_size: usize,
    clients: &[usize],
) -> Result<Vec<CeilingRow>, CompareError> {
    let responder = Responder::start(false).map_err(CompareError::Responder)?;
    let connector = TcpConnector::plain(responder.addr);
    load::preload(&connector, &template.keys, value_size, 8, 32)
        .map_err(load_err_named("responder"))?;
    let mut rows = Vec::new();
    for &c in clients {
        let mut cfg = template.clone();
        cfg.threads = c;
        cfg.value_size = value_size;
        cfg.label = format!("responder {c} clients");
        let m = load::measured_run(&connector, &cfg, None).map_err(load_err_named("responder"))?;
        rows.push(CeilingRow {
            clients: c,
            run: m.summary("responder", value_size),
        });
    }
    Ok(rows)
}

fn load_err_named(target: &str) -> impl Fn(LoadError) -> CompareError + '_ {
    move |source| CompareError::Load {
        target: target.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn latency_rows_are_cut_into_slices_of_about_a_hundred_ops() {
        assert_eq!(latency_slices(1000, 2), (10, 100));
        assert_eq!(latency_slices(50, 2), (2, 25));
        assert_eq!(latency_slices(1000, 20), (20, 50));
        assert_eq!(latency_slices(1, 0), (1, 1));
    }

    #[test]
    fn rounds_alternate_direction() {
        assert_eq!(round_order(3, 0), vec![0, 1, 2]);
        assert_eq!(round_order(3, 1), vec![2, 1, 0]);
        assert_eq!(round_order(3, 2), vec![0, 1, 2]);
    }

    #[test]
    fn the_reference_comes_first_whatever_the_order_asked() {
        let t = targets_named(&["memfabricd-ucx".into(), "memcached-tcp".into()]).unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.name).collect();
        assert_eq!(names, vec!["memcached-tcp", "memfabricd-ucx"]);
        assert!(targets_named(&["nope".into()]).is_err());
        assert!(targets_named(&[]).is_err());
    }

    #[test]
    fn ucx_target_needs_a_ucx_port() {
        let a = ServerAddrs {
            tcp: SocketAddr::from(([127, 0, 0, 1], 1)),
            ucx: None,
        };
        let ucx = TARGETS.iter().find(|t| t.name == "memfabricd-ucx").unwrap();
        assert!((ucx.connector)(&a).is_none());
        assert!((TARGETS[0].connector)(&a).is_some());
    }
}
