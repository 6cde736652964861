//! `hybrid`: a cache with a RAM tier and a flash tier under a working set larger than both
//! (after OSU's `ohb_memhybrid`).
//!
//! Each target gets its own server with the same memory limit (and, for flash targets, the
//! same flash file size). Phase 1 stores every key once, in order; phase 2 reads keys by a
//! uniform or zipfian draw from closed-loop clients. A miss is what an application would
//! pay for: a back-end penalty (a busy-wait of `miss_penalty`), then a SET that refills the
//! cache. What a flash tier buys is therefore visible as fewer misses and less total time,
//! and what it costs as slower hits (the GET latency, which excludes the penalty).

use crate::metrics::{pct_us, Progress};
use crate::rng::Rng;
use crate::server::{ServerError, ServerProcess, ServerSpec};
use crate::textproto::{self, Reply, Request};
use crate::workload::{KeyChooser, KeyDist, KeySpace, ValueMaker, WorkloadError};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum HybridError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("{target}: {what}: {source}")]
    Io {
        target: String,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{target}: {msg}")]
    Protocol { target: String, msg: String },
    #[error("unknown hybrid target {0:?} (memcached, memcached-ext, memfabricd, memfabricd-flash, memfabricd-flash-ucx)")]
    UnknownTarget(String),
    #[error("{0}")]
    Config(String),
}

/// What is measured: a server, with or without a flash tier, and how phase 2 reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    /// memcached, RAM only.
    Memcached,
    /// memcached with extstore (`-o ext_path=...`).
    MemcachedExt,
    /// memfabricd, RAM only.
    Memfabricd,
    /// memfabricd with its flash tier (`-o ext_path=...`).
    MemfabricdFlash,
    /// As `MemfabricdFlash`, phase 2 over the UCX data path with batches of GETs in flight.
    MemfabricdFlashUcx,
}

/// The targets of a run when none are named (the UCX one needs UCX and is asked for).
pub const DEFAULT_TARGETS: [TargetKind; 4] = [
    TargetKind::Memcached,
    TargetKind::MemcachedExt,
    TargetKind::Memfabricd,
    TargetKind::MemfabricdFlash,
];

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Memcached => "memcached",
            TargetKind::MemcachedExt => "memcached-ext",
            TargetKind::Memfabricd => "memfabricd",
            TargetKind::MemfabricdFlash => "memfabricd-flash",
            TargetKind::MemfabricdFlashUcx => "memfabricd-flash-ucx",
        }
    }

    pub fn parse(s: &str) -> Result<TargetKind, HybridError> {
        [
            TargetKind::Memcached,
            TargetKind::MemcachedExt,
            TargetKind::Memfabricd,
            TargetKind::MemfabricdFlash,
            TargetKind::MemfabricdFlashUcx,
        ]
        .into_iter()
        .find(|t| t.name() == s.trim())
        .ok_or_else(|| HybridError::UnknownTarget(s.to_string()))
    }

    pub fn is_memcached(self) -> bool {
        matches!(self, TargetKind::Memcached | TargetKind::MemcachedExt)
    }

    pub fn has_flash(self) -> bool {
        matches!(
            self,
            TargetKind::MemcachedExt | TargetKind::MemfabricdFlash | TargetKind::MemfabricdFlashUcx
        )
    }

    pub fn ucx(self) -> bool {
        self == TargetKind::MemfabricdFlashUcx
    }
}

/// The workload and the servers' sizes, the same for every target.
#[derive(Clone, Debug)]
pub struct HybridConfig {
    /// RAM of each server in MB (`-m`).
    pub maxmemory_mb: usize,
    /// Flash file of each flash target in MB.
    pub flash_mb: usize,
    pub valsize: usize,
    /// The key space is this many times what RAM + flash hold.
    pub spillfactor: f64,
    pub dist: KeyDist,
    /// GETs of phase 2 over all clients.
    pub ops: u64,
    pub miss_penalty: Duration,
    pub clients: usize,
    /// GETs in flight per client on the UCX target.
    pub batch: usize,
    pub seed: u64,
    /// Worker threads of every server (`-t`).
    pub server_threads: usize,
    /// memfabricd's `--flash-io` (direct or buffered).
    pub flash_io: String,
    /// memfabricd's `--flash-io-engine` (auto, io_uring or psync).
    pub flash_io_engine: String,
    pub progress: bool,
}

