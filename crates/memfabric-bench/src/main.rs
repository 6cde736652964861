//! memfabric-bench: throughput, latency, and the memcached comparison.

use clap::{Args, Parser, Subcommand, ValueEnum};
use memfabric_bench::compare::{self, CompareConfig, CompareResult};
use memfabric_bench::latency::{self, LatencyConfig, LatencyReport};
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::metrics::{self, RunSummary};
use memfabric_bench::plot::{self, Panel};
use memfabric_bench::report::{self, Machine};
use memfabric_bench::server::{self, ServerSpec};
use memfabric_bench::transport::{Connector, TcpConnector};
use memfabric_bench::ucx::UcxConnector;
use memfabric_bench::workload::{KeyDist, KeySpace, OpKind, OpMix, Pattern};
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
    /// Start memcached and memfabricd with the same flags, run the same load on both, report ratios.
    Compare(CompareArgs),
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
}

impl TransportKind {
    fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Ucx => "ucx",
        }
    }

    fn connector(self, addr: SocketAddr) -> Box<dyn Connector> {
        match self {
            TransportKind::Tcp => Box::new(TcpConnector { addr }),
            TransportKind::Ucx => Box::new(UcxConnector::new(addr)),
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
        default_value = "1,8,32,128,512,1024,4096,16384,65536"
    )]
    sizes: Vec<usize>,
    /// Operations to measure.
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
    /// The candidate server binary (point it at memcached for a smoke test).
    #[arg(long, default_value = "target/release/memfabricd")]
    memfabricd: PathBuf,
    /// Label of the candidate in reports.
    #[arg(long, default_value = "memfabricd")]
    cand_name: String,
    /// Worker threads of both servers (-t).
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Memory limit of both servers in MB (-m); large enough to hold the key space.
    #[arg(long, default_value_t = 1024)]
    memory: usize,
    /// Extra argument for memcached (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    memcached_arg: Vec<String>,
    /// Extra argument for memfabricd (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    memfabricd_arg: Vec<String>,
    /// Measured rounds per value size; the order of the servers alternates each round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Exit with status 1 when the acceptance target is missed.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    workload: WorkloadArgs,
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
        let cpu0 = a
            .server_pid
            .and_then(|p| metrics::process_cpu_seconds(p).ok());
        let cli0 = metrics::self_cpu_seconds().ok();
        let stats = load::run(connector, &cfg)?;
        let cpu1 = a
            .server_pid
            .and_then(|p| metrics::process_cpu_seconds(p).ok());
        let cli1 = metrics::self_cpu_seconds().ok();
        let d = |x: Option<f64>, y: Option<f64>| x.zip(y).map(|(x, y)| y - x);
        summaries.push(RunSummary::from_stats(
            &a.name,
            size,
            &stats,
            d(cpu0, cpu1),
            d(cli0, cli1),
        ));
        panels.push(Panel {
            title: format!("{size} B values"),
            series: vec![(a.name.clone(), plot::percentile_curve(&stats.all_hist()))],
        });
    }
    println!(
        "workload: {} keys, {}, {:?}, {} thread(s) x {} conn(s), depth {}, {}",
        base.keys.n,
        pattern_label(&base),
        base.dist,
        base.threads,
        base.conns_per_thread,
        base.depth,
        a.transport.name()
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
        .map(|o| match o.as_str() {
            "get" => Ok(OpKind::Get),
            "set" => Ok(OpKind::Set),
            other => Err(format!("--ops: unknown op {other:?} (get, set)")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if a.transport.is_empty() {
        return Err("--transport: give at least one of tcp, ucx".into());
    }
    let measure_ucx = a.transport.contains(&TransportKind::Ucx);
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
            TransportKind::Ucx => ucx_addr,
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
    let mut headers = vec!["transport", "op", "size", "p50_us", "p99_us", "ops"];
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

fn compare_cmd(a: CompareArgs) -> Fallible<bool> {
    let load = a.workload.load_config("")?;
    let spec = |name: &str, path: &Path, extra: &[String]| ServerSpec {
        name: name.to_string(),
        path: path.to_path_buf(),
        threads: a.server_threads,
        memory_mb: a.memory,
        extra_args: extra.to_vec(),
    };
    let base = spec("memcached", &a.memcached, &a.memcached_arg);
    let cand = spec(&a.cand_name, &a.memfabricd, &a.memfabricd_arg);
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    println!("reference: {}", base.display_args());
    println!("candidate: {}", cand.display_args());
    println!(
        "workload: {} keys, {} get:set, {:?}, {} client thread(s) x {} conn(s), depth {}, {} round(s) of {}",
        load.keys.n,
        load.mix,
        load.dist,
        load.threads,
        load.conns_per_thread,
        load.depth,
        a.rounds,
        match (load.ops, load.duration) {
            (Some(o), _) => format!("{o} ops"),
            (None, Some(d)) => format!("{:.0}s", d.as_secs_f64()),
            (None, None) => "-".into(),
        }
    );
    let cfg = CompareConfig {
        base: base.clone(),
        cand: cand.clone(),
        load,
        value_sizes: a.workload.value_size.clone(),
        rounds: a.rounds,
        preload: !a.workload.no_preload,
    };
    let res = compare::run(&cfg)?;
    println!("\nper round:");
    let per_round: Vec<RunSummary> = res
        .rounds
        .iter()
        .map(|(r, s)| {
            let mut s = s.clone();
            s.server = format!("r{r} {}", s.server);
            s
        })
        .collect();
    print!("{}", report::runs_table(&per_round));
    println!("\nall rounds:");
    print!("{}", report::runs_table(&res.totals));
    println!("\n{} / memcached:", a.cand_name);
    print!("{}", ratios_table(&res));
    let pass = res.ratios.iter().all(|r| r.meets_target.all());
    println!(
        "target (throughput >= 1.0x, p99 <= 1.1x, CPU/Mop <= 1.0x): {}",
        if pass { "MET" } else { "NOT MET" }
    );
    if let Some(p) = &a.out.json {
        write_json(p, &compare_json(&machine, &a, &base, &cand, &res))?;
    }
    if let Some(p) = &a.out.plot {
        let panels = a
            .workload
            .value_size
            .iter()
            .enumerate()
            .map(|(i, size)| Panel {
                title: format!("{size} B values"),
                series: (0..2)
                    .filter_map(|k| {
                        let idx = 2 * i + k;
                        let s = res.totals.get(idx)?;
                        let h = res.hists.get(idx)?;
                        Some((s.server.clone(), plot::percentile_curve(h)))
                    })
                    .collect(),
            })
            .collect::<Vec<_>>();
        report_plot(
            plot::latency_percentiles(
                p,
                &format!(
                    "{} vs memcached, -t {}, {} get:set, {} conns",
                    a.cand_name,
                    a.server_threads,
                    a.workload.mix,
                    a.workload.threads * a.workload.conns
                ),
                &panels,
            ),
            p,
        );
    }
    Ok(pass)
}

fn ratios_table(res: &CompareResult) -> String {
    let yes = |b: bool| if b { "ok" } else { "MISS" };
    let list = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let rows: Vec<Vec<String>> = res
        .ratios
        .iter()
        .map(|r| {
            vec![
                format!("{} B", r.value_size),
                format!("{:.3}x {}", r.throughput, yes(r.meets_target.throughput)),
                format!("{:.3}x {}", r.p99, yes(r.meets_target.p99)),
                r.cpu_per_mop.map_or_else(
                    || "-".into(),
                    |c| format!("{c:.3}x {}", yes(r.meets_target.cpu_per_mop)),
                ),
                format!("{:.3}x", r.median_throughput),
                format!("{:.3}x", r.median_p99),
                list(&r.throughput_by_round),
                list(&r.p99_by_round),
            ]
        })
        .collect();
    report::table(
        &[
            "value",
            "throughput",
            "p99",
            "cpu/Mop",
            "median tput",
            "median p99",
            "tput by round",
            "p99 by round",
        ],
        &rows,
    )
}

fn compare_json(
    machine: &Machine,
    a: &CompareArgs,
    base: &ServerSpec,
    cand: &ServerSpec,
    res: &CompareResult,
) -> serde_json::Value {
    let rounds: Vec<serde_json::Value> = res
        .rounds
        .iter()
        .map(|(r, s)| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("round".into(), (*r).into());
            }
            v
        })
        .collect();
    serde_json::json!({
        "machine": machine,
        "servers": {
            "memcached": {
                "path": a.memcached.display().to_string(),
                "version": server::version_of(&a.memcached),
                "command": base.display_args(),
                "addr": res.base_addr,
            },
            "candidate": {
                "name": a.cand_name,
                "path": a.memfabricd.display().to_string(),
                "command": cand.display_args(),
                "addr": res.cand_addr,
            },
        },
        "workload": &a.workload,
        "rounds": rounds,
        "totals": &res.totals,
        "ratios": &res.ratios,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Throughput(a) => throughput(a).map(|()| true),
        Cmd::Latency(a) => latency_cmd(a).map(|()| true),
        Cmd::Compare(a) => {
            let check = a.check;
            compare_cmd(a).map(|pass| pass || !check)
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
