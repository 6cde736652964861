//! The closed-loop load generator: N client threads, each driving M connections with up to
//! `depth` requests in flight per connection. A new request is issued only when a reply
//! comes back, so the offered load adapts to the server (closed loop), and the run ends by
//! itself on an op count and/or a deadline.

use crate::metrics::{LoadStats, Progress};
use crate::rng::Rng;
use crate::textproto::{Reply, Request};
use crate::transport::{Connector, Transport, TransportError};
use crate::workload::{
    KeyChooser, KeyDist, KeySpace, OpKind, OpMix, OpSequence, Pattern, ValueMaker, WorkloadError,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a run failed.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("server sent a reply nobody asked for on connection {0}")]
    UnsolicitedReply(usize),
    #[error("reply of the wrong kind for a {op:?} on connection {conn}")]
    WrongReplyKind { op: OpKind, conn: usize },
    #[error("no reply for {0:?} with requests in flight: server stalled")]
    Stalled(Duration),
    #[error("preload: {failed} of {total} sets were not stored (first reply: {first})")]
    PreloadFailed {
        failed: u64,
        total: u64,
        first: String,
    },
    #[error("invalid load configuration: {0}")]
    Config(&'static str),
    #[error("a client thread panicked")]
    ThreadPanicked,
}

/// One run's parameters.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub threads: usize,
    pub conns_per_thread: usize,
    /// Requests in flight per connection (1 = no pipelining).
    pub depth: usize,
    /// Stop after this many operations (over all threads)...
    pub ops: Option<u64>,
    /// ...and/or after this long.
    pub duration: Option<Duration>,
    pub keys: KeySpace,
    pub dist: KeyDist,
    /// The get:set mix of [`Pattern::Mix`].
    pub mix: OpMix,
    /// The order of operations.
    pub pattern: Pattern,
    pub value_size: usize,
    pub seed: u64,
    /// Print a progress line on stderr for runs longer than a couple of seconds.
    pub progress: bool,
    pub label: String,
}

/// How long the loop waits without any reply before calling the server stalled.
const STALL: Duration = Duration::from_secs(10);
/// Granularity of the deadline check and of progress reports.
const TICK: Duration = Duration::from_millis(50);

impl LoadConfig {
    fn validate(&self) -> Result<(), LoadError> {
        if self.threads == 0 || self.conns_per_thread == 0 || self.depth == 0 {
            return Err(LoadError::Config("threads, conns and depth must be >= 1"));
        }
        if self.ops.is_none() && self.duration.is_none() {
            return Err(LoadError::Config("give an op count or a duration"));
        }
        if self.keys.n == 0 {
            return Err(LoadError::Workload(WorkloadError::EmptyKeySpace));
        }
        Ok(())
    }
}

struct Pending {
    start: Instant,
    op: OpKind,
    key: u64,
}

/// Run the load; returns merged statistics of all threads.
pub fn run(connector: &dyn Connector, cfg: &LoadConfig) -> Result<LoadStats, LoadError> {
    cfg.validate()?;
    let chooser = KeyChooser::new(cfg.keys.n, cfg.dist)?;
    let values = ValueMaker::new(cfg.value_size);
    let stop = AtomicBool::new(false);
    let done_ops = AtomicU64::new(0);
    let finished = AtomicUsize::new(0);
    let barrier = Barrier::new(cfg.threads + 1);
    let budgets = split_budget(cfg.ops, cfg.threads);

    let results = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..cfg.threads {
            let shared = Worker {
                cfg,
                chooser: &chooser,
                values: &values,
                stop: &stop,
                done_ops: &done_ops,
                budget: budgets.get(t).copied().flatten(),
                seed: cfg.seed.wrapping_add(t as u64 * 0x1000_0000_0001),
            };
            let barrier = &barrier;
            let finished = &finished;
            handles.push(s.spawn(move || {
                // Connect in this thread: a UCX transport must stay in the thread that made it.
                let tr = connector.connect(cfg.conns_per_thread);
                barrier.wait();
                let r = match tr {
                    Ok(mut tr) => shared.drive(tr.as_mut()),
                    Err(e) => Err(e.into()),
                };
                finished.fetch_add(1, Ordering::Release);
                // An erroring thread stops the others: a partial result is not a result.
                if r.is_err() {
                    shared.stop.store(true, Ordering::Release);
                }
                r
            }));
        }
        barrier.wait();
        let start = Instant::now();
        let mut progress = Progress::new(&cfg.label, cfg.progress);
        while finished.load(Ordering::Acquire) < cfg.threads {
            std::thread::sleep(TICK);
            let elapsed = start.elapsed();
            if cfg.duration.is_some_and(|d| elapsed >= d) {
                stop.store(true, Ordering::Release);
            }
            progress.tick(
                elapsed,
                done_ops.load(Ordering::Relaxed),
                cfg.duration,
                cfg.ops,
            );
        }
        progress.finish();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(LoadError::ThreadPanicked)))
            .collect::<Vec<_>>()
    });

    let mut total = LoadStats::new();
    for r in results {
        total.merge(&r?);
    }
    Ok(total)
}

