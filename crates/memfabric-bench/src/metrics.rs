//! What a run measured: latency histograms, op counts, hit ratio, CPU time.

use crate::workload::{OpKind, TxnKind};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Latencies are recorded in nanoseconds; 3 significant digits keeps p99.9 exact to 0.1%.
fn new_hist() -> Histogram<u64> {
    // 1 ns .. 60 s with auto-resize for anything longer. These constant bounds satisfy
    // every precondition of the constructor (low >= 1, high >= 2 * low, sigfig <= 5), so
    // this cannot fail at run time whatever the input.
    let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("constant, valid bounds");
    h.auto(true);
    h
}

/// Counters and histograms of one run (one thread, or merged). Requests (a GET, a SET) and
/// operations (what the workload asked for: a YCSB scan is many GETs) are counted apart;
/// for the get/set workloads every operation is one request.
#[derive(Clone, Debug)]
pub struct LoadStats {
    /// Latency of each operation by kind, indexed by [`TxnKind::index`]; created on first
    /// use (a histogram is ~200 KB).
    pub txn_hists: [Option<Histogram<u64>>; TxnKind::ALL.len()],
    pub get_hist: Histogram<u64>,
    pub set_hist: Histogram<u64>,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    /// GET replies for the wrong key or with a wrong value: a server bug, never a hit.
    pub mismatches: u64,
    pub sets: u64,
    pub stored: u64,
    pub not_stored: u64,
    /// ERROR / CLIENT_ERROR / SERVER_ERROR replies.
    pub errors: u64,
    /// Wall time of the run (the longest thread's).
    pub elapsed: Duration,
    /// CPU seconds of the load generator's own threads (summed), when readable.
    pub generator_cpu_s: Option<f64>,
}

impl Default for LoadStats {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadStats {
    pub fn new() -> Self {
        LoadStats {
            txn_hists: Default::default(),
            get_hist: new_hist(),
            set_hist: new_hist(),
            gets: 0,
            hits: 0,
            misses: 0,
            mismatches: 0,
            sets: 0,
            stored: 0,
            not_stored: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            generator_cpu_s: None,
        }
    }

    /// A GET finished: `hit` is `None` for a miss, `Some(valid)` for a VALUE reply.
    pub fn record_get(&mut self, ns: u64, hit: Option<bool>) {
        self.gets += 1;
        match hit {
            None => self.misses += 1,
            Some(true) => self.hits += 1,
            Some(false) => self.mismatches += 1,
        }
        let _ = self.get_hist.record(ns.max(1));
    }

    pub fn record_set(&mut self, ns: u64, stored: bool) {
        self.sets += 1;
        if stored {
            self.stored += 1;
        } else {
            self.not_stored += 1;
        }
        let _ = self.set_hist.record(ns.max(1));
    }

    pub fn record_error(&mut self, op: OpKind, ns: u64) {
        self.errors += 1;
        match op {
            OpKind::Get => {
                self.gets += 1;
                let _ = self.get_hist.record(ns.max(1));
            }
            OpKind::Set => {
                self.sets += 1;
                let _ = self.set_hist.record(ns.max(1));
            }
        }
    }

    /// An operation finished `ns` after it was sent (or, in an open loop, after it was due).
    pub fn record_txn(&mut self, kind: TxnKind, ns: u64) {
        let h = self.txn_hists[kind.index()].get_or_insert_with(new_hist);
        let _ = h.record(ns.max(1));
    }

    /// The latency histogram of one kind of operation, if any finished.
    pub fn txn_hist(&self, kind: TxnKind) -> Option<&Histogram<u64>> {
        self.txn_hists[kind.index()].as_ref()
    }

    /// Fold `other` in (threads of one run, or rounds of one comparison: time adds up).
    pub fn merge(&mut self, other: &LoadStats) {
        for (mine, theirs) in self.txn_hists.iter_mut().zip(&other.txn_hists) {
            if let Some(t) = theirs {
                let _ = mine.get_or_insert_with(new_hist).add(t);
            }
        }
        let _ = self.get_hist.add(&other.get_hist);
        let _ = self.set_hist.add(&other.set_hist);
        self.gets += other.gets;
        self.hits += other.hits;
        self.misses += other.misses;
        self.mismatches += other.mismatches;
        self.sets += other.sets;
        self.stored += other.stored;
        self.not_stored += other.not_stored;
        self.errors += other.errors;
        self.elapsed = self.elapsed.max(other.elapsed);
        self.generator_cpu_s = match (self.generator_cpu_s, other.generator_cpu_s) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }

