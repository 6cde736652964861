//! memfabric-bench: throughput, latency, and the memcached comparison.

use clap::{Args, Parser, Subcommand, ValueEnum};
use memfabric_bench::compare::{self, SuitePlan, ThroughputPlan, YcsbPlan};
use memfabric_bench::compare_report::{self, ReportContext};
use memfabric_bench::latency::{self, LatencyConfig, LatencyOp, LatencyReport};
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::metrics::{self, RunSummary};
use memfabric_bench::plot::{self, Panel};
use memfabric_bench::report::{self, Machine};
use memfabric_bench::server::{self, ServerSpec};
use memfabric_bench::transport::{Connector, TcpConnector};
use memfabric_bench::ucx::UcxConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpMix, Pattern};
use memfabric_bench::ycsb::{RequestDist, YcsbSpec, YcsbWorkload};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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
}

/// Order of operations (`--pattern`).
#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum PatternArg {
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
enum Dist {
    Uniform,
    Zipfian,
}

/// How requests reach the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum TransportKind {
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
    fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Ucx => "ucx",
            TransportKind::Onesided => "onesided",
        }
    }

    fn connector(self, addr: SocketAddr) -> Box<dyn Connector> {
        match self {
            TransportKind::Tcp => Box::new(TcpConnector { addr }),
            TransportKind::Ucx => Box::new(UcxConnector::new(addr)),
            TransportKind::Onesided => Box::new(UcxConnector::onesided(addr)),
        }
    }
}

#[derive(Args, Clone, Debug, Serialize)]
struct WorkloadArgs {
    /// Number of distinct keys (all preloaded).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Key name prefix; keys are PREFIX + 10 digits.
    #[arg(long, default_value = "mfb:")]
    key_prefix: String,
    /// Value size(s) in bytes, comma separated; one run per size.
    #[arg(long, value_delimiter = ',', default_value = "32")]
    value_size: Vec<usize>,
    /// get:set ratio of `--pattern mix`.
    #[arg(long, default_value = "90:10")]
    mix: String,
    /// Order of operations: mix (random draws from --mix), interleaved (set, get, set,
    /// get ...: 50:50) or non-interleaved (10 sets then 90 gets, repeating: 10:90).
    #[arg(long, value_enum, default_value_t = PatternArg::Mix)]
    pattern: PatternArg,
    /// Key popularity.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    dist: Dist,
    /// Zipfian exponent.
    #[arg(long, default_value_t = 0.99)]
    theta: f64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Connections per client thread.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Requests in flight per connection (1 = no pipelining).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Open loop: send at this fixed rate (ops/s over all client threads) whatever the
    /// server does, and measure latency from each op's scheduled send time (no coordinated
    /// omission). Without it the loop is closed (send when a reply comes back).
    #[arg(long)]
    rate: Option<f64>,
    /// Stop after this many operations in total.
    #[arg(long)]
    ops: Option<u64>,
    /// Stop after this many seconds (default 10 when --ops is not given).
    #[arg(long)]
    duration: Option<f64>,
    /// Seed of the key and op sequences (same seed, same requests).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip storing every key before measuring.
    #[arg(long)]
    no_preload: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct OutputArgs {
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw a PNG plot to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct ThroughputArgs {
    /// Server address (with `--transport ucx`: memfabricd's `--ucx-port`).
    #[arg(long, default_value = "127.0.0.1:11211")]
    server: SocketAddr,
    /// tcp, or ucx (memfabricd only; each client thread has its own client and UCX worker,
    /// and its `--conns` are request queues over it).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// Server process id, to measure its CPU time (utime+stime from /proc).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Label of the server in reports.
    #[arg(long, default_value = "server")]
    name: String,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct LatencyArgs {
    /// Server address: its TCP port, or with `--transport ucx` alone its `--ucx-port`.
    #[arg(long, default_value = "127.0.0.1:11211")]
    server: SocketAddr,
    /// Transports to measure, comma separated (tcp, ucx); each gets every (op, size).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "tcp")]
    transport: Vec<TransportKind>,
    /// memfabricd's UCX bootstrap port (`--ucx-port`), for `--transport tcp,ucx` against one
    /// server; defaults to `--server`.
    #[arg(long)]
    ucx_server: Option<SocketAddr>,
    /// Server process id: report its CPU seconds per million ops for every row.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Start this server (memcached or memfabricd) on free loopback ports for the run
    /// (`--ucx-port` too when ucx is measured) instead of using `--server`; killed at the end.
    #[arg(long)]
    start_server: Option<PathBuf>,
    /// Worker threads (-t) of the started server.
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Memory limit (-m, MB) of the started server.
    #[arg(long, default_value_t = 1024)]
    memory: usize,
    /// Extra argument for the started server (repeatable), e.g. --server-arg=--poll-us
    /// --server-arg=200.
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// Value sizes in bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,8,32,128,512,1024,4096,16384,65536,524288"
    )]
    sizes: Vec<usize>,
    /// Operations to measure: get, set, mix (90% get, 10% set of the same key).
    #[arg(long, value_delimiter = ',', default_value = "get,set")]
    ops: Vec<String>,
    /// Measured operations per (op, size).
    #[arg(long, default_value_t = 10_000)]
    iterations: u64,
    /// Unmeasured operations before each (op, size).
    #[arg(long, default_value_t = 200)]
    warmup: u64,
    #[arg(long, default_value = "mfb-lat:")]
    key_prefix: String,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Args)]