/// Share `ops` between `threads`; the first ones take the remainder.
fn split_budget(ops: Option<u64>, threads: usize) -> Vec<Option<u64>> {
    let t = threads.max(1) as u64;
    (0..t)
        .map(|i| ops.map(|o| o / t + u64::from(i < o % t)))
        .collect()
}

struct Worker<'a> {
    cfg: &'a LoadConfig,
    chooser: &'a KeyChooser,
    values: &'a ValueMaker,
    stop: &'a AtomicBool,
    done_ops: &'a AtomicU64,
    budget: Option<u64>,
    seed: u64,
}

impl Worker<'_> {
    fn drive(&self, tr: &mut dyn Transport) -> Result<LoadStats, LoadError> {
        let conns = tr.connections();
        let mut rng = Rng::new(self.seed);
        let mut ops = OpSequence::new(self.cfg.pattern, self.cfg.mix);
        let mut stats = LoadStats::new();
        let mut pending: Vec<VecDeque<Pending>> = (0..conns)
            .map(|_| VecDeque::with_capacity(self.cfg.depth))
            .collect();
        let mut in_flight = 0usize;
        let mut issued = 0u64;
        let mut key_buf = Vec::with_capacity(64);
        let mut val_buf = Vec::with_capacity(self.values.size());
        let mut check_buf = Vec::with_capacity(64);
        let mut ready: Vec<usize> = Vec::with_capacity(conns * self.cfg.depth);
        let mut fault: Option<LoadError> = None;
        let mut unreported = 0u64;

        let start = Instant::now();
        for c in 0..conns {
            for _ in 0..self.cfg.depth {
                ready.push(c);
            }
        }
        let mut last_reply = Instant::now();
        loop {
            let may_issue = !self.stop.load(Ordering::Relaxed)
                && match self.budget {
                    Some(b) => issued < b,
                    None => true,
                };
            if may_issue {
                for &c in &ready {
                    if self.budget.is_some_and(|b| issued >= b) {
                        break;
                    }
                    let op = ops.next(&mut rng);
                    let key = self.chooser.next(&mut rng);
                    key_buf.clear();
                    self.cfg.keys.write_key(key, &mut key_buf);
                    let req = match op {
                        OpKind::Get => Request::Get { key: &key_buf },
                        OpKind::Set => {
                            self.values.fill(key, &mut val_buf);
                            Request::Set {
                                key: &key_buf,
                                value: &val_buf,
                            }
                        }
                    };
                    tr.submit(c, &req)?;
                    if let Some(q) = pending.get_mut(c) {
                        q.push_back(Pending {
                            start: Instant::now(),
                            op,
                            key,
                        });
                    }
                    in_flight += 1;
                    issued += 1;
                }
            }
            ready.clear();
            if in_flight == 0 {
                break;
            }
            let n = tr.progress(TICK, &mut |conn, reply| {
                let now = Instant::now();
                let Some(p) = pending.get_mut(conn).and_then(|q| q.pop_front()) else {
                    fault.get_or_insert(LoadError::UnsolicitedReply(conn));
                    return;
                };
                let ns = now.duration_since(p.start).as_nanos() as u64;
                match (p.op, reply) {
                    (OpKind::Get, Reply::Hit { key, data, .. }) => {
                        check_buf.clear();
                        self.cfg.keys.write_key(p.key, &mut check_buf);
                        let ok = key == &check_buf[..] && self.values.check(p.key, data);
                        stats.record_get(ns, Some(ok));
                    }
                    (OpKind::Get, Reply::Miss) => stats.record_get(ns, None),
                    (OpKind::Set, Reply::Stored) => stats.record_set(ns, true),
                    (OpKind::Set, Reply::NotStored) => stats.record_set(ns, false),
                    (_, Reply::Error(_)) => stats.record_error(p.op, ns),
                    (op, _) => {
                        fault.get_or_insert(LoadError::WrongReplyKind { op, conn });
                    }
                }
                ready.push(conn);
            })?;
            if let Some(f) = fault.take() {
                return Err(f);
            }
            if n > 0 {
                in_flight -= n.min(in_flight);
                last_reply = Instant::now();
                unreported += n as u64;
                if unreported >= 256 || in_flight == 0 {
                    self.done_ops.fetch_add(unreported, Ordering::Relaxed);
                    unreported = 0;
                }
            } else if last_reply.elapsed() >= STALL {
                return Err(LoadError::Stalled(STALL));
            }
        }
        self.done_ops.fetch_add(unreported, Ordering::Relaxed);
        stats.elapsed = start.elapsed();
        Ok(stats)
    }
}

