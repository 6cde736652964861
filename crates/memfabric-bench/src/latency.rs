//! Latency in the style of OSU's ohb_memlat: one client, one connection, one operation at a
//! time, for each value size and operation (get, set, or a 90:10 mix of both on the same
//! key); reports p50/p99/p99.9 per (op, size).

use crate::load::LoadError;
use crate::metrics::{pct_us, Progress};
use crate::rng::Rng;
use crate::textproto::{Reply, Request};
use crate::transport::{Connector, Transport};
use crate::workload::{OpKind, OpMix, ValueMaker};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::{Duration, Instant};

/// What each measured operation of a row is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyOp {
    Get,
    Set,
    /// Each operation drawn from this get:set mix (same seed every row).
    Mix(OpMix),
}

impl LatencyOp {
    /// The ohb_memlat mix: 90% gets, 10% sets.
    pub const MIX_90_10: LatencyOp = LatencyOp::Mix(OpMix { gets: 90, sets: 10 });

    /// `get`, `set` or `mix` (90:10).
    pub fn parse(s: &str) -> Option<LatencyOp> {
        match s {
            "get" => Some(LatencyOp::Get),
            "set" => Some(LatencyOp::Set),
            "mix" => Some(LatencyOp::MIX_90_10),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LatencyOp::Get => "get",
            LatencyOp::Set => "set",
            LatencyOp::Mix(_) => "mix",
        }
    }
}

