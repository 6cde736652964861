//! `memfabric-bench resilience`: erasure coding against replication on servers this run
//! starts (memory, latency and its crossover, pipelining, degraded reads).

use crate::args::OutputArgs;
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::plot;
use memfabric_bench::report::{self, CpuTimes};
use memfabric_bench::resilience::{self, Fleet, PoolKind, ResilienceConfig, ResilienceReport};
use memfabric_bench::server::{self, ServerSpec};
use memfabric_client::{EcGeometry, WritePolicy};
use memfabric_cluster::LinkRate;
use std::path::PathBuf;

#[derive(Args)]
pub(crate) struct ResilienceArgs {
    /// memfabricd servers to start (on loopback, or see --link-rate).
    #[arg(long, default_value_t = 6)]
    servers: usize,
    /// Start each server in a network namespace of its own behind a link shaped to this
    /// rate each way (`10gbit`, `800mbit`; needs root, `ip` and `tc`), as servers on
    /// separate hosts: transfers to several servers then overlap. Default: all on
    /// loopback, where every transfer is a memory copy on this machine's cores. For UCX
    /// use a network transport (UCX_TLS=tcp,self): shared memory bypasses the links.
    #[arg(long)]
    link_rate: Option<LinkRate>,
    /// The erasure code.
    #[arg(long, default_value = "4+2")]
    ec: EcGeometry,
    /// Extra copies of the replicated pool it is compared with.
    #[arg(long, default_value_t = 2)]
    replicas: u8,
    /// Write policy of both pools.
    #[arg(long, default_value = "quorum")]
    write_policy: WritePolicy,
    /// The smallest value the EC pool codes (default 1: every measured value, so that the
    /// pools compare like with like; the library's and the CLI's default is 16384).
    #[arg(long, default_value_t = 1)]
    ec_threshold: usize,
    /// Both pools read a random copy (or, for a coded key, fragment set) first.
    #[arg(long)]
    randomize_reads: bool,
    /// Transports to measure, comma separated (tcp, ucx).
    #[arg(long, value_delimiter = ',', default_value = "tcp,ucx")]
    transport: Vec<String>,
    /// Value sizes of the latency comparison.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096,16384,65536,262144,1048576"
    )]
    sizes: Vec<usize>,
    /// Value sizes of the memory comparison.
    #[arg(long, value_delimiter = ',', default_value = "1024,16384,65536,262144")]
    memory_sizes: Vec<usize>,
    /// Measured operations per point (fewer for large values: see --bytes-per-point).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    iterations: u64,
    /// At most this many value bytes per point.
    #[arg(long, default_value_t = 256 << 20)]
    bytes_per_point: u64,
    /// Outstanding EC SETs of the pipelined run.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Value size of the pipelining and degraded-read runs.
    #[arg(long, default_value_t = 65536)]
    probe_size: usize,
    /// Rounds of the degraded-read run (each: healthy p99, kill m servers, degraded p99,
    /// start them again empty); the report gives the median round by ratio.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    degraded_rounds: u32,
    /// memfabricd to start (default: next to this binary, then PATH, then the build).
    #[arg(long)]
    memfabricd: Option<PathBuf>,
    /// Memory limit (-m, MB) of each server.
    #[arg(long, default_value_t = 1024)]
    memory: usize,
    /// Extra argument for every server (repeatable), e.g. --server-arg=--ucx-poll-us
    /// --server-arg=0.
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    out: OutputArgs,
}

