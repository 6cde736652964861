//! Server-side counters. Each worker owns a `ThreadStats` (single writer, so increments
//! are a plain load + store, no locked instruction); `stats` sums them.
//!
//! The `collect_*` functions that turn these and the store's counters into memcached's
//! `stats` output live here too, so ascii `stats` and binary STAT print the same things.
use std::fmt::Write as _;
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
        }

        /// The sum of every worker's `ThreadStats` at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct ThreadTotals {
            $(pub $name: u64,)*
        }

        impl ThreadTotals {
            fn add(&mut self, t: &ThreadStats) {
                $(self.$name = self.$name.wrapping_add(t.$name.get());)*
            }
            fn since(&self, base: &ThreadTotals) -> ThreadTotals {
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
}

/// Store counters that `stats reset` zeroes (the others are gauges).
#[derive(Clone, Copy, Debug, Default)]
struct StoreBase {
    total_items: u64,
    evictions: u64,
    reclaimed: u64,
    expired_unfetched: u64,
    evicted_unfetched: u64,
    evicted_active: u64,
    crawler_reclaimed: u64,
    get_expired: u64,
    get_flushed: u64,
    slabs_moved: u64,
    malloc_fails: u64,
}

/// Counter values at the last `stats reset`. Counters have a single writer each, so
/// instead of zeroing them from another thread (which would race with that writer) a
/// reset remembers where they stood and `stats` reports the difference.
#[derive(Debug, Default)]
pub struct ResetBase {
    inner: Mutex<BaseInner>,
}

#[derive(Debug, Default)]
struct BaseInner {
    threads: ThreadTotals,
    store: StoreBase,
    total_connections: u64,
    rejected_connections: u64,
    listen_disabled_num: u64,
}

impl ResetBase {
    fn lock(&self) -> std::sync::MutexGuard<'_, BaseInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

use crate::exec::{ExecCtx, Shared};

/// Every worker's counters summed, since the last `stats reset`.
pub fn thread_totals(shared: &Shared) -> ThreadTotals {
    raw_thread_totals(shared).since(&shared.stats_base.lock().threads)
}

fn raw_thread_totals(shared: &Shared) -> ThreadTotals {
    let mut t = ThreadTotals::default();
    for s in shared
        .thread_stats
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        t.add(s);
    }
    t
}

fn store_base_of(st: &memfabric_store::StoreStats) -> StoreBase {
    StoreBase {
        total_items: st.total_items,
        evictions: st.evictions,
        reclaimed: st.reclaimed,
        expired_unfetched: st.expired_unfetched,
        evicted_unfetched: st.evicted_unfetched,
        evicted_active: st.evicted_active,
        crawler_reclaimed: st.crawler_reclaimed,
        get_expired: st.get_expired,
        get_flushed: st.get_flushed,
        slabs_moved: st.slabs_moved,
        malloc_fails: st.malloc_fails,
    }
}

/// The key/value pairs of `stats <group>` (`group` = "" for the general stats, or
/// "settings", "items", "slabs", "conns", "sizes", "fabric"). `None` for an unknown group.
/// Shared by ascii `stats` and binary STAT so both print the same names.
pub fn collect(ctx: &ExecCtx<'_>, group: &str) -> Option<Vec<(String, String)>> {
    let shared = ctx.shared;
    let mut v = Stats::default();
    match group {
        "" => general(shared, &mut v),
        "settings" => settings(shared, &mut v),
        "items" => items(shared, &mut v),
        "slabs" => slabs(shared, &mut v),
        "conns" => conns(shared, &mut v),
        "sizes" => v.put("sizes_status", "disabled"),
        // memfabric's own group: the UCX data path.
        "fabric" => v.0.extend(crate::fabric::fabric_stats(shared)),
        // memfabric's own group: what connections hold (docs/connections.md).
        "bounds" => v.0.extend(shared.gauges.stats()),
        _ => return None,
    }
    Some(v.0)
}

/// `stats reset`: zero the resettable counters.
pub fn reset(ctx: &ExecCtx<'_>) {
    let shared = ctx.shared;
    let threads = raw_thread_totals(shared);
    let store = store_base_of(&shared.store.stats());
    let mut b = shared.stats_base.lock();
    b.threads = threads;
    b.store = store;
    b.total_connections = shared.total_connections.load(Ordering::Relaxed);
    b.rejected_connections = shared.rejected_connections.load(Ordering::Relaxed);
    b.listen_disabled_num = shared.listen_disabled_num.load(Ordering::Relaxed);
}

#[derive(Default)]
struct Stats(Vec<(String, String)>);

impl Stats {
    fn put(&mut self, k: impl Into<String>, v: impl std::fmt::Display) {
        self.0.push((k.into(), v.to_string()));
    }
}

/// CPU time as memcached prints it: seconds.microseconds.
fn rusage() -> (String, String) {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(r) => {
            let f = |t: nix::sys::time::TimeVal| {
                let mut s = String::new();
                let _ = write!(s, "{}.{:06}", t.tv_sec(), t.tv_usec());
                s
            };
            (f(r.user_time()), f(r.system_time()))
        }
        Err(_) => ("0.000000".into(), "0.000000".into()),
    }
}