struct CompareArgs {
    /// The reference server binary.
    #[arg(long, default_value = "/usr/bin/memcached")]
    memcached: PathBuf,
    /// The candidate server binary (point it at memcached, with --targets
    /// memcached-tcp,memfabricd-tcp, for an A/A noise check). Default: the memfabricd next
    /// to this memfabric-bench, else the first on PATH, else target/release/memfabricd.
    #[arg(long)]
    memfabricd: Option<PathBuf>,
    /// What to measure: server x transport, comma separated; the first known one
    /// (memcached-tcp) is the reference of every ratio.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memcached-tcp,memfabricd-tcp,memfabricd-ucx,memfabricd-onesided"
    )]
    targets: Vec<String>,
    /// Sections to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latency,throughput,ycsb,ceiling"
    )]
    sections: Vec<Section>,
    /// Worker threads of both servers (-t).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Memory limit of both servers in MB (-m); large enough to hold the key space.
    #[arg(long, default_value_t = 1024)]
    memory: usize,
    /// memfabricd's --poll-us (busy-poll after activity; UCX clients want it); 0 passes no
    /// flag.
    #[arg(long, default_value_t = 50)]
    poll_us: u64,
    /// Extra argument for memcached (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    memcached_arg: Vec<String>,
    /// Extra argument for memfabricd (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    memfabricd_arg: Vec<String>,
    /// Measured rounds per load; the order of the targets alternates each round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Throughput section: client thread counts, one cell each (default: --threads).
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Latency section: value sizes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,32,1024,4096,16384,65536,524288"
    )]
    latency_sizes: Vec<usize>,
    /// Latency section: operations (get, set, mix).
    #[arg(long, value_delimiter = ',', default_value = "get,set,mix")]
    latency_ops: Vec<String>,
    /// Latency section: measured operations per (op, size, target).
    #[arg(long, default_value_t = 5000)]
    latency_iterations: u64,
    /// YCSB section: workloads (a-f).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c")]
    ycsb: Vec<String>,
    /// YCSB section: records of the load phase.
    #[arg(long, default_value_t = 100_000)]
    ycsb_records: u64,
    /// YCSB section: client threads.
    #[arg(long, default_value_t = 2)]
    ycsb_threads: usize,
    /// Exit with status 1 when a throughput cell misses the acceptance target
    /// (throughput >= 1.0x, p99 <= 1.1x, CPU/Mop <= 1.0x of memcached-tcp).
    #[arg(long)]
    check: bool,
    /// The quick report: fixed, small parameters (listed in the report), under 3 minutes on
    /// 2 cores; writes docs/benchmarks.md's generated section, docs/img/compare-quick.json
    /// and docs/img/compare-*.png unless --report/--json/--plot-dir say otherwise.
    #[arg(long)]
    quick: bool,
    /// Write the Markdown report into this file between its compare-report markers.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Directory for the report's PNG plots (default: the report's docs/img).
    #[arg(long)]
    plot_dir: Option<PathBuf>,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Section {
    /// One op at a time by value size.
    Latency,
    /// Closed loop by client threads.
    Throughput,
    /// YCSB workloads.
    Ycsb,
    /// The load generator against the in-process responder.
    Ceiling,
}

