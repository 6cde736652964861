//! `memfabric-bench resilience`: what replication and erasure coding cost and buy, on
//! servers this run starts (issue 12's benchmarks):
//!
//! - **memory**: server-reported bytes (`stats` `bytes`, summed over the servers) per
//!   logical byte written, for an RS(k,m) pool and an (r+1)-way replicated pool;
//! - **latency**: SET and GET p50/p99 of both pools per value size and transport, the
//!   crossover size from which erasure coding is not slower, and the share of an EC SET
//!   spent encoding;
//! - **pipelining**: EC SETs with a window of requests outstanding against blocking ones;
//! - **degraded reads**: EC GET p99 with `m` servers killed against the healthy p99.
//!
//! Everything goes through `memfabric_client`, the library users have.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use memfabric_client::{Client, Config, EcGeometry, WritePolicy};
use serde::Serialize;

use crate::metrics::{pct_us, Progress};
use crate::server::{ServerError, ServerProcess, ServerSpec};
use memfabric_cluster::{Cluster, ClusterConfig, LinkRate};

/// One pool shape under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PoolKind {
    /// RS(k, m) for every measured value.
    Ec,
    /// `replicas + 1` copies.
    Replicated,
}

impl PoolKind {
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Ec => "ec",
            PoolKind::Replicated => "replicated",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ResilienceConfig {
    pub servers: usize,
    pub ec: EcGeometry,
    pub replicas: u8,
    pub policy: WritePolicy,
    /// "tcp" and/or "ucx".
    pub transports: Vec<String>,
    pub sizes: Vec<usize>,
    pub memory_sizes: Vec<usize>,
    /// Measured operations per (pool, transport, op, size); fewer for large values (at
    /// most `bytes_per_point` bytes each).
    pub iterations: u64,
    pub bytes_per_point: u64,
    /// Outstanding requests of the pipelined EC SETs.
    pub window: usize,
    pub progress: bool,
    /// The EC pool's `ec_threshold` (1: every value coded).
    pub ec_threshold: usize,
    pub randomize_reads: bool,
}

#[derive(Debug, Serialize)]
pub struct MemoryRow {
    pub pool: PoolKind,
    pub value_size: usize,
    pub values: u64,
    pub logical_bytes: u64,
    pub server_bytes: u64,
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
pub struct LatencyRow {
    pub transport: String,
    pub pool: PoolKind,
    pub op: &'static str,
    pub value_size: usize,
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// EC SETs: the share of the SET's mean time spent encoding.
    pub encode_share: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Crossover {
    pub transport: String,
    pub op: &'static str,
    /// The smallest measured size from which the EC p50 is at most the replicated p50 at
    /// every larger measured size (None: never).
    pub from_size: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct PipelineRow {
    pub transport: String,
    pub pool: PoolKind,
    pub value_size: usize,
    pub blocking_ops_per_s: f64,
    pub pipelined_ops_per_s: f64,
    pub window: usize,
    pub speedup: f64,
}

/// EC GET p99 with `killed` servers down against the healthy p99, measured in rounds
/// (each: healthy, kill, degraded, restart) because one p99 of a few thousand GETs on a
/// shared machine moves 2-5x between runs. The p99s and the ratio are the median round's
/// (by ratio; the lower middle one of an even count); `round_ratios` are every round's.
#[derive(Debug, Serialize)]
pub struct DegradedRow {
    pub transport: String,
    pub value_size: usize,
    pub healthy_p99_us: f64,
    pub degraded_p99_us: f64,
    pub killed: usize,
    pub ratio: f64,
    pub round_ratios: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct ResilienceReport {
    pub servers: usize,
    /// Each server's link rate, each way (`None`: loopback, unshaped).
    pub link_rate: Option<String>,
    /// The share of the machine's CPU time its hypervisor took during the run (steal).
    pub steal_share: Option<f64>,
    pub ec: String,
    pub replicas: u8,
    pub policy: String,
    pub memory: Vec<MemoryRow>,
    pub latency: Vec<LatencyRow>,
    pub crossovers: Vec<Crossover>,
    pub pipeline: Vec<PipelineRow>,
    pub degraded: Vec<DegradedRow>,
}

/// The servers of a run: memfabricd on loopback, or each in a network namespace behind
/// a link of its own shaped to a rate (`memfabric_cluster`); with a UCX port each when
/// UCX is measured.
pub struct Fleet {
    servers: Servers,
}

enum Servers {
    /// The processes, and how to start one again (`Fleet::revive`).
    Loopback {
        procs: Vec<(ServerProcess, Option<u16>)>,
        spec: ServerSpec,
        ucx: bool,
    },
    Shaped(Cluster),
}

/// The UCX port of the servers of a shaped fleet (each has its own address).
const SHAPED_UCX_PORT: u16 = 11311;

impl Fleet {
    pub fn start(spec: &ServerSpec, n: usize, ucx: bool) -> Result<Fleet, ServerError> {
        let mut procs = Vec::new();
        for _ in 0..n {
            procs.push(Self::start_one(spec, ucx)?);
        }
        Ok(Fleet {
            servers: Servers::Loopback {
                procs,
                spec: spec.clone(),
                ucx,
            },
        })
    }

    /// `n` servers, each in its own network namespace behind a veth pair shaped to
    /// `rate` each way: transfers to different servers overlap, transfers to one queue
    /// behind each other, as with servers on separate hosts.
    pub fn start_shaped(
        spec: &ServerSpec,
        n: usize,
        ucx: bool,
        rate: LinkRate,
    ) -> Result<Fleet, memfabric_cluster::Error> {
        let mut args = vec![
            "-t".to_string(),
            spec.threads.to_string(),
            "-m".into(),
            spec.memory_mb.to_string(),
        ];
        args.extend(spec.extra_args.iter().cloned());
        let cluster = Cluster::start(ClusterConfig {
            servers: n,
            memfabricd: Some(spec.path.clone()),
            ucx_port: ucx.then_some(SHAPED_UCX_PORT),
            args,
            link_rate: Some(rate),
            ..ClusterConfig::default()
        })?;
        Ok(Fleet {
            servers: Servers::Shaped(cluster),
        })
    }

    fn start_one(
        spec: &ServerSpec,
        ucx: bool,
    ) -> Result<(ServerProcess, Option<u16>), ServerError> {
        if ucx {
            let proc = spec.start_with_ucx_port()?;
            let port = proc.ucx_port;
            return Ok((proc, port));
        }
        let mut spec = spec.clone();
        spec.extra_args.extend(["--ucx-port".into(), "0".into()]);
        Ok((spec.start()?, None))
    }

    pub fn len(&self) -> usize {
        match &self.servers {
            Servers::Loopback { procs, .. } => procs.len(),
            Servers::Shaped(c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pool's server list for `transport` ("tcp" or "ucx").
    pub fn list(&self, transport: &str) -> String {
        let addrs: Vec<String> = match &self.servers {
            Servers::Loopback { procs, .. } => procs
                .iter()
                .map(|(p, ucx)| match (transport, ucx) {
                    ("ucx", Some(port)) => format!("ucx://127.0.0.1:{port}"),
                    _ => p.addr.to_string(),
                })
                .collect(),
            Servers::Shaped(c) => (0..c.len())
                .map(|i| match (transport, c.ucx_addr(i)) {
                    ("ucx", Some(a)) => format!("ucx://{a}"),
                    _ => c.addr(i).to_string(),
                })
                .collect(),
        };
        addrs.join(",")
    }

    /// Kills server `i` (SIGKILL; it stays down until `revive`).
    pub fn kill(&mut self, i: usize) {
        match &mut self.servers {
            Servers::Loopback { procs, .. } => procs[i].0.stop(),
            Servers::Shaped(c) => {
                let _ = c.kill(i);
            }
        }
    }

    /// Starts server `i` again, empty. On loopback it gets new ports (a pool made from
    /// `list` afterwards finds it); in a namespace it keeps its address.
    pub fn revive(&mut self, i: usize) -> Fallible<()> {
        match &mut self.servers {
            Servers::Loopback { procs, spec, ucx } => {
                procs[i] = Self::start_one(spec, *ucx)?;
            }
            Servers::Shaped(c) => c.restart(i)?,
        }
        Ok(())
    }

    /// `bytes` from every server's `stats`, summed.
    pub fn stored_bytes(&self) -> u64 {
        let list = self.list("tcp");
        let Ok(mut c) = Client::new(list.as_str(), Config::default()) else {
            return 0;
        };
        c.stats(None)
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter_map(|s| {
                s.into_iter()
                    .find(|(k, _)| k == "bytes")
                    .and_then(|(_, v)| v.parse::<u64>().ok())
            })
            .sum()
    }
}

fn pool_config(cfg: &ResilienceConfig, kind: PoolKind) -> Config {
    let t = Duration::from_secs(2);
    let base = Config {
        timeout: t,
        connect_timeout: t,
        retry_timeout: Duration::from_secs(1),
        write_policy: cfg.policy,
        randomize_reads: cfg.randomize_reads,
        ..Config::default()
    };
    match kind {
        PoolKind::Ec => Config {
            ec: Some(cfg.ec),
            ec_threshold: cfg.ec_threshold.max(1),
            ..base
        },
        PoolKind::Replicated => Config {
            replicas: cfg.replicas,
            ..base
        },
    }
}

fn payload(size: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    Bytes::from(
        (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

/// Memory: write `values` of each size through each pool, compare the servers' `bytes`
/// before and after.
pub fn memory(cfg: &ResilienceConfig, fleet: &Fleet) -> Fallible<Vec<MemoryRow>> {
    let mut rows = Vec::new();
    let mut progress = Progress::new("memory", cfg.progress);
    let started = Instant::now();
    let mut done = 0u64;
    for &size in &cfg.memory_sizes {
        for kind in [PoolKind::Ec, PoolKind::Replicated] {
            let mut c = Client::new(fleet.list("tcp").as_str(), pool_config(cfg, kind))?;
            let values = (cfg.bytes_per_point / size.max(1) as u64).clamp(50, 2000);
            let before = fleet.stored_bytes();
            let value = payload(size, size as u64);
            for i in 0..values {
                let key = format!("mem:{}:{size}:{i}", kind.name());
                c.set(key.as_bytes(), &value, 0, 0)?;
                done += 1;
                progress.tick(started.elapsed(), done, None, None);
            }
            // Let the background copies of quorum writes land before counting.
            let _ = c.get(b"mem:drain");
            std::thread::sleep(Duration::from_millis(200));
            let _ = c.get(b"mem:drain");
            let after = fleet.stored_bytes();
            let logical = values * size as u64;
            let server = after.saturating_sub(before);
            rows.push(MemoryRow {
                pool: kind,
                value_size: size,
                values,
                logical_bytes: logical,
                server_bytes: server,
                ratio: server as f64 / logical.max(1) as f64,
            });
        }
    }
    progress.finish();
    Ok(rows)
}

/// Operations per point: `iterations`, fewer for large values (at most `bytes_per_point`
/// bytes, but 50 operations when `iterations` allows that many), never none.
fn iterations_for(cfg: &ResilienceConfig, size: usize) -> u64 {
    (cfg.bytes_per_point / size.max(1) as u64)
        .max(50)
        .min(cfg.iterations)
        .max(1)
}

/// Latency of blocking SETs then GETs of each size through each pool and transport.
pub fn latency(cfg: &ResilienceConfig, fleet: &Fleet) -> Fallible<Vec<LatencyRow>> {
    let mut rows = Vec::new();
    let mut progress = Progress::new("latency", cfg.progress);
    let started = Instant::now();
    let mut done = 0u64;
    for transport in &cfg.transports {
        for &size in &cfg.sizes {
            for kind in [PoolKind::Ec, PoolKind::Replicated] {
                let mut c = Client::new(fleet.list(transport).as_str(), pool_config(cfg, kind))?;
                let n = iterations_for(cfg, size);
                let keys: Vec<Vec<u8>> = (0..64)
                    .map(|i| format!("lat:{}:{size}:{i}", kind.name()).into_bytes())
                    .collect();
                let value = payload(size, 7);
                // Warm up: connections, and every key written once.
                for k in &keys {
                    c.set(k, &value, 0, 0)?;
                }
                let encode_before = c.pool_counters().encode_ns;
                let (mut set_h, mut get_h) = (hist(), hist());
                let mut set_total = 0u64;
                for i in 0..n {
                    let k = &keys[(i % keys.len() as u64) as usize];
                    let t = Instant::now();
                    c.set(k, &value, 0, 0)?;
                    let ns = t.elapsed().as_nanos() as u64;
                    set_total += ns;
                    let _ = set_h.record(ns.max(1));
                    done += 1;
                    progress.tick(started.elapsed(), done, None, None);
                }
                let encode_ns = c.pool_counters().encode_ns - encode_before;
                for i in 0..n {
                    let k = &keys[(i % keys.len() as u64) as usize];
                    let t = Instant::now();
                    let v = c.get(k)?;
                    let ns = t.elapsed().as_nanos() as u64;
                    match v {
                        Some(v) if v.data.len() == size => {}
                        other => {
                            return Err(format!(
                                "{transport} {} GET of a {size}-byte value: {:?}",
                                kind.name(),
                                other.map(|v| v.data.len())
                            )
                            .into())
                        }
                    }
                    let _ = get_h.record(ns.max(1));
                    done += 1;
                    progress.tick(started.elapsed(), done, None, None);
                }
                for (op, h) in [("set", &set_h), ("get", &get_h)] {
                    rows.push(LatencyRow {
                        transport: transport.clone(),
                        pool: kind,
                        op,
                        value_size: size,
                        ops: n,
                        p50_us: pct_us(h, 0.5),
                        p99_us: pct_us(h, 0.99),
                        encode_share: (op == "set" && kind == PoolKind::Ec)
                            .then(|| encode_ns as f64 / set_total.max(1) as f64),
                    });
                }
            }
        }
    }
    progress.finish();
    Ok(rows)
}

/// From which size on EC is not slower than replication (p50), per transport and op.
pub fn crossovers(rows: &[LatencyRow], transports: &[String]) -> Vec<Crossover> {
    let mut out = Vec::new();
    for t in transports {
        for op in ["set", "get"] {
            let p50 = |kind: PoolKind, size: usize| {
                rows.iter()
                    .find(|r| {
                        &r.transport == t && r.op == op && r.pool == kind && r.value_size == size
                    })
                    .map(|r| r.p50_us)
            };
            let mut sizes: Vec<usize> = rows
                .iter()
                .filter(|r| &r.transport == t && r.op == op)
                .map(|r| r.value_size)
                .collect();
            sizes.sort_unstable();
            sizes.dedup();
            let mut from = None;
            for &s in sizes.iter().rev() {
                match (p50(PoolKind::Ec, s), p50(PoolKind::Replicated, s)) {
                    (Some(e), Some(r)) if e <= r => from = Some(s),
                    _ => break,
                }
            }
            out.push(Crossover {
                transport: t.clone(),
                op,
                from_size: from,
            });
        }
    }
    out
}

/// SETs one at a time against `window` outstanding (iset + wait_all), for both pools.
pub fn pipeline(cfg: &ResilienceConfig, fleet: &Fleet, size: usize) -> Fallible<Vec<PipelineRow>> {
    let mut rows = Vec::new();
    for transport in &cfg.transports {
        for kind in [PoolKind::Ec, PoolKind::Replicated] {
            let mut c = Client::new(fleet.list(transport).as_str(), pool_config(cfg, kind))?;
            let n = iterations_for(cfg, size).max(cfg.window as u64 * 4);
            let value = payload(size, 11);
            let keys: Vec<Vec<u8>> = (0..256)
                .map(|i| format!("pipe:{}:{size}:{i}", kind.name()).into_bytes())
                .collect();
            for k in &keys {
                c.set(k, &value, 0, 0)?;
            }
            let t = Instant::now();
            for i in 0..n {
                c.set(&keys[(i % 256) as usize], &value, 0, 0)?;
            }
            let blocking = n as f64 / t.elapsed().as_secs_f64();
            let t = Instant::now();
            let mut i = 0u64;
            while i < n {
                let hs: Vec<_> = (0..cfg.window as u64)
                    .take_while(|j| i + j < n)
                    .map(|j| c.iset(&keys[((i + j) % 256) as usize], value.clone(), 0, 0))
                    .collect();
                i += hs.len() as u64;
                for r in c.wait_all(&hs, Duration::from_secs(30)) {
                    r?;
                }
            }
            let pipelined = n as f64 / t.elapsed().as_secs_f64();
            rows.push(PipelineRow {
                transport: transport.clone(),
                pool: kind,
                value_size: size,
                blocking_ops_per_s: blocking,
                pipelined_ops_per_s: pipelined,
                window: cfg.window,
                speedup: pipelined / blocking.max(1e-9),
            });
        }
    }
    Ok(rows)
}

/// EC GET p99, healthy and then with `m` servers killed, in `rounds` rounds: the killed
/// servers are started again (empty) between rounds and every key is written anew.
pub fn degraded(
    cfg: &ResilienceConfig,
    fleet: &mut Fleet,
    size: usize,
    rounds: usize,
) -> Fallible<Vec<DegradedRow>> {
    let n = iterations_for(cfg, size);
    let keys: Vec<Vec<u8>> = (0..256)
        .map(|i| format!("deg:{size}:{i}").into_bytes())
        .collect();
    let value = payload(size, 13);
    let killed = usize::from(cfg.ec.m);
    // Spread over the ring: the first and the middle server (for m = 2).
    let victims: Vec<usize> = (0..killed)
        .map(|i| i * fleet.len() / killed.max(1))
        .collect();
    // Per transport: (healthy, degraded) p99 of each round.
    let mut measured: Vec<Vec<(f64, f64)>> = vec![Vec::new(); cfg.transports.len()];
    for round in 0..rounds.max(1) {
        let mut healthy = Vec::new();
        for transport in &cfg.transports {
            let mut c = Client::new(
                fleet.list(transport).as_str(),
                pool_config(cfg, PoolKind::Ec),
            )?;
            for k in &keys {
                c.set(k, &value, 0, 0)?;
            }
            healthy.push(get_p99(&mut c, &keys, n, size)?);
        }
        for &v in &victims {
            fleet.kill(v);
        }
        for (t, transport) in cfg.transports.iter().enumerate() {
            let mut c = Client::new(
                fleet.list(transport).as_str(),
                pool_config(cfg, PoolKind::Ec),
            )?;
            // Let the pool learn which servers are down (their first failures are not
            // part of a steady degraded state).
            for k in keys.iter().take(32) {
                let _ = c.get(k);
            }
            measured[t].push((healthy[t], get_p99(&mut c, &keys, n, size)?));
        }
        if round + 1 < rounds {
            for &v in &victims {
                fleet.revive(v)?;
            }
        }
    }
    Ok(cfg
        .transports
        .iter()
        .zip(measured)
        .map(|(transport, rounds)| {
            let round_ratios: Vec<f64> = rounds.iter().map(|(h, d)| d / h.max(1e-9)).collect();
            let (healthy, degraded) = rounds[median_index(&round_ratios)];
            DegradedRow {
                transport: transport.clone(),
                value_size: size,
                healthy_p99_us: healthy,
                degraded_p99_us: degraded,
                killed,
                ratio: degraded / healthy.max(1e-9),
                round_ratios,
            }
        })
        .collect())
}

/// The index of the median of `values` (the lower middle one of an even count).
fn median_index(values: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    order[(values.len().max(1) - 1) / 2]
}

fn get_p99(c: &mut Client, keys: &[Vec<u8>], n: u64, size: usize) -> Fallible<f64> {
    let mut h = hist();
    for i in 0..n {
        let k = &keys[(i % keys.len() as u64) as usize];
        let t = Instant::now();
        let v = c.get(k)?;
        let ns = t.elapsed().as_nanos() as u64;
        if v.map(|v| v.data.len()) != Some(size) {
            return Err(format!(
                "GET of {} did not return its {size} bytes",
                String::from_utf8_lossy(k)
            )
            .into());
        }
        let _ = h.record(ns.max(1));
    }
    Ok(pct_us(&h, 0.99))
}

#[cfg(test)]
mod tests {
    use super::median_index;

    #[test]
    fn the_median_round_is_the_middle_one_or_the_lower_middle_one() {
        assert_eq!(median_index(&[3.0, 1.0, 2.0]), 2);
        assert_eq!(median_index(&[4.0, 1.0, 3.0, 2.0]), 3);
        assert_eq!(median_index(&[7.5]), 0);
    }
}