fn general(shared: &Shared, v: &mut Stats) {
    let now = shared.store.clock().now();
    let st = shared.store.stats();
    let base = {
        let b = shared.stats_base.lock();
        (
            b.store,
            b.total_connections,
            b.rejected_connections,
            b.listen_disabled_num,
        )
    };
    let (sb, base_total, base_rejected, base_disabled) = base;
    // A store counter as counted since the last `stats reset`.
    macro_rules! since_reset {
        ($field:ident) => {
            st.$field.wrapping_sub(sb.$field)
        };
    }
    let t = thread_totals(shared);
    let (ru, rs) = rusage();
    let curr = shared.curr_connections.load(Ordering::Relaxed);
    v.put("pid", shared.pid);
    v.put("uptime", now.saturating_sub(shared.started));
    v.put("time", now);
    v.put("version", VERSION);
    // We have no libevent; the field stays because monitoring tools expect it.
    v.put("libevent", "mio");
    v.put("pointer_size", usize::BITS);
    v.put("rusage_user", ru);
    v.put("rusage_system", rs);
    v.put("max_connections", shared.settings.max_connections);
    v.put("curr_connections", curr);
    v.put(
        "total_connections",
        shared
            .total_connections
            .load(Ordering::Relaxed)
            .wrapping_sub(base_total),
    );
    v.put(
        "rejected_connections",
        shared
            .rejected_connections
            .load(Ordering::Relaxed)
            .wrapping_sub(base_rejected),
    );
    v.put("connection_structures", shared.conns.len());
    // memcached's response-object and read-buffer pools do not exist here: each
    // connection owns growable buffers.
    v.put("response_obj_oom", 0);
    v.put("response_obj_count", 0);
    v.put("response_obj_bytes", 0);
    v.put("read_buf_count", 0);
    v.put("read_buf_bytes", 0);
    v.put("read_buf_bytes_free", 0);
    v.put("read_buf_oom", 0);
    v.put("reserved_fds", 0);
    v.put("cmd_get", t.cmd_get);
    v.put("cmd_set", t.cmd_set);
    v.put("cmd_flush", t.cmd_flush);
    v.put("cmd_touch", t.cmd_touch);
    v.put("cmd_meta", t.meta_cmds);
    v.put("get_hits", t.get_hits);
    v.put("get_misses", t.get_misses);
    v.put("get_expired", since_reset!(get_expired));
    let store_flushed = since_reset!(get_flushed);
    v.put(
        "get_flushed",
        if store_flushed > 0 {
            store_flushed
        } else {
            t.get_flushed
        },
    );
    v.put("delete_misses", t.delete_misses);
    v.put("delete_hits", t.delete_hits);
    v.put("incr_misses", t.incr_misses);
    v.put("incr_hits", t.incr_hits);
    v.put("decr_misses", t.decr_misses);
    v.put("decr_hits", t.decr_hits);
    v.put("cas_misses", t.cas_misses);
    v.put("cas_hits", t.cas_hits);
    v.put("cas_badval", t.cas_badval);
    v.put("touch_hits", t.touch_hits);
    v.put("touch_misses", t.touch_misses);
    v.put("store_too_large", t.store_too_large);
    v.put("store_no_memory", t.store_no_memory);
    v.put("auth_cmds", t.auth_cmds);
    v.put("auth_errors", t.auth_errors);
    if shared.settings.idle_timeout > 0 {
        v.put("idle_kicks", t.idle_kicks);
    }
    v.put("bytes_read", t.bytes_read);
    v.put("bytes_written", t.bytes_written);
    v.put("limit_maxbytes", st.limit_maxbytes);
    v.put("accepting_conns", u8::from(!shared.is_shutting_down()));
    v.put(
        "listen_disabled_num",
        shared
            .listen_disabled_num
            .load(Ordering::Relaxed)
            .wrapping_sub(base_disabled),
    );
    v.put("time_in_listen_disabled_us", 0);
    v.put("threads", shared.settings.threads);
    v.put("conn_yields", t.conn_yields);
    v.put("hash_power_level", st.hash_power_level);
    v.put("hash_bytes", st.hash_bytes);
    v.put("hash_is_expanding", 0);
    v.put("slab_reassign_rescues", 0);
    v.put("slab_reassign_chunk_rescues", 0);
    v.put("slab_reassign_evictions_nomem", 0);
    v.put("slab_reassign_inline_reclaim", 0);
    v.put("slab_reassign_busy_items", 0);
    v.put("slab_reassign_busy_deletes", 0);
    v.put("slab_reassign_running", 0);
    v.put("slabs_moved", since_reset!(slabs_moved));
    v.put("lru_crawler_running", 0);
    v.put("lru_crawler_starts", 0);
    v.put("lru_maintainer_juggles", 0);
    v.put("malloc_fails", since_reset!(malloc_fails));
    v.put("log_worker_dropped", 0);
    v.put("log_worker_written", 0);
    v.put("log_watcher_skipped", 0);
    v.put("log_watcher_sent", 0);
    v.put("log_watchers", 0);
    v.put("unexpected_napi_ids", 0);
    v.put("round_robin_fallback", 0);
    v.put("bytes", st.bytes);
    v.put("curr_items", st.curr_items);
    v.put("total_items", since_reset!(total_items));
    v.put("slab_global_page_pool", 0);
    v.put("expired_unfetched", since_reset!(expired_unfetched));
    v.put("evicted_unfetched", since_reset!(evicted_unfetched));
    v.put("evicted_active", since_reset!(evicted_active));
    v.put("evictions", since_reset!(evictions));
    v.put("reclaimed", since_reset!(reclaimed));
    v.put("crawler_reclaimed", since_reset!(crawler_reclaimed));
    v.put("crawler_items_checked", 0);
    v.put("lrutail_reflocked", 0);
    v.put("moves_to_cold", 0);
    v.put("moves_to_warm", 0);
    v.put("moves_within_lru", 0);
    v.put("direct_reclaims", 0);
    v.put("lru_bumps_dropped", 0);
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn settings(shared: &Shared, v: &mut Stats) {
    let s = &shared.settings;
    let c = &s.store;
    v.put("maxbytes", c.memory_limit);
    v.put("maxconns", s.max_connections);
    v.put("tcpport", s.tcp_port);
    v.put("udpport", s.udp_port);
    v.put(
        "inter",
        if s.listen.is_empty() {
            "NULL".to_string()
        } else {
            s.listen.join(",")
        },
    );
    v.put("verbosity", shared.verbose.load(Ordering::Relaxed));
    v.put("oldest", 0);
    v.put("evictions", if c.evict { "on" } else { "off" });
    v.put("domain_socket", s.unix_socket.as_deref().unwrap_or("NULL"));
    v.put("umask", format!("{:o}", s.unix_mask));
    v.put("shutdown_command", yes_no(s.enable_shutdown));
    v.put("growth_factor", format!("{:.2}", c.growth_factor));
    v.put("chunk_size", c.min_chunk);
    v.put("num_threads", s.threads);
    v.put("num_threads_per_udp", s.threads);
    v.put("stat_key_prefix", s.prefix_delimiter);
    v.put("detail_enabled", yes_no(s.detail_enabled));
    v.put("reqs_per_event", s.reqs_per_event);
    v.put("cas_enabled", yes_no(s.use_cas));
    v.put("tcp_backlog", s.backlog);
    v.put("binding_protocol", s.protocol.name());
    v.put("auth_enabled_sasl", "no");
    v.put("auth_enabled_ascii", "no");
    v.put("item_size_max", c.item_size_max);
    v.put("maxconns_fast", yes_no(s.maxconns_fast));
    v.put("hashpower_init", s.hashpower_init);
    v.put("slab_reassign", yes_no(c.slab_automove));
    v.put("slab_automove", s.slab_automove);
    v.put("slab_chunk_max", s.slab_chunk_max);
    v.put("lru_crawler", yes_no(s.lru_crawler));
    v.put("tail_repair_time", s.tail_repair_time);
    v.put("flush_enabled", yes_no(s.flush_enabled));
    v.put("dump_enabled", yes_no(s.dump_enabled));
    v.put("idle_timeout", s.idle_timeout);
    v.put("track_sizes", yes_no(s.track_sizes));
    v.put("poll_us", s.poll_us);
}

fn items(shared: &Shared, v: &mut Stats) {
    let slabs = shared.store.slab_stats();
    for it in shared.store.item_stats().iter().filter(|i| i.number > 0) {
        let p = |k: &str| format!("items:{}:{k}", it.id);
        let mem_requested = slabs
            .iter()
            .find(|s| s.id == it.id)
            .map_or(0, |s| s.mem_requested);
        v.put(p("number"), it.number);
        // One LRU per class here: all items count as cold.
        v.put(p("number_hot"), 0);
        v.put(p("number_warm"), 0);
        v.put(p("number_cold"), it.number);
        v.put(p("age_hot"), 0);
        v.put(p("age_warm"), 0);
        v.put(p("age"), it.age);
        v.put(p("mem_requested"), mem_requested);
        v.put(p("evicted"), it.evicted);
        v.put(p("evicted_nonzero"), it.evicted_nonzero);
        v.put(p("evicted_time"), it.evicted_time);
        v.put(p("outofmemory"), it.outofmemory);
        v.put(p("tailrepairs"), 0);
        v.put(p("reclaimed"), it.reclaimed);
        v.put(p("expired_unfetched"), it.expired_unfetched);
        v.put(p("evicted_unfetched"), it.evicted_unfetched);
        v.put(p("evicted_active"), it.evicted_active);
        v.put(p("crawler_reclaimed"), it.crawler_reclaimed);
        v.put(p("crawler_items_checked"), 0);
        v.put(p("lrutail_reflocked"), 0);
        v.put(p("moves_to_cold"), 0);
        v.put(p("moves_to_warm"), 0);
        v.put(p("moves_within_lru"), 0);
        v.put(p("direct_reclaims"), 0);
        v.put(p("hits_to_hot"), 0);
        v.put(p("hits_to_warm"), 0);
        v.put(p("hits_to_cold"), 0);
        v.put(p("hits_to_temp"), 0);
    }
}

fn slabs(shared: &Shared, v: &mut Stats) {
    let st = shared.store.stats();
    let mut active = 0;
    for s in shared
        .store
        .slab_stats()
        .iter()
        .filter(|s| s.total_pages > 0)
    {
        active += 1;
        let p = |k: &str| format!("{}:{k}", s.id);
        v.put(p("chunk_size"), s.chunk_size);
        v.put(p("chunks_per_page"), s.chunks_per_page);
        v.put(p("total_pages"), s.total_pages);
        v.put(p("total_chunks"), s.total_chunks);
        v.put(p("used_chunks"), s.used_chunks);
        v.put(p("free_chunks"), s.free_chunks);
        v.put(p("free_chunks_end"), 0);
        // memcached's per-class command counters (get_hits, cmd_set, ...) are not kept
        // per class here; leaving them out is better than printing zeros that lie.
    }
    v.put("active_slabs", active);
    v.put("total_malloced", st.total_malloced);
}

fn conns(shared: &Shared, v: &mut Stats) {
    let now = shared.store.clock().now();
    for (id, e) in shared.conns.snapshot() {
        if e.udp {
            v.put(format!("{id}:UDP"), "UDP");
        }
        v.put(format!("{id}:addr"), &e.addr);
        if let Some(l) = &e.listen_addr {
            v.put(format!("{id}:listen_addr"), l);
        }
        v.put(format!("{id}:state"), e.state().name());
        let last = e.last_cmd();
        let last = if last == 0 { shared.started } else { last };
        v.put(
            format!("{id}:secs_since_last_cmd"),
            now.saturating_sub(last),
        );
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