/// Key names of the run (fixed width, so every GET has the same size).
pub const KEY_PREFIX: &str = "mfh:";

impl HybridConfig {
    /// `spillfactor x (RAM + flash) / valsize`: the same for every target, flash or not.
    pub fn keys(&self) -> u64 {
        let bytes = (self.maxmemory_mb + self.flash_mb) as f64 * 1024.0 * 1024.0;
        (self.spillfactor * bytes / self.valsize.max(1) as f64).ceil() as u64
    }

    pub fn validate(&self) -> Result<(), HybridError> {
        let bad = |m: &str| Err(HybridError::Config(m.to_string()));
        if self.valsize == 0 {
            return bad("--valsize must be at least 1");
        }
        if !(self.spillfactor.is_finite() && self.spillfactor > 0.0) {
            return bad("--spillfactor must be > 0");
        }
        if self.clients == 0 || self.batch == 0 {
            return bad("--clients and --batch must be at least 1");
        }
        if self.keys() == 0 {
            return bad("the key space is empty");
        }
        Ok(())
    }
}

/// Where the key of zipfian rank `rank` (0 = hottest) lives in the key space: a fixed
/// permutation, so that the hot keys are spread over the load order. Without it the hottest
/// keys would be the first stored, hence the first evicted from RAM and from flash, and the
/// measurement would mostly show how fast a cold start warms up.
pub fn scatter(rank: u64, n: u64) -> u64 {
    // A prime that does not divide n: multiplication by it is a bijection of Z/n.
    const PRIMES: [u64; 2] = [2_654_435_761, 1_000_000_007];
    let p = PRIMES
        .into_iter()
        .find(|p| !n.is_multiple_of(*p))
        .unwrap_or(1);
    ((u128::from(rank) * u128::from(p)) % u128::from(n.max(1))) as u64
}

/// Server binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// None: memcached is not installed; its targets are skipped.
    pub memcached: Option<PathBuf>,
    pub memfabricd: PathBuf,
}

/// How one target's server is started.
#[derive(Clone, Debug)]
pub struct TargetPlan {
    pub kind: TargetKind,
    pub spec: ServerSpec,
    pub flash_file: Option<PathBuf>,
    /// Whether memfabricd gets a UCX bootstrap port (the UCX target only; chosen at start).
    pub ucx: bool,
}

/// The command line of `kind`'s server; its flash file goes in `flash_dir`.
pub fn plan_target(
    kind: TargetKind,
    cfg: &HybridConfig,
    bins: &Binaries,
    flash_dir: &Path,
) -> Result<TargetPlan, HybridError> {
    let path = if kind.is_memcached() {
        bins.memcached
            .clone()
            .ok_or_else(|| HybridError::Config("memcached is not installed".into()))?
    } else {
        bins.memfabricd.clone()
    };
    let mut extra = Vec::new();
    if !kind.is_memcached() && !kind.ucx() {
        // memfabricd listens for UCX on 11311 unless told otherwise; 0 keeps the RAM and
        // TCP targets off that port (another server may hold it). The UCX target is given
        // a free port of its own when it starts.
        extra.extend(["--ucx-port".into(), "0".into()]);
    }
    let flash_file = kind
        .has_flash()
        .then(|| flash_dir.join(format!("{}.flash", kind.name())));
    if let Some(f) = &flash_file {
        extra.extend([
            "-o".into(),
            format!("ext_path={}:{}m", f.display(), cfg.flash_mb),
        ]);
        if !kind.is_memcached() {
            extra.extend(["--flash-io".into(), cfg.flash_io.clone()]);
            extra.extend(["--flash-io-engine".into(), cfg.flash_io_engine.clone()]);
        }
    }
    Ok(TargetPlan {
        kind,
        spec: ServerSpec {
            name: kind.name().to_string(),
            path,
            threads: cfg.server_threads,
            memory_mb: cfg.maxmemory_mb,
            extra_args: extra,
        },
        flash_file,
        ucx: kind.ucx(),
    })
}

