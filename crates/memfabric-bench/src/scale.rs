//! `memfabric-bench scale`: thousands of UCX client endpoints on one memfabricd
//! (docs/scaling.md). The endpoints live in worker processes this benchmark spawns (itself,
//! `scale-worker`): one UCX worker per process carries all of that process's endpoints,
//! each a session of its own on the server. A few endpoints are hot (closed-loop GETs);
//! the others each send one GET a second. The server's memory (RSS, anonymous and shared,
//! PSS), descriptors and memory maps are sampled as clients arrive; latencies of hot and
//! cold endpoints are measured with the hot endpoints alone and with everyone connected;
//! the hot set then rotates (churn) while failures are counted; finally every worker is
//! killed with SIGKILL and the server is watched giving its resources back.
//!
//! The worker side (`worker_main`) reads commands on stdin and answers on stdout, one
//! JSON object a line.

use hdrhistogram::Histogram;
use memfabric_client::transport::{ConnId, GetMode, Transport};
use memfabric_client::ucx::UcxTransport;
use memfabric_client::{Op, Reply, ServerAddr};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a server process holds, from /proc.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ProcSample {
    /// VmRSS and its parts, KiB.
    pub rss_kb: u64,
    pub anon_kb: u64,
    pub shmem_kb: u64,
    /// Proportional set size (shared pages split among their users), KiB.
    pub pss_kb: u64,
    pub fds: u64,
    pub maps: u64,
}

impl ProcSample {
    /// Read `pid`'s /proc entries.
    pub fn of(pid: u32) -> std::io::Result<ProcSample> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let rollup =
            std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        let pss_kb = rollup
            .lines()
            .find(|l| l.starts_with("Pss:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?
            .lines()
            .count() as u64;
        Ok(ProcSample {
            rss_kb: field("VmRSS:"),
            anon_kb: field("RssAnon:"),
            shmem_kb: field("RssShmem:"),
            pss_kb,
            fds,
            maps,
        })
    }
}

/// What a worker prints once its endpoints are connected.
#[derive(Debug, Serialize, Deserialize)]
pub struct Connected {
    pub connected: u64,
    pub failed: u64,
    pub connect_ms: f64,
    /// The first error, if any endpoint failed.
    pub error: Option<String>,
}

/// What a worker prints for `report`: since the previous report.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Latency histograms (ns) of busy and quiet endpoints' GETs: (value, count) pairs.
    pub busy: Vec<(u64, u64)>,
    pub quiet: Vec<(u64, u64)>,
    pub ops: u64,
    pub misses: u64,
    /// Requests that failed (an error instead of a reply).
    pub failures: u64,
    pub first_failure: Option<String>,
    /// The transport's moves between a server's tiers so far (not reset).
    pub moves: u64,
}

fn hist() -> Histogram<u64> {
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("constant, valid bounds");
    h.auto(true);
    h
}

fn pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

/// Merge (value, count) pairs into a histogram.
pub fn add_pairs(h: &mut Histogram<u64>, pairs: &[(u64, u64)]) {
    for &(v, n) in pairs {
        let _ = h.record_n(v.max(1), n);
    }
}

/// An empty latency histogram of the kind reports merge into.
pub fn new_hist() -> Histogram<u64> {
    hist()
}

