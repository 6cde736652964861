//! Server-side counters. Each worker owns a `ThreadStats` (single writer, so increments
//! are a plain load + store, no locked instruction); `command::stats` sums them into
//! memcached's `stats` output.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A counter written by one thread and read by any.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn incr(&self) {
        self.add(1)
    }
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: no read-modify-write needed.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The memcached version we speak and report (`version`, `stats`): clients use it to
/// decide which protocol features (meta commands) they may use.
pub const VERSION: &str = "1.6.18";

/// Declares the per-worker counters once, and a plain-number copy of them for sums and
/// reset baselines.
macro_rules! thread_counters {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        /// Per-worker command counters, named as in memcached's `stats`.
        #[derive(Debug, Default)]
        pub struct ThreadStats {
            $($(#[$m])* pub $name: Counter,)*
            /// memcached's per-slab-class counters (`stats slabs`); count them with
            /// `ThreadStats::count`, which keeps the totals above in step.
            pub classes: ClassCounters,
        }

        /// The sum of every worker's `ThreadStats` at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct ThreadTotals {
            $(pub $name: u64,)*
        }

        impl ThreadTotals {
            pub(crate) fn add(&mut self, t: &ThreadStats) {
                $(self.$name = self.$name.wrapping_add(t.$name.get());)*
            }
            pub(crate) fn since(&self, base: &ThreadTotals) -> ThreadTotals {
                ThreadTotals { $($name: self.$name.wrapping_sub(base.$name),)* }
            }
        }
    };
}

thread_counters! {
    cmd_get,
    get_hits,
    get_misses,
    cmd_set,
    cmd_touch,
    touch_hits,
    touch_misses,
    cmd_flush,
    delete_hits,
    delete_misses,
    incr_hits,
    incr_misses,
    decr_hits,
    decr_misses,
    cas_hits,
    cas_misses,
    cas_badval,
    /// Gets that found an item invalidated by `flush_all` (if the executor counts them;
    /// the store's own count is used when it has one).
    get_flushed,
    /// Counted by the worker loop for every byte read and written (executors do not).
    bytes_read,
    bytes_written,
    conn_yields,
    /// memcached's `cmd_meta`.
    meta_cmds,
    /// Requests rejected as malformed (any protocol).
    protocol_errors,
    /// Stores refused because the value exceeds `-I`.
    store_too_large,
    /// Stores refused for lack of memory.
    store_no_memory,
    auth_cmds,
    auth_errors,
    /// Connections closed by `-o idle_timeout`.
    idle_kicks,
    /// Blocking waits of a worker with UCX sessions that its UCX event fd ended (`stats
    /// fabric`).
    ucx_wakeups_by_event,
    /// Blocking waits that ended by their timeout, after which UCX had work: a UCX event
    /// that did not wake the worker (a missed wake-up hidden by the timer). Should stay 0.
    ucx_wakeups_by_timer,
    /// Adaptive UCX polls started (`--ucx-poll-us`): only UCX work starts one.
    ucx_poll_spins,
    /// Pauses of a worker whose UCX had work it could not do (sends waiting for room in
    /// a peer's FIFO; see `UcxStall` in worker.rs).
    ucx_stalled_waits,
    /// Polls for the next TCP/UDP request started (`--tcp-poll-us`).
    tcp_poll_spins,
    /// Rounds of requests such a poll caught (served without the worker going to sleep).
    tcp_poll_caught,
    /// Microseconds such polls spent finding no request: the CPU time they cost.
    tcp_poll_idle_us,
}

/// memcached's per-slab-class command counters, in the order `stats slabs` prints them.
/// Each is also one of the all-class totals of `stats` (same name, `SetCmds` = `cmd_set`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassStat {
    GetHits,
    SetCmds,
    DeleteHits,
    IncrHits,
    DecrHits,
    CasHits,
    CasBadval,
    TouchHits,
}

impl ClassStat {
    pub const ALL: [ClassStat; 8] = [
        ClassStat::GetHits,
        ClassStat::SetCmds,
        ClassStat::DeleteHits,
        ClassStat::IncrHits,
        ClassStat::DecrHits,
        ClassStat::CasHits,
        ClassStat::CasBadval,
        ClassStat::TouchHits,
    ];

