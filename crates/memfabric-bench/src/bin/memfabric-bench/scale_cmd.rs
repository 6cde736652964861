//! `memfabric-bench scale`: thousands of UCX clients on one memfabricd, in three server
//! configurations in one run — every client dedicated (hot), every client cold, hybrid —
//! or against a running server (`--server`). Tables, JSON, a plot.

use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::plot::{self, BarPanel};
use memfabric_bench::report::{table, Machine};
use memfabric_bench::scale::{self, Mode, ModeResult, ScaleConfig};
use memfabric_bench::server::{self, ServerSpec};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ScaleArgs {
    /// A running memfabricd's UCX bootstrap (HOST:UCXPORT); with it, one mode: the
    /// server as it runs (its memory is sampled when --server-pid is given). Without
    /// it, memfabricd is started in each of the three modes.
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// The running server's memcached port (for `stats fabric`), with --server.
    #[arg(long, default_value_t = 11211)]
    pub(crate) stats_port: u16,
    /// The running server's process id (for its memory), with --server.
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
    /// Client endpoints in all (hot ones included).
    #[arg(long, default_value_t = 4096)]
    pub(crate) clients: usize,
    /// Hot (closed-loop) endpoints; as many more take turns with them in the churn.
    #[arg(long, default_value_t = 16)]
    pub(crate) hot: usize,
    /// Seconds of each measurement window.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) duration: f64,
    /// Seconds between rotations of the hot set in the churn.
    #[arg(long, default_value_t = 3.0)]
    pub(crate) churn_every: f64,
    /// Endpoints per client process.
    #[arg(long, default_value_t = 512)]
    pub(crate) per_process: usize,
    /// The modes to run (dedicated, cold, hybrid).
    #[arg(long, value_delimiter = ',', default_value = "dedicated,cold,hybrid")]
    pub(crate) modes: Vec<String>,
    /// Transports of the hot tier (and of every client in the dedicated mode): RC on
    /// InfiniBand (rc_x), shared memory here.
    #[arg(long, default_value = "posix,cma,self")]
    pub(crate) hot_tls: String,
    /// Transports of the cold tier (and of every client in the cold mode): DC/UD on
    /// InfiniBand (dc_x,ud_x), TCP here.
    #[arg(long, default_value = "tcp")]
    pub(crate) cold_tls: String,
    /// Server worker threads (-t).
    #[arg(long, default_value_t = 4)]
    pub(crate) server_threads: usize,
    /// memfabricd binary (default: next to this memfabric-bench, else on PATH, else
    /// target/release/memfabricd).
    #[arg(long)]
    pub(crate) memfabricd: Option<PathBuf>,
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw server memory per client and latencies per mode to this PNG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

/// The hidden subcommand the benchmark runs its client processes as.
#[derive(Args)]
pub(crate) struct ScaleWorkerArgs {
    #[arg(long)]
    pub(crate) server: String,
    #[arg(long)]
    pub(crate) clients: usize,
}

pub(crate) fn scale_worker_cmd(a: ScaleWorkerArgs) -> Fallible<()> {
    scale::worker_main(&a.server, a.clients)?;
    Ok(())
}

#[derive(Serialize)]
struct ScaleOutput {
    command: String,
    machine: Machine,
    ucx: String,
    config: ScaleConfig,
    results: Vec<ModeResult>,
}

/// The UCX library this process loaded, its version and its file (the benchmark says which
/// UCX ran).
fn ucx_version() -> String {
    let version = memfabric_client::ucx::library_version();
    let file = std::fs::read_to_string("/proc/self/maps")
        .ok()
        .and_then(|m| {
            m.lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.contains("libucp.so"))
                .map(|p| {
                    std::fs::canonicalize(p)
                        .map_or_else(|_| p.to_string(), |c| c.display().to_string())
                })
        })
        .unwrap_or_else(|| "libucp (not mapped)".into());
    format!("UCX {version} ({file})")
}