    /// Finished operations (of every kind).
    pub fn ops(&self) -> u64 {
        self.txn_hists.iter().flatten().map(Histogram::len).sum()
    }

    /// Latency of every operation, all kinds in one histogram.
    pub fn all_hist(&self) -> Histogram<u64> {
        let mut h = new_hist();
        for t in self.txn_hists.iter().flatten() {
            let _ = h.add(t);
        }
        h
    }
}

/// Latency percentile in microseconds (0 for an empty histogram).
pub fn pct_us(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.value_at_quantile(q) as f64 / 1000.0
}

/// CPU time (user + system) a process has used so far, in seconds, from /proc/PID/stat.
#[derive(Debug, Error)]
pub enum CpuError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("unexpected format of {0}")]
    Format(String),
}

/// utime + stime of process `pid` (all its threads), in seconds.
pub fn process_cpu_seconds(pid: u32) -> Result<f64, CpuError> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|source| CpuError::Read {
        path: path.clone(),
        source,
    })?;
    parse_stat_cpu(&text, clock_ticks()).ok_or(CpuError::Format(path))
}

/// Parse utime+stime out of a /proc/PID/stat line. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu(stat: &str, ticks_per_sec: f64) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ')' comes field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_sec)
}

/// USER_HZ: the unit of /proc times. It is 100 on every Linux target we run on, but ask
/// `getconf` once rather than assume.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU seconds of the calling thread (from /proc/thread-self/stat): a load generator thread's
/// own cost, apart from anything else in the process (such as an in-process responder).
pub fn thread_cpu_seconds() -> Result<f64, CpuError> {
    let path = "/proc/thread-self/stat";
    let text = std::fs::read_to_string(path).map_err(|source| CpuError::Read {
        path: path.to_string(),
        source,
    })?;
    parse_stat_cpu(&text, clock_ticks()).ok_or(CpuError::Format(path.to_string()))
}

/// The client's own CPU seconds (to show how much of the machine the load generator took).
pub fn self_cpu_seconds() -> Result<f64, CpuError> {
    process_cpu_seconds(std::process::id())
}

/// One progress line on stderr, once a run has lasted a couple of seconds.
pub struct Progress {
    label: String,
    enabled: bool,
    tty: bool,
    last: Option<Instant>,
    printed: bool,
}

const PROGRESS_AFTER: Duration = Duration::from_secs(2);

impl Progress {
    pub fn new(label: &str, enabled: bool) -> Self {
        Progress {
            label: label.to_string(),
            enabled,
            tty: std::io::stderr().is_terminal(),
            last: None,
            printed: false,
        }
    }