/// YCSB's request distribution (`--distribution` overrides the workload's own).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum RequestDistArg {
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

#[derive(Args)]
struct YcsbArgs {
    /// Server address (with `--transport ucx`: memfabricd's `--ucx-port`).
    #[arg(long, default_value = "127.0.0.1:11211")]
    server: SocketAddr,
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// Server process id, to measure its CPU time (utime+stime from /proc).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Label of the server in reports.
    #[arg(long, default_value = "server")]
    name: String,
    /// Workloads to run in order (a-f), after one load phase.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,e,f")]
    workloads: Vec<String>,
    /// Records inserted by the load phase (YCSB's recordcount).
    #[arg(long, default_value_t = 100_000)]
    record_count: u64,
    /// Operations of each run phase (YCSB's operationcount); 100000 if neither this nor
    /// --duration is given.
    #[arg(long)]
    operation_count: Option<u64>,
    /// Stop each run phase after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Override the workloads' request distribution.
    #[arg(long, value_enum)]
    distribution: Option<RequestDistArg>,
    /// Longest scan of workload E (multi-get of consecutive records).
    #[arg(long, default_value_t = 100)]
    max_scan_length: u64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Connections per client thread.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Operations in flight per connection.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Open loop at this many ops/s (latency from the scheduled send time).
    #[arg(long)]
    rate: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip the load phase (the records are already there).
    #[arg(long)]
    no_load: bool,
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    out: OutputArgs,
}

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