/// Result of [`preload`].
#[derive(Clone, Debug)]
pub struct PreloadStats {
    pub stored: u64,
    pub elapsed: Duration,
}

/// Store every key of the key space once (values of `value_size`), pipelined over `conns`
/// connections of one thread, so that GETs of the measured run hit.
pub fn preload(
    connector: &dyn Connector,
    keys: &KeySpace,
    value_size: usize,
    conns: usize,
    depth: usize,
) -> Result<PreloadStats, LoadError> {
    let start = Instant::now();
    let conns = conns.max(1);
    let depth = depth.max(1);
    let mut tr = connector.connect(conns)?;
    let values = ValueMaker::new(value_size);
    let mut next: Vec<std::ops::Range<u64>> = (0..conns as u64)
        .map(|c| keys.preload_range(c, conns as u64))
        .collect();
    let mut key_buf = Vec::new();
    let mut val_buf = Vec::new();
    let mut in_flight = 0usize;
    let mut stored = 0u64;
    let mut failed = 0u64;
    let mut first_failure: Option<String> = None;
    // Every connection starts with `depth` requests' worth of credit.
    let mut ready: Vec<usize> = Vec::with_capacity(conns * depth);
    for c in 0..conns {
        for _ in 0..depth {
            ready.push(c);
        }
    }
    let mut last_reply = Instant::now();
    loop {
        for &c in &ready {
            let Some(id) = next.get_mut(c).and_then(|r| r.next()) else {
                continue;
            };
            key_buf.clear();
            keys.write_key(id, &mut key_buf);
            values.fill(id, &mut val_buf);
            tr.submit(
                c,
                &Request::Set {
                    key: &key_buf,
                    value: &val_buf,
                },
            )?;
            in_flight += 1;
        }
        ready.clear();
        if in_flight == 0 {
            break;
        }
        let n = tr.progress(TICK, &mut |conn, reply| {
            match reply {
                Reply::Stored => stored += 1,
                other => {
                    failed += 1;
                    first_failure.get_or_insert_with(|| format!("{other:?}"));
                }
            }
            ready.push(conn);
        })?;
        if n > 0 {
            in_flight -= n.min(in_flight);
            last_reply = Instant::now();
        } else if last_reply.elapsed() >= STALL {
            return Err(LoadError::Stalled(STALL));
        }
    }
    if failed > 0 {
        return Err(LoadError::PreloadFailed {
            failed,
            total: keys.n,
            first: first_failure.unwrap_or_default(),
        });
    }
    Ok(PreloadStats {
        stored,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_budget_is_split_exactly() {
        let b = split_budget(Some(10), 3);
        assert_eq!(b, vec![Some(4), Some(3), Some(3)]);
        assert_eq!(split_budget(None, 2), vec![None, None]);
    }
}
