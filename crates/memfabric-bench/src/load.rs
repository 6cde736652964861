//! The load generator: N client threads, each driving M connections with up to `depth`
//! operations in flight per connection, bounded by an op count and/or a deadline.
//!
//! Closed loop (the default): an operation is issued only when one comes back, so the
//! offered load adapts to the server. Open loop (`rate`): operations are due on a fixed
//! schedule ([`OpenLoopSchedule`]) whatever the server does, and latency is measured from
//! the time an operation was due, not from when it could be sent; an operation that waits
//! for a free connection slot counts its wait (no coordinated omission).

use crate::metrics::{LoadStats, Progress};
use crate::rng::Rng;
use crate::textproto::{Reply, Request};
use crate::transport::{Connector, Transport, TransportError};
use crate::workload::{
    Action, GetSetSource, KeyChooser, KeyDist, KeySpace, OpKind, OpMix, Pattern, TxnKind,
    TxnSource, ValueMaker, WorkloadError,
};
use crate::ycsb::{YcsbSource, YcsbSpec};
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
    #[error("open-loop rate must be a positive number of ops/s, got {0}")]
    BadRate(f64),
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
    /// A YCSB workload instead of dist/mix/pattern (then `keys` and `value_size` should be
    /// the spec's [`key_space`](YcsbSpec::key_space) and [`value_size`](YcsbSpec::value_size)).
    pub ycsb: Option<YcsbSpec>,
    /// Open loop at this many operations per second over all threads; `None` = closed loop.
    pub rate: Option<f64>,
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
        if let Some(rate) = self.rate {
            OpenLoopSchedule::new(rate, 0, self.threads)?;
        }
        if let Some(spec) = &self.ycsb {
            spec.validate()?;
        }
        Ok(())
    }
}

/// When the operations of one thread of an open-loop run are due. Thread `t` of `T` at a
/// total rate `r` sends its `i`-th operation `(i + t/T) * T/r` after the start: each thread
/// runs at `r/T`, and the threads' sends interleave evenly rather than all at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpenLoopSchedule {
    interval_s: f64,
    offset_s: f64,
}

impl OpenLoopSchedule {
    pub fn new(rate: f64, thread: usize, threads: usize) -> Result<Self, LoadError> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(LoadError::BadRate(rate));
        }
        let threads = threads.max(1) as f64;
        let interval_s = threads / rate;
        Ok(OpenLoopSchedule {
            interval_s,
            offset_s: interval_s * thread as f64 / threads,
        })
    }

    /// How long after the start of the run operation `i` is due.
    pub fn due(&self, i: u64) -> Duration {
        Duration::from_secs_f64(self.offset_s + i as f64 * self.interval_s)
    }
}

/// Below this much time to the next due operation an open-loop thread polls without
/// sleeping: epoll's timeout has millisecond granularity, and sleeping through a 20 us gap
/// would send late (which the latency then shows, but the generator should not cause it).
const SPIN_BELOW: Duration = Duration::from_millis(1);

/// One request on the wire, waiting for its reply (replies come in order per connection).
struct Pending {
    /// The operation slot it belongs to.
    slot: usize,
    /// Start of its latency: when it was sent, or (first requests of an open-loop
    /// operation) when the operation was due.
    start: Instant,
    op: OpKind,
    key: u64,
}