/// One target's results.
#[derive(Clone, Debug, Serialize)]
pub struct TargetResult {
    pub target: String,
    pub command: String,
    /// Phase 1: seconds to store every key, and SETs the server did not store.
    pub load_seconds: f64,
    pub load_not_stored: u64,
    /// Seconds waited for the flash writer after the load; whether it drained in time.
    pub drain_seconds: f64,
    pub drained: bool,
    /// Whether the page cache was dropped before phase 2 (None: no flash, not attempted).
    pub page_cache_dropped: Option<bool>,
    /// `direct_io` of `stats extstore` (memfabricd's flash targets only).
    pub direct_io: Option<bool>,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: f64,
    pub miss_ratio: f64,
    /// Hits whose value was not the key's (must be 0).
    pub wrong_values: u64,
    /// Cache fills after a miss that the server did not store.
    pub fill_errors: u64,
    /// Phase 2 wall time, penalties and fills included.
    pub total_seconds: f64,
    /// Time spent in miss penalties, summed over clients.
    pub penalty_seconds: f64,
    pub gets_per_sec: f64,
    /// GET latency (the request alone, no penalty, no fill).
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    /// From the server's `stats` after phase 2 (None when it has no such counter).
    pub flash_reads: Option<u64>,
    pub flash_objects_read: Option<u64>,
    pub flash_bytes_written: Option<u64>,
    pub flash_objects_used: Option<u64>,
    /// Each target's total time and miss ratio over memcached-ext's.
    pub total_time_vs_ext: Option<f64>,
    pub miss_ratio_vs_ext: Option<f64>,
    /// Flash-related counters of `stats` before and after phase 2.
    pub stats_before: BTreeMap<String, String>,
    pub stats_after: BTreeMap<String, String>,
}

/// A target not measured, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub target: String,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct HybridResult {
    pub keys: u64,
    pub results: Vec<TargetResult>,
    pub skipped: Vec<Skipped>,
}

/// The run's flash directory: a fresh temporary one (removed on drop) or the user's.
pub struct FlashDir {
    pub path: PathBuf,
    owned: bool,
}

impl FlashDir {
    pub fn new(given: Option<&Path>) -> Result<FlashDir, HybridError> {
        let io = |source| HybridError::Io {
            target: "flash directory".into(),
            what: "create",
            source,
        };
        match given {
            Some(p) => {
                std::fs::create_dir_all(p).map_err(io)?;
                Ok(FlashDir {
                    path: p.to_path_buf(),
                    owned: false,
                })
            }
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let p = std::env::temp_dir()
                    .join(format!("memfabric-hybrid-{}-{nanos}", std::process::id()));
                std::fs::create_dir_all(&p).map_err(io)?;
                Ok(FlashDir {
                    path: p,
                    owned: true,
                })
            }
        }
    }
}