pub(crate) fn resilience_cmd(a: ResilienceArgs) -> Fallible<()> {
    for t in &a.transport {
        if t != "tcp" && t != "ucx" {
            return Err(format!("unknown transport '{t}' (tcp, ucx)").into());
        }
    }
    if a.window == 0 {
        return Err("--window must be at least 1".into());
    }
    if a.replicas == 0 || usize::from(a.replicas) >= a.servers {
        return Err(format!(
            "--replicas must be 1 to {} with {} servers (copies on distinct servers)",
            a.servers.saturating_sub(1),
            a.servers
        )
        .into());
    }
    if a.sizes.contains(&0) || a.memory_sizes.contains(&0) {
        return Err("--sizes and --memory-sizes take value sizes of 1 byte or more".into());
    }
    if a.memory == 0 {
        return Err("--memory must be at least 1 (MB per server)".into());
    }
    if a.ec_threshold > a.probe_size {
        return Err(format!(
            "--ec-threshold {} is above --probe-size {}: the pipelined and degraded runs \
             would measure values the EC pool does not code",
            a.ec_threshold, a.probe_size
        )
        .into());
    }
    if a.servers < usize::from(a.ec.k) + usize::from(a.ec.m) {
        return Err(format!("RS({}) needs {} servers", a.ec, a.ec.k + a.ec.m).into());
    }
    let (path, origin) = server::locate_memfabricd(a.memfabricd.as_deref())?;
    eprintln!("memfabricd: {} ({origin:?})", path.display());
    let spec = ServerSpec {
        name: "memfabricd".into(),
        path,
        threads: 1,
        memory_mb: a.memory,
        // Room for a 1 MiB value and its key (replicated values are stored whole).
        extra_args: ["-I", "2m"]
            .into_iter()
            .map(String::from)
            .chain(a.server_arg.iter().cloned())
            .collect(),
    };
    let cfg = ResilienceConfig {
        servers: a.servers,
        ec: a.ec,
        replicas: a.replicas,
        policy: a.write_policy,
        transports: a.transport.clone(),
        sizes: a.sizes.clone(),
        memory_sizes: a.memory_sizes.clone(),
        iterations: a.iterations,
        bytes_per_point: a.bytes_per_point,
        window: a.window,
        progress: !a.quiet,
        ec_threshold: a.ec_threshold,
        randomize_reads: a.randomize_reads,
    };
    let ucx = a.transport.iter().any(|t| t == "ucx");
    let cpu_at_start = CpuTimes::now();
    let mut fleet = match a.link_rate {
        None => Fleet::start(&spec, a.servers, ucx)?,
        Some(rate) => {
            let tls = std::env::var("UCX_TLS").ok();
            if ucx && shared_memory_possible(tls.as_deref()) {
                return Err(format!(
                    "--link-rate with UCX needs a network transport: shared memory would \
                     bypass the shaped links (UCX_TLS is {:?}; use UCX_TLS=tcp,self)",
                    tls.unwrap_or_default()
                )
                .into());
            }
            Fleet::start_shaped(&spec, a.servers, ucx, rate)?
        }
    };
    let memory = resilience::memory(&cfg, &fleet)?;
    let latency = resilience::latency(&cfg, &fleet)?;
    let crossovers = resilience::crossovers(&latency, &cfg.transports);
    let pipeline = resilience::pipeline(&cfg, &fleet, a.probe_size)?;
    let degraded =
        resilience::degraded(&cfg, &mut fleet, a.probe_size, a.degraded_rounds as usize)?;
    drop(fleet);
    let r = ResilienceReport {
        servers: a.servers,
        link_rate: a.link_rate.map(|r| r.to_string()),
        steal_share: CpuTimes::steal_share_until_now(cpu_at_start),
        ec: a.ec.to_string(),
        replicas: a.replicas,
        policy: a.write_policy.to_string(),
        memory,
        latency,
        crossovers,
        pipeline,
        degraded,
    };
    print_report(&r);
    if let Some(p) = &a.out.json {
        write_json(p, &r)?;
    }
    if let Some(p) = &a.out.plot {
        let mut series = Vec::new();
        for t in &cfg.transports {
            for op in ["set", "get"] {
                for kind in [PoolKind::Ec, PoolKind::Replicated] {
                    let points: Vec<(usize, f64)> = r
                        .latency
                        .iter()
                        .filter(|x| &x.transport == t && x.op == op && x.pool == kind)
                        .map(|x| (x.value_size, x.p50_us))
                        .collect();
                    let name = match kind {
                        PoolKind::Ec => format!("{t} {op} RS({})", a.ec),
                        PoolKind::Replicated => format!("{t} {op} {}x", a.replicas + 1),
                    };
                    series.push((name, points));
                }
            }
        }
        report_plot(
            plot::latency_vs_size(p, "p50: erasure coding vs replication", &series),
            p,
        );
    }
    Ok(())
}

/// Whether UCX could choose a shared-memory transport with this `UCX_TLS`: unset (UCX
/// picks what it finds), or naming one (`posix`, `sysv`, `cma`, `knem`, `xpmem`, `sm`,
/// `shm`, `all`).
fn shared_memory_possible(tls: Option<&str>) -> bool {
    let Some(tls) = tls else {
        return true;
    };
    // `^a,b`: every transport but those.
    tls.starts_with('^')
        || tls.split(',').any(|t| {
            matches!(
                t.trim(),
                "all" | "posix" | "sysv" | "cma" | "knem" | "xpmem" | "sm" | "shm"
            )
        })
}