pub(crate) fn scale_cmd(a: ScaleArgs) -> Fallible<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    if a.clients == 0 || a.hot == 0 || a.hot * 2 > a.clients {
        return Err("need --hot >= 1 and --clients >= 2 x --hot".into());
    }
    let exe = std::env::current_exe()?;
    let cfg = ScaleConfig {
        clients: a.clients,
        hot: a.hot,
        duration_s: a.duration,
        churn_every_s: a.churn_every,
        per_worker: a.per_process,
        milestones: vec![256, 1024, 4096],
        client_tls: format!("{},{},self", a.hot_tls, a.cold_tls),
        progress: !a.quiet,
    };
    // The UCX this process runs with (the workers load the same library).
    let _ = memfabric_client::ucx::UcxTransport::new(memfabric_client::GetMode::Auto, false);
    let ucx = ucx_version();
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    println!("UCX: {ucx}");
    let mut results = Vec::new();
    if let Some(url) = &a.server {
        let url = if url.starts_with("ucx://") {
            url.clone()
        } else {
            format!("ucx://{url}")
        };
        let host = url
            .trim_start_matches("ucx://")
            .rsplit_once(':')
            .map_or("127.0.0.1", |(h, _)| h)
            .to_string();
        let stats: std::net::SocketAddr = format!("{host}:{}", a.stats_port).parse()?;
        let pid = a
            .server_pid
            .ok_or("--server needs --server-pid to sample the server")?;
        let mode = Mode {
            name: "as running".into(),
            server_args: vec![],
        };
        results.push(scale::run_mode(&cfg, mode, &exe, &url, stats, pid)?);
    } else {
        let (mf_path, origin) = server::locate_memfabricd(a.memfabricd.as_deref())?;
        eprintln!("scale: memfabricd is {} ({origin})", mf_path.display());
        let conns = (a.clients * 2 + 1024).to_string();
        for name in &a.modes {
            let tiers: Vec<String> = match name.as_str() {
                "dedicated" => vec![
                    "--ucx-hot-tls".into(),
                    a.hot_tls.clone(),
                    "--ucx-cold-tls".into(),
                    "none".into(),
                ],
                "cold" => vec![
                    "--ucx-hot-tls".into(),
                    a.cold_tls.clone(),
                    "--ucx-cold-tls".into(),
                    "none".into(),
                ],
                "hybrid" => vec![
                    "--ucx-hot-tls".into(),
                    a.hot_tls.clone(),
                    "--ucx-cold-tls".into(),
                    a.cold_tls.clone(),
                    "--hot-clients".into(),
                    a.hot.to_string(),
                ],
                other => return Err(format!("unknown mode {other}").into()),
            };
            let server_args = [
                tiers,
                vec![
                    "--max-clients".into(),
                    (a.clients + 64).to_string(),
                    "-c".into(),
                    conns.clone(),
                ],
            ]
            .concat();
            let spec = ServerSpec {
                name: format!("memfabricd-{name}"),
                path: mf_path.clone(),
                threads: a.server_threads,
                memory_mb: 64,
                extra_args: server_args.clone(),
            };
            println!("{name}: {} --ucx-port <port>", spec.display_args());
            let s = spec.start_with_ucx_port()?;
            let ucx_port = s.ucx_port.expect("started with a UCX port");
            let mode = Mode {
                name: name.clone(),
                server_args,
            };
            let url = format!("ucx://127.0.0.1:{ucx_port}");
            results.push(scale::run_mode(&cfg, mode, &exe, &url, s.addr, s.pid())?);
        }
    }
    print_tables(&results);
    if let Some(p) = &a.json {
        write_json(
            p,
            &ScaleOutput {
                command,
                machine,
                ucx,
                config: cfg,
                results: results.clone(),
            },
        )?;
    }
    if let Some(p) = &a.plot {
        let per = |f: &dyn Fn(&scale::PerClient) -> f64| -> Vec<(String, f64)> {
            results
                .iter()
                .filter_map(|r| Some((r.mode.name.clone(), f(r.per_client.as_ref()?))))
                .collect()
        };
        let panels = vec![
            BarPanel {
                title: "server RSS per client".into(),
                y_desc: "bytes".into(),
                bars: per(&|p| p.rss_bytes),
            },
            BarPanel {
                title: "fds per client".into(),
                y_desc: "descriptors".into(),
                bars: per(&|p| p.fds),
            },
            BarPanel {
                title: "hot GET p50, all connected".into(),
                y_desc: "us".into(),
                bars: results
                    .iter()
                    .map(|r| (r.mode.name.clone(), r.hot_full.p50_us))
                    .collect(),
            },
        ];
        report_plot(
            plot::bars(p, &format!("scale: {} clients", a.clients), &panels),
            p,
        );
    }
    let failed: u64 = results
        .iter()
        .map(|r| r.failures + r.connect_failures)
        .sum();
    if failed > 0 {
        eprintln!("scale: {failed} failed requests or connections (see the tables)");
    }
    Ok(())
}