impl Drop for FlashDir {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes a target's flash file when the target is done, also when it failed.
struct FlashFile(Option<PathBuf>);

impl Drop for FlashFile {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Run every planned target, one after the other (one server at a time: they would
/// otherwise share the machine's two cores and its disk).
pub fn run(
    cfg: &HybridConfig,
    plans: &[TargetPlan],
    skipped: Vec<Skipped>,
) -> Result<HybridResult, HybridError> {
    cfg.validate()?;
    let mut results = Vec::new();
    for plan in plans {
        eprintln!("hybrid: {} ...", plan.kind.name());
        results.push(run_target(cfg, plan)?);
    }
    add_ratios(&mut results);
    Ok(HybridResult {
        keys: cfg.keys(),
        results,
        skipped,
    })
}

/// Fill in each result's ratios to memcached-ext, when it was measured.
pub fn add_ratios(results: &mut [TargetResult]) {
    let Some(ext) = results
        .iter()
        .find(|r| r.target == TargetKind::MemcachedExt.name())
        .map(|r| (r.total_seconds, r.miss_ratio))
    else {
        return;
    };
    for r in results.iter_mut() {
        r.total_time_vs_ext = (ext.0 > 0.0).then(|| r.total_seconds / ext.0);
        r.miss_ratio_vs_ext = (ext.1 > 0.0).then(|| r.miss_ratio / ext.1);
    }
}

fn run_target(cfg: &HybridConfig, plan: &TargetPlan) -> Result<TargetResult, HybridError> {
    let name = plan.kind.name().to_string();
    // Declared before the server so that it is dropped after it: the file goes once the
    // server that wrote it is gone.
    let _flash = FlashFile(plan.flash_file.clone());
    if let Some(f) = &plan.flash_file {
        // A file left by an earlier run must not be recovered from.
        let _ = std::fs::remove_file(f);
    }
    let proc = if plan.ucx {
        plan.spec.start_with_ucx_port()?
    } else {
        plan.spec.start()?
    };
    let items = Items {
        keys: KeySpace::new(KEY_PREFIX, cfg.keys()),
        values: ValueMaker::new(cfg.valsize),
    };
    let load_start = Instant::now();
    let load_not_stored = load(&name, proc.addr, &items, cfg.progress)?;
    let load_seconds = load_start.elapsed().as_secs_f64();
    let drain_start = Instant::now();
    let drained = drain(&name, &plan.kind, &proc)?;
    let drain_seconds = drain_start.elapsed().as_secs_f64();
    let page_cache_dropped = plan.kind.has_flash().then(drop_page_cache);
    let direct_io = if plan.kind.has_flash() && !plan.kind.is_memcached() {
        stats(&name, proc.addr, "stats extstore")?
            .get("direct_io")
            .map(|v| v == "yes")
    } else {
        None
    };
    let before = stats(&name, proc.addr, "stats")?;
    let m = measure(cfg, plan, &proc, &items)?;
    let after = stats(&name, proc.addr, "stats")?;
    drop(proc);
    let num = |k: &str| after.get(k).and_then(|v| v.parse::<u64>().ok());
    let gets = m.hits + m.misses;
    let ratio = |x: u64| {
        if gets > 0 {
            x as f64 / gets as f64
        } else {
            0.0
        }
    };
    Ok(TargetResult {
        target: name,
        command: plan.spec.display_args(),
        load_seconds,
        load_not_stored,
        drain_seconds,
        drained,
        page_cache_dropped,
        direct_io,
        gets,
        hits: m.hits,
        misses: m.misses,
        hit_ratio: ratio(m.hits),
        miss_ratio: ratio(m.misses),
        wrong_values: m.wrong,
        fill_errors: m.fill_errors,
        total_seconds: m.wall.as_secs_f64(),
        penalty_seconds: m.penalty_ns as f64 / 1e9,
        gets_per_sec: gets as f64 / m.wall.as_secs_f64().max(1e-9),
        get_p50_us: pct_us(&m.hist, 0.50),
        get_p99_us: pct_us(&m.hist, 0.99),
        flash_reads: num("get_extstore").or_else(|| num("extstore_objects_read")),
        flash_objects_read: num("extstore_objects_read"),
        flash_bytes_written: num("extstore_bytes_written"),
        flash_objects_used: num("extstore_objects_used"),
        total_time_vs_ext: None,
        miss_ratio_vs_ext: None,
        stats_before: flash_counters(before),
        stats_after: flash_counters(after),
    })
}

/// The counters worth keeping in the JSON: the tier's, and the GET totals.
fn flash_counters(all: BTreeMap<String, String>) -> BTreeMap<String, String> {
    all.into_iter()
        .filter(|(k, _)| {
            k.contains("extstore")
                || k.starts_with("flash_")
                || matches!(
                    k.as_str(),
                    "get_hits" | "get_misses" | "cmd_get" | "cmd_set" | "evictions"
                )
        })
        .collect()
}

/// The key space and the value of every key.
struct Items {
    keys: KeySpace,
    values: ValueMaker,
}

/// SETs per round trip of the load: enough to keep the pipe full; their replies (8 bytes
/// each) never fill a socket buffer while the SETs are still being written.
const LOAD_BATCH: u64 = 64;

/// I/O timeout of every request: a server that stops answering fails the run instead of
/// hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Phase 1: store every key once, in key order, batched; returns the SETs not stored.
fn load(name: &str, addr: SocketAddr, items: &Items, progress: bool) -> Result<u64, HybridError> {
    let mut c = TextConn::connect(name, addr)?;
    let n = items.keys.n;
    let mut p = Progress::new(&format!("{name} load"), progress);
    let start = Instant::now();
    let (mut key, mut val) = (Vec::new(), Vec::new());
    let mut not_stored = 0;
    let mut id = 0;
    while id < n {
        let end = (id + LOAD_BATCH).min(n);
        for k in id..end {
            key.clear();
            items.keys.write_key(k, &mut key);
            items.values.fill(k, &mut val);
            textproto::encode(
                &Request::Set {
                    key: &key,
                    value: &val,
                },
                &mut c.out,
            );
        }
        c.flush()?;
        for _ in id..end {
            if !c.reply(|r| matches!(r, Reply::Stored))? {
                not_stored += 1;
            }
        }
        id = end;
        p.tick(start.elapsed(), id, None, Some(n));
    }
    p.finish();
    Ok(not_stored)
}

/// How long the flash writer may take to write what the load left in its buffers.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Wait until the flash writer has written what the load gave it, so that phase 2 starts
/// from a settled tier: memfabricd says how many pages are still buffered; memcached does
/// not, so it gets a second.
fn drain(name: &str, kind: &TargetKind, proc: &ServerProcess) -> Result<bool, HybridError> {
    if !kind.has_flash() {
        return Ok(true);
    }
    if kind.is_memcached() {
        std::thread::sleep(Duration::from_secs(1));
        return Ok(true);
    }
    let start = Instant::now();
    while start.elapsed() < DRAIN_LIMIT {
        let s = stats(name, proc.addr, "stats extstore")?;
        // One page is always open for the next writes; more are waiting for the device.
        if s.get("pages_buffered")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|b| b <= 1)
        {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(false)
}

/// Drop the page cache (root only), so that flash reads of phase 2 go to the device where
/// the server reads through it (memcached always, memfabricd when O_DIRECT is refused).
/// Whether it was dropped.
pub fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    // The write fails for anyone but root (and in a container whose /proc/sys is
    // read-only): then the cache stays, and the report says so.
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// `STAT name value` lines of `cmd` ("stats", "stats extstore"), on a connection of its own.
pub fn stats(
    name: &str,
    addr: SocketAddr,
    cmd: &str,
) -> Result<BTreeMap<String, String>, HybridError> {
    let io = |what| {
        move |source| HybridError::Io {
            target: name.to_string(),
            what,
            source,
        }
    };
    let mut s = TcpStream::connect(addr).map_err(io("connect"))?;
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(io("connect"))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())
        .map_err(io("stats"))?;
    let mut r = BufReader::new(s);
    let mut out = BTreeMap::new();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(io("stats"))? == 0 {
            return Err(HybridError::Protocol {
                target: name.to_string(),
                msg: format!("{cmd}: connection closed before END"),
            });
        }
        let l = line.trim_end();
        if l == "END" {
            return Ok(out);
        }
        if l.starts_with("ERROR") || l.starts_with("CLIENT_ERROR") {
            return Err(HybridError::Protocol {
                target: name.to_string(),
                msg: format!("{cmd}: {l}"),
            });
        }
        let mut parts = l.splitn(3, ' ');
        if let (Some("STAT"), Some(k), Some(v)) = (parts.next(), parts.next(), parts.next()) {
            out.insert(k.to_string(), v.to_string());
        }
    }
}

/// A blocking text-protocol connection: requests are encoded into `out`, replies parsed
/// from `buf` as they arrive.
struct TextConn {
    name: String,
    s: TcpStream,
    out: Vec<u8>,
    buf: Vec<u8>,
    head: usize,
}

impl TextConn {
    fn connect(name: &str, addr: SocketAddr) -> Result<TextConn, HybridError> {
        let io = |source| HybridError::Io {
            target: name.to_string(),
            what: "connect",
            source,
        };
        let s = TcpStream::connect(addr).map_err(io)?;
        // One small request at a time: Nagle would hold it back for the previous ACK.
        s.set_nodelay(true).map_err(io)?;
        s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        s.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        Ok(TextConn {
            name: name.to_string(),
            s,
            out: Vec::with_capacity(64 * 1024),
            buf: Vec::with_capacity(64 * 1024),
            head: 0,
        })
    }