/// The worker: `n` endpoints to `server`; commands on stdin (`busy I J`: endpoints I..J
/// closed-loop, the rest one GET a second; `report`; `quit`), answers on stdout.
pub fn worker_main(server: &str, n: usize) -> Result<(), String> {
    let addr = ServerAddr::parse(server).map_err(|e| e.to_string())?;
    let mut t = UcxTransport::new(GetMode::Auto, false).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut conns: Vec<ConnId> = Vec::with_capacity(n);
    let mut failed = 0u64;
    let mut error = None;
    for _ in 0..n {
        match t.connect(&addr, Duration::from_secs(30)) {
            Ok(c) => conns.push(c),
            Err(e) => {
                failed += 1;
                error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let key = format!("scale-{}", std::process::id()).into_bytes();
    // The key every GET reads, stored once (through the first endpoint).
    if let Some(&c) = conns.first() {
        let op = Op::Store {
            mode: memfabric_client::StoreMode::Set,
            key: key.clone(),
            value: vec![7u8; 32].into(),
            flags: 0,
            exptime: 0,
            cas: 0,
        };
        let _ = t.submit(c, u64::MAX, op);
        let (mut done, mut gone) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.is_empty() && Instant::now() < deadline {
            let _ = t.progress(Duration::from_millis(10), &mut done, &mut gone);
        }
    }
    say(&Connected {
        connected: conns.len() as u64,
        failed,
        connect_ms: start.elapsed().as_secs_f64() * 1e3,
        error,
    });
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
        let _ = tx.send("quit".into());
    });
    let mut busy = 0..0;
    // Per endpoint: a GET in flight since, and when a quiet one sends next.
    let mut in_flight: HashMap<u64, (usize, Instant)> = HashMap::new();
    let mut pending = vec![false; conns.len()];
    let spread = Duration::from_secs(1).as_nanos() as u64 / conns.len().max(1) as u64;
    let t0 = Instant::now();
    let mut next_due: Vec<Instant> = (0..conns.len())
        .map(|i| t0 + Duration::from_nanos(spread * i as u64))
        .collect();
    let (mut busy_h, mut quiet_h) = (hist(), hist());
    let mut report = Report::default();
    let mut next_id = 0u64;
    let (mut done, mut gone) = (Vec::new(), Vec::new());
    loop {
        while let Ok(cmd) = rx.try_recv() {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            match words.as_slice() {
                ["busy", i, j] => {
                    let (i, j) = (i.parse().unwrap_or(0), j.parse().unwrap_or(0));
                    busy = i.min(conns.len())..j.min(conns.len());
                }
                ["report"] => {
                    report.busy = pairs(&busy_h);
                    report.quiet = pairs(&quiet_h);
                    report.moves = t
                        .counters()
                        .iter()
                        .find(|(k, _)| k == "ucx_moves")
                        .map_or(0, |(_, v)| *v);
                    say(&report);
                    report = Report::default();
                    busy_h.reset();
                    quiet_h.reset();
                }
                ["quit"] => return Ok(()),
                _ => {}
            }
        }
        let now = Instant::now();
        for (i, &c) in conns.iter().enumerate() {
            if pending[i] {
                continue;
            }
            let go = busy.contains(&i) || now >= next_due[i];
            if !go {
                continue;
            }
            if !busy.contains(&i) {
                next_due[i] = now + Duration::from_secs(1);
            }
            next_id += 1;
            let op = Op::Get {
                key: key.clone(),
                cas: false,
            };
            match t.submit(c, next_id, op) {
                Ok(()) => {
                    pending[i] = true;
                    in_flight.insert(next_id, (i, now));
                }
                Err(e) => {
                    report.failures += 1;
                    report.first_failure.get_or_insert_with(|| e.to_string());
                }
            }
        }
        let wait = if busy.is_empty() {
            Duration::from_millis(5)
        } else {
            Duration::from_millis(1)
        };
        if t.progress(wait, &mut done, &mut gone).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = Instant::now();
        for d in done.drain(..) {
            let Some((i, since)) = in_flight.remove(&d.id) else {
                continue;
            };
            pending[i] = false;
            let ns = now.duration_since(since).as_nanos() as u64;
            match d.result {
                Ok(Reply::Value(Some(_))) => {}
                Ok(Reply::Value(None)) => report.misses += 1,
                Ok(_) => {}
                Err(e) => {
                    report.failures += 1;
                    report.first_failure.get_or_insert_with(|| e.to_string());
                    continue;
                }
            }
            report.ops += 1;
            let h = if busy.contains(&i) {
                &mut busy_h
            } else {
                &mut quiet_h
            };
            let _ = h.record(ns.max(1));
        }
        gone.clear();
    }
}

fn say<T: Serialize>(v: &T) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, v);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// One run's settings.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleConfig {
    /// Client endpoints in all (the hot ones included).
    pub clients: usize,
    /// Hot (closed-loop) endpoints; as many more are held ready for the churn.
    pub hot: usize,
    /// Seconds of each measurement window (hot alone, everyone connected, churn).
    pub duration_s: f64,
    /// Seconds between rotations of the hot set during the churn.
    pub churn_every_s: f64,
    /// Endpoints per worker process (each has one UCX worker).
    pub per_worker: usize,
    /// Client counts at which the server is sampled (0 is always sampled).
    pub milestones: Vec<usize>,
    /// UCX_TLS of the client processes (they must reach both tiers).
    pub client_tls: String,
    pub progress: bool,
}

