//! `memfabric-bench latency`: one op at a time per size (ohb_memlat style) against a
//! running server.

use crate::args::{OutputArgs, TransportKind};
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::latency::{self, LatencyConfig, LatencyOp, LatencyReport};
use memfabric_bench::metrics;
use memfabric_bench::plot;
use memfabric_bench::report;
use memfabric_bench::server::ServerSpec;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct LatencyArgs {
    /// Server address: its TCP port, or with `--transport ucx` alone its `--ucx-port`.
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub(crate) server: SocketAddr,
    /// Transports to measure, comma separated (tcp, ucx); each gets every (op, size).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "tcp")]
    pub(crate) transport: Vec<TransportKind>,
    /// memfabricd's UCX bootstrap port (`--ucx-port`), for `--transport tcp,ucx` against one
    /// server; defaults to `--server`.
    #[arg(long)]
    pub(crate) ucx_server: Option<SocketAddr>,
    /// Server process id: report its CPU seconds per million ops for every row.
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
    /// Start this server (memcached or memfabricd) on free loopback ports for the run
    /// (`--ucx-port` too when ucx is measured) instead of using `--server`; killed at the end.
    #[arg(long)]
    pub(crate) start_server: Option<PathBuf>,
    /// Worker threads (-t) of the started server.
    #[arg(long, default_value_t = 1)]
    pub(crate) server_threads: usize,
    /// Memory limit (-m, MB) of the started server.
    #[arg(long, default_value_t = 1024)]
    pub(crate) memory: usize,
    /// Extra argument for the started server (repeatable), e.g. --server-arg=--poll-us
    /// --server-arg=200.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) server_arg: Vec<String>,
    /// Value sizes in bytes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,8,32,128,512,1024,4096,16384,65536,524288"
    )]
    pub(crate) sizes: Vec<usize>,
    /// Operations to measure: get, set, mix (90% get, 10% set of the same key).
    #[arg(long, value_delimiter = ',', default_value = "get,set")]
    pub(crate) ops: Vec<String>,
    /// Measured operations per (op, size).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) iterations: u64,
    /// Unmeasured operations before each (op, size).
    #[arg(long, default_value_t = 200)]
    pub(crate) warmup: u64,
    #[arg(long, default_value = "mfb-lat:")]
    pub(crate) key_prefix: String,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

pub(crate) fn latency_cmd(a: LatencyArgs) -> Fallible<()> {
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
            let extra = a.server_arg.clone();
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
            let proc = if measure_ucx {
                spec.start_with_ucx_port()?
            } else {
                spec.start()?
            };
            let ucx = proc.ucx_port.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
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