    fn io_err(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> HybridError + '_ {
        move |source| HybridError::Io {
            target: self.name.clone(),
            what,
            source,
        }
    }

    fn flush(&mut self) -> Result<(), HybridError> {
        let r = self.s.write_all(&self.out);
        self.out.clear();
        r.map_err(self.io_err("send"))
    }

    /// Wait for the next reply and hand it to `f`.
    fn reply<T>(&mut self, f: impl FnOnce(Reply<'_>) -> T) -> Result<T, HybridError> {
        loop {
            let used = match textproto::parse_reply(&self.buf[self.head..]) {
                Ok(Some((_, n))) => n,
                Ok(None) => {
                    self.fill()?;
                    continue;
                }
                Err(e) => {
                    return Err(HybridError::Protocol {
                        target: self.name.clone(),
                        msg: e.to_string(),
                    })
                }
            };
            // Parsed again to hand out the borrow: the first parse only found the end
            // (the header line; the value bytes are not scanned).
            let (r, _) = textproto::parse_reply(&self.buf[self.head..])
                .ok()
                .flatten()
                .ok_or_else(|| HybridError::Protocol {
                    target: self.name.clone(),
                    msg: "reply changed between parses".into(),
                })?;
            let out = f(r);
            self.head += used;
            if self.head == self.buf.len() {
                self.buf.clear();
                self.head = 0;
            }
            return Ok(out);
        }
    }

    /// Read more bytes into `buf`, first moving what is left to the front.
    fn fill(&mut self) -> Result<(), HybridError> {
        if self.head > 0 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        let at = self.buf.len();
        self.buf.resize(at + 64 * 1024, 0);
        let r = self.s.read(&mut self.buf[at..]);
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                self.buf.truncate(at);
                return Err(self.io_err("receive")(e));
            }
        };
        self.buf.truncate(at + n);
        if n == 0 {
            return Err(HybridError::Protocol {
                target: self.name.clone(),
                msg: "server closed the connection".into(),
            });
        }
        Ok(())
    }
}

/// What a GET found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Got {
    Hit,
    /// A value, but not the key's.
    Wrong,
    Miss,
}