/// One of a connection's `depth` places for an operation in flight.
#[derive(Clone, Copy)]
struct Slot {
    kind: TxnKind,
    /// The operation's first key (reported back to the source when it completes).
    key: u64,
    start: Instant,
    /// Replies still to come for the current batch of requests.
    awaiting: usize,
    /// A read-modify-write's SET, sent once its GET is answered.
    then_set: Option<u64>,
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
                thread: t,
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

/// A run with the CPU time it cost: the server's (when its pid is known) and this process's.
#[derive(Clone, Debug)]
pub struct MeasuredRun {
    pub stats: LoadStats,
    /// Server CPU seconds (utime+stime of all its threads) during the run.
    pub server_cpu_s: Option<f64>,
    /// The load generator's own CPU seconds during the run.
    pub client_cpu_s: Option<f64>,
}

impl MeasuredRun {
    /// The summary row of this run under `name`.
    pub fn summary(&self, name: &str, value_size: usize) -> crate::metrics::RunSummary {
        crate::metrics::RunSummary::from_stats(
            name,
            value_size,
            &self.stats,
            self.server_cpu_s,
            self.client_cpu_s,
        )
    }
}

/// [`run`], reading the server's CPU time (from /proc, when `server_pid` is given) and the
/// client's before and after.
pub fn measured_run(
    connector: &dyn Connector,
    cfg: &LoadConfig,
    server_pid: Option<u32>,
) -> Result<MeasuredRun, LoadError> {
    let server_cpu = || server_pid.and_then(|p| crate::metrics::process_cpu_seconds(p).ok());
    let client_cpu = || crate::metrics::self_cpu_seconds().ok();
    let (server0, client0) = (server_cpu(), client_cpu());
    let stats = run(connector, cfg)?;
    let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
    Ok(MeasuredRun {
        stats,
        server_cpu_s: delta(server0, server_cpu()),
        client_cpu_s: delta(client0, client_cpu()),
    })
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
    thread: usize,
    chooser: &'a KeyChooser,
    values: &'a ValueMaker,
    stop: &'a AtomicBool,
    done_ops: &'a AtomicU64,
    budget: Option<u64>,
    seed: u64,
}

/// Per-thread buffers for encoding requests.
struct Buffers {
    key: Vec<u8>,
    value: Vec<u8>,
    check: Vec<u8>,
}

impl Worker<'_> {
    fn source(&self) -> Result<Box<dyn TxnSource + '_>, LoadError> {
        Ok(match &self.cfg.ycsb {
            Some(spec) => Box::new(YcsbSource::new(spec, self.thread, self.cfg.threads)?),
            None => Box::new(GetSetSource::new(
                self.cfg.pattern,
                self.cfg.mix,
                self.chooser,
            )),
        })
    }

    fn submit_one(
        &self,
        tr: &mut dyn Transport,
        bufs: &mut Buffers,
        pending: &mut [VecDeque<Pending>],
        conn: usize,
        request: Pending,
    ) -> Result<(), LoadError> {
        bufs.key.clear();
        self.cfg.keys.write_key(request.key, &mut bufs.key);
        let req = match request.op {
            OpKind::Get => Request::Get { key: &bufs.key },
            OpKind::Set => {
                self.values.fill(request.key, &mut bufs.value);
                Request::Set {
                    key: &bufs.key,
                    value: &bufs.value,
                }
            }
        };
        tr.submit(conn, &req)?;
        if let Some(q) = pending.get_mut(conn) {
            q.push_back(request);
        }
        Ok(())
    }

    /// Send the first requests of an operation; returns how many replies it now awaits.
    #[allow(clippy::too_many_arguments)]
    fn submit_txn(
        &self,
        tr: &mut dyn Transport,
        bufs: &mut Buffers,
        pending: &mut [VecDeque<Pending>],
        conn: usize,
        slot: usize,
        action: &Action,
        start: Instant,
    ) -> Result<usize, LoadError> {
        let mut send = |op, key| {
            let p = Pending {
                slot,
                start,
                op,
                key,
            };
            self.submit_one(tr, bufs, pending, conn, p)
        };
        Ok(match action {
            Action::Get(k) | Action::GetThenSet(k) => {
                send(OpKind::Get, *k)?;
                1
            }
            Action::Set(k) => {
                send(OpKind::Set, *k)?;
                1
            }
            Action::MultiGet(keys) => {
                for &k in keys {
                    send(OpKind::Get, k)?;
                }
                keys.len()
            }
        })
    }

    fn drive(&self, tr: &mut dyn Transport) -> Result<LoadStats, LoadError> {
        let conns = tr.connections();
        let depth = self.cfg.depth;
        let mut rng = Rng::new(self.seed);
        let mut source = self.source()?;
        let schedule = match self.cfg.rate {
            Some(r) => Some(OpenLoopSchedule::new(r, self.thread, self.cfg.threads)?),
            None => None,
        };
        let mut stats = LoadStats::new();
        let mut pending: Vec<VecDeque<Pending>> =
            (0..conns).map(|_| VecDeque::with_capacity(depth)).collect();
        let idle = Slot {
            kind: TxnKind::Get,
            key: 0,
            start: Instant::now(),
            awaiting: 0,
            then_set: None,
        };
        // Slot `s` belongs to connection `s / depth`; free slots wait here in the order
        // they became free.
        let mut slots = vec![idle; conns * depth];
        let mut ready: VecDeque<usize> = (0..conns * depth).collect();
        let mut follow_ups: Vec<usize> = Vec::new();
        let mut bufs = Buffers {
            key: Vec::with_capacity(64),
            value: Vec::with_capacity(self.values.size()),
            check: Vec::with_capacity(64),
        };
        let mut fault: Option<LoadError> = None;
        let mut in_flight = 0usize;
        let mut issued = 0u64;
        let mut unreported = 0u64;

        let cpu_at_start = crate::metrics::thread_cpu_seconds().ok();
        let start = Instant::now();
        let mut last_reply = Instant::now();
        loop {
            let done_issuing =
                self.stop.load(Ordering::Relaxed) || self.budget.is_some_and(|b| issued >= b);
            // When the next operation is due (open loop); `None` = as soon as a slot frees.
            let mut next_due = None;
            if !done_issuing {
                while let Some(&slot) = ready.front() {
                    if self.budget.is_some_and(|b| issued >= b) {
                        break;
                    }
                    let due = match schedule {
                        Some(sch) => {
                            let due = start + sch.due(issued);
                            if due > Instant::now() {
                                next_due = Some(due);
                                break;
                            }
                            due
                        }
                        None => Instant::now(),
                    };
                    ready.pop_front();
                    let txn = source.next_txn(&mut rng);
                    let conn = slot / depth;
                    let awaiting =
                        self.submit_txn(tr, &mut bufs, &mut pending, conn, slot, &txn.action, due)?;
                    let then_set = match txn.action {
                        Action::GetThenSet(k) => Some(k),
                        _ => None,
                    };
                    slots[slot] = Slot {
                        kind: txn.kind,
                        key: txn.action.first_key(),
                        start: due,
                        awaiting,
                        then_set,
                    };
                    in_flight += 1;
                    issued += 1;
                    if awaiting == 0 {
                        // Nothing to wait for (an empty multi-get): done at once.
                        stats.record_txn(txn.kind, 0);
                        source.completed(txn.kind, txn.action.first_key());
                        in_flight -= 1;
                        ready.push_back(slot);
                    }
                }
            }
            if in_flight == 0 {
                if done_issuing || (schedule.is_none() && ready.is_empty()) {
                    break;
                }
                // Open loop, nothing in flight: wait for the next due time.
                if let Some(due) = next_due {
                    let wait = due.saturating_duration_since(Instant::now());
                    if wait > SPIN_BELOW {
                        std::thread::sleep((wait - SPIN_BELOW).min(TICK));
                    } else {
                        std::thread::yield_now();
                    }
                }
                last_reply = Instant::now();
                continue;
            }
            // Open loop with a free slot and an operation due soon: poll without sleeping.
            let timeout = match next_due {
                Some(due) => {
                    let wait = due.saturating_duration_since(Instant::now());
                    if wait > SPIN_BELOW {
                        (wait - SPIN_BELOW).min(TICK)
                    } else {
                        Duration::ZERO
                    }
                }
                None => TICK,
            };
            let mut completed = 0usize;
            let n = tr.progress(timeout, &mut |conn, reply| {
                let now = Instant::now();
                let Some(p) = pending.get_mut(conn).and_then(|q| q.pop_front()) else {
                    fault.get_or_insert(LoadError::UnsolicitedReply(conn));
                    return;
                };
                let ns = now.duration_since(p.start).as_nanos() as u64;
                match (p.op, reply) {
                    (OpKind::Get, Reply::Hit { key, data, .. }) => {
                        bufs.check.clear();
                        self.cfg.keys.write_key(p.key, &mut bufs.check);
                        let ok = key == &bufs.check[..] && self.values.check(p.key, data);
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
                let Some(slot) = slots.get_mut(p.slot) else {
                    return;
                };
                slot.awaiting = slot.awaiting.saturating_sub(1);
                if slot.awaiting > 0 {
                    return;
                }
                if slot.then_set.is_some() {
                    follow_ups.push(p.slot);
                } else {
                    stats.record_txn(slot.kind, now.duration_since(slot.start).as_nanos() as u64);
                    source.completed(slot.kind, slot.key);
                    completed += 1;
                    ready.push_back(p.slot);
                }
            })?;
            if let Some(f) = fault.take() {
                return Err(f);
            }
            for slot in follow_ups.drain(..) {
                if let Some(key) = slots[slot].then_set.take() {
                    let p = Pending {
                        slot,
                        start: Instant::now(),
                        op: OpKind::Set,
                        key,
                    };
                    self.submit_one(tr, &mut bufs, &mut pending, slot / depth, p)?;
                    slots[slot].awaiting = 1;
                }
            }
            if n > 0 {
                in_flight -= completed.min(in_flight);
                last_reply = Instant::now();
                unreported += completed as u64;
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
        stats.generator_cpu_s = cpu_at_start
            .zip(crate::metrics::thread_cpu_seconds().ok())
            .map(|(a, b)| b - a);
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
