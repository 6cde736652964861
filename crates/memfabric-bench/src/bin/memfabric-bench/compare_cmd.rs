//! `memfabric-bench compare`: starts memcached and memfabricd with the same flags, runs
//! the same load on each target and reports the ratios to memcached.

use crate::args::{OutputArgs, WorkloadArgs};
use crate::output::{pattern_label, report_plot, write_json};
use crate::Fallible;
use clap::{Args, ValueEnum};
use memfabric_bench::compare::{self, SuitePlan, ThroughputPlan, YcsbPlan};
use memfabric_bench::compare_report::{self, ReportContext};
use memfabric_bench::latency::{LatencyConfig, LatencyOp};
use memfabric_bench::load::LoadConfig;
use memfabric_bench::plot;
use memfabric_bench::report::{steal_line, CpuTimes, Machine};
use memfabric_bench::server::{self, ServerSpec};
use memfabric_bench::workload::KeyDist;
use memfabric_bench::ycsb::{YcsbSpec, YcsbWorkload};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct CompareArgs {
    /// The reference server binary.
    #[arg(long, default_value = "/usr/bin/memcached")]
    pub(crate) memcached: PathBuf,
    /// The candidate server binary (point it at memcached, with --targets
    /// memcached-tcp,memfabricd-tcp, for an A/A noise check). Default: the memfabricd next
    /// to this memfabric-bench, else the first on PATH, else target/release/memfabricd.
    #[arg(long)]
    pub(crate) memfabricd: Option<PathBuf>,
    /// What to measure: server x transport, comma separated; the first known one
    /// (memcached-tcp) is the reference of every ratio.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memcached-tcp,memfabricd-tcp,memfabricd-ucx,memfabricd-onesided"
    )]
    pub(crate) targets: Vec<String>,
    /// Sections to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "latency,throughput,ycsb,ceiling"
    )]
    pub(crate) sections: Vec<Section>,
    /// Worker threads of both servers (-t).
    #[arg(long, default_value_t = 1)]
    pub(crate) server_threads: usize,
    /// Memory limit of both servers in MB (-m); large enough to hold the key space.
    #[arg(long, default_value_t = 1024)]
    pub(crate) memory: usize,
    /// memfabricd's --poll-us (busy-poll after any activity); 0 passes no flag and leaves
    /// memfabricd at its defaults (it polls adaptively after UCX work only).
    #[arg(long, default_value_t = 0)]
    pub(crate) poll_us: u64,
    /// Extra argument for memcached (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) memcached_arg: Vec<String>,
    /// Extra argument for memfabricd (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) memfabricd_arg: Vec<String>,
    /// Measured rounds per load; the order of the targets alternates each round.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Throughput section: client thread counts, one cell each (default: --threads).
    #[arg(long, value_delimiter = ',')]
    pub(crate) clients: Vec<usize>,
    /// Latency section: value sizes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,32,1024,4096,16384,65536,524288"
    )]
    pub(crate) latency_sizes: Vec<usize>,
    /// Latency section: operations (get, set, mix).
    #[arg(long, value_delimiter = ',', default_value = "get,set,mix")]
    pub(crate) latency_ops: Vec<String>,
    /// Latency section: measured operations per (op, size, target).
    #[arg(long, default_value_t = 5000)]
    pub(crate) latency_iterations: u64,
    /// YCSB section: workloads (a-f).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c")]
    pub(crate) ycsb: Vec<String>,
    /// YCSB section: records of the load phase.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) ycsb_records: u64,
    /// YCSB section: client threads.
    #[arg(long, default_value_t = 2)]
    pub(crate) ycsb_threads: usize,
    /// Exit with status 1 when a throughput cell misses the acceptance target
    /// (throughput >= 1.0x, p99 <= 1.1x, CPU/Mop <= 1.0x of memcached-tcp).
    #[arg(long)]
    pub(crate) check: bool,
    /// The quick report: fixed, small parameters (listed in the report), under 3 minutes on
    /// 2 cores; writes docs/benchmarks.md's generated section, docs/img/compare-quick.json
    /// and docs/img/compare-*.png unless --report/--json/--plot-dir say otherwise.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Write the Markdown report into this file between its compare-report markers.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
    /// Directory for the report's PNG plots (default: the report's docs/img).
    #[arg(long)]
    pub(crate) plot_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) workload: WorkloadArgs,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Section {
    /// One op at a time by value size.
    Latency,
    /// Closed loop by client threads.
    Throughput,
    /// YCSB workloads.
    Ycsb,
    /// The load generator against the in-process responder.
    Ceiling,
}

/// The parameters `--quick` fixes, as (flag effect, description for the report).
pub(crate) fn apply_quick(a: &mut CompareArgs) {
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

pub(crate) fn compare_cmd(mut a: CompareArgs) -> Fallible<bool> {
    let wall = std::time::Instant::now();
    let cpu_at_start = CpuTimes::now();
    // Before this run writes anything.
    let commit = git_commit();
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
            warmup: memfabric_bench::compare::latency_warmup(a.latency_iterations),
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
    let steal_share = CpuTimes::steal_share_until_now(cpu_at_start);
    if let Some(x) = steal_share {
        println!("{}", steal_line(x));
    }
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
            "steal_share": steal_share,
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
            steal_share,
            commit,
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
pub(crate) const DEFAULT_UCX_TLS: &str = "posix,cma,self";

/// The parameters of a comparison, one line each, for the terminal and the report.
pub(crate) fn suite_settings(a: &CompareArgs, plan: &SuitePlan) -> Vec<String> {
    let names: Vec<&str> = plan.targets.iter().map(|t| t.name).collect();
    let mut out = vec![format!(
        "Targets: {}; {} round(s) per load, target order alternating each round.",
        names.join(", "),
        plan.rounds
    )];
    if let Some(l) = &plan.latency {
        let ops: Vec<&str> = l.ops.iter().map(|o| o.name()).collect();
        let (slices, per_slice) =
            memfabric_bench::compare::latency_slices(l.iterations, plan.rounds);
        out.push(format!(
            "Latency: one client, one op at a time; ops {} (mix = 90% get, 10% set), sizes {:?} B, {} measured ops per row: a UCX row on one connection, a TCP row in {} slices of {} (each on a new connection after {} warm-up ops), the TCP targets' slices interleaved row by row in alternating order and pooled.",
            ops.join(", "),
            l.sizes,
            l.iterations,
            slices,
            per_slice,
            memfabric_bench::compare::latency_warmup(per_slice)
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

pub(crate) fn bound_label(c: &LoadConfig) -> String {
    match (c.ops, c.duration) {
        (Some(o), _) => format!("{o} ops"),
        (None, Some(d)) => format!("{:.1} s", d.as_secs_f64()),
        (None, None) => "-".into(),
    }
}

/// The commit the binaries were built from (for the report), and whether tracked files had
/// uncommitted changes (they were built too); None outside a git checkout.
pub(crate) fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).filter(|s| !s.is_empty())?;
    // Documentation is not built in (and this run rewrites the report's own files).
    let changed = git(&["status", "--porcelain", "--untracked-files=no"]).map_or(0, |s| {
        s.lines()
            .filter_map(|l| l.get(3..))
            .filter(|path| !path.starts_with("docs/") && !path.ends_with(".md"))
            .count()
    });
    Some(if changed > 0 {
        format!(
            "commit `{head}` plus the working tree's uncommitted changes to {changed} tracked \
             file(s) (built in)"
        )
    } else {
        format!("commit `{head}`")
    })
}