/// One client's connection in phase 2: GETs (several in flight on UCX), and fills.
trait GetClient {
    /// GET every id of `ids`; push (what it found, its latency in ns) for each, in order.
    fn gets(&mut self, ids: &[u64], out: &mut Vec<(Got, u64)>) -> Result<(), HybridError>;
    /// Store key `id`'s value after a miss; whether the server stored it.
    fn fill(&mut self, id: u64) -> Result<bool, HybridError>;
}

struct TcpGetClient<'a> {
    conn: TextConn,
    items: &'a Items,
    key: Vec<u8>,
    val: Vec<u8>,
}

impl GetClient for TcpGetClient<'_> {
    fn gets(&mut self, ids: &[u64], out: &mut Vec<(Got, u64)>) -> Result<(), HybridError> {
        // One at a time: the closed loop of one client is one GET in flight.
        for &id in ids {
            self.key.clear();
            self.items.keys.write_key(id, &mut self.key);
            let t0 = Instant::now();
            textproto::encode(&Request::Get { key: &self.key }, &mut self.conn.out);
            self.conn.flush()?;
            let values = &self.items.values;
            let got = self.conn.reply(|r| match r {
                Reply::Hit { data, .. } if values.check(id, data) => Ok(Got::Hit),
                Reply::Hit { .. } => Ok(Got::Wrong),
                Reply::Miss => Ok(Got::Miss),
                other => Err(format!("GET answered {other:?}")),
            })?;
            let ns = t0.elapsed().as_nanos() as u64;
            let got = got.map_err(|msg| HybridError::Protocol {
                target: self.conn.name.clone(),
                msg,
            })?;
            out.push((got, ns));
        }
        Ok(())
    }

    fn fill(&mut self, id: u64) -> Result<bool, HybridError> {
        self.key.clear();
        self.items.keys.write_key(id, &mut self.key);
        self.items.values.fill(id, &mut self.val);
        textproto::encode(
            &Request::Set {
                key: &self.key,
                value: &self.val,
            },
            &mut self.conn.out,
        );
        self.conn.flush()?;
        self.conn.reply(|r| matches!(r, Reply::Stored))
    }
}

/// The UCX data path through the client library: a batch of `iget`s in flight, then each
/// waited for in order.
struct UcxGetClient<'a> {
    name: String,
    client: memfabric_client::Client,
    items: &'a Items,
    key: Vec<u8>,
    val: Vec<u8>,
}

