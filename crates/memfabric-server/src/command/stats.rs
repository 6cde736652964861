//! `stats` and its groups: every worker's counters, the store's and the connections',
//! in memcached's names and order (ascii `stats`, binary STAT and the UCX STATS request
//! all print these).
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use crate::counters::{
    ClassStat, ClassTotals, StoreBase, ThreadTotals, CLASS_ROWS, CLASS_STATS, VERSION,
};
use crate::shared::{ExecCtx, Shared};

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

/// Every worker's per-class counters summed, since the last `stats reset`.
fn class_totals(shared: &Shared) -> ClassTotals {
    let mut t = raw_class_totals(shared);
    let base = shared.stats_base.lock();
    for (row, b) in t.iter_mut().zip(base.classes.iter()) {
        for (v, b) in row.iter_mut().zip(b) {
            *v = v.wrapping_sub(*b);
        }
    }
    t
}

fn raw_class_totals(shared: &Shared) -> ClassTotals {
    let mut t = vec![[0u64; CLASS_STATS]; CLASS_ROWS];
    for s in shared
        .thread_stats
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        for (row, counters) in t.iter_mut().zip(s.classes.0.iter()) {
            for (v, c) in row.iter_mut().zip(counters) {
                *v = v.wrapping_add(c.get());
            }
        }
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
/// "settings", "items", "slabs", "conns", "sizes", "extstore", "fabric", "bounds").
/// `None` for an unknown group.
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
        // Without a flash tier memcached answers with no stats at all.
        "extstore" => {
            if let Some(f) = shared.store.flash_stats() {
                flash_detail(&f, &mut v);
                let engine = shared
                    .flash_reads
                    .as_ref()
                    .map_or("none", |r| r.engine_name());
                v.put("io_engine", engine);
            }
        }
        // memfabric's own group: its own settings and the UCX data path.
        "fabric" => {
            // Names this run: a restarted server (empty) has a new one (docs/resilience.md).
            v.put("instance_id", shared.instance_id());
            // `ms ... K` is understood (memfabricd's flag; a coded pool sends it to
            // servers that say so: docs/resilience.md, the write hole).
            v.put("ms_keep_newer_write", 1);
            v.put("poll_us", shared.settings.poll_us);
            v.put("ucx_poll_us", shared.settings.ucx_poll_us);
            v.put("tcp_poll_us", shared.settings.tcp_poll_us);
            // Which crc32c implementation items' checksums use here (measured at start).
            v.put("checksum_engine", memfabric_checksum::large_engine().name());
            // Where a TCP client upgrades to UCX (libmemfabric asks for this line;
            // docs/fabric-protocol.md §1.0): present only while the UCX listener runs.
            if shared.fabric.is_some() && shared.settings.ucx_port != 0 {
                v.put("ucx_port", shared.settings.ucx_port);
            }
            v.0.extend(crate::ucx_context::fabric_stats(shared.fabric.as_ref()));
            let t = thread_totals(shared);
            v.put("ucx_wakeups_by_event", t.ucx_wakeups_by_event);
            v.put("ucx_wakeups_by_timer", t.ucx_wakeups_by_timer);
            v.put("ucx_poll_spins", t.ucx_poll_spins);
            v.put("ucx_stalled_waits", t.ucx_stalled_waits);
            v.put("tcp_poll_spins", t.tcp_poll_spins);
            v.put("tcp_poll_caught", t.tcp_poll_caught);
            v.put("tcp_poll_idle_us", t.tcp_poll_idle_us);
        }
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
    let classes = raw_class_totals(shared);
    let store = store_base_of(&shared.store.stats());
    let items = shared.store.item_stats();
    let mut b = shared.stats_base.lock();
    b.threads = threads;
    b.classes = classes;
    b.items = items;
    b.store = store;
    b.total_connections = raw_total_connections(shared);
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

/// memcached counts each listening (and UDP) socket as a connection once, at start, in
/// `total_connections`.
fn listening_conns(shared: &Shared) -> u64 {
    let snapshot = shared.conns.snapshot();
    snapshot
        .iter()
        .filter(|(_, e)| e.listen_addr.is_none())
        .count() as u64
}

fn raw_total_connections(shared: &Shared) -> u64 {
    shared.total_connections.load(Ordering::Relaxed) + listening_conns(shared)
}

/// memcached's `reserved_fds` counts the descriptors it keeps for itself (listeners,
/// thread pipes, stdio). Ours: every open descriptor that is not a client connection
/// (listeners, epoll and wake-up fds, UCX's, stdio), counted now.
fn reserved_fds(shared: &Shared) -> usize {
    // Less the one the listing itself holds open.
    let open = std::fs::read_dir("/proc/self/fd").map_or(1, |d| d.count()) - 1;
    let clients = shared
        .conns
        .snapshot()
        .iter()
        .filter(|(_, e)| e.listen_addr.is_some())
        .count();
    open.saturating_sub(clients)
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
    // (memcached counts its listeners here too, then prints one less.)
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
        raw_total_connections(shared).wrapping_sub(base_total),
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
    // connection owns bounded buffers (docs/connections.md). The nearest honest values:
    // replies queued as references to item memory (pinned values) stand for response
    // objects, the reply bytes copied and unsent for their bytes, and each connection's
    // read buffer for a read buffer; nothing is pooled, so none is free and none fails.
    let g = &shared.gauges;
    let gauge = |a: &std::sync::atomic::AtomicI64| a.load(Ordering::Relaxed).max(0);
    v.put("response_obj_oom", 0);
    v.put("response_obj_count", gauge(&g.pinned_values));
    v.put("response_obj_bytes", gauge(&g.copied_out_bytes));
    v.put("read_buf_count", gauge(&g.connections));
    v.put("read_buf_bytes", gauge(&g.read_buf_bytes));
    v.put("read_buf_bytes_free", 0);
    v.put("read_buf_oom", 0);
    v.put("reserved_fds", reserved_fds(shared));
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
    if let Some(f) = shared.store.flash_stats() {
        v.put("get_extstore", f.reads);
        v.put("get_aborted_extstore", 0);
        v.put("get_oom_extstore", 0);
        v.put("recache_from_extstore", f.recached);
        v.put("miss_from_extstore", f.misses);
        v.put("badcrc_from_extstore", f.badcrc);
    }
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
    // memcached shows it with -o idle_timeout; memfabricd also with -Y, -S or -Z, whose
    // --auth-timeout closes are counted there.
    let auth_deadline = shared.settings.handshakes() && shared.settings.auth_timeout > 0;
    if shared.settings.idle_timeout != 0 || auth_deadline {
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
    // memcached lists it only while its maintainer runs (not with -o no_lru_maintainer).
    if !shared.settings.store.busy_tick.is_zero() {
        v.put("lru_maintainer_juggles", st.maintainer_juggles);
    }
    v.put("malloc_fails", since_reset!(malloc_fails));
    v.put("log_worker_dropped", 0);
    v.put("log_worker_written", 0);
    v.put("log_watcher_skipped", 0);
    v.put("log_watcher_sent", 0);
    v.put("log_watchers", 0);
    if let Some(f) = shared.store.flash_stats() {
        flash_general(shared, &f, v);
    }
    if let Some(tls) = shared.settings.tls.as_ref() {
        if tls.options.session_cache {
            v.put("ssl_new_sessions", tls.new_sessions.load(Ordering::Relaxed));
        }
        v.put(
            "ssl_handshake_errors",
            tls.handshake_errors.load(Ordering::Relaxed),
        );
        v.put("time_since_server_cert_refresh", tls.since_refresh());
    }
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
    v.put("auth_enabled_sasl", yes_no(s.sasl.is_some()));
    // memcached prints the file's path when -Y is on.
    match s.auth.as_ref() {
        Some(a) => v.put("auth_enabled_ascii", a.path()),
        None => v.put("auth_enabled_ascii", "no"),
    }
    v.put("item_size_max", c.item_size_max);
    v.put("maxconns_fast", yes_no(s.maxconns_fast));
    v.put("hashpower_init", s.hashpower_init);
    v.put("slab_reassign", yes_no(s.slab_reassign));
    v.put(
        "slab_automove",
        shared.slab_automove.load(Ordering::Relaxed),
    );
    // The automover's own rule is fixed (docs/store.md); memcached's tuning knobs for
    // its algorithm are reported at memcached's defaults, which nothing here reads.
    v.put("slab_automove_ratio", "0.80");
    v.put("slab_automove_window", 30);
    v.put("slab_chunk_max", s.slab_chunk_max);
    // Switched at run time by `lru_crawler enable|disable`.
    v.put("lru_crawler", yes_no(shared.store.sweeping()));
    // The expiry sweeper (our crawler) paces itself; `lru_crawler sleep|tocrawl` are
    // accepted without effect, so their defaults are what holds.
    v.put("lru_crawler_sleep", 100);
    v.put("lru_crawler_tocrawl", 0);
    v.put("tail_repair_time", s.tail_repair_time);
    v.put("flush_enabled", yes_no(s.flush_enabled));
    v.put("dump_enabled", yes_no(s.dump_enabled));
    // The index hashes keys with seeded xxh3, not murmur3.
    v.put("hash_algorithm", "xxh3");
    // The store's maintenance thread does the LRU maintainer's background work; as
    // memcached's, it keeps a 1 ms tick under load unless -o no_lru_maintainer.
    v.put("lru_maintainer_thread", yes_no(!c.busy_tick.is_zero()));
    // One eviction queue per class: no hot/warm/cold/temp segments. memcached
    // prints the segment tuning under `no_lru_segmented` too; so do we, at its defaults.
    v.put("lru_segmented", "no");
    v.put("hot_lru_pct", 20);
    v.put("warm_lru_pct", 40);
    v.put("hot_max_factor", "0.20");
    v.put("warm_max_factor", "2.00");
    v.put("temp_lru", "no");
    v.put("temporary_ttl", 61);
    v.put("idle_timeout", s.idle_timeout);
    // No `watch` log streams, so no log buffers.
    v.put("watcher_logbuf_size", 0);
    v.put("worker_logbuf_size", 0);
    // 0 = no server-wide cap on read buffers (memcached's default too).
    v.put("read_buf_mem_limit", 0);
    v.put("track_sizes", yes_no(s.track_sizes));
    v.put("inline_ascii_response", "no");
    // As memcached prints them (with or without a flash tier), as `extstore` left them.
    let e = &shared.ext;
    let l = |a: &std::sync::atomic::AtomicU32| a.load(Ordering::Relaxed);
    v.put("ext_item_size", e.item_size.load(Ordering::Relaxed));
    v.put("ext_item_age", l(&e.item_age));
    v.put("ext_low_ttl", l(&e.low_ttl));
    v.put("ext_recache_rate", l(&e.recache_rate));
    v.put("ext_wbuf_size", s.ext.wbuf_mb << 20);
    v.put("ext_compact_under", l(&e.compact_under));
    v.put("ext_drop_under", l(&e.drop_under));
    v.put("ext_max_sleep", l(&e.max_sleep));
    v.put(
        "ext_max_frag",
        format!("{:.2}", f64::from_bits(e.max_frag.load(Ordering::Relaxed))),
    );
    v.put("slab_automove_freeratio", "0.010");
    v.put(
        "ext_drop_unread",
        yes_no(e.drop_unread.load(Ordering::Relaxed)),
    );
    // As memcached built with TLS prints them, with -Z or without.
    let tls = s.tls.as_ref().map(|t| &t.options);
    let default = crate::tls::TlsOptions::default();
    let o = tls.unwrap_or(&default);
    v.put("ssl_enabled", yes_no(tls.is_some()));
    v.put(
        "ssl_chain_cert",
        o.chain_cert.as_deref().unwrap_or("(null)"),
    );
    v.put("ssl_key", o.key.as_deref().unwrap_or("(null)"));
    v.put("ssl_verify_mode", o.verify_mode);
    v.put("ssl_keyformat", 1);
    v.put("ssl_ciphers", "NULL");
    v.put("ssl_ca_cert", o.ca_cert.as_deref().unwrap_or("NULL"));
    v.put("ssl_wbuf_size", o.wbuf_size);
    v.put("ssl_session_cache", yes_no(o.session_cache));
    v.put("ssl_kernel_tls", "no");
    v.put("ssl_min_version", o.min_version());
    v.put("num_napi_ids", "(null)");
    v.put("memory_file", "(null)");
}

/// memcached's `extstore_*` lines of the general stats, and memfabric's own `flash_*`.
fn flash_general(shared: &Shared, f: &memfabric_store::FlashStats, v: &mut Stats) {
    // No compaction: nothing is lost, rescued or skipped by one.
    v.put("extstore_compact_lost", 0);
    v.put("extstore_compact_rescues", 0);
    v.put("extstore_compact_skipped", 0);
    v.put("extstore_page_allocs", f.page_allocs);
    // Every reclaimed page was evicted (reused oldest first).
    v.put("extstore_page_evictions", f.page_reclaims);
    v.put("extstore_page_reclaims", f.page_reclaims);
    v.put("extstore_pages_free", f.pages_free);
    v.put("extstore_pages_used", f.pages_used);
    v.put("extstore_objects_evicted", f.objects_evicted);
    v.put("extstore_objects_read", f.objects_read);
    v.put("extstore_objects_written", f.objects_written);
    v.put("extstore_objects_used", f.objects_used);
    v.put("extstore_bytes_evicted", f.bytes_evicted);
    v.put("extstore_bytes_written", f.bytes_written);
    v.put("extstore_bytes_read", f.bytes_read);
    v.put("extstore_bytes_used", f.bytes_used);
    v.put(
        "extstore_bytes_fragmented",
        (f.pages_used * f.page_size).saturating_sub(f.bytes_used),
    );
    v.put("extstore_limit_maxbytes", f.limit_bytes);
    v.put(
        "extstore_io_queue",
        shared.flash_reads.as_ref().map_or(0, |r| r.queued()),
    );
    v.put("flash_device_bytes_written", f.device_bytes_written);
    v.put("flash_admitted_bytes", f.admitted_bytes);
    v.put("flash_reinserted", f.reinserted);
    v.put("flash_overwritten", f.overwritten);
    v.put("flash_dropped_budget", f.dropped_budget);
    v.put("flash_dropped_writer_behind", f.dropped_no_buffer);
    v.put("flash_dropped_too_large", f.dropped_too_large);
    v.put("flash_chained_written", f.chained_written);
    v.put("flash_chained_used", f.chained_used);
    v.put("flash_write_errors", f.write_errors);
    v.put("flash_read_errors", f.read_errors);
    v.put("flash_index_drops", f.index_drops);
    v.put("flash_recovered", f.recovered);
    v.put("flash_recovery_ms", f.recovery_us / 1000);
    v.put("flash_snapshots", f.snapshots);
    v.put("flash_invalidations_lost", f.invalidations_lost);
}

/// `stats extstore`: the tier's geometry and state (memfabric's pages are all one size;
/// memcached lists its pages one by one).
fn flash_detail(f: &memfabric_store::FlashStats, v: &mut Stats) {
    v.put("page_size", f.page_size);
    v.put("page_count", f.pages);
    v.put("pages_free", f.pages_free);
    v.put("pages_used", f.pages_used);
    v.put("pages_buffered", f.pages_buffered);
    v.put("pages_reserved", f.pages_reserved);
    v.put("objects_used", f.objects_used);
    v.put("bytes_used", f.bytes_used);
    v.put("limit_bytes", f.limit_bytes);
    v.put("item_size_min", f.item_min);
    v.put("write_budget", f.write_budget);
    v.put("direct_io", yes_no(f.direct_io));
    v.put("device_bytes_written", f.device_bytes_written);
    v.put("admitted_bytes", f.admitted_bytes);
}

fn items(shared: &Shared, v: &mut Stats) {
    let slabs = shared.store.slab_stats();
    let classes = class_totals(shared);
    let base = shared.stats_base.lock().items.clone();
    for it in shared.store.item_stats().iter().filter(|i| i.number > 0) {
        let p = |k: &str| format!("items:{}:{k}", it.id);
        let mem_requested = slabs
            .iter()
            .find(|s| s.id == it.id)
            .map_or(0, |s| s.mem_requested);
        // `stats reset` zeroes the per-class event counters (memcached's itemstats);
        // `number`, `age` and `mem_requested` describe what is stored and stay.
        let b = base
            .iter()
            .find(|b| b.id == it.id)
            .cloned()
            .unwrap_or_default();
        let evicted = it.evicted.wrapping_sub(b.evicted);
        let hits = classes[usize::from(it.id)][ClassStat::GetHits as usize];
        v.put(p("number"), it.number);
        // One eviction queue per class here (no hot/warm/cold segments): all items count as cold.
        v.put(p("number_hot"), 0);
        v.put(p("number_warm"), 0);
        v.put(p("number_cold"), it.number);
        v.put(p("age_hot"), 0);
        v.put(p("age_warm"), 0);
        v.put(p("age"), it.age);
        v.put(p("mem_requested"), mem_requested);
        v.put(p("evicted"), evicted);
        v.put(
            p("evicted_nonzero"),
            it.evicted_nonzero.wrapping_sub(b.evicted_nonzero),
        );
        // memcached zeroes it on reset; it is set again by the next eviction.
        v.put(
            p("evicted_time"),
            if evicted == 0 { 0 } else { it.evicted_time },
        );
        v.put(p("outofmemory"), it.outofmemory.wrapping_sub(b.outofmemory));
        v.put(p("tailrepairs"), 0);
        v.put(p("reclaimed"), it.reclaimed.wrapping_sub(b.reclaimed));
        v.put(
            p("expired_unfetched"),
            it.expired_unfetched.wrapping_sub(b.expired_unfetched),
        );
        v.put(
            p("evicted_unfetched"),
            it.evicted_unfetched.wrapping_sub(b.evicted_unfetched),
        );
        v.put(
            p("evicted_active"),
            it.evicted_active.wrapping_sub(b.evicted_active),
        );
        v.put(
            p("crawler_reclaimed"),
            it.crawler_reclaimed.wrapping_sub(b.crawler_reclaimed),
        );
        v.put(p("crawler_items_checked"), 0);
        v.put(p("lrutail_reflocked"), 0);
        v.put(p("moves_to_cold"), 0);
        v.put(p("moves_to_warm"), 0);
        v.put(p("moves_within_lru"), 0);
        v.put(p("direct_reclaims"), 0);
        v.put(p("hits_to_hot"), 0);
        v.put(p("hits_to_warm"), 0);
        v.put(p("hits_to_cold"), hits);
        v.put(p("hits_to_temp"), 0);
    }
}

fn slabs(shared: &Shared, v: &mut Stats) {
    let st = shared.store.stats();
    let classes = class_totals(shared);
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
        for (what, n) in ClassStat::ALL.iter().zip(classes[usize::from(s.id)]) {
            v.put(p(what.name()), n);
        }
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