/// A server configuration to measure.
#[derive(Clone, Debug, Serialize)]
pub struct Mode {
    pub name: String,
    /// memfabricd flags besides the ports.
    pub server_args: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Milestone {
    pub clients: usize,
    pub server: ProcSample,
    /// `stats fabric` then.
    pub sessions: u64,
    pub hot_sessions: u64,
    pub cold_sessions: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        let q = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        Latency {
            ops: h.len(),
            p50_us: if h.is_empty() { 0.0 } else { q(0.5) },
            p99_us: if h.is_empty() { 0.0 } else { q(0.99) },
        }
    }
}

/// Growth of the server between two milestones, per client added.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PerClient {
    pub from: usize,
    pub to: usize,
    pub rss_bytes: f64,
    pub anon_bytes: f64,
    pub shmem_bytes: f64,
    pub pss_bytes: f64,
    pub fds: f64,
    pub maps: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    pub seconds: f64,
    pub rotations: u64,
    pub hot: Latency,
    pub promotions: u64,
    pub demotions: u64,
    /// Per rotation (tiered servers): seconds from the rotation until the server had
    /// promoted as many sessions as had become busy (the time to cross the threshold
    /// included); `None` if not within the rotation's period.
    pub promote_s: Vec<Option<f64>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModeResult {
    pub mode: Mode,
    pub baseline: ProcSample,
    pub milestones: Vec<Milestone>,
    pub per_client: Option<PerClient>,
    /// Seconds spent connecting every endpoint: from each worker process's start until
    /// it said all its endpoints were connected, summed (the processes connect one after
    /// the other; the measurement windows between them are not counted).
    pub connect_s: f64,
    pub connected: u64,
    pub connect_failures: u64,
    pub first_connect_error: Option<String>,
    pub hot_alone: Latency,
    pub hot_full: Latency,
    pub cold_full: Latency,
    pub churn: Churn,
    /// Requests that failed in the whole run (every worker, every phase).
    pub failures: u64,
    pub first_failure: Option<String>,
    pub misses: u64,
    /// The server after every worker was killed: (seconds after the kill, sample).
    pub teardown: Vec<(f64, ProcSample)>,
    /// `stats fabric` at the end (before the kill).
    pub fabric_stats: Vec<(String, String)>,
}

/// `stats fabric` of the server at `addr` (hybrid's stats reader, one connection each).
pub fn fabric_stats(addr: std::net::SocketAddr) -> Result<Vec<(String, String)>, String> {
    crate::hybrid::stats("memfabricd", addr, "stats fabric")
        .map(|m| m.into_iter().collect())
        .map_err(|e| e.to_string())
}