    pub fn tick(&mut self, elapsed: Duration, ops: u64, dur: Option<Duration>, total: Option<u64>) {
        if !self.enabled || elapsed < PROGRESS_AFTER {
            return;
        }
        // A terminal gets a line rewritten every second; a log gets one line per 5 s.
        let every = if self.tty {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(5)
        };
        if self.last.is_some_and(|l| l.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        let rate = ops as f64 / elapsed.as_secs_f64().max(1e-9);
        let goal = match (dur, total) {
            (Some(d), _) => format!("/{:.0}s", d.as_secs_f64()),
            (None, Some(t)) => format!(" ({:.0}% of {t} ops)", 100.0 * ops as f64 / t as f64),
            (None, None) => String::new(),
        };
        let line = format!(
            "[{}] {:.1}s{goal}  {} ops  {}/s",
            self.label,
            elapsed.as_secs_f64(),
            human(ops as f64),
            human(rate)
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line:<78}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        self.printed = true;
    }

    pub fn finish(&mut self) {
        if self.printed && self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// 1234567 -> "1.23M".
pub fn human(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// The summary of one run, as printed and as written to JSON.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    pub server: String,
    pub value_size: usize,
    pub ops: u64,
    pub duration_s: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub get_p99_us: f64,
    pub set_p99_us: f64,
    /// Hits / gets; None when the run had no gets.
    pub hit_ratio: Option<f64>,
    pub gets: u64,
    pub sets: u64,
    pub misses: u64,
    pub mismatches: u64,
    pub errors: u64,
    /// Server CPU (utime+stime) during the run; None if its pid was unknown.
    pub server_cpu_s: Option<f64>,
    pub server_cpu_s_per_mop: Option<f64>,
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the load generator's threads per million ops (its own cost per op,
    /// without anything else in the process).
    pub generator_cpu_s_per_mop: Option<f64>,
    /// Latency by kind of operation (only kinds that ran).
    pub by_kind: Vec<KindSummary>,
}

/// Count and latency percentiles of one kind of operation.
#[derive(Clone, Debug, Serialize)]
pub struct KindSummary {
    pub kind: TxnKind,
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

impl KindSummary {
    pub fn of(s: &LoadStats) -> Vec<KindSummary> {
        TxnKind::ALL
            .iter()
            .filter_map(|&kind| {
                let h = s.txn_hist(kind)?;
                Some(KindSummary {
                    kind,
                    ops: h.len(),
                    p50_us: pct_us(h, 0.50),
                    p99_us: pct_us(h, 0.99),
                    p999_us: pct_us(h, 0.999),
                })
            })
            .collect()
    }
}

impl RunSummary {
    pub fn from_stats(
        server: &str,
        value_size: usize,
        s: &LoadStats,
        server_cpu_s: Option<f64>,
        client_cpu_s: Option<f64>,
    ) -> Self {
        let all = s.all_hist();
        let ops = s.ops();
        let secs = s.elapsed.as_secs_f64();
        RunSummary {
            server: server.to_string(),
            value_size,
            ops,
            duration_s: secs,
            ops_per_sec: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            p50_us: pct_us(&all, 0.50),
            p99_us: pct_us(&all, 0.99),
            p999_us: pct_us(&all, 0.999),
            get_p99_us: pct_us(&s.get_hist, 0.99),
            set_p99_us: pct_us(&s.set_hist, 0.99),
            hit_ratio: (s.gets > 0).then(|| s.hits as f64 / s.gets as f64),
            gets: s.gets,
            sets: s.sets,
            misses: s.misses,
            mismatches: s.mismatches,
            errors: s.errors,
            server_cpu_s,
            server_cpu_s_per_mop: server_cpu_s
                .filter(|_| ops > 0)
                .map(|c| c * 1e6 / ops as f64),
            client_cpu_s,
            generator_cpu_s_per_mop: s
                .generator_cpu_s
                .filter(|_| ops > 0)
                .map(|c| c * 1e6 / ops as f64),
            by_kind: KindSummary::of(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_is_read_after_the_last_parenthesis() {
        // comm "a) b" contains a space and a parenthesis; utime=250 stime=50 ticks.
        let stat = "1234 (a) b) S 1 1 1 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 100";
        assert_eq!(parse_stat_cpu(stat, 100.0), Some(3.0));
        assert_eq!(parse_stat_cpu("garbage", 100.0), None);
    }

    #[test]
    fn own_process_cpu_is_readable() {
        assert!(self_cpu_seconds().is_ok());
    }

    #[test]
    fn merged_stats_add_counts_and_keep_longest_elapsed() {
        let mut a = LoadStats::new();
        a.record_get(1000, Some(true));
        a.record_txn(TxnKind::Get, 1000);
        a.elapsed = Duration::from_secs(2);
        let mut b = LoadStats::new();
        b.record_get(3000, None);
        b.record_txn(TxnKind::Get, 3000);
        b.record_set(2000, true);
        b.record_get(2500, None);
        b.record_txn(TxnKind::ReadModifyWrite, 4500);
        b.elapsed = Duration::from_secs(1);
        a.merge(&b);
        assert_eq!((a.gets, a.hits, a.misses, a.sets), (3, 1, 2, 1));
        assert_eq!(a.ops(), 3);
        assert_eq!(a.all_hist().len(), 3);
        assert_eq!(a.txn_hist(TxnKind::Get).map(|h| h.len()), Some(2));
        assert!(a.txn_hist(TxnKind::Scan).is_none());
        assert_eq!(a.elapsed, Duration::from_secs(2));
    }
}
