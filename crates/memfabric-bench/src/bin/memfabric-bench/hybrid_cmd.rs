//! `memfabric-bench hybrid`: RAM-only and RAM + flash servers under a working set larger
//! than RAM + flash (after OSU's `ohb_memhybrid`); misses pay a back-end penalty.

use crate::compare_cmd::DEFAULT_UCX_TLS;
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::{Args, ValueEnum};
use memfabric_bench::hybrid::{
    self, Binaries, FlashDir, HybridConfig, HybridResult, Skipped, TargetKind, TargetResult,
};
use memfabric_bench::plot::{self, BarPanel};
use memfabric_bench::report::{table, Machine};
use memfabric_bench::server;
use memfabric_bench::workload::KeyDist;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ScanMode {
    Uniform,
    Zipf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum FlashIo {
    Direct,
    Buffered,
}

#[derive(Args)]
pub(crate) struct HybridArgs {
    /// Targets, comma separated: memcached, memcached-ext, memfabricd, memfabricd-flash,
    /// memfabricd-flash-ucx (phase 2 over UCX, batches of --batch GETs in flight).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memcached,memcached-ext,memfabricd,memfabricd-flash"
    )]
    pub(crate) targets: Vec<String>,
    /// RAM of every server in MB (-m).
    #[arg(long, default_value_t = 64)]
    pub(crate) maxmemory: usize,
    /// Flash file of every flash target in MB (default 4 x --maxmemory). memcached's
    /// extstore pages are 64 MB: give it a multiple of 64.
    #[arg(long)]
    pub(crate) flash: Option<usize>,
    /// Directory for the flash files (default: a fresh temporary directory, removed at the
    /// end). Each target's file is removed when the target is done.
    #[arg(long)]
    pub(crate) flash_dir: Option<PathBuf>,
    /// memfabricd's --flash-io.
    #[arg(long, value_enum, default_value_t = FlashIo::Direct)]
    pub(crate) flash_io: FlashIo,
    /// memfabricd's --flash-io-engine (auto, io_uring or psync).
    #[arg(long, default_value = "auto", value_parser = ["auto", "io_uring", "psync"])]
    pub(crate) flash_io_engine: String,
    /// Value size in bytes.
    #[arg(long, default_value_t = 4096)]
    pub(crate) valsize: usize,
    /// The key space is this many times what RAM + flash hold (the same key count for
    /// RAM-only targets).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) spillfactor: f64,
    /// Key popularity in phase 2.
    #[arg(long, value_enum, default_value_t = ScanMode::Zipf)]
    pub(crate) scanmode: ScanMode,
    /// Zipfian exponent.
    #[arg(long, default_value_t = 0.99)]
    pub(crate) zipf_theta: f64,
    /// GETs of the measured phase, over all clients.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) ops: u64,
    /// Back-end penalty of a miss in microseconds (busy-wait), before the cache fill.
    #[arg(long, default_value_t = 100)]
    pub(crate) misspenalty: u64,
    /// Client threads (closed loop, one connection each).
    #[arg(long, default_value_t = 4)]
    pub(crate) clients: usize,
    /// GETs in flight per client on memfabricd-flash-ucx.
    #[arg(long, default_value_t = 16)]
    pub(crate) batch: usize,
    /// Worker threads of every server (-t).
    #[arg(long, default_value_t = 4)]
    pub(crate) server_threads: usize,
    /// Seed of the key draws.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// memcached binary; its targets are skipped when it is missing.
    #[arg(long, default_value = "/usr/bin/memcached")]
    pub(crate) memcached: PathBuf,
    /// memfabricd binary (default: next to this memfabric-bench, else on PATH, else
    /// target/release/memfabricd).
    #[arg(long)]
    pub(crate) memfabricd: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw total time and miss ratio per target to this PNG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

