//! `memfabric-bench ycsb`: YCSB core workloads A-F adapted to a cache: a load phase,
//! then each run phase.

use crate::args::{OutputArgs, RequestDistArg, TransportKind};
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::load::{self, LoadConfig};
use memfabric_bench::metrics::RunSummary;
use memfabric_bench::plot::{self, Panel};
use memfabric_bench::report::{self, Machine};
use memfabric_bench::workload::{KeyDist, OpMix, Pattern};
use memfabric_bench::ycsb::{YcsbSpec, YcsbWorkload};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct YcsbArgs {
    /// Server address (with `--transport ucx`: memfabricd's `--ucx-port`).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub(crate) server: SocketAddr,
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    pub(crate) transport: TransportKind,
    /// Server process id, to measure its CPU time (utime+stime from /proc).
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
    /// Label of the server in reports.
    #[arg(long, default_value = "server")]
    pub(crate) name: String,
    /// Workloads to run in order (a-f), after one load phase.
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,e,f")]
    pub(crate) workloads: Vec<String>,
    /// Records inserted by the load phase (YCSB's recordcount).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) record_count: u64,
    /// Operations of each run phase (YCSB's operationcount); 100000 if neither this nor
    /// --duration is given.
    #[arg(long)]
    pub(crate) operation_count: Option<u64>,
    /// Stop each run phase after this many seconds.
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Override the workloads' request distribution.
    #[arg(long, value_enum)]
    pub(crate) distribution: Option<RequestDistArg>,
    /// Longest scan of workload E (multi-get of consecutive records).
    #[arg(long, default_value_t = 100)]
    pub(crate) max_scan_length: u64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Connections per client thread.
    #[arg(long, default_value_t = 4)]
    pub(crate) conns: usize,
    /// Operations in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub(crate) depth: usize,
    /// Open loop at this many ops/s (latency from the scheduled send time).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Skip the load phase (the records are already there).
    #[arg(long)]
    pub(crate) no_load: bool,
    #[arg(long)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

pub(crate) fn ycsb_cmd(a: YcsbArgs) -> Fallible<()> {
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