fn stat_u64(stats: &[(String, String)], name: &str) -> u64 {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// A worker process and its pipes.
struct Worker {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Worker {
    fn spawn(exe: &std::path::Path, server: &str, n: usize, tls: &str) -> Result<Worker, String> {
        let mut child = std::process::Command::new(exe)
            .args([
                "scale-worker",
                "--server",
                server,
                "--clients",
                &n.to_string(),
            ])
            .env("UCX_TLS", tls)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    fn send(&mut self, cmd: &str) {
        let _ = writeln!(self.stdin, "{cmd}");
        let _ = self.stdin.flush();
    }

    fn read<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("a worker exited".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("worker said {line:?}: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn report(&mut self) -> Result<Report, String> {
        self.send("report");
        self.read()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `cfg` against a memfabricd at `server_url` (its UCX bootstrap) whose memcached
/// port is `stats_addr` and whose process is `pid`; `exe` is the benchmark binary.
pub fn run_mode(
    cfg: &ScaleConfig,
    mode: Mode,
    exe: &std::path::Path,
    server_url: &str,
    stats_addr: std::net::SocketAddr,
    pid: u32,
) -> Result<ModeResult, String> {
    let say = |msg: String| {
        if cfg.progress {
            eprintln!("scale [{}]: {msg}", mode.name);
        }
    };
    let sample = || ProcSample::of(pid).map_err(|e| format!("server /proc: {e}"));
    let stats = || fabric_stats(stats_addr);
    let window = Duration::from_secs_f64(cfg.duration_s);
    std::thread::sleep(Duration::from_millis(500));
    let baseline = sample()?;
    let mut milestones = Vec::new();
    let (mut connected, mut connect_failures, mut first_connect_error) = (0u64, 0u64, None);
    let mut note_connect = |c: Connected| {
        connected += c.connected;
        connect_failures += c.failed;
        if first_connect_error.is_none() {
            first_connect_error = c.error;
        }
    };
    // The hot endpoints (and their churn partners) first, in one process.
    let hot_n = (2 * cfg.hot).min(cfg.clients);
    let connecting = Instant::now();
    let mut hot = Worker::spawn(exe, server_url, hot_n, &cfg.client_tls)?;
    note_connect(hot.read()?);
    let mut connect_time = connecting.elapsed();
    let mark = |n: usize, milestones: &mut Vec<Milestone>| -> Result<(), String> {
        let st = stats()?;
        milestones.push(Milestone {
            clients: n,
            server: sample()?,
            sessions: stat_u64(&st, "ucx_curr_sessions"),
            hot_sessions: stat_u64(&st, "ucx_hot_sessions"),
            cold_sessions: stat_u64(&st, "ucx_cold_sessions"),
        });
        Ok(())
    };
    let hot_busy = cfg.hot.min(hot_n);
    hot.send(&format!("busy 0 {hot_busy}"));
    say(format!(
        "{hot_n} endpoints, {hot_busy} busy: hot clients alone"
    ));
    std::thread::sleep(Duration::from_secs(2).min(window));
    let mut totals = Report::default();
    let absorb = |r: &Report, totals: &mut Report| {
        totals.failures += r.failures;
        totals.misses += r.misses;
        if totals.first_failure.is_none() {
            totals.first_failure = r.first_failure.clone();
        }
    };
    let r = hot.report()?;
    absorb(&r, &mut totals);
    std::thread::sleep(window);
    let r = hot.report()?;
    absorb(&r, &mut totals);
    let mut h = new_hist();
    add_pairs(&mut h, &r.busy);
    let hot_alone = Latency::of(&h);
    // The crowd, milestone by milestone.
    let mut workers: Vec<Worker> = Vec::new();
    let mut total = hot_n;
    let mut targets: Vec<usize> = cfg
        .milestones
        .iter()
        .copied()
        .filter(|&m| m > 0 && m <= cfg.clients)
        .collect();
    if !targets.contains(&cfg.clients) {
        targets.push(cfg.clients);
    }
    for &target in &targets {
        if target < total {
            continue;
        }
        while total < target {
            let n = (target - total).min(cfg.per_worker.max(1));
            let connecting = Instant::now();
            let mut w = Worker::spawn(exe, server_url, n, &cfg.client_tls)?;
            note_connect(w.read()?);
            connect_time += connecting.elapsed();
            workers.push(w);
            total += n;
        }
        // Let the sessions' first requests settle before sampling.
        std::thread::sleep(Duration::from_millis(1500));
        mark(target, &mut milestones)?;
        say(format!(
            "{target} endpoints: server rss {} KiB, {} fds, {} maps",
            milestones.last().map_or(0, |m| m.server.rss_kb),
            milestones.last().map_or(0, |m| m.server.fds),
            milestones.last().map_or(0, |m| m.server.maps)
        ));
    }
    let connect_s = connect_time.as_secs_f64();
    // Everyone connected: the hot clients again, and the cold ones.
    let r = hot.report()?;
    absorb(&r, &mut totals);
    for w in workers.iter_mut() {
        let r = w.report()?;
        absorb(&r, &mut totals);
    }
    std::thread::sleep(window);
    let r = hot.report()?;
    absorb(&r, &mut totals);
    let mut h = new_hist();
    add_pairs(&mut h, &r.busy);
    let hot_full = Latency::of(&h);
    let mut cold = new_hist();
    add_pairs(&mut cold, &r.quiet);
    for w in workers.iter_mut() {
        let r = w.report()?;
        absorb(&r, &mut totals);
        add_pairs(&mut cold, &r.quiet);
    }
    let cold_full = Latency::of(&cold);
    say(format!(
        "hot p50 {:.1} us alone, {:.1} us with {total}; cold p50 {:.1} us",
        hot_alone.p50_us, hot_full.p50_us, cold_full.p50_us
    ));
    // Churn: the hot set rotates.
    let before = stats()?;
    let churn_start = Instant::now();
    let mut rotations = 0u64;
    let every = Duration::from_secs_f64(cfg.churn_every_s.max(0.1));
    let mut churn_h = new_hist();
    let tiered = stat_u64(&before, "ucx_tiers") > 1;
    let mut promote_s = Vec::new();
    while churn_start.elapsed() < window {
        rotations += 1;
        let (i, j) = if rotations % 2 == 1 {
            (hot_busy, hot_n)
        } else {
            (0, hot_busy)
        };
        let promoted_before = stat_u64(&stats()?, "ucx_promotions");
        hot.send(&format!("busy {i} {j}"));
        let rotated = Instant::now();
        let period = every.min(window.saturating_sub(churn_start.elapsed()));
        // How long until the server has promoted as many sessions as became busy (the
        // tiered mode only; the others never promote).
        let mut promoted_in = None;
        while rotated.elapsed() < period {
            std::thread::sleep(Duration::from_millis(50).min(period));
            if promoted_in.is_none() && tiered {
                let now = stat_u64(&stats()?, "ucx_promotions");
                if now >= promoted_before + (j - i) as u64 {
                    promoted_in = Some(rotated.elapsed().as_secs_f64());
                }
            }
        }
        if tiered {
            promote_s.push(promoted_in);
        }
        let r = hot.report()?;
        absorb(&r, &mut totals);
        add_pairs(&mut churn_h, &r.busy);
    }
    let after = stats()?;
    for w in workers.iter_mut() {
        let r = w.report()?;
        absorb(&r, &mut totals);
    }
    let churn = Churn {
        seconds: churn_start.elapsed().as_secs_f64(),
        rotations,
        hot: Latency::of(&churn_h),
        promotions: stat_u64(&after, "ucx_promotions") - stat_u64(&before, "ucx_promotions"),
        promote_s,
        demotions: stat_u64(&after, "ucx_demotions") - stat_u64(&before, "ucx_demotions"),
    };
    say(format!(
        "churn: {rotations} rotations, {} promotions, {} demotions, {} failed requests",
        churn.promotions, churn.demotions, totals.failures
    ));
    // Teardown: every client killed at once.
    let fabric_stats = after;
    drop(hot);
    workers.clear();
    let killed = Instant::now();
    let mut teardown = Vec::new();
    for at in [0.5, 1.0, 2.0, 3.0, 4.0, 5.0] {
        let due = Duration::from_secs_f64(at);
        std::thread::sleep(due.saturating_sub(killed.elapsed()));
        teardown.push((at, sample()?));
    }
    let per_client = match (milestones.first(), milestones.last()) {
        (Some(a), Some(b)) if b.clients > a.clients => {
            let n = (b.clients - a.clients) as f64;
            let d = |x: u64, y: u64| (y as f64 - x as f64) / n;
            Some(PerClient {
                from: a.clients,
                to: b.clients,
                rss_bytes: d(a.server.rss_kb, b.server.rss_kb) * 1024.0,
                anon_bytes: d(a.server.anon_kb, b.server.anon_kb) * 1024.0,
                shmem_bytes: d(a.server.shmem_kb, b.server.shmem_kb) * 1024.0,
                pss_bytes: d(a.server.pss_kb, b.server.pss_kb) * 1024.0,
                fds: d(a.server.fds, b.server.fds),
                maps: d(a.server.maps, b.server.maps),
            })
        }
        _ => None,
    };
    Ok(ModeResult {
        mode,
        baseline,
        milestones,
        per_client,
        connect_s,
        connected,
        connect_failures,
        first_connect_error,
        hot_alone,
        hot_full,
        cold_full,
        churn,
        failures: totals.failures,
        first_failure: totals.first_failure,
        misses: totals.misses,
        teardown,
        fabric_stats,
    })
}