    /// The name in `stats slabs` (`N:<name>`) and in `stats`.
    pub fn name(self) -> &'static str {
        match self {
            ClassStat::GetHits => "get_hits",
            ClassStat::SetCmds => "cmd_set",
            ClassStat::DeleteHits => "delete_hits",
            ClassStat::IncrHits => "incr_hits",
            ClassStat::DecrHits => "decr_hits",
            ClassStat::CasHits => "cas_hits",
            ClassStat::CasBadval => "cas_badval",
            ClassStat::TouchHits => "touch_hits",
        }
    }
}

pub(crate) const CLASS_STATS: usize = ClassStat::ALL.len();
/// One row per possible class id (ids are a `u8`). Row 0 takes events whose item had no
/// class (memcached's class 0 too): they count in the totals but no class prints them.
pub(crate) const CLASS_ROWS: usize = 1 << u8::BITS;

/// One worker's per-class counters: `[class][ClassStat]`.
#[derive(Debug)]
pub struct ClassCounters(pub(crate) Box<[[Counter; CLASS_STATS]]>);

impl Default for ClassCounters {
    fn default() -> Self {
        ClassCounters((0..CLASS_ROWS).map(|_| Default::default()).collect())
    }
}

/// Per-class sums over every worker: `[class][ClassStat]`.
pub(crate) type ClassTotals = Vec<[u64; CLASS_STATS]>;

impl ThreadStats {
    /// Count one of memcached's per-class events for an item of slab class `class` (None
    /// when there was no item to take a class from), in its class and in the total.
    #[inline]
    pub fn count(&self, what: ClassStat, class: Option<u8>) {
        let total = match what {
            ClassStat::GetHits => &self.get_hits,
            ClassStat::SetCmds => &self.cmd_set,
            ClassStat::DeleteHits => &self.delete_hits,
            ClassStat::IncrHits => &self.incr_hits,
            ClassStat::DecrHits => &self.decr_hits,
            ClassStat::CasHits => &self.cas_hits,
            ClassStat::CasBadval => &self.cas_badval,
            ClassStat::TouchHits => &self.touch_hits,
        };
        total.incr();
        self.classes.0[usize::from(class.unwrap_or(0))][what as usize].incr();
    }
}

/// Store counters that `stats reset` zeroes (the others are gauges).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StoreBase {
    pub(crate) total_items: u64,
    pub(crate) evictions: u64,
    pub(crate) reclaimed: u64,
    pub(crate) expired_unfetched: u64,
    pub(crate) evicted_unfetched: u64,
    pub(crate) evicted_active: u64,
    pub(crate) crawler_reclaimed: u64,
    pub(crate) get_expired: u64,
    pub(crate) get_flushed: u64,
    pub(crate) slabs_moved: u64,
    pub(crate) malloc_fails: u64,
}

/// Counter values at the last `stats reset`. Counters have a single writer each, so
/// instead of zeroing them from another thread (which would race with that writer) a
/// reset remembers where they stood and `stats` reports the difference.
#[derive(Debug, Default)]
pub struct ResetBase {
    inner: Mutex<BaseInner>,
}

#[derive(Debug, Default)]
pub(crate) struct BaseInner {
    pub(crate) threads: ThreadTotals,
    /// Per-class command counters (empty until the first reset).
    pub(crate) classes: ClassTotals,
    /// The store's per-class item counters, by class id.
    pub(crate) items: Vec<memfabric_store::ItemClassStats>,
    pub(crate) store: StoreBase,
    pub(crate) total_connections: u64,
    pub(crate) rejected_connections: u64,
    pub(crate) listen_disabled_num: u64,
}

impl ResetBase {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, BaseInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_since_a_base_subtract_each_counter() {
        let t = ThreadStats::default();
        t.cmd_get.add(5);
        t.bytes_read.add(100);
        let mut base = ThreadTotals::default();
        base.add(&t);
        t.cmd_get.add(2);
        let mut now = ThreadTotals::default();
        now.add(&t);
        let d = now.since(&base);
        assert_eq!(d.cmd_get, 2);
        assert_eq!(d.bytes_read, 0);
    }

    #[test]
    fn counter_adds_from_its_single_writer() {
        let c = Counter::default();
        c.incr();
        c.add(41);
        assert_eq!(c.get(), 42);
    }
}