pub(crate) fn hybrid_cmd(a: HybridArgs) -> Fallible<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let wall = std::time::Instant::now();
    let mut kinds = Vec::new();
    for t in &a.targets {
        let k = TargetKind::parse(t)?;
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    if kinds.iter().any(|k| k.ucx()) && std::env::var_os("UCX_TLS").is_none() {
        // Shared memory on one host, as `compare`; set before the server starts so that
        // both ends use the same transports.
        std::env::set_var("UCX_TLS", DEFAULT_UCX_TLS);
    }
    let cfg = HybridConfig {
        maxmemory_mb: a.maxmemory,
        flash_mb: a.flash.unwrap_or(4 * a.maxmemory),
        valsize: a.valsize,
        spillfactor: a.spillfactor,
        dist: match a.scanmode {
            ScanMode::Uniform => KeyDist::Uniform,
            ScanMode::Zipf => KeyDist::Zipfian {
                theta: a.zipf_theta,
            },
        },
        ops: a.ops,
        miss_penalty: Duration::from_micros(a.misspenalty),
        clients: a.clients,
        batch: a.batch,
        seed: a.seed,
        server_threads: a.server_threads,
        flash_io: match a.flash_io {
            FlashIo::Direct => "direct".into(),
            FlashIo::Buffered => "buffered".into(),
        },
        flash_io_engine: a.flash_io_engine.clone(),
        progress: !a.quiet,
    };
    cfg.validate()?;
    let memcached = server::version_of(&a.memcached).map(|_| a.memcached.clone());
    let mut skipped = Vec::new();
    if memcached.is_none() && kinds.iter().any(|k| k.is_memcached()) {
        eprintln!(
            "hybrid: memcached not found at {} (or it does not run): skipping its targets",
            a.memcached.display()
        );
        kinds.retain(|k| {
            if k.is_memcached() {
                skipped.push(Skipped {
                    target: k.name().into(),
                    reason: format!("memcached not found at {}", a.memcached.display()),
                });
            }
            !k.is_memcached()
        });
    }
    let (mf_path, origin) = server::locate_memfabricd(a.memfabricd.as_deref())?;
    eprintln!("hybrid: memfabricd is {} ({origin})", mf_path.display());
    let bins = Binaries {
        memcached,
        memfabricd: mf_path,
    };
    let dir = FlashDir::new(a.flash_dir.as_deref())?;
    let plans = kinds
        .iter()
        .map(|&k| hybrid::plan_target(k, &cfg, &bins, &dir.path))
        .collect::<Result<Vec<_>, _>>()?;
    let machine = Machine::describe();
    let settings = settings(&a, &cfg);
    println!("machine: {}", machine.line());
    println!("{settings}");
    for p in &plans {
        println!("{}: {}", p.kind.name(), p.spec.display_args());
    }
    let res = hybrid::run(&cfg, &plans, skipped)?;
    drop(dir);
    print!("{}", text(&res));
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "command": command,
            "machine": machine,
            "settings": settings,
            "memcached_version": bins.memcached.as_deref().and_then(server::version_of),
            "ucx_tls": std::env::var("UCX_TLS").ok(),
            "results": res,
        });
        write_json(p, &v)?;
    }
    if let Some(p) = &a.plot {
        let bars = |f: fn(&TargetResult) -> f64| -> Vec<(String, f64)> {
            res.results
                .iter()
                .map(|r| (r.target.clone(), f(r)))
                .collect()
        };
        let panels = [
            BarPanel {
                title: "total time of the GET phase".into(),
                y_desc: "seconds".into(),
                bars: bars(|r| r.total_seconds),
            },
            BarPanel {
                title: "miss ratio".into(),
                y_desc: "misses / GETs".into(),
                bars: bars(|r| r.miss_ratio),
            },
        ];
        let title = format!(
            "hybrid: {} MB RAM + {} MB flash, {} B values, spill {}",
            cfg.maxmemory_mb, cfg.flash_mb, cfg.valsize, cfg.spillfactor
        );
        report_plot(plot::bars(p, &title, &panels), p);
    }
    let wrong: u64 = res.results.iter().map(|r| r.wrong_values).sum();
    eprintln!("hybrid took {:.0}s", wall.elapsed().as_secs_f64());
    if wrong > 0 {
        return Err(format!("{wrong} GETs returned a value that is not their key's").into());
    }
    Ok(())
}

/// The run's parameters in one line.
fn settings(a: &HybridArgs, cfg: &HybridConfig) -> String {
    let dist = match cfg.dist {
        KeyDist::Uniform => "uniform".to_string(),
        KeyDist::Zipfian { theta } => format!("zipf {theta}"),
    };
    format!(
        "hybrid: -m {} MB, flash {} MB, values {} B, spillfactor {} -> {} keys ({} MB of values); \
         {} GETs ({dist}) by {} clients; miss penalty {} us then a fill; server -t {}, flash io {} ({} engine)",
        cfg.maxmemory_mb,
        cfg.flash_mb,
        cfg.valsize,
        cfg.spillfactor,
        cfg.keys(),
        cfg.keys() * cfg.valsize as u64 / (1024 * 1024),
        cfg.ops,
        cfg.clients,
        a.misspenalty,
        cfg.server_threads,
        cfg.flash_io,
        cfg.flash_io_engine,
    )
}

fn opt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

fn opt_x(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.2}x"))
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

/// The tables: phase 2 per target, then the flash tier's counters and the ratios.
pub(crate) fn text(res: &HybridResult) -> String {
    let rows: Vec<Vec<String>> = res
        .results
        .iter()
        .map(|r| {
            vec![
                r.target.clone(),
                r.hits.to_string(),
                r.misses.to_string(),
                format!("{:.4}", r.hit_ratio),
                format!("{:.4}", r.miss_ratio),
                format!("{:.2}", r.total_seconds),
                format!("{:.2}", r.penalty_seconds),
                format!("{:.0}", r.gets_per_sec),
                format!("{:.1}", r.get_p50_us),
                format!("{:.1}", r.get_p99_us),
                r.wrong_values.to_string(),
            ]
        })
        .collect();
    let mut out = format!("\nkeys: {}\n", res.keys);
    out.push_str(&table(
        &[
            "target",
            "hits",
            "misses",
            "hit",
            "miss",
            "total s",
            "penalty s",
            "GETs/s",
            "p50 us",
            "p99 us",
            "wrong",
        ],
        &rows,
    ));
    let rows: Vec<Vec<String>> = res
        .results
        .iter()
        .map(|r| {
            vec![
                r.target.clone(),
                opt_u(r.flash_reads),
                r.flash_bytes_written
                    .map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
                opt_u(r.flash_objects_used),
                format!("{:.1}", r.load_seconds),
                format!(
                    "{:.1}{}",
                    r.drain_seconds,
                    if r.drained { "" } else { " (not drained)" }
                ),
                yes_no(r.page_cache_dropped).into(),
                yes_no(r.direct_io).into(),
                r.fill_errors.to_string(),
                opt_x(r.total_time_vs_ext),
                opt_x(r.miss_ratio_vs_ext),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &[
            "target",
            "flash reads",
            "flash MB written",
            "objects on flash",
            "load s",
            "drain s",
            "cache dropped",
            "O_DIRECT",
            "fill errors",
            "time vs ext",
            "miss vs ext",
        ],
        &rows,
    ));
    for s in &res.skipped {
        out.push_str(&format!("skipped {}: {}\n", s.target, s.reason));
    }
    out
}
