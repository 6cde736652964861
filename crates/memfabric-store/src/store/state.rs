//! The shared state behind `Store` (`Inner`), its construction and teardown, and the
//! accessors the maintenance thread uses.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::arena::{Allocate, Arena};
use crate::clock::Clock;
use crate::config::StoreConfig;
use crate::index::{self, Index};
use crate::item::{Header, HDR};
use crate::pin_table::Pins;
use crate::slab::{self, Slabs};

use super::counters::Counters;
use super::grace::Grace;

/// The storage engine, shared by all worker threads (`Send + Sync`).
pub struct Store {
    pub(super) inner: Arc<Inner>,
    pub(super) maintenance: Option<std::thread::JoinHandle<()>>,
    /// The flash tier's writer thread, when there is a flash tier.
    pub(super) flash_writer: Option<std::thread::JoinHandle<()>>,
    /// Serializes `slabs reassign` requests (memcached answers BUSY to a second one).
    pub(super) reassigning: Mutex<()>,
}

/// The shared state behind `Store` (not nameable outside the crate).
#[doc(hidden)]
pub struct Inner {
    pub(crate) cfg: StoreConfig,
    pub(crate) clock: Clock,
    pub(crate) arena: Arena,
    pub(crate) index: Index,
    pub(crate) slabs: Slabs,
    pub(crate) grace: Grace,
    pub(crate) pins: Pins,
    pub(super) next_cas: AtomicU64,
    pub(crate) c: Counters,
    pub(super) sweep_cursor: AtomicUsize,
    pub(super) compacting: Mutex<()>,
    pub(super) shutdown: AtomicBool,
    /// The background sweeper runs (starts as `cfg.background_sweeper`; `lru_crawler
    /// enable|disable` switch it).
    pub(crate) sweeping: AtomicBool,
    /// Whether the maintenance thread moves pages between classes (`slabs automove`).
    pub(crate) automove: AtomicBool,
    pub(super) wake: (Mutex<bool>, Condvar),
    /// Requests arriving and whether the CPUs have time to spare (`Store::note_activity`,
    /// `Store::note_spin`; the maintenance thread's busy tick goes by it).
    pub(crate) activity: Activity,
    /// The flash tier (SSD), when configured.
    pub(crate) flash: Option<crate::flash::Flash>,
}

/// Flags on a cache line of their own: every worker reads them on each wake-up, and they
/// must not share a line with what every store writes (`next_cas`).
#[repr(align(64))]
pub(crate) struct Activity {
    /// Set by `Store::note_activity`, taken by the maintenance thread.
    pub(crate) seen: AtomicBool,
    /// Nanoseconds the workers spent polling for requests that had not come
    /// (`Store::note_spin`): CPU time that was spare before they took it.
    pub(crate) spin_ns: AtomicU64,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            seen: AtomicBool::new(false),
            spin_ns: AtomicU64::new(0),
        }
    }
}

impl std::ops::Deref for Store {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.wake_maintenance();
        if let Some(h) = self.maintenance.take() {
            let _ = h.join();
        }
        // The writer writes what is sealed and the page being filled, then ends.
        if let Some(f) = self.inner.flash.as_ref() {
            f.shutdown();
        }
        if let Some(h) = self.flash_writer.take() {
            let _ = h.join();
        }
    }
}

impl Store {
    /// Map the arena and build the index.
    pub fn new(config: StoreConfig) -> std::io::Result<Store> {
        Store::build(config, None)
    }

    /// Like `Store::new`, but the arena and the index (with its control block) live in
    /// memory from `alloc` (called twice: arena, then index).
    pub fn with_memory(config: StoreConfig, alloc: Allocate<'_>) -> std::io::Result<Store> {
        Store::build(config, Some(alloc))
    }

    fn build(config: StoreConfig, alloc: Option<Allocate<'_>>) -> std::io::Result<Store> {
        let mut cfg = config;
        cfg.page_size = cfg.page_size.clamp(64 << 10, 1 << 30).next_power_of_two();
        cfg.min_chunk = cfg.min_chunk.clamp(1, cfg.page_size / 4);
        let limit_pages = cfg.memory_limit.div_ceil(cfg.page_size).max(2);
        let max_chunk = (cfg.page_size / 2)
            .max(HDR + cfg.min_chunk + 8)
            .next_multiple_of(8);
        let sizes = slab::class_sizes(cfg.min_chunk, cfg.growth_factor, max_chunk);
        // Address space for `cache_memlimit` to grow into: twice the start limit. Untouched
        // pages of the mapping cost nothing (MAP_NORESERVE).
        let slabs = Slabs::new(cfg.page_size, limit_pages, limit_pages * 2, &sizes);
        let arena_len = slabs.total_pages * cfg.page_size;
        let arena = match alloc {
            Some(alloc) => Arena::with_memory(arena_len, alloc)?,
            None => Arena::new(arena_len)?,
        };
        let power = index_power(&slabs, cfg.hashpower);
        let seed = {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15
        };
        let index = Index::new_in(power, seed, alloc)?;
        let chunk_sizes: Vec<u32> = slabs.classes.iter().map(|c| c.size as u32).collect();
        index.init_control(&chunk_sizes, cfg.page_size, arena.len());
        let clock = Clock::new();
        index.ctl_now().store(clock.now(), Ordering::Release);
        let total_pages = slabs.total_pages;
        let flash = match cfg.flash.clone() {
            Some(f) => Some(crate::flash::Flash::open(f, cfg.page_size)?),
            None => None,
        };
        let inner = Arc::new(Inner {
            flash,
            clock,
            arena,
            index,
            slabs,
            grace: Grace::default(),
            pins: Pins::new(total_pages, cfg.page_size),
            next_cas: AtomicU64::new(0),
            c: Counters::default(),
            sweep_cursor: AtomicUsize::new(0),
            compacting: Mutex::new(()),
            shutdown: AtomicBool::new(false),
            sweeping: AtomicBool::new(cfg.background_sweeper),
            automove: AtomicBool::new(cfg.slab_automove),
            wake: (Mutex::new(false), Condvar::new()),
            activity: Activity::default(),
            cfg,
        });
        // Always running: besides sweeping and moving pages (if configured) it keeps the
        // control block's clock fresh for remote readers.
        let maintenance = {
            let m = inner.clone();
            Some(
                std::thread::Builder::new()
                    .name("mf-maintenance".into())
                    .spawn(move || m.maintenance_loop())?,
            )
        };
        inner.recover_flash();
        let flash_writer = match inner.flash {
            Some(_) => {
                let w = inner.clone();
                Some(
                    std::thread::Builder::new()
                        .name("mf-flash-writer".into())
                        .spawn(move || w.flash_writer_loop())?,
                )
            }
            None => None,
        };
        Ok(Store {
            inner,
            maintenance,
            flash_writer,
            reassigning: Mutex::new(()),
        })
    }