fn print_tables(results: &[ModeResult]) {
    let kb = |v: f64| format!("{v:.0}");
    let mut rows = Vec::new();
    for r in results {
        for m in std::iter::once((0usize, &r.baseline))
            .chain(r.milestones.iter().map(|m| (m.clients, &m.server)))
        {
            rows.push(vec![
                r.mode.name.clone(),
                m.0.to_string(),
                m.1.rss_kb.to_string(),
                m.1.anon_kb.to_string(),
                m.1.shmem_kb.to_string(),
                m.1.pss_kb.to_string(),
                m.1.fds.to_string(),
                m.1.maps.to_string(),
            ]);
        }
    }
    println!("\nserver as clients arrive (KiB):");
    println!(
        "{}",
        table(
            &["mode", "clients", "rss", "anon", "shmem", "pss", "fds", "maps"],
            &rows
        )
    );
    let rows: Vec<Vec<String>> = results
        .iter()
        .filter_map(|r| {
            let p = r.per_client.as_ref()?;
            Some(vec![
                r.mode.name.clone(),
                format!("{}..{}", p.from, p.to),
                kb(p.rss_bytes),
                kb(p.anon_bytes),
                kb(p.shmem_bytes),
                kb(p.pss_bytes),
                format!("{:.2}", p.fds),
                format!("{:.2}", p.maps),
            ])
        })
        .collect();
    println!("\nserver growth per client added (bytes):");
    println!(
        "{}",
        table(
            &["mode", "clients", "rss", "anon", "shmem", "pss", "fds", "maps"],
            &rows
        )
    );
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let ratio = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.2}x", a / b)
                } else {
                    "-".into()
                }
            };
            vec![
                r.mode.name.clone(),
                format!("{:.1}", r.hot_alone.p50_us),
                format!("{:.1}", r.hot_alone.p99_us),
                format!("{:.1}", r.hot_full.p50_us),
                format!("{:.1}", r.hot_full.p99_us),
                ratio(r.hot_full.p50_us, r.hot_alone.p50_us),
                ratio(r.hot_full.p99_us, r.hot_alone.p99_us),
                format!("{:.1}", r.cold_full.p50_us),
                format!("{:.1}", r.connect_s),
                format!("{}/{}", r.connected, r.connected + r.connect_failures),
            ]
        })
        .collect();
    println!("\nlatency (us) and connecting:");
    println!(
        "{}",
        table(
            &[
                "mode",
                "hot p50 alone",
                "p99 alone",
                "hot p50 all",
                "p99 all",
                "p50 x",
                "p99 x",
                "cold p50",
                "connect s",
                "connected",
            ],
            &rows
        )
    );
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let last = r.teardown.last().map(|t| t.1).unwrap_or_default();
            let pct = |a: u64, b: u64| {
                format!("{:+.1}%", (a as f64 - b as f64) / b.max(1) as f64 * 100.0)
            };
            vec![
                r.mode.name.clone(),
                r.churn.rotations.to_string(),
                r.churn.promotions.to_string(),
                r.churn.demotions.to_string(),
                {
                    let all: Vec<f64> = r.churn.promote_s.iter().flatten().copied().collect();
                    let missed = r.churn.promote_s.len() - all.len();
                    match all.iter().copied().reduce(f64::max) {
                        Some(m) if missed == 0 => format!("{m:.2}"),
                        Some(m) => format!("{m:.2} ({missed} late)"),
                        None if missed > 0 => format!("({missed} late)"),
                        None => "-".into(),
                    }
                },
                format!("{:.1}", r.churn.hot.p50_us),
                r.failures.to_string(),
                r.first_failure.clone().unwrap_or_default(),
                pct(last.rss_kb, r.baseline.rss_kb),
                pct(last.fds, r.baseline.fds),
            ]
        })
        .collect();
    println!("\nchurn, failures, and the server 5 s after every client was killed (vs. baseline):");
    println!(
        "{}",
        table(
            &[
                "mode",
                "rotations",
                "promotions",
                "demotions",
                "promoted in (max s)",
                "hot p50",
                "failed",
                "first failure",
                "rss",
                "fds",
            ],
            &rows
        )
    );
}