fn print_report(r: &ResilienceReport) {
    println!(
        "{} servers{}; RS({}) against {}-way replication; write policy {}\n",
        r.servers,
        r.link_rate
            .as_ref()
            .map_or(" on loopback".to_string(), |l| format!(
                ", each behind its own link at {l} each way"
            )),
        r.ec,
        r.replicas + 1,
        r.policy
    );
    println!("Memory: server-reported bytes per logical byte");
    let rows: Vec<Vec<String>> = r
        .memory
        .iter()
        .map(|m| {
            vec![
                m.pool.name().into(),
                m.value_size.to_string(),
                m.values.to_string(),
                m.logical_bytes.to_string(),
                m.server_bytes.to_string(),
                format!("{:.2}x", m.ratio),
            ]
        })
        .collect();
    println!(
        "{}",
        report::table(
            &["pool", "value", "values", "logical B", "server B", "ratio"],
            &rows
        )
    );
    println!("Latency (us)");
    let rows: Vec<Vec<String>> = r
        .latency
        .iter()
        .map(|l| {
            vec![
                l.transport.clone(),
                l.op.into(),
                l.value_size.to_string(),
                l.pool.name().into(),
                l.ops.to_string(),
                format!("{:.1}", l.p50_us),
                format!("{:.1}", l.p99_us),
                l.encode_share
                    .map_or(String::new(), |s| format!("{:.1}%", 100.0 * s)),
            ]
        })
        .collect();
    println!(
        "{}",
        report::table(
            &[
                "transport",
                "op",
                "value",
                "pool",
                "ops",
                "p50",
                "p99",
                "encode/SET"
            ],
            &rows
        )
    );
    for c in &r.crossovers {
        println!(
            "crossover {} {}: EC p50 <= replication p50 {}",
            c.transport,
            c.op,
            c.from_size
                .map_or("at no measured size".into(), |s| format!(
                    "from {s} bytes up"
                ))
        );
    }
    println!("\nPipelined SETs");
    let rows: Vec<Vec<String>> = r
        .pipeline
        .iter()
        .map(|p| {
            vec![
                p.transport.clone(),
                p.pool.name().into(),
                p.value_size.to_string(),
                format!("{:.0}", p.blocking_ops_per_s),
                format!("{:.0}", p.pipelined_ops_per_s),
                p.window.to_string(),
                format!("{:.2}x", p.speedup),
            ]
        })
        .collect();
    println!(
        "{}",
        report::table(
            &[
                "transport",
                "pool",
                "value",
                "blocking/s",
                "pipelined/s",
                "window",
                "speedup"
            ],
            &rows
        )
    );
    println!(
        "Degraded EC GETs (p99 in us; the median of {} rounds by ratio)",
        r.degraded.first().map_or(0, |d| d.round_ratios.len())
    );
    let rows: Vec<Vec<String>> = r
        .degraded
        .iter()
        .map(|d| {
            vec![
                d.transport.clone(),
                d.value_size.to_string(),
                format!("{:.1}", d.healthy_p99_us),
                format!("{:.1}", d.degraded_p99_us),
                d.killed.to_string(),
                format!("{:.2}x", d.ratio),
                d.round_ratios
                    .iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]
        })
        .collect();
    println!(
        "{}",
        report::table(
            &[
                "transport",
                "value",
                "healthy p99",
                "degraded p99",
                "down",
                "ratio",
                "each round"
            ],
            &rows
        )
    );
    if let Some(x) = r.steal_share {
        println!("{}", report::steal_line(x));
    }
}

#[cfg(test)]
mod tests {
    use super::shared_memory_possible;

    #[test]
    fn only_network_transports_keep_ucx_on_the_shaped_links() {
        for tls in ["tcp,self", "tcp", "rc_x,ud_x,self", "self, tcp"] {
            assert!(!shared_memory_possible(Some(tls)), "{tls}");
        }
        for tls in [
            None,
            Some("posix,cma,self"),
            Some("tcp,sm"),
            Some("^ud"),
            Some("all"),
        ] {
            assert!(shared_memory_possible(tls), "{tls:?}");
        }
    }
}