impl<'a> UcxGetClient<'a> {
    fn connect(name: &str, port: u16, items: &'a Items) -> Result<Self, HybridError> {
        let config = memfabric_client::Config {
            timeout: IO_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            // Items on flash are only reachable through the server: no RMA reads.
            get_mode: memfabric_client::GetMode::TwoSided,
            ..memfabric_client::Config::default()
        };
        let mut client =
            memfabric_client::Client::new(format!("ucx://127.0.0.1:{port}").as_str(), config)
                .map_err(|e| HybridError::Protocol {
                    target: name.to_string(),
                    msg: format!("UCX connect: {e}"),
                })?;
        // Connect now, so that a server without UCX fails here rather than mid-run.
        for (_, r) in client.version() {
            r.map_err(|e| HybridError::Protocol {
                target: name.to_string(),
                msg: format!("UCX version: {e}"),
            })?;
        }
        Ok(UcxGetClient {
            name: name.to_string(),
            client,
            items,
            key: Vec::new(),
            val: Vec::new(),
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> HybridError {
        HybridError::Protocol {
            target: self.name.clone(),
            msg: e.to_string(),
        }
    }
}

impl GetClient for UcxGetClient<'_> {
    fn gets(&mut self, ids: &[u64], out: &mut Vec<(Got, u64)>) -> Result<(), HybridError> {
        let t0 = Instant::now();
        let mut handles = Vec::with_capacity(ids.len());
        for &id in ids {
            self.key.clear();
            self.items.keys.write_key(id, &mut self.key);
            handles.push(self.client.iget(&self.key));
        }
        for (&id, h) in ids.iter().zip(handles) {
            let r = self.client.wait(h, IO_TIMEOUT).map_err(|e| self.err(e))?;
            // From the batch's start: the time this GET spent in flight.
            let ns = t0.elapsed().as_nanos() as u64;
            let got = match r {
                memfabric_client::Reply::Value(Some(v)) if self.items.values.check(id, &v.data) => {
                    Got::Hit
                }
                memfabric_client::Reply::Value(Some(_)) => Got::Wrong,
                memfabric_client::Reply::Value(None) => Got::Miss,
                other => return Err(self.err(format!("GET answered {other:?}"))),
            };
            out.push((got, ns));
        }
        Ok(())
    }

    fn fill(&mut self, id: u64) -> Result<bool, HybridError> {
        self.key.clear();
        self.items.keys.write_key(id, &mut self.key);
        self.items.values.fill(id, &mut self.val);
        Ok(self.client.set(&self.key, &self.val, 0, 0).is_ok())
    }
}

/// Phase 2's counts of one client, then of all.
struct Measured {
    hits: u64,
    misses: u64,
    wrong: u64,
    fill_errors: u64,
    penalty_ns: u64,
    hist: Histogram<u64>,
    wall: Duration,
}

fn new_hist() -> Histogram<u64> {
    // 1 ns to 60 s at 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("constant, valid bounds")
}

/// Spend `d` on the CPU, as a back end computing the missing value would (a sleep would
/// give the core to the server instead and understate the cost).
fn busy_wait(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// What every client of phase 2 shares.
struct RunShared<'a> {
    cfg: &'a HybridConfig,
    chooser: KeyChooser,
    /// Keys in the key space.
    n: u64,
    /// GETs in flight per client.
    batch: usize,
    /// GETs done by all clients (for the progress line).
    done: AtomicU64,
}

/// One client's share of phase 2: `ops` GETs.
fn client_loop(
    c: &mut dyn GetClient,
    sh: &RunShared<'_>,
    ops: u64,
    rng: &mut Rng,
) -> Result<Measured, HybridError> {
    let (cfg, batch) = (sh.cfg, sh.batch);
    let mut m = Measured {
        hits: 0,
        misses: 0,
        wrong: 0,
        fill_errors: 0,
        penalty_ns: 0,
        hist: new_hist(),
        wall: Duration::ZERO,
    };
    let mut ids = Vec::with_capacity(batch);
    let mut got = Vec::with_capacity(batch);
    let mut left = ops;
    while left > 0 {
        let b = (batch as u64).min(left);
        ids.clear();
        ids.extend((0..b).map(|_| scatter(sh.chooser.next(rng), sh.n)));
        got.clear();
        c.gets(&ids, &mut got)?;
        for (&id, &(g, ns)) in ids.iter().zip(&got) {
            let _ = m.hist.record(ns.max(1));
            match g {
                Got::Hit => m.hits += 1,
                Got::Wrong => {
                    m.hits += 1;
                    m.wrong += 1;
                }
                Got::Miss => {
                    m.misses += 1;
                    let p0 = Instant::now();
                    busy_wait(cfg.miss_penalty);
                    m.penalty_ns += p0.elapsed().as_nanos() as u64;
                    if !c.fill(id)? {
                        m.fill_errors += 1;
                    }
                }
            }
        }
        left -= b;
        sh.done.fetch_add(b, Ordering::Relaxed);
    }
    Ok(m)
}

/// Phase 2: `cfg.ops` GETs over `cfg.clients` closed-loop clients, each on its own
/// connection with its own seed.
fn measure(
    cfg: &HybridConfig,
    plan: &TargetPlan,
    proc: &ServerProcess,
    items: &Items,
) -> Result<Measured, HybridError> {
    let name = plan.kind.name();
    let sh = RunShared {
        cfg,
        chooser: KeyChooser::new(items.keys.n, cfg.dist)?,
        n: items.keys.n,
        batch: if plan.kind.ucx() { cfg.batch } else { 1 },
        done: AtomicU64::new(0),
    };
    let per = cfg.ops / cfg.clients as u64;
    let extra = cfg.ops % cfg.clients as u64;
    // Every client connects in its own thread (the UCX client may not move between
    // threads), then all meet here so that the clock starts once all are connected.
    let ready = std::sync::Barrier::new(cfg.clients + 1);
    let (results, wall) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.clients)
            .map(|i| {
                let ops = per + u64::from((i as u64) < extra);
                let (sh, ready) = (&sh, &ready);
                // Distinct, reproducible streams per client.
                let mut rng = Rng::new(cfg.seed.wrapping_add(0x9E37 * (i as u64 + 1)));
                s.spawn(move || {
                    let c: Result<Box<dyn GetClient>, HybridError> = match proc.ucx_port {
                        Some(port) => UcxGetClient::connect(name, port, items)
                            .map(|c| Box::new(c) as Box<dyn GetClient>),
                        None => TextConn::connect(name, proc.addr).map(|conn| {
                            Box::new(TcpGetClient {
                                conn,
                                items,
                                key: Vec::new(),
                                val: Vec::new(),
                            }) as Box<dyn GetClient>
                        }),
                    };
                    // Also after a failed connect: the others must not wait forever.
                    ready.wait();
                    let r = c.and_then(|mut c| client_loop(c.as_mut(), sh, ops, &mut rng));
                    // The clock stops when the last client is done, not when the poll
                    // below notices.
                    (r, Instant::now())
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let mut p = Progress::new(&format!("{name} gets"), cfg.progress);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            p.tick(
                start.elapsed(),
                sh.done.load(Ordering::Relaxed),
                None,
                Some(cfg.ops),
            );
        }
        p.finish();
        let mut end = start;
        let results: Vec<Result<Measured, HybridError>> = handles
            .into_iter()
            .map(|h| match h.join() {
                Ok((r, t)) => {
                    end = end.max(t);
                    r
                }
                Err(_) => Err(HybridError::Protocol {
                    target: name.to_string(),
                    msg: "a client thread panicked".into(),
                }),
            })
            .collect();
        (results, end - start)
    });
    let mut all = Measured {
        hits: 0,
        misses: 0,
        wrong: 0,
        fill_errors: 0,
        penalty_ns: 0,
        hist: new_hist(),
        wall,
    };
    for r in results {
        let m = r?;
        all.hits += m.hits;
        all.misses += m.misses;
        all.wrong += m.wrong;
        all.fill_errors += m.fill_errors;
        all.penalty_ns += m.penalty_ns;
        let _ = all.hist.add(&m.hist);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation() {
        for n in [1u64, 2, 7, 100, 1000, 4096] {
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let id = scatter(r, n) as usize;
                assert!(!seen[id], "n={n}: {id} twice");
                seen[id] = true;
            }
        }
    }

    #[test]
    fn keys_are_spillfactor_times_ram_plus_flash() {
        let cfg = HybridConfig {
            maxmemory_mb: 64,
            flash_mb: 256,
            valsize: 4096,
            spillfactor: 2.0,
            dist: KeyDist::Uniform,
            ops: 1,
            miss_penalty: Duration::ZERO,
            clients: 1,
            batch: 1,
            seed: 1,
            server_threads: 4,
            flash_io: "direct".into(),
            flash_io_engine: "auto".into(),
            progress: false,
        };
        assert_eq!(cfg.keys(), 2 * 320 * 1024 * 1024 / 4096);
    }

    #[test]
    fn target_names_round_trip() {
        for t in DEFAULT_TARGETS
            .into_iter()
            .chain([TargetKind::MemfabricdFlashUcx])
        {
            assert_eq!(TargetKind::parse(t.name()).unwrap(), t);
        }
        assert!(TargetKind::parse("redis").is_err());
    }
}
