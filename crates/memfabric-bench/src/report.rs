//! Plain-text tables and the machine description that goes with every report.

use crate::metrics::{human, RunSummary};
use serde::Serialize;

/// Print `rows` under `headers`, columns padded to their widest cell; the first column is
/// left-aligned, numbers right-aligned.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.len());
            }
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("  {c:>w$}"));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    let rule: String = widths
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                "-".repeat(*w)
            } else {
                format!("  {}", "-".repeat(*w))
            }
        })
        .collect();
    out.push_str(&rule);
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.prec$}"))
}

/// p50, p99 and p99.9 in microseconds, then the hit ratio, as table cells.
pub fn latency_and_hit_cells(r: &RunSummary) -> [String; 4] {
    [
        format!("{:.1}", r.p50_us),
        format!("{:.1}", r.p99_us),
        format!("{:.1}", r.p999_us),
        r.hit_ratio
            .map_or_else(|| "-".into(), |h| format!("{:.2}%", 100.0 * h)),
    ]
}

/// The standard run table (throughput and compare).
pub fn runs_table(runs: &[RunSummary]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let mut row = vec![
                r.server.clone(),
                r.value_size.to_string(),
                human(r.ops as f64),
                format!("{:.1}", r.duration_s),
                human(r.ops_per_sec),
            ];
            row.extend(latency_and_hit_cells(r));
            row.extend([
                format!("{}", r.errors + r.mismatches),
                opt(r.server_cpu_s, 2),
                opt(r.server_cpu_s_per_mop, 2),
                opt(r.client_cpu_s, 2),
            ]);
            row
        })
        .collect();
    table(
        &[
            "server",
            "value",
            "ops",
            "secs",
            "ops/s",
            "p50us",
            "p99us",
            "p99.9us",
            "hit",
            "err",
            "srv_cpu_s",
            "cpu_s/Mop",
            "cli_cpu_s",
        ],
        &rows,
    )
}

/// Latency by kind of operation, one row per (run, kind).
pub fn kinds_table(runs: &[RunSummary]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .flat_map(|r| {
            r.by_kind.iter().map(move |k| {
                vec![
                    r.server.clone(),
                    k.kind.name().to_string(),
                    human(k.ops as f64),
                    format!("{:.1}", k.p50_us),
                    format!("{:.1}", k.p99_us),
                    format!("{:.1}", k.p999_us),
                ]
            })
        })
        .collect();
    table(&["server", "op", "ops", "p50us", "p99us", "p99.9us"], &rows)
}

/// Where the numbers were taken.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_gib: f64,
    pub kernel: String,
    pub loadavg: String,
}

impl Machine {
    pub fn describe() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let loadavg = std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        Machine {
            cpu_model,
            cpus,
            mem_gib: mem_kib / (1024.0 * 1024.0),
            kernel,
            loadavg,
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{} x {} | {:.0} GiB | Linux {} | loadavg {}",
            self.cpus, self.cpu_model, self.mem_gib, self.kernel, self.loadavg
        )
    }
}

/// This machine's CPU time so far, from `/proc/stat`'s `cpu` line (in clock ticks): the
/// whole and the part a hypervisor gave to other guests ("steal").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: u64,
    pub steal: u64,
}

impl CpuTimes {
    pub fn now() -> Option<CpuTimes> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; guest time
    /// is already counted in user and nice.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        (fields.len() == 8).then(|| CpuTimes {
            total: fields.iter().sum(),
            steal: fields[7],
        })
    }

    /// The share of the CPU time since `earlier` that the hypervisor took away (0..1): how
    /// contended the host was while something was measured.
    pub fn steal_share_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        (total > 0).then(|| steal as f64 / total as f64)
    }

    /// The steal share from `start` (taken with [`CpuTimes::now`]) until now.
    pub fn steal_share_until_now(start: Option<CpuTimes>) -> Option<f64> {
        start
            .zip(CpuTimes::now())
            .and_then(|(start, end)| end.steal_share_since(&start))
    }
}

/// The terminal line that reports a run's steal share.
pub fn steal_line(share: f64) -> String {
    format!(
        "host contention: the hypervisor took {:.1}% of this machine's CPU time during the run (steal)",
        100.0 * share
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steal_is_the_eighth_field_of_the_cpu_line() {
        let before =
            CpuTimes::parse("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
                .unwrap();
        assert_eq!(
            before,
            CpuTimes {
                total: 1000,
                steal: 35
            }
        );
        let after = CpuTimes::parse("cpu  200 0 100 1500 10 0 5 185 0 0\n").unwrap();
        assert_eq!(after.steal_share_since(&before), Some(0.15));
        assert_eq!(before.steal_share_since(&after), None);
        assert_eq!(before.steal_share_since(&before), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 3\n"), None);
        assert_eq!(CpuTimes::parse("intr 5\n"), None);
    }

    #[test]
    fn table_aligns_columns_to_widest_cell() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "a    bb");
        assert_eq!(lines[1], "---  --");
        assert_eq!(lines[2], "xyz   1");
    }
}
