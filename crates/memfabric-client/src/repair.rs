//! The state of the pool's background repairs: one thread per server being refilled
//! (`refill.rs` holds what the thread does), its stop flag, and the counters every
//! repair of the pool adds to. Kept apart from the walk so that the pool's state does
//! not depend on the code that uses the pool.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the pool's background repairs have done (`memfabric --counters` prints them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairCounters {
    /// Repairs started (a restart detected, or [`crate::Client::repair`]).
    pub repairs_started: u64,
    /// Repairs that walked every other server's key list to its end.
    pub repairs_finished: u64,
    /// Repairs not made because another client had claimed the server (it is
    /// repairing it, or finished a repair of it in the last ten minutes).
    pub repairs_left_to_others: u64,
    /// Repairs that ended early or incomplete: stopped (the pool was dropped, or the
    /// server restarted again), the server being refilled failed, or another server's
    /// key list could not be read (`Client::repair_problem` says why). What they wrote
    /// stays; the server is not marked repaired, so a later repair walks it again.
    pub repairs_abandoned: u64,
    /// Keys listed by the other servers that the refilled server should hold.
    pub repair_keys_scanned: u64,
    /// Copies (values or fragments) written back to it.
    pub repair_copies_written: u64,
    /// Keys it already held again (written by a client meanwhile): left as they are.
    pub repair_already_present: u64,
    /// Copies written back and then deleted because the key was deleted at the source
    /// meanwhile.
    pub repair_undone: u64,
    /// Keys that could not be repaired (gone, expired, a fragment set that no longer
    /// has `k` pieces of one write, an error reading the source).
    pub repair_skipped: u64,
    /// Servers whose key list could not be read (refused, unreachable).
    pub repair_sources_failed: u64,
    /// Bytes read and written by repairs.
    pub repair_bytes: u64,
}

impl RepairCounters {
    pub fn pairs(&self) -> Vec<(String, u64)> {
        [
            ("repairs_started", self.repairs_started),
            ("repairs_finished", self.repairs_finished),
            ("repairs_left_to_others", self.repairs_left_to_others),
            ("repairs_abandoned", self.repairs_abandoned),
            ("repair_keys_scanned", self.repair_keys_scanned),
            ("repair_copies_written", self.repair_copies_written),
            ("repair_already_present", self.repair_already_present),
            ("repair_undone", self.repair_undone),
            ("repair_skipped", self.repair_skipped),
            ("repair_sources_failed", self.repair_sources_failed),
            ("repair_bytes", self.repair_bytes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The counters, shared by the pool and its repair threads.
#[derive(Debug, Default)]
pub(crate) struct RepairTally {
    pub(crate) started: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) left_to_others: AtomicU64,
    pub(crate) abandoned: AtomicU64,
    pub(crate) scanned: AtomicU64,
    pub(crate) written: AtomicU64,
    pub(crate) present: AtomicU64,
    pub(crate) undone: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) sources_failed: AtomicU64,
    pub(crate) bytes: AtomicU64,
    /// What kept the latest repairs from finishing, oldest first, with the server each
    /// repair refilled (a repair's start clears that server's; the last `PROBLEMS_KEPT`).
    pub(crate) problems: Mutex<std::collections::VecDeque<(usize, String)>>,
}

/// Problems `RepairTally` keeps, the most recent.
const PROBLEMS_KEPT: usize = 32;

impl RepairTally {
    pub(crate) fn add(n: &AtomicU64, by: u64) {
        n.fetch_add(by, Ordering::Relaxed);
    }

    /// Records what kept the repair of server `target` from finishing.
    pub(crate) fn problem(&self, target: usize, what: String) {
        if let Ok(mut p) = self.problems.lock() {
            if p.len() == PROBLEMS_KEPT {
                p.pop_front();
            }
            p.push_back((target, what));
        }
    }

    /// Forgets the problems of earlier repairs of `target` (one starts again).
    pub(crate) fn clear_problems(&self, target: usize) {
        if let Ok(mut p) = self.problems.lock() {
            p.retain(|(t, _)| *t != target);
        }
    }

    /// The problems kept, joined with "; ".
    pub(crate) fn last_problem(&self) -> Option<String> {
        let p = self.problems.lock().ok()?;
        (!p.is_empty()).then(|| {
            p.iter()
                .map(|(_, w)| w.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    pub(crate) fn snapshot(&self) -> RepairCounters {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        RepairCounters {
            repairs_started: get(&self.started),
            repairs_finished: get(&self.finished),
            repairs_left_to_others: get(&self.left_to_others),
            repairs_abandoned: get(&self.abandoned),
            repair_keys_scanned: get(&self.scanned),
            repair_copies_written: get(&self.written),
            repair_already_present: get(&self.present),
            repair_undone: get(&self.undone),
            repair_skipped: get(&self.skipped),
            repair_sources_failed: get(&self.sources_failed),
            repair_bytes: get(&self.bytes),
        }
    }
}

/// One repair thread. Dropping it stops the thread and waits for it (at most about one
/// request timeout: it checks the flag between keys and while it waits for bandwidth).
pub(crate) struct RepairJob {
    pub(crate) target: usize,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl RepairJob {
    pub(crate) fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    pub(crate) fn ask_to_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for RepairJob {
    fn drop(&mut self) {
        self.ask_to_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