impl From<OpKind> for LatencyOp {
    fn from(op: OpKind) -> Self {
        match op {
            OpKind::Get => LatencyOp::Get,
            OpKind::Set => LatencyOp::Set,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LatencyConfig {
    pub sizes: Vec<usize>,
    pub ops: Vec<LatencyOp>,
    /// Measured operations per (op, size).
    pub iterations: u64,
    /// Unmeasured operations first, to warm caches and the connection.
    pub warmup: u64,
    pub key_prefix: String,
    /// The server's process id: each row then reports its CPU time per million measured ops.
    pub server_pid: Option<u32>,
}

/// One row of the JSON report: `{"transport","op","size","p50_us","p99_us","p999_us","ops"}`;
/// `ops` is the number of measured operations.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyResult {
    pub transport: String,
    pub op: String,
    pub size: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub ops: u64,
    /// Server CPU seconds (utime+stime, all threads) per million measured ops; only with a
    /// server pid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_cpu_s_per_mop: Option<f64>,
}

impl LatencyResult {
    /// The row for `h` (ns) of `op` at `size` over `transport`; `server_cpu_s`: the
    /// server's CPU seconds over those operations, if known.
    pub fn of(
        transport: &str,
        op: LatencyOp,
        size: usize,
        h: &Histogram<u64>,
        server_cpu_s: Option<f64>,
    ) -> LatencyResult {
        LatencyResult {
            transport: transport.to_string(),
            op: op.name().to_string(),
            size,
            p50_us: pct_us(h, 0.5),
            p99_us: pct_us(h, 0.99),
            p999_us: pct_us(h, 0.999),
            ops: h.len(),
            server_cpu_s_per_mop: server_cpu_s
                .filter(|_| !h.is_empty())
                .map(|c| c / h.len() as f64 * 1e6),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LatencyReport {
    pub results: Vec<LatencyResult>,
}

const STALL: Duration = Duration::from_secs(10);

/// Send one request and wait for its reply; returns the latency in ns and whether the reply
/// was what a successful op answers (STORED, or a VALUE that checks out).
fn one_op(
    tr: &mut dyn Transport,
    req: &Request<'_>,
    op: OpKind,
    check: &dyn Fn(&[u8]) -> bool,
) -> Result<(u64, bool), LoadError> {
    let start = Instant::now();
    tr.submit(0, req)?;
    let mut ok = None;
    while ok.is_none() {
        tr.progress(Duration::from_millis(50), &mut |_, reply| {
            ok = Some(match (op, reply) {
                (OpKind::Set, Reply::Stored) => true,
                (OpKind::Get, Reply::Hit { data, .. }) => check(data),
                _ => false,
            });
        })?;
        if ok.is_none() && start.elapsed() > STALL {
            return Err(LoadError::Stalled(STALL));
        }
    }
    Ok((start.elapsed().as_nanos() as u64, ok.unwrap_or(false)))
}

/// Run every (op, size) pair; returns the rows and their histograms (ns), in the same order.
pub fn run(
    connector: &dyn Connector,
    cfg: &LatencyConfig,
) -> Result<Vec<(LatencyResult, Histogram<u64>)>, LoadError> {
    run_with(connector, cfg, true)
}

/// [`run`] without its progress line (a caller that runs many short slices shows its own).
pub fn run_quiet(
    connector: &dyn Connector,
    cfg: &LatencyConfig,
) -> Result<Vec<(LatencyResult, Histogram<u64>)>, LoadError> {
    run_with(connector, cfg, false)
}

fn run_with(
    connector: &dyn Connector,
    cfg: &LatencyConfig,
    show_progress: bool,
) -> Result<Vec<(LatencyResult, Histogram<u64>)>, LoadError> {
    let mut tr = connector.connect(1)?;
    let transport = tr.name().to_string();
    let mut out = Vec::new();
    let mut val = Vec::new();
    let rows = cfg.ops.len() * cfg.sizes.len();
    let started = Instant::now();
    let mut progress = Progress::new(
        &format!("latency {transport}, (op, size) rows"),
        show_progress,
    );
    for &op in &cfg.ops {
        for &size in &cfg.sizes {
            // Rows done so far against all rows: the progress line's op count and goal.
            progress.tick(started.elapsed(), out.len() as u64, None, Some(rows as u64));
            let key = format!("{}{size}", cfg.key_prefix).into_bytes();
            let vm = ValueMaker::new(size);
            vm.fill(0, &mut val);
            let set = Request::Set {
                key: &key,
                value: &val,
            };
            // A GET is only meaningful on a stored item: store it first.
            let (_, stored) = one_op(tr.as_mut(), &set, OpKind::Set, &|_| true)?;
            if !stored {
                return Err(LoadError::PreloadFailed {
                    failed: 1,
                    total: 1,
                    first: format!("set of {size} bytes not stored"),
                });
            }
            let get = Request::Get { key: &key };
            let check = |d: &[u8]| vm.check(0, d);
            let mut h = Histogram::<u64>::new(3).map_err(|_| LoadError::Config("histogram"))?;
            let mut failures = 0u64;
            let mut cpu0 = None;
            // The mix draws its ops from a fixed seed: every row and every server sees the
            // same sequence.
            let mut rng = Rng::new(0x006d_6978);
            for i in 0..cfg.warmup + cfg.iterations {
                if i == cfg.warmup {
                    cpu0 = server_cpu(cfg.server_pid);
                }
                let kind = match op {
                    LatencyOp::Get => OpKind::Get,
                    LatencyOp::Set => OpKind::Set,
                    LatencyOp::Mix(mix) => mix.next(&mut rng),
                };
                let req = match kind {
                    OpKind::Get => get,
                    OpKind::Set => set,
                };
                let (ns, ok) = one_op(tr.as_mut(), &req, kind, &check)?;
                if i >= cfg.warmup {
                    let _ = h.record(ns.max(1));
                    failures += u64::from(!ok);
                }
            }
            let cpu = cpu0.zip(server_cpu(cfg.server_pid)).map(|(a, b)| b - a);
            if failures > 0 {
                return Err(LoadError::PreloadFailed {
                    failed: failures,
                    total: cfg.iterations,
                    first: format!("{} of {size} bytes did not succeed", op.name()),
                });
            }
            out.push((LatencyResult::of(&transport, op, size, &h, cpu), h));
        }
    }
    progress.finish();
    Ok(out)
}

fn server_cpu(pid: Option<u32>) -> Option<f64> {
    pid.and_then(|p| crate::metrics::process_cpu_seconds(p).ok())
}
