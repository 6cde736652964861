//! `memfabric-bench bursty`: a checkpoint written and read back through the burst buffer
//! and straight to the backing directory with fsync, then flushed; one run, ratios.

use crate::compare_cmd::DEFAULT_UCX_TLS;
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::{Args, ValueEnum};
use memfabric_bb::fs::Options;
use memfabric_bench::bursty::{self, BurstyConfig, BurstyResult, Pattern, Pool, Scratch};
use memfabric_bench::plot::{self, BarPanel};
use memfabric_bench::report::{table, Machine};
use memfabric_bench::server::{self, ServerSpec};
use memfabric_client::Config;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Transport {
    Ucx,
    Tcp,
}

/// `512k`, `1m`, `2g` or plain bytes.
fn size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s}: a size such as 4096, 512k, 1m, 2g"))
}

#[derive(Args)]
pub(crate) struct BurstyArgs {
    /// Writers (threads, each with its own connections).
    #[arg(long, default_value_t = 4)]
    pub(crate) writers: usize,
    /// Files per writer in the checkpoint.
    #[arg(long, default_value_t = 1)]
    pub(crate) files: usize,
    /// Bytes each writer writes per file (512m with 4 writers: a 2 GiB checkpoint).
    #[arg(long, default_value = "512m", value_parser = size)]
    pub(crate) file_size: u64,
    /// Bytes per write and read call.
    #[arg(long, default_value = "1m", value_parser = size)]
    pub(crate) block: u64,
    /// The burst buffer's chunk size.
    #[arg(long, default_value = "512k", value_parser = size)]
    pub(crate) chunk: u64,
    /// Chunk writes and reads in flight per file (non-blocking depth).
    #[arg(long, default_value_t = 16)]
    pub(crate) depth: usize,
    /// sequential (file per writer), strided (N-1: writers interleaved in shared files)
    /// or random (file per writer, blocks shuffled).
    #[arg(long, default_value = "sequential")]
    pub(crate) pattern: Pattern,
    /// Flushers working at once in the flush phase.
    #[arg(long, default_value_t = 2)]
    pub(crate) flushers: usize,
    /// How clients reach the servers.
    #[arg(long, value_enum, default_value_t = Transport::Ucx)]
    pub(crate) transport: Transport,
    /// memfabricd servers to start.
    #[arg(long, default_value_t = 1)]
    pub(crate) servers: usize,
    /// Worker threads of every server (-t).
    #[arg(long, default_value_t = 4)]
    pub(crate) server_threads: usize,
    /// Memory of every server in MB (default: what the checkpoint and its copies need,
    /// spread over the servers, plus a quarter).
    #[arg(long)]
    pub(crate) memory: Option<usize>,
    /// More copies of every chunk (docs/resilience.md).
    #[arg(long, default_value_t = 0)]
    pub(crate) replicas: u8,
    /// Erasure-code chunks with RS(K, M), for example 4+2.
    #[arg(long)]
    pub(crate) ec: Option<memfabric_client::EcGeometry>,
    /// The backing directory (the parallel file system's stand-in); a scratch directory
    /// is made in it and removed at the end. Default: the system's temporary directory.
    #[arg(long)]
    pub(crate) backing: Option<PathBuf>,
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
    /// Draw MB/s per phase to this PNG.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

pub(crate) fn bursty_cmd(a: BurstyArgs) -> Fallible<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let cfg = BurstyConfig {
        writers: a.writers,
        files: a.files,
        file_size: a.file_size,
        block: usize::try_from(a.block)?,
        chunk: u32::try_from(a.chunk)?,
        depth: a.depth,
        pattern: a.pattern,
        flushers: a.flushers,
        progress: !a.quiet,
    };
    cfg.validate()?;
    if a.servers == 0 {
        return Err("--servers must be at least 1".into());
    }
    let copies = match a.ec {
        Some(g) => (g.k as f64 + g.m as f64) / g.k as f64,
        None => 1.0 + a.replicas as f64,
    };
    let memory = a.memory.unwrap_or_else(|| {
        let need = cfg.total() as f64 * copies / a.servers as f64 * 1.25;
        (need / (1 << 20) as f64) as usize + 64
    });
    if a.transport == Transport::Ucx && std::env::var_os("UCX_TLS").is_none() {
        std::env::set_var("UCX_TLS", DEFAULT_UCX_TLS);
    }
    let (mf_path, origin) = server::locate_memfabricd(a.memfabricd.as_deref())?;
    eprintln!("bursty: memfabricd is {} ({origin})", mf_path.display());
    let mut servers = Vec::new();
    let mut list = Vec::new();
    for i in 0..a.servers {
        let ucx = a.transport == Transport::Ucx;
        let mut extra = Vec::new();
        if !ucx {
            extra.extend(["--ucx-port".to_string(), "0".to_string()]);
        }
        let spec = ServerSpec {
            name: format!("memfabricd-{i}"),
            path: mf_path.clone(),
            threads: a.server_threads,
            memory_mb: memory,
            // A full cache refuses instead of evicting a file (docs/burst-buffer.md).
            extra_args: [extra, vec!["-M".into()]].concat(),
        };
        if i == 0 {
            println!("servers: {} x {}", a.servers, spec.display_args());
        }
        let s = if ucx {
            spec.start_with_ucx_port()?
        } else {
            spec.start()?
        };
        list.push(match s.ucx_port {
            Some(p) => format!("ucx://127.0.0.1:{p}"),
            None => s.addr.to_string(),
        });
        servers.push(s);
    }
    let pool = Pool {
        servers: list.join(","),
        config: Config {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            replicas: a.replicas,
            ec: a.ec,
            ..Config::default()
        },
        fs: Options {
            name: format!("bursty-{}", std::process::id()),
            chunk_size: cfg.chunk,
            depth: cfg.depth,
            backing: None,
            ..Options::default()
        },
    };
    let base = a.backing.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = Scratch(base.join(format!("memfabric-bursty-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)?;
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    let settings = format!(
        "bursty: {} writers x {} files x {} MiB ({:?}), {} KiB blocks; burst buffer: {} KiB \
         chunks, depth {}, {} x memfabricd -m {} over {:?}{}; backing {}; {} flushers",
        cfg.writers,
        cfg.files,
        cfg.file_size >> 20,
        cfg.pattern,
        cfg.block >> 10,
        cfg.chunk >> 10,
        cfg.depth,
        a.servers,
        memory,
        a.transport,
        match (a.ec, a.replicas) {
            (Some(g), _) => format!(", RS({}, {})", g.k, g.m),
            (None, 0) => String::new(),
            (None, r) => format!(", {r} replicas"),
        },
        scratch.0.display(),
        cfg.flushers,
    );
    println!("{settings}");
    let bytes = cfg.total();
    let raw = bursty::raw_write(&scratch.0, bytes.min(2 << 30)).map_err(|e| e.to_string())?;
    let (dw, dr) = bursty::direct(&cfg, &scratch.0.join("direct")).map_err(|e| e.to_string())?;
    // The baseline's files go before the flush needs the room.
    std::fs::remove_dir_all(scratch.0.join("direct"))?;
    let (bw, br) = bursty::burst_buffer(&cfg, &pool).map_err(|e| e.to_string())?;
    let flush_dir = scratch.0.join("flushed");
    std::fs::create_dir_all(&flush_dir)?;
    let mut fpool = pool.clone();
    fpool.fs.backing = Some(flush_dir.clone());
    let fl = bursty::flush_phase(&cfg, &fpool).map_err(|e| e.to_string())?;
    bursty::check_flushed(&cfg, &flush_dir).map_err(|e| e.to_string())?;
    let mut res = BurstyResult {
        raw_direct_write: raw,
        direct_write: dw,
        direct_read: dr,
        bb_write: bw,
        bb_read: br,
        flush: fl,
        write_speedup: 0.0,
        read_speedup: 0.0,
        flush_of_raw: 0.0,
    };
    bursty::speedups(&mut res);
    drop(servers);
    drop(scratch);
    let row = |p: &bursty::Phase, ratio: String| {
        vec![
            p.name.clone(),
            format!("{}", p.bytes >> 20),
            format!("{:.2}", p.seconds),
            format!("{:.0}", p.mb_per_s),
            ratio,
        ]
    };
    let rows = vec![
        row(&res.raw_direct_write, String::new()),
        row(&res.direct_write, String::new()),
        row(&res.bb_write, format!("{:.2}x direct", res.write_speedup)),
        row(&res.direct_read, String::new()),
        row(&res.bb_read, format!("{:.2}x direct", res.read_speedup)),
        row(
            &res.flush,
            format!("{:.0}% of raw", res.flush_of_raw * 100.0),
        ),
    ];
    print!(
        "{}",
        table(&["phase", "MiB", "seconds", "MB/s", "ratio"], &rows)
    );
    println!(
        "absorbed {:.2}x faster than direct + fsync, read back {:.2}x faster, flushed at {:.0}% of \
         the backing directory's raw write speed (every byte read back checked)",
        res.write_speedup,
        res.read_speedup,
        res.flush_of_raw * 100.0
    );
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "command": command,
            "machine": machine,
            "settings": settings,
            "config": cfg,
            "ucx_tls": std::env::var("UCX_TLS").ok(),
            "results": res,
        });
        write_json(p, &v)?;
    }
    if let Some(p) = &a.plot {
        let panels = [BarPanel {
            title: "bandwidth per phase".into(),
            y_desc: "MB/s".into(),
            bars: vec![
                ("raw dd".into(), res.raw_direct_write.mb_per_s),
                ("direct write".into(), res.direct_write.mb_per_s),
                ("bb write".into(), res.bb_write.mb_per_s),
                ("direct read".into(), res.direct_read.mb_per_s),
                ("bb read".into(), res.bb_read.mb_per_s),
                ("flush".into(), res.flush.mb_per_s),
            ],
        }];
        let title = format!(
            "bursty: {} writers x {} MiB checkpoint ({:?})",
            cfg.writers,
            cfg.total() >> 20,
            cfg.pattern
        );
        report_plot(plot::bars(p, &title, &panels), p);
    }
    Ok(())
}