    /// A share of the internals, for handles that must not borrow the `Store`.
    pub(crate) fn shared(&self) -> Arc<Inner> {
        self.inner.clone()
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Whether the background sweeper (memcached's LRU crawler, to clients) runs.
    pub fn sweeping(&self) -> bool {
        self.sweeping.load(Ordering::Relaxed)
    }

    /// Starts (true) or stops the background sweeper; false if it already was so.
    /// Stopped, expired items are reclaimed only when a lookup or an eviction meets them.
    pub fn set_sweeping(&self, on: bool) -> bool {
        let changed = self.sweeping.swap(on, Ordering::Relaxed) != on;
        if changed && on {
            self.wake_maintenance();
        }
        changed
    }

    /// Whether slab pages move between classes by themselves (`slab_automove`).
    pub fn automove(&self) -> bool {
        self.automove.load(Ordering::Relaxed)
    }

    /// Turns the page mover on or off (memcached's `slabs automove 0|1|2`).
    pub fn set_automove(&self, on: bool) {
        self.automove.store(on, Ordering::Relaxed);
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Requests are arriving: the maintenance thread may keep its busy tick
    /// (`StoreConfig::busy_tick`). Cheap enough for every worker wake-up: a read, and a
    /// write only when the maintenance thread took the flag since.
    #[inline]
    pub fn note_activity(&self) {
        let flag = &self.activity.seen;
        if !flag.load(Ordering::Relaxed) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// A worker spent `spent` polling for requests that had not come yet: time the
    /// machine had to spare, which the maintenance thread's reading of the idle share
    /// counts as idle (else the workers' polling would stop the busy tick).
    pub fn note_spin(&self, spent: std::time::Duration) {
        let ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.activity.spin_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// log2 of the index's buckets: enough that the index is never what evicts within the
/// start memory limit. The most items the store can hold is every chunk of the smallest
/// class in that limit plus its reserve page; the index gets at least 9/4 as many slots
/// (a load of at most 0.44), and `free_slot`
/// balances the two buckets of a key. A simulation of that rule at 0.42 and 0.45 with
/// ten replacements per item overflowed a bucket pair 0 and 1 times in 30M inserts
/// (docs/store.md). The geometry is published to one-sided readers, so it is fixed at
/// start. `-o hashpower=N` is a lower bound, as in memcached.
///
/// Sized for the start limit, not for the twice as much `cache_memlimit` may grow it to:
/// the index costs ~21 bytes per smallest chunk, so room for the doubled limit would cost
/// ~43% of `-m` whether or not it is ever used. A cache grown past its start limit and
/// filled with its very smallest items can therefore have items evicted by the index
/// (counted in `evictions`); `-o hashpower=N` sizes it for more.
fn index_power(slabs: &Slabs, hashpower: Option<u8>) -> u32 {
    let smallest = slabs.classes.get(1).map_or(1, |c| c.per_page.max(1));
    let start_pages = slabs.limit_pages.load(std::sync::atomic::Ordering::Relaxed);
    let max_items = (start_pages + 1).saturating_mul(smallest);
    let buckets = max_items
        .saturating_mul(9)
        .div_ceil(4 * index::SLOTS)
        .clamp(1024, 1 << 32);
    let auto = buckets.next_power_of_two().trailing_zeros();
    auto.max(hashpower.map_or(0, |p| (p as u32).clamp(4, 32)))
}

impl Inner {
    pub(super) fn next_cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn wake_pair(&self) -> &(Mutex<bool>, Condvar) {
        &self.wake
    }

    pub(crate) fn shutdown_flag(&self) -> &AtomicBool {
        &self.shutdown
    }

    /// Where the sweeper continues when its last pass ran out of budget.
    pub(crate) fn sweep_cursor(&self) -> &AtomicUsize {
        &self.sweep_cursor
    }

    pub(crate) fn is_dead(&self, h: &Header, now: u32) -> bool {
        self.dead(h, now).is_some()
    }

    pub(crate) fn wake_maintenance(&self) {
        let (m, cv) = &self.wake;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_one();
    }
}