impl WorkloadArgs {
    fn load_config(&self, label: &str) -> Fallible<LoadConfig> {
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

fn write_json<T: Serialize>(path: &Path, v: &T) -> Fallible<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn report_plot(r: Result<(), plot::PlotError>, path: &Path) {
    match r {
        Ok(()) => eprintln!("wrote {}", path.display()),
        // A missing font must not throw away a finished benchmark: say so and go on.
        Err(e) => eprintln!("plot skipped: {e}"),
    }
}

fn throughput(a: ThroughputArgs) -> Fallible<()> {
    let base = a.workload.load_config(&a.name)?;
    let connector = a.transport.connector(a.server);
    let connector = connector.as_ref();
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    let mut summaries = Vec::new();
    let mut panels = Vec::new();
    for &size in &a.workload.value_size {
        let mut cfg = base.clone();
        cfg.value_size = size;
        if !a.workload.no_preload {
            let p = load::preload(connector, &cfg.keys, size, 8, 32)?;
            eprintln!(
                "preloaded {} keys of {size} B in {:.1}s",
                p.stored,
                p.elapsed.as_secs_f64()
            );
        }
        let m = load::measured_run(connector, &cfg, a.server_pid)?;
        summaries.push(m.summary(&a.name, size));
        let stats = m.stats;
        panels.push(Panel {
            title: format!("{size} B values"),
            series: vec![(a.name.clone(), plot::percentile_curve(&stats.all_hist()))],
        });
    }
    println!(
        "workload: {} keys, {}, {:?}, {} thread(s) x {} conn(s), depth {}, {}, {}",
        base.keys.n,
        pattern_label(&base),
        base.dist,
        base.threads,
        base.conns_per_thread,
        base.depth,
        a.transport.name(),
        base.rate.map_or_else(
            || "closed loop".to_string(),
            |r| format!("open loop at {r} ops/s (latency from the scheduled send time)")
        )
    );
    print!("{}", report::runs_table(&summaries));
    if let Some(p) = &a.out.json {
        #[derive(Serialize)]
        struct Out<'a> {
            machine: &'a Machine,
            server: String,
            transport: TransportKind,
            workload: &'a WorkloadArgs,
            results: &'a [RunSummary],
        }
        write_json(
            p,
            &Out {
                machine: &machine,
                server: a.server.to_string(),
                transport: a.transport,
                workload: &a.workload,
                results: &summaries,
            },
        )?;
    }
    if let Some(p) = &a.out.plot {
        report_plot(
            plot::latency_percentiles(p, &format!("{} latency by percentile", a.name), &panels),
            p,
        );
    }
    Ok(())
}

/// "mix 90:10 get:set", "interleaved", ...
fn pattern_label(c: &LoadConfig) -> String {
    match c.pattern {
        Pattern::Mix => format!("mix {} get:set", c.mix),
        p => p.name().to_string(),
    }
}

fn latency_cmd(a: LatencyArgs) -> Fallible<()> {
    let ops = a
        .ops
        .iter()
        .map(|o| {
            LatencyOp::parse(o).ok_or_else(|| format!("--ops: unknown op {o:?} (get, set, mix)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if a.transport.is_empty() {
        return Err("--transport: give at least one of tcp, ucx".into());
    }
    let measure_ucx = a.transport.iter().any(|t| *t != TransportKind::Tcp);
    // A server of our own, on free ports; dropping it kills it.
    let started = match &a.start_server {
        Some(path) => {
            let mut extra = a.server_arg.clone();
            let ucx_port = if measure_ucx {
                let p = server::free_port()?;
                extra.extend(["--ucx-port".to_string(), p.to_string()]);
                Some(p)
            } else {
                None
            };
            let spec = ServerSpec {
                name: path
                    .file_name()
                    .map_or("server".into(), |n| n.to_string_lossy().into_owned()),
                path: path.clone(),
                threads: a.server_threads,
                memory_mb: a.memory,
                extra_args: extra,
            };
            eprintln!("starting {}", spec.display_args());
            let proc = spec.start()?;
            let ucx = ucx_port.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
            Some((proc, ucx))
        }
        None => None,
    };
    let (tcp_addr, ucx_addr, pid) = match &started {
        Some((p, ucx)) => (p.addr, ucx.unwrap_or(p.addr), Some(p.pid())),
        None => (a.server, a.ucx_server.unwrap_or(a.server), a.server_pid),
    };
    let cfg = LatencyConfig {
        sizes: a.sizes.clone(),
        ops,
        iterations: a.iterations,
        warmup: a.warmup,
        key_prefix: a.key_prefix.clone(),
        server_pid: pid,
    };
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for &t in &a.transport {
        let addr = match t {
            TransportKind::Tcp => tcp_addr,
            TransportKind::Ucx | TransportKind::Onesided => ucx_addr,
        };
        // One transport: the title names the address alone, as it always did.
        targets.push(if a.transport.len() > 1 {
            format!("{} {addr}", t.name())
        } else {
            addr.to_string()
        });
        rows.extend(latency::run(t.connector(addr).as_ref(), &cfg)?);
    }
    drop(started);
    let with_cpu = rows.iter().any(|(r, _)| r.server_cpu_s_per_mop.is_some());
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(r, _)| {
            let mut row = vec![
                r.transport.clone(),
                r.op.clone(),
                r.size.to_string(),
                format!("{:.2}", r.p50_us),
                format!("{:.2}", r.p99_us),
                format!("{:.2}", r.p999_us),
                r.ops.to_string(),
            ];
            if with_cpu {
                row.push(
                    r.server_cpu_s_per_mop
                        .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                );
            }
            row
        })
        .collect();
    let mut headers = vec![
        "transport",
        "op",
        "size",
        "p50_us",
        "p99_us",
        "p99.9_us",
        "ops",
    ];
    if with_cpu {
        headers.push("server_cpu_s_per_mop");
    }
    print!("{}", report::table(&headers, &table_rows));
    let results: Vec<_> = rows.iter().map(|(r, _)| r.clone()).collect();
    if let Some(p) = &a.out.json {
        write_json(p, &LatencyReport { results })?;
    }
    if let Some(p) = &a.out.plot {
        let mut series = Vec::new();
        for t in &a.transport {
            let tname = t.name();
            for op in &a.ops {
                for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
                    let pts: Vec<(usize, f64)> = rows
                        .iter()
                        .filter(|(r, _)| &r.op == op && r.transport == tname)
                        .map(|(r, h)| (r.size, metrics::pct_us(h, q)))
                        .collect();
                    // One transport: the legend stays as it was ("get p50").
                    let label = if a.transport.len() > 1 {
                        format!("{tname} {op} {name}")
                    } else {
                        format!("{op} {name}")
                    };
                    series.push((label, pts));
                }
            }
        }
        report_plot(
            plot::latency_vs_size(
                p,
                &format!("latency, one op at a time ({})", targets.join(", ")),
                &series,
            ),
            p,
        );
    }
    Ok(())
}

/// The parameters `--quick` fixes, as (flag effect, description for the report).
fn apply_quick(a: &mut CompareArgs) {
    a.rounds = 2;
    a.latency_sizes = vec![1, 32, 1024, 4096, 16384, 65536, 524_288];
    a.latency_ops = vec!["get".into(), "set".into(), "mix".into()];
    a.latency_iterations = 1000;
    a.clients = vec![1, 2, 4];
    a.workload.keys = 10_000;
    a.workload.value_size = vec![4096];
    a.workload.conns = 2;
    a.workload.depth = 1;
    a.workload.ops = None;
    a.workload.duration = Some(1.5);
    a.workload.rate = None;
    a.ycsb = vec!["a".into(), "b".into(), "c".into()];
    a.ycsb_records = 20_000;
    a.ycsb_threads = 2;
    a.workload.quiet = true;
    let docs = PathBuf::from("docs");
    a.report.get_or_insert_with(|| docs.join("benchmarks.md"));
    a.out
        .json
        .get_or_insert_with(|| docs.join("img").join("compare-quick.json"));
}

fn compare_cmd(mut a: CompareArgs) -> Fallible<bool> {
    let wall = std::time::Instant::now();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    if a.quick {
        apply_quick(&mut a);
    }
    // The UCX transports of both sides: the environment's, or shared memory. Set before
    // any thread or server starts, so both inherit it.
    let ucx_tls = std::env::var("UCX_TLS").unwrap_or_else(|_| {
        std::env::set_var("UCX_TLS", DEFAULT_UCX_TLS);
        DEFAULT_UCX_TLS.to_string()
    });
    let targets = compare::targets_named(&a.targets)?;
    let machine = Machine::describe();
    let spec = |name: &str, path: &Path, extra: Vec<String>| ServerSpec {
        name: name.to_string(),
        path: path.to_path_buf(),
        threads: a.server_threads,
        memory_mb: a.memory,
        extra_args: extra,
    };
    let memcached = spec("memcached", &a.memcached, a.memcached_arg.clone());
    // 0 is memfabricd's default: no flag, so the candidate may also be memcached (A/A).
    let mut mf_extra = Vec::new();
    if a.poll_us > 0 {
        mf_extra.extend(["--poll-us".to_string(), a.poll_us.to_string()]);
    }
    mf_extra.extend(a.memfabricd_arg.iter().cloned());
    let (mf_path, origin) = server::locate_memfabricd(a.memfabricd.as_deref())?;
    eprintln!("compare: memfabricd is {} ({origin})", mf_path.display());
    let memfabricd = spec("memfabricd", &mf_path, mf_extra);
    let mut load = a.workload.load_config("")?;
    let clients = if a.clients.is_empty() {
        vec![a.workload.threads]
    } else {
        a.clients.clone()
    };
    let has = |s| a.sections.contains(&s);
    let latency = if has(Section::Latency) {
        let ops = a
            .latency_ops
            .iter()
            .map(|o| {
                LatencyOp::parse(o)
                    .ok_or_else(|| format!("--latency-ops: unknown op {o:?} (get, set, mix)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Some(LatencyConfig {
            sizes: a.latency_sizes.clone(),
            ops,
            iterations: a.latency_iterations,
            warmup: (a.latency_iterations / 10).max(10),
            key_prefix: "mfb-lat:".into(),
            server_pid: None,
        })
    } else {
        None
    };
    let throughput = (has(Section::Throughput) || has(Section::Ceiling)).then(|| ThroughputPlan {
        load: load.clone(),
        value_sizes: a.workload.value_size.clone(),
        clients: clients.clone(),
        preload: !a.workload.no_preload,
    });
    let ycsb = if has(Section::Ycsb) {
        let specs = a
            .ycsb
            .iter()
            .map(|w| YcsbWorkload::parse(w).map(|w| YcsbSpec::standard(w, a.ycsb_records)))
            .collect::<Result<Vec<_>, _>>()?;
        load.threads = a.ycsb_threads;
        Some(YcsbPlan { load, specs })
    } else {
        None
    };
    let plan = SuitePlan {
        memcached: memcached.clone(),
        memfabricd: memfabricd.clone(),
        targets,
        rounds: a.rounds,
        latency,
        throughput: throughput.filter(|_| has(Section::Throughput) || has(Section::Ceiling)),
        ycsb,
        ceiling: has(Section::Ceiling).then(|| clients.clone()),
    };
    let mut plan = plan;
    // Ceiling alone: the throughput template is needed, its cells are not.
    let throughput_cells = has(Section::Throughput);
    if !throughput_cells {
        if let Some(tp) = plan.throughput.as_mut() {
            tp.clients.clear();
        }
    }
    println!("machine: {}", machine.line());
    println!("reference: {}", memcached.display_args());
    println!("candidate: {}", memfabricd.display_args());
    println!("UCX_TLS={ucx_tls}");
    let settings = suite_settings(&a, &plan);
    for line in &settings {
        println!("{line}");
    }
    let res = compare::run_suite(&plan)?;
    print!("{}", compare_report::text(&res));
    let pass = res
        .throughput
        .iter()
        .flat_map(|c| &c.ratios)
        .all(|r| r.meets_target.all());
    if throughput_cells {
        println!(
            "\ntarget (every target vs memcached-tcp: throughput >= 1.0x, p99 <= 1.1x, CPU/Mop <= 1.0x): {}",
            if pass { "MET" } else { "NOT MET" }
        );
    }
    if let Some(p) = &a.out.json {
        let v = serde_json::json!({
            "command": command,
            "machine": machine,
            "ucx_tls": ucx_tls,
            "servers": {
                "memcached": {
                    "command": memcached.display_args(),
                    "version": server::version_of(&a.memcached),
                },
                "memfabricd": { "command": memfabricd.display_args() },
            },
            "settings": settings,
            "results": res,
        });
        write_json(p, &v)?;
    }
    if let Some(p) = &a.out.plot {
        let panels = compare_report::percentile_panels(&res.throughput);
        report_plot(
            plot::latency_percentiles(p, "latency by percentile, closed loop", &panels),
            p,
        );
    }
    if let Some(doc) = &a.report {
        let doc_dir = doc.parent().unwrap_or(Path::new("."));
        let plot_dir = a.plot_dir.clone().unwrap_or_else(|| doc_dir.join("img"));
        let drawn = compare_report::draw_plots(&res, &plot_dir, "compare");
        let plots: Vec<(String, String)> = drawn
            .iter()
            .map(|(caption, path)| {
                let rel = path.strip_prefix(doc_dir).unwrap_or(path);
                (caption.clone(), rel.display().to_string())
            })
            .collect();
        let servers = [memcached.display_args(), memfabricd.display_args()];
        let ctx = ReportContext {
            command: &command,
            machine: &machine,
            servers: &servers,
            ucx_tls: &ucx_tls,
            settings: &settings,
            wall_seconds: wall.elapsed().as_secs_f64(),
            commit: git_commit(),
            plots: &plots,
        };
        let section = compare_report::markdown(&res, &ctx);
        let old = std::fs::read_to_string(doc).unwrap_or_default();
        std::fs::write(doc, compare_report::splice(&old, &section))
            .map_err(|e| format!("{}: {e}", doc.display()))?;
        eprintln!("wrote {} (generated section)", doc.display());
    }
    eprintln!("compare took {:.0}s", wall.elapsed().as_secs_f64());
    Ok(pass)
}

/// UCX transports when UCX_TLS is unset: shared memory on one host.
const DEFAULT_UCX_TLS: &str = "posix,cma,self";

/// The parameters of a comparison, one line each, for the terminal and the report.
fn suite_settings(a: &CompareArgs, plan: &SuitePlan) -> Vec<String> {
    let names: Vec<&str> = plan.targets.iter().map(|t| t.name).collect();
    let mut out = vec![format!(
        "Targets: {}; {} round(s) per load, target order alternating each round.",
        names.join(", "),
        plan.rounds
    )];
    if let Some(l) = &plan.latency {
        let ops: Vec<&str> = l.ops.iter().map(|o| o.name()).collect();
        out.push(format!(
            "Latency: one client, one connection, one op at a time; ops {} (mix = 90% get, 10% set), sizes {:?} B, {} measured ops per row after {} warm-up.",
            ops.join(", "),
            l.sizes,
            l.iterations,
            l.warmup
        ));
    }
    if let Some(t) = plan.throughput.as_ref().filter(|t| !t.clients.is_empty()) {
        out.push(format!(
            "Throughput: closed loop, {} keys ({}), {}, values {:?} B, {:?} client threads x {} connection(s) x depth {}, {} per round.",
            t.load.keys.n,
            match t.load.dist {
                KeyDist::Uniform => "uniform".to_string(),
                KeyDist::Zipfian { theta } => format!("zipfian {theta}"),
            },
            pattern_label(&t.load),
            t.value_sizes,
            t.clients,
            t.load.conns_per_thread,
            t.load.depth,
            bound_label(&t.load),
        ));
    }
    if let Some(y) = &plan.ycsb {
        let w: String = y.specs.iter().map(|s| s.workload.letter()).collect();
        if let Some(s) = y.specs.first() {
            out.push(format!(
                "YCSB {w}: {} records of {} x {} B, keys user+fnvhash64, {} client threads x {} connection(s), {} per round; zipfian theta {} (latest for D).",
                s.record_count,
                s.field_count,
                s.field_length,
                y.load.threads,
                y.load.conns_per_thread,
                bound_label(&y.load),
                s.theta
            ));
        }
    }
    if let Some(c) = &plan.ceiling {
        out.push(format!(
            "Generator ceiling: the throughput load against the in-process responder with {c:?} client threads, one round."
        ));
    }
    if a.quick {
        out.push("Parameters fixed by --quick.".into());
    }
    out
}

fn bound_label(c: &LoadConfig) -> String {
    match (c.ops, c.duration) {
        (Some(o), _) => format!("{o} ops"),
        (None, Some(d)) => format!("{:.1} s", d.as_secs_f64()),
        (None, None) => "-".into(),
    }
}

/// The commit the binaries were built from (for the report), and whether tracked files had
/// uncommitted changes (they were built too); None outside a git checkout.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).filter(|s| !s.is_empty())?;
    let changed =
        git(&["status", "--porcelain", "--untracked-files=no"]).map_or(0, |s| s.lines().count());
    Some(if changed > 0 {
        format!(
            "commit `{head}` plus the working tree's uncommitted changes to {changed} tracked \
             file(s) (built in)"
        )
    } else {
        format!("commit `{head}`")
    })
}

fn ycsb_cmd(a: YcsbArgs) -> Fallible<()> {
    let connector = a.transport.connector(a.server);
    let connector = connector.as_ref();
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    let mut specs = Vec::new();
    for w in &a.workloads {
        let mut spec = YcsbSpec::standard(YcsbWorkload::parse(w)?, a.record_count);
        spec.max_scan_length = a.max_scan_length;
        if let Some(d) = a.distribution {
            spec.request_dist = d.into();
        }
        spec.validate()?;
        specs.push(spec);
    }
    let Some(first) = specs.first() else {
        return Err("--workloads: give at least one of a-f".into());
    };
    let keys = first.key_space();
    let load_phase = if a.no_load {
        None
    } else {
        let p = load::preload(connector, &keys, first.value_size(), 8, 32)?;
        let secs = p.elapsed.as_secs_f64();
        eprintln!("load phase: {} records in {secs:.1}s", p.stored);
        Some(serde_json::json!({
            "records": p.stored,
            "seconds": secs,
            "ops_per_sec": if secs > 0.0 { p.stored as f64 / secs } else { 0.0 },
        }))
    };
    let duration = a
        .duration
        .map(Duration::try_from_secs_f64)
        .transpose()
        .map_err(|e| format!("--duration: {e}"))?;
    let ops = match (a.operation_count, duration) {
        (None, None) => Some(100_000),
        (o, _) => o,
    };
    let mut rows = Vec::new();
    let mut panels = Vec::new();
    for spec in &specs {
        let name = format!("{} {}", a.name, spec.workload.letter());
        let cfg = LoadConfig {
            threads: a.threads,
            conns_per_thread: a.conns,
            depth: a.depth,
            ops,
            duration,
            keys: keys.clone(),
            dist: KeyDist::Uniform,
            mix: OpMix { gets: 1, sets: 0 },
            pattern: Pattern::Mix,
            ycsb: Some(spec.clone()),
            rate: a.rate,
            value_size: spec.value_size(),
            seed: a.seed,
            progress: !a.quiet,
            label: name.clone(),
        };
        let m = load::measured_run(connector, &cfg, a.server_pid)?;
        panels.push(Panel {
            title: format!("YCSB {}", spec.workload.letter()),
            series: vec![(a.name.clone(), plot::percentile_curve(&m.stats.all_hist()))],
        });
        rows.push((spec.clone(), m.summary(&name, spec.value_size())));
    }
    println!(
        "YCSB: {} records, {} thread(s) x {} conn(s), depth {}, {}{}",
        a.record_count,
        a.threads,
        a.conns,
        a.depth,
        a.transport.name(),
        a.rate
            .map_or_else(String::new, |r| format!(", open loop at {r} ops/s"))
    );
    let summaries: Vec<RunSummary> = rows.iter().map(|(_, s)| s.clone()).collect();
    print!("{}", report::runs_table(&summaries));
    print!("{}", report::kinds_table(&summaries));
    if let Some(p) = &a.out.json {
        let results: Vec<serde_json::Value> = rows
            .iter()
            .map(|(spec, s)| serde_json::json!({ "spec": spec, "summary": s }))
            .collect();
        write_json(
            p,
            &serde_json::json!({
                "machine": machine,
                "server": a.server.to_string(),
                "transport": a.transport,
                "load_phase": load_phase,
                "results": results,
            }),
        )?;
    }
    if let Some(p) = &a.out.plot {
        report_plot(
            plot::latency_percentiles(p, &format!("YCSB on {}", a.name), &panels),
            p,
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Throughput(a) => throughput(a).map(|()| true),
        Cmd::Latency(a) => latency_cmd(a).map(|()| true),
        Cmd::Ycsb(a) => ycsb_cmd(a).map(|()| true),
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
