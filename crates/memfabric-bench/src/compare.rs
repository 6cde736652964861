//! `compare`: memcached and memfabricd, same flags, same load, in one run; ratios.
//!
//! Both servers stay up for the whole comparison. Each value size is preloaded on both, then
//! measured in `rounds` rounds; the order alternates every round (A B, B A, ...) so slow
//! drifts of a shared machine (another job's build starting) hit both servers alike.
//! Rounds are summed into one result per server and size; per-round throughput ratios are
//! kept to show how noisy the run was.

use crate::load::{self, LoadConfig, LoadError};
use crate::metrics::{self, LoadStats, RunSummary};
use crate::server::{ServerError, ServerProcess, ServerSpec};
use crate::transport::TcpConnector;
use hdrhistogram::Histogram;
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompareError {
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("{server}: {source}")]
    Load { server: String, source: LoadError },
}

#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// The reference (memcached).
    pub base: ServerSpec,
    /// The candidate (memfabricd).
    pub cand: ServerSpec,
    /// Load template; value_size is set per size.
    pub load: LoadConfig,
    pub value_sizes: Vec<usize>,
    pub rounds: usize,
    pub preload: bool,
}

/// Candidate / reference for one value size.
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    pub value_size: usize,
    /// > 1 means the candidate did more ops/s.
    pub throughput: f64,
    /// < 1 means the candidate's p99 is lower.
    pub p99: f64,
    /// < 1 means the candidate used less server CPU per million ops.
    pub cpu_per_mop: Option<f64>,
    /// Throughput ratio of each round, to judge the noise.
    pub throughput_by_round: Vec<f64>,
    /// p99 ratio of each round.
    pub p99_by_round: Vec<f64>,
    /// Medians of the per-round ratios: robust to one round disturbed by another job.
    pub median_throughput: f64,
    pub median_p99: f64,
    pub meets_target: Verdict,
}

/// The acceptance target: throughput >= 1.0x, p99 <= 1.1x, CPU per Mop <= 1.0x.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub throughput: bool,
    pub p99: bool,
    pub cpu_per_mop: bool,
}

impl Verdict {
    pub fn all(&self) -> bool {
        self.throughput && self.p99 && self.cpu_per_mop
    }
}

pub struct CompareResult {
    /// Every (round, server, size) run, in execution order.
    pub rounds: Vec<(usize, RunSummary)>,
    /// Summed over rounds: base then candidate, per size.
    pub totals: Vec<RunSummary>,
    pub ratios: Vec<Ratios>,
    /// Merged latency histograms per total (same order as `totals`), for plots.
    pub hists: Vec<Histogram<u64>>,
    pub base_addr: String,
    pub cand_addr: String,
}

fn measure(
    srv: &ServerProcess,
    cfg: &LoadConfig,
) -> Result<(LoadStats, Option<f64>, Option<f64>), CompareError> {
    let cpu0 = metrics::process_cpu_seconds(srv.pid()).ok();
    let cli0 = metrics::self_cpu_seconds().ok();
    let stats =
        load::run(&TcpConnector { addr: srv.addr }, cfg).map_err(|source| CompareError::Load {
            server: srv.name.clone(),
            source,
        })?;
    let cpu1 = metrics::process_cpu_seconds(srv.pid()).ok();
    let cli1 = metrics::self_cpu_seconds().ok();
    let d = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
    Ok((stats, d(cpu0, cpu1), d(cli0, cli1)))
}

fn ratio(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        b / a
    } else {
        f64::NAN
    }
}

/// Median (mean of the middle two for an even count); NaN for none.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub fn run(cfg: &CompareConfig) -> Result<CompareResult, CompareError> {
    let base = cfg.base.start()?;
    let cand = cfg.cand.start()?;
    let servers = [&base, &cand];
    let mut rounds = Vec::new();
    let mut totals = Vec::new();
    let mut ratios = Vec::new();
    let mut hists = Vec::new();
    for &size in &cfg.value_sizes {
        if cfg.preload {
            for srv in servers {
                load::preload(
                    &TcpConnector { addr: srv.addr },
                    &cfg.load.keys,
                    size,
                    8,
                    32,
                )
                .map_err(|source| CompareError::Load {
                    server: srv.name.clone(),
                    source,
                })?;
            }
        }
        let mut agg = [LoadStats::new(), LoadStats::new()];
        let mut elapsed = [0f64; 2];
        let mut cpu: [Option<f64>; 2] = [Some(0.0), Some(0.0)];
        let mut cli: [Option<f64>; 2] = [Some(0.0), Some(0.0)];
        let mut per_round_tput = Vec::new();
        let mut per_round_p99 = Vec::new();
        for r in 0..cfg.rounds.max(1) {
            let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            let mut tput = [0f64; 2];
            let mut p99 = [0f64; 2];
            for i in order {
                let srv = servers[i];
                let mut lc = cfg.load.clone();
                lc.value_size = size;
                lc.label = format!("{} {}B r{}", srv.name, size, r + 1);
                lc.seed = cfg.load.seed.wrapping_add(r as u64);
                let (stats, c, k) = measure(srv, &lc)?;
                let summary = RunSummary::from_stats(&srv.name, size, &stats, c, k);
                tput[i] = summary.ops_per_sec;
                p99[i] = summary.p99_us;
                rounds.push((r + 1, summary));
                elapsed[i] += stats.elapsed.as_secs_f64();
                cpu[i] = cpu[i].zip(c).map(|(a, b)| a + b);
                cli[i] = cli[i].zip(k).map(|(a, b)| a + b);
                agg[i].merge(&stats);
            }
            per_round_tput.push(ratio(tput[0], tput[1]));
            per_round_p99.push(ratio(p99[0], p99[1]));
        }
        let mut sums = Vec::new();
        for i in 0..2 {
            agg[i].elapsed = std::time::Duration::from_secs_f64(elapsed[i]);
            hists.push(agg[i].all_hist());
            sums.push(RunSummary::from_stats(
                &servers[i].name,
                size,
                &agg[i],
                cpu[i],
                cli[i],
            ));
        }
        let (a, b) = (&sums[0], &sums[1]);
        let throughput = ratio(a.ops_per_sec, b.ops_per_sec);
        let p99 = ratio(a.p99_us, b.p99_us);
        let cpu_per_mop = a
            .server_cpu_s_per_mop
            .zip(b.server_cpu_s_per_mop)
            .map(|(x, y)| ratio(x, y));
        ratios.push(Ratios {
            value_size: size,
            throughput,
            p99,
            cpu_per_mop,
            median_throughput: median(&per_round_tput),
            median_p99: median(&per_round_p99),
            throughput_by_round: per_round_tput,
            p99_by_round: per_round_p99,
            meets_target: Verdict {
                throughput: throughput >= 1.0,
                p99: p99 <= 1.1,
                cpu_per_mop: cpu_per_mop.is_some_and(|c| c <= 1.0),
            },
        });
        totals.extend(sums);
    }
    Ok(CompareResult {
        rounds,
        totals,
        ratios,
        hists,
        base_addr: base.addr.to_string(),
        cand_addr: cand.addr.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
