//! The `Store`: lock-free reads, per-bucket locked writes, and the `Txn` API.
use crate::clock::Clock;
use crate::config::StoreConfig;

/// What a reader learns about an item besides its value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemInfo {
    /// Client flags (opaque 32 bits).
    pub flags: u32,
    /// CAS unique (0 when the store runs without CAS).
    pub cas: u64,
    /// Absolute expiry in server unix seconds; 0 = never.
    pub exptime: u32,
    /// Value length in bytes.
    pub value_len: u32,
    /// Server time of the last access (before this one).
    pub last_access: u32,
    /// Time the item was stored.
    pub time: u32,
    /// Whether the item had been fetched before this access.
    pub fetched: bool,
    /// Meta protocol: item was invalidated (`md I`, `ms I`) and is being served stale.
    pub stale: bool,
    /// Meta protocol: a recache "win" token has been handed out for this item.
    pub token_sent: bool,
    /// Meta protocol: the key was stored base64-encoded (`ms ... b`).
    pub key_binary: bool,
    /// Slab class holding the item.
    pub class_id: u8,
}

/// Options of a retrieval.
#[derive(Clone, Copy, Debug)]
pub struct GetOptions {
    /// `gat`/`gats`/`mg T`: set a new absolute exptime (0 = never) while fetching.
    pub touch: Option<u32>,
    /// Record the access (fetched bit, last-access time, eviction recency). Default on.
    pub bump: bool,
    /// Values longer than this are not copied: the header callback and the returned info
    /// still report the hit and its length, and the caller fetches the value another way
    /// (`get_pinned`, to send it from item memory). Default: no limit.
    pub copy_limit: usize,
}

impl Default for GetOptions {
    fn default() -> Self {
        GetOptions {
            touch: None,
            bump: true,
            copy_limit: usize::MAX,
        }
    }
}

/// How `Txn::link` stamps the new item.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkOptions {
    /// Use this CAS value instead of a fresh one (meta `E` flag).
    pub explicit_cas: Option<u64>,
    /// Mark the item stale (meta invalidation).
    pub stale: bool,
    /// Mark that a win token was already handed out.
    pub token_sent: bool,
}

/// Why an item could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Larger than `item_size_max` (memcached: "object too large for cache").
    #[error("object too large for cache")]
    TooLarge,
    /// No memory and eviction is off (`-M`) or found nothing to evict.
    #[error("out of memory storing object")]
    OutOfMemory,
}

/// Arguments of incr/decr beyond key and delta.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArithOptions {
    /// Compare-and-swap: 0 = unconditional.
    pub cas: u64,
    /// Create the item on a miss with (initial value, flags, absolute exptime): binary
    /// incr/decr with an exptime other than 0xffffffff, and meta `ma N`.
    pub create: Option<(u64, u32, u32)>,
}

/// The storage engine, shared by all worker threads (`Send + Sync`).
pub struct Store {
    inner: Arc<Inner>,
    maintenance: Option<std::thread::JoinHandle<()>>,
    /// Serializes `slabs reassign` requests (memcached answers BUSY to a second one).
    reassigning: Mutex<()>,
}

/// Outcome of `Store::slabs_reassign`, one per memcached reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReassignStatus {
    Ok,
    /// Another move is running, or no page of the source could be moved now.
    Busy,
    BadClass,
    NoSpare,
    Same,
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
    next_cas: AtomicU64,
    pub(crate) c: Counters,
    sweep_cursor: AtomicUsize,
    compacting: Mutex<()>,
    shutdown: AtomicBool,
    wake: (Mutex<bool>, Condvar),
}

#[derive(Default)]
pub(crate) struct Counters {
    curr_items: AtomicI64,
    total_items: AtomicU64,
    bytes: AtomicI64,
    evictions: AtomicU64,
    reclaimed: AtomicU64,
    expired_unfetched: AtomicU64,
    evicted_unfetched: AtomicU64,
    evicted_active: AtomicU64,
    get_expired: AtomicU64,
    get_flushed: AtomicU64,
    slabs_moved: AtomicU64,
    slab_reassign_evictions: AtomicU64,
    crawler_reclaimed: AtomicU64,
    outofmemory: AtomicU64,
    index_evictions: AtomicU64,
    remote_hints: AtomicU64,
    remote_hints_rejected: AtomicU64,
}

/// Why an item is being removed (for the counters).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// Deleted or replaced by a client.
    Client,
    /// Dead (expired or flushed) and found by a lookup of its key (any command): the
    /// lookup counts `get_expired` / `get_flushed`, as memcached's `do_item_get` does;
    /// nothing else counts it.
    Lookup,
    /// Dead and found while looking for memory (the evictor, a full index bucket), or by
    /// the background sweeper: `reclaimed` (and `expired_unfetched` if never fetched),
    /// as memcached counts what its LRU tail pulls reclaim.
    Reclaimed,
    /// Evicted for space from the front of its class's queue.
    Evicted,
    /// Evicted because both index buckets of a new key were full.
    IndexFull,
    /// Evicted because its page moves to another class.
    PageMove,
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
        let inner = Arc::new(Inner {
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
            wake: (Mutex::new(false), Condvar::new()),
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
        Ok(Store {
            inner,
            maintenance,
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

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Look up `key`. On a hit, calls `header(info, out)` (so the caller can write a reply
    /// header that needs the length) and then appends the value to `out`. A torn read is
    /// retried internally, truncating `out` back first, so `header` may run more than
    /// once. Returns the item's info as it was before this access (fetched / last-access).
    pub fn get_into(
        &self,
        key: &[u8],
        opts: &GetOptions,
        out: &mut Vec<u8>,
        mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> Option<ItemInfo> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        if opts.touch.is_some() {
            return self.get_locked(key, opts, out, header);
        }
        let start = out.len();
        let _guard = self.grace.enter();
        let kh = self.index.hash(key);
        for _ in 0..OPTIMISTIC_TRIES {
            match self.try_read(key, &kh, out, start, opts.copy_limit, &mut header) {
                ReadOutcome::Hit(info, off) => {
                    if opts.bump {
                        self.touch_access(off);
                    }
                    return Some(info);
                }
                ReadOutcome::Miss => return None,
                ReadOutcome::Dead(off, flushed) => {
                    self.count_dead_lookup(flushed);
                    self.reclaim_if_dead(&kh, off);
                    return None;
                }
                ReadOutcome::Retry => {
                    out.truncate(start);
                    std::hint::spin_loop();
                }
            }
        }
        // A key written continuously: read it under its lock instead of spinning forever.
        out.truncate(start);
        self.get_locked(key, opts, out, header)
    }

    /// A read under the key's bucket locks (touching reads, and reads that lost too many
    /// races with writers).
    fn get_locked(
        &self,
        key: &[u8],
        opts: &GetOptions,
        out: &mut Vec<u8>,
        mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> Option<ItemInfo> {
        self.transact(key, |t| {
            let info = t.item()?;
            if let Some(exptime) = opts.touch {
                t.set_exptime(exptime);
            }
            header(&info, out);
            if info.value_len as usize <= opts.copy_limit {
                t.read_value(out);
            }
            if opts.bump {
                t.mark_fetched();
            }
            Some(info)
        })
    }

    /// A hit's value handed to `f` in place (slices of item memory, under the key's
    /// bucket locks for the duration of the call), for callers that copy it onward
    /// anyway (a network send): one copy fewer than `get_into`. Records no access.
    pub fn with_locked_value<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&ItemInfo, &[&[u8]]) -> R,
    ) -> Option<R> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        self.transact(key, |t| {
            let info = t.item()?;
            t.with_value_slices(|s| f(&info, s))
        })
    }

    /// `get_into` without a header.
    pub fn get(&self, key: &[u8], opts: &GetOptions, out: &mut Vec<u8>) -> Option<ItemInfo> {
        self.get_into(key, opts, out, |_, _| {})
    }

    /// Would memcached 1.6 reject an item of this shape as "object too large for cache"?
    pub fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.inner.too_large(key_len, value_len, flags)
    }

    /// The size memcached 1.6 gives an item of this shape (meta `me` prints it, and the
    /// `-I` limit is checked against it).
    pub fn memcached_item_size(&self, key_len: usize, value_len: usize, flags: u32) -> usize {
        self.inner.memcached_item_size(key_len, value_len, flags)
    }

    /// The slab class a new item of this shape is allocated in (None if none holds it).
    /// memcached counts a storage command's `cmd_set` against the class of the item
    /// holding the request's data, whatever the command then does with it.
    pub fn item_class(&self, key_len: usize, value_len: usize) -> Option<u8> {
        let inner: &Inner = &self.inner;
        let max_chunk = inner.slabs.max_chunk();
        // The same layout as `alloc_item`: a value too large for one chunk is chained
        // and its head holds the key and the chain table.
        let head_size = if HDR + key_len + value_len > max_chunk {
            let nchain = value_len.div_ceil(max_chunk.checked_sub(HDR)?.max(1));
            (HDR + key_len).next_multiple_of(8) + 8 * nchain
        } else {
            HDR + key_len + value_len
        };
        inner.slabs.class_for(head_size)
    }

    /// Metadata only (no value copy, no access recorded).
    pub fn peek(&self, key: &[u8]) -> Option<ItemInfo> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        self.transact(key, |t| t.item())
    }

    /// Allocate an unlinked item for `key` with room for `value_len` bytes. Fill it with
    /// `NewItem::write`, then `Txn::link` it (or drop it to free it).
    pub fn alloc(
        &self,
        key: &[u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'_>, AllocError> {
        let inner: &Inner = &self.inner;
        inner.alloc_item(Owner::Borrowed(inner), key, value_len, flags, exptime)
    }

    /// Run `f` with `key`'s index buckets locked against other writers (readers never
    /// wait). Keep `f` short; it may allocate. Inside `f`, use only the `Txn`: calling
    /// another locking `Store` method for the same key would deadlock.
    pub fn transact<'s, R>(&'s self, key: &[u8], f: impl FnOnce(&mut Txn<'s>) -> R) -> R {
        let inner: &Inner = &self.inner;
        let kh = inner.index.hash(key);
        let mut key_buf = [0u8; KEY_MAX_LEN];
        let key_len = key.len().min(KEY_MAX_LEN);
        key_buf[..key_len].copy_from_slice(&key[..key_len]);
        inner.index.lock_pair(&kh);
        let mut t = Txn {
            inner,
            key_buf,
            key_len,
            kh,
            cur: None,
            to_free: Vec::new(),
        };
        t.cur = t.find_live();
        let r = f(&mut t);
        inner.index.unlock_pair(&kh);
        let to_free = std::mem::take(&mut t.to_free);
        for off in to_free {
            inner.free_item(off);
        }
        r
    }

    /// Invalidate every item stored up to now (`at` = None) or up to absolute time `at`.
    /// Both words live in the index's control block, where remote readers see them.
    pub fn flush_all(&self, at: Option<u32>) {
        let now = self.clock.now();
        self.refresh_remote_clock(now);
        match at {
            Some(t) if t > now => {
                // memcached: items stored before the flush time die when it comes.
                self.index.flush_time().store(t - 1, Ordering::SeqCst);
                self.slabs.all_due(t - 1);
            }
            _ => {
                let c = self.next_cas.fetch_add(1, Ordering::SeqCst) + 1;
                self.index.flush_cas().store(c, Ordering::SeqCst);
                self.index.flush_time().store(0, Ordering::SeqCst);
                self.slabs.all_due(now);
                // Reclaim at once, as memcached's LRU maintainer does (within a second).
                self.wake_maintenance();
            }
        }
    }

    /// Reclaim every dead (expired or flushed) item now, as the maintenance thread does
    /// in the background within a tick of their death (memcached's LRU maintainer does
    /// the same within about a second). Returns how many items it removed; they count
    /// as `reclaimed` (and `expired_unfetched` if never fetched).
    pub fn reclaim_dead(&self) -> usize {
        self.inner.sweep_due(usize::MAX).0
    }

    /// The xxh3-64 seed of the index hash (also in the control block).
    pub fn hash_seed(&self) -> u64 {
        self.index.seed()
    }

    /// A copy of the index's control block (`remote` describes the layout), read field
    /// by field with atomic loads.
    pub fn control_block(&self) -> Vec<u8> {
        self.index.control_block()
    }

    /// Arena offset and header `seq` of `key`'s live item, as a one-sided reader would
    /// find them (tests and diagnostics; takes the key's bucket locks).
    pub fn item_location(&self, key: &[u8]) -> Option<(u64, u32)> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        let a = &self.arena;
        self.transact(key, |t| {
            let off = t.current_off()?;
            Some((off as u64, item::read_header(a, off).seq))
        })
    }

    /// A remote reader read the item at arena offset `off` whose header seq was `seq`.
    /// Marks it referenced/fetched and bumps its atime exactly like a local GET does, if
    /// and only if `off` is the start of a chunk of a carved page (page's class, chunk
    /// boundary), the chunk is LINKED (the index points at it) and its seq is still
    /// `seq`. Untrusted input: any `off`/`seq` is answered with false, never a panic,
    /// never a write anywhere else. Lock-free (no bucket or class lock).
    pub fn note_remote_access(&self, off: u64, seq: u32) -> bool {
        let guard = self.grace.enter();
        let ok = self.inner.remote_access(&guard, off, seq);
        let c = if ok {
            &self.c.remote_hints
        } else {
            &self.c.remote_hints_rejected
        };
        c.fetch_add(1, Ordering::Relaxed);
        ok
    }

    /// `note_remote_access` for a batch of (offset, seq) hints, inside one grace period
    /// (cheaper per hint). Returns how many were accepted.
    pub fn note_remote_accesses(&self, hints: &[(u64, u32)]) -> usize {
        let guard = self.grace.enter();
        let ok = hints
            .iter()
            .filter(|&&(off, seq)| self.inner.remote_access(&guard, off, seq))
            .count();
        self.c.remote_hints.fetch_add(ok as u64, Ordering::Relaxed);
        self.c
            .remote_hints_rejected
            .fetch_add((hints.len() - ok) as u64, Ordering::Relaxed);
        ok
    }

    /// `cache_memlimit`: change the memory limit at run time. Growing is possible up to
    /// twice the limit the store started with (the arena's reserved address space);
    /// shrinking stops new pages from being taken (pages in use stay). Returns false
    /// when the new limit does not fit.
    pub fn set_memory_limit(&self, bytes: usize) -> bool {
        let pages = bytes.div_ceil(self.slabs.page_size).max(2);
        if pages > self.slabs.max_limit_pages {
            return false;
        }
        self.slabs.limit_pages.store(pages, Ordering::Relaxed);
        true
    }

    /// `slabs reassign <src> <dst>`: move one page from class `src` (-1 = any class with
    /// a spare page) to class `dst` (0 = the unassigned pool), evicting its items.
    pub fn slabs_reassign(&self, src: i32, dst: i32) -> ReassignStatus {
        let largest = (self.slabs.classes.len() - 1) as i32;
        if src == dst {
            return ReassignStatus::Same;
        }
        let src = if src == -1 {
            // The class with the most pages, as memcached's "pick any" prefers a donor
            // that can spare one.
            (1..=largest)
                .filter(|&c| c != dst)
                .max_by_key(|&c| self.slabs.lock(c as u8).pages.len())
                .unwrap_or(-1)
        } else {
            src
        };
        if !(1..=largest).contains(&src) || !(0..=largest).contains(&dst) {
            return ReassignStatus::BadClass;
        }
        if self.slabs.lock(src as u8).pages.len() < 2 {
            return ReassignStatus::NoSpare;
        }
        let _one_at_a_time = match self.reassigning.try_lock() {
            Ok(g) => g,
            Err(_) => return ReassignStatus::Busy,
        };
        if self.inner.move_page(src as u8, dst as u8) {
            ReassignStatus::Ok
        } else {
            ReassignStatus::Busy
        }
    }

    /// `stats cachedump <class> <limit>`: up to `limit` live items of a class (0 = as
    /// many as fit in 2 MB of output, like memcached), as (key, value length, exptime).
    pub fn cachedump(&self, class: u8, limit: usize) -> Vec<(Vec<u8>, u32, u32)> {
        let Some(ci) = self.slabs.classes.get(class as usize).copied() else {
            return Vec::new();
        };
        if class == 0 {
            return Vec::new();
        }
        let now = self.clock.now();
        let st = self.slabs.lock(class);
        let mut v = Vec::new();
        let mut bytes = 0;
        'pages: for &p in &st.pages {
            for i in 0..ci.per_page {
                let off = self.slabs.chunk_off(&ci, p, i);
                if item::state(&self.arena, off) != item::LINKED {
                    continue;
                }
                let h = item::read_header(&self.arena, off);
                if self.dead(&h, now).is_some() {
                    continue;
                }
                let mut key = vec![0u8; h.key_len as usize];
                self.arena.read(item::key_off(off), &mut key);
                bytes += key.len() + 40;
                v.push((key, h.value_len, h.exptime));
                if (limit != 0 && v.len() >= limit) || bytes > (2 << 20) - 1024 {
                    break 'pages;
                }
            }
        }
        v
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.c;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            curr_items: c.curr_items.load(Ordering::Relaxed).max(0) as u64,
            total_items: r(&c.total_items),
            bytes: c.bytes.load(Ordering::Relaxed).max(0) as u64,
            evictions: r(&c.evictions),
            reclaimed: r(&c.reclaimed),
            expired_unfetched: r(&c.expired_unfetched),
            evicted_unfetched: r(&c.evicted_unfetched),
            evicted_active: r(&c.evicted_active),
            get_expired: r(&c.get_expired),
            get_flushed: r(&c.get_flushed),
            limit_maxbytes: (self.slabs.limit_pages.load(Ordering::Relaxed) * self.slabs.page_size)
                as u64,
            total_malloced: self.slabs.pages_used.load(Ordering::Relaxed)
                * self.slabs.page_size as u64,
            slabs_moved: r(&c.slabs_moved),
            slab_reassign_evictions: r(&c.slab_reassign_evictions),
            crawler_reclaimed: r(&c.crawler_reclaimed),
            hash_power_level: self.index.power(),
            hash_bytes: self.index.bytes() as u64,
            outofmemory: r(&c.outofmemory),
            index_evictions: r(&c.index_evictions),
            malloc_fails: 0,
            remote_hints: r(&c.remote_hints),
            remote_hints_rejected: r(&c.remote_hints_rejected),
        }
    }

    pub fn slab_stats(&self) -> Vec<SlabClassStats> {
        let mut v = Vec::new();
        for ci in &self.slabs.classes[1..] {
            let st = self.slabs.lock(ci.id);
            if st.pages.is_empty() {
                continue;
            }
            let total = (st.pages.len() * ci.per_page) as u64;
            let free = st.free.len() as u64;
            v.push(SlabClassStats {
                id: ci.id,
                chunk_size: ci.size as u32,
                chunks_per_page: ci.per_page as u32,
                total_pages: st.pages.len() as u64,
                total_chunks: total,
                used_chunks: total - free.min(total),
                free_chunks: free,
                mem_requested: self.slabs.counters[ci.id as usize]
                    .requested
                    .load(Ordering::Relaxed),
            });
        }
        v
    }

    pub fn item_stats(&self) -> Vec<ItemClassStats> {
        let now = self.clock.now();
        let mut v = Vec::new();
        for ci in &self.slabs.classes[1..] {
            let k = &self.slabs.counters[ci.id as usize];
            let number = k.items.load(Ordering::Relaxed);
            let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
            if number == 0 && r(&k.evicted) == 0 && r(&k.outofmemory) == 0 {
                continue;
            }
            v.push(ItemClassStats {
                id: ci.id,
                number,
                age: self.oldest_age(ci.id, now),
                evicted: r(&k.evicted),
                evicted_nonzero: r(&k.evicted_nonzero),
                evicted_time: r(&k.evicted_time),
                outofmemory: r(&k.outofmemory),
                reclaimed: r(&k.reclaimed),
                expired_unfetched: r(&k.expired_unfetched),
                evicted_unfetched: r(&k.evicted_unfetched),
                evicted_active: r(&k.evicted_active),
                crawler_reclaimed: r(&k.crawler_reclaimed),
            });
        }
        v
    }
}

/// A new key stays in its first bucket while that has this many empty slots.
const FIRST_BUCKET_SPARE: usize = 3;

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

/// Bounded optimistic attempts before a read takes the key's lock.
const OPTIMISTIC_TRIES: usize = 64;

enum ReadOutcome {
    Hit(ItemInfo, usize),
    Miss,
    /// Found but expired or flushed (`true` = flushed).
    Dead(usize, bool),
    Retry,
}

impl Inner {
    fn next_cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A lookup of a key found its item dead (memcached's `do_item_get` counts this for
    /// every command that looks a key up, stores included).
    fn count_dead_lookup(&self, flushed: bool) {
        let c = if flushed {
            &self.c.get_flushed
        } else {
            &self.c.get_expired
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Is an item with this header dead (expired or flushed) at `now`?
    fn dead(&self, h: &Header, now: u32) -> Option<bool> {
        if h.exptime != 0 && h.exptime <= now {
            return Some(false);
        }
        let fc = self.index.flush_cas().load(Ordering::Relaxed);
        if fc != 0 && h.cas < fc {
            return Some(true);
        }
        let ft = self.index.flush_time().load(Ordering::Relaxed);
        if ft != 0 && ft <= now && h.time <= ft {
            return Some(true);
        }
        None
    }

    fn info(&self, h: &Header) -> ItemInfo {
        ItemInfo {
            flags: h.flags,
            cas: if self.cfg.use_cas { h.cas } else { 0 },
            exptime: h.exptime,
            value_len: h.value_len,
            last_access: h.atime,
            time: h.time,
            fetched: h.iflags & item::F_FETCHED != 0,
            stale: h.iflags & item::F_STALE != 0,
            token_sent: h.iflags & item::F_TOKEN_SENT != 0,
            key_binary: h.iflags & item::F_KEY_BINARY != 0,
            class_id: h.class,
        }
    }

    /// Bytes an item occupies in memory (memcached's "bytes" counts item totals).
    fn item_total(&self, h: &Header) -> usize {
        if h.iflags & item::F_CHUNKED != 0 {
            let payload = self.slabs.max_chunk() - HDR;
            let n = (h.value_len as usize).div_ceil(payload);
            (HDR + h.key_len as usize).next_multiple_of(8) + 8 * n + h.value_len as usize
        } else {
            HDR + h.key_len as usize + h.value_len as usize
        }
    }

    /// One optimistic (lock-free) lookup. Never writes shared memory.
    fn try_read(
        &self,
        key: &[u8],
        kh: &KeyHash,
        out: &mut Vec<u8>,
        start: usize,
        copy_limit: usize,
        header: &mut impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> ReadOutcome {
        let a = &self.arena;
        for b in [kh.b1, kh.b2] {
            let v = self.index.read_begin(b);
            for i in 0..index::SLOTS {
                let Some(slot) = self.index.slot(b, i) else {
                    continue;
                };
                if slot.tag != kh.tag {
                    continue;
                }
                let off = slot.off;
                let Some(cls) = self.slabs.classes.get(slot.class as usize).copied() else {
                    return ReadOutcome::Retry;
                };
                if !off.is_multiple_of(8) || off.saturating_add(cls.size) > a.len() {
                    return ReadOutcome::Retry;
                }
                let h = item::read_header(a, off);
                if h.seq & 1 == 1 || h.state != item::LINKED {
                    return ReadOutcome::Retry;
                }
                if h.key_len as usize != key.len() || !a.eq(item::key_off(off), key) {
                    // A tag collision, or the slot changed under us: re-check the bucket.
                    if !self.index.read_validate(b, v) {
                        return ReadOutcome::Retry;
                    }
                    continue;
                }
                let now = self.clock.now();
                if let Some(flushed) = self.dead(&h, now) {
                    if !self.validate(off, h.seq, b, v) {
                        return ReadOutcome::Retry;
                    }
                    return ReadOutcome::Dead(off, flushed);
                }
                let info = self.info(&h);
                out.truncate(start);
                header(&info, out);
                let copied =
                    h.value_len as usize > copy_limit || self.copy_value(off, &h, cls.size, out);
                if !copied || !self.validate(off, h.seq, b, v) {
                    return ReadOutcome::Retry;
                }
                return ReadOutcome::Hit(info, off);
            }
            if !self.index.read_validate(b, v) {
                return ReadOutcome::Retry;
            }
        }
        ReadOutcome::Miss
    }

    fn validate(&self, off: usize, seq: u32, b: usize, v: u32) -> bool {
        fence(Ordering::Acquire);
        self.arena
            .u32_at(off + item::OFF_SEQ)
            .load(Ordering::Relaxed)
            == seq
            && self.index.read_validate(b, v)
    }

    /// Copy an item's value (possibly chained) into `out` without trusting the header:
    /// every length and offset is bounds-checked; `false` means "inconsistent, retry".
    fn copy_value(&self, off: usize, h: &Header, chunk_size: usize, out: &mut Vec<u8>) -> bool {
        let a = &self.arena;
        let klen = h.key_len as usize;
        let vlen = h.value_len as usize;
        if h.iflags & item::F_CHUNKED == 0 {
            if HDR + klen + vlen > chunk_size {
                return false;
            }
            a.read_into(item::value_off(off, klen), vlen, out);
            return true;
        }
        let payload = self.slabs.max_chunk() - HDR;
        let n = vlen.div_ceil(payload);
        let table = item::chain_off(off, klen);
        if vlen > self.cfg.item_size_max.max(payload) || table + 8 * n > off + chunk_size {
            return false;
        }
        let mut left = vlen;
        for i in 0..n {
            let c = a.u64_at(table + 8 * i).load(Ordering::Relaxed) as usize;
            let take = left.min(payload);
            if !c.is_multiple_of(8) || c.saturating_add(HDR + take) > a.len() {
                return false;
            }
            a.read_into(c + HDR, take, out);
            left -= take;
        }
        true
    }

    /// Whether `touch_access(off)` would write nothing: both access flags set and the
    /// access time already this second. Only reads.
    fn access_already_noted(&self, off: usize) -> bool {
        let f = self.arena.u8_at(off + item::OFF_IFLAGS);
        let at = self.arena.u32_at(off + item::OFF_ATIME);
        f.load(Ordering::Relaxed) & item::F_ACCESSED == item::F_ACCESSED
            && at.load(Ordering::Relaxed) == self.clock.now()
    }

    /// Record an access: fetched + referenced bits and last-access time. Writes only
    /// atomic words that no validation depends on.
    fn touch_access(&self, off: usize) {
        let f = self.arena.u8_at(off + item::OFF_IFLAGS);
        if f.load(Ordering::Relaxed) & item::F_ACCESSED != item::F_ACCESSED {
            f.fetch_or(item::F_ACCESSED, Ordering::Relaxed);
        }
        let now = self.clock.now();
        let at = self.arena.u32_at(off + item::OFF_ATIME);
        if at.load(Ordering::Relaxed) != now {
            at.store(now, Ordering::Relaxed);
        }
    }

    /// Publish the store's clock in the control block (maintenance tick, flush_all).
    pub(crate) fn refresh_remote_clock(&self, now: u32) {
        let w = self.index.ctl_now();
        if w.load(Ordering::Relaxed) != now {
            w.store(now, Ordering::Release);
        }
    }

    /// `Store::note_remote_access` without the counters, inside the caller's grace period
    /// (`_in_grace`: a batch shares one).
    ///
    /// The access-bit write must obey the rule of the lock-free reader (`get_into`): it
    /// may only land on the header of an item that was linked *after* this thread entered
    /// the grace period. Then a page move that re-carves the item's page must have
    /// unlinked it after we entered, so its `synchronize` waits for us, and the chunk
    /// boundaries cannot shift under the write. "Linked after we entered" is proven as
    /// the local reader proves it: a slot of one of the key's buckets points at `off`,
    /// and both that bucket's version and the item's `seq` are unchanged across the
    /// checks. The cheap geometry checks (carved page, class, chunk boundary) come first
    /// so garbage is rejected without reading a key out of the middle of a value.
    fn remote_access(&self, _in_grace: &GraceGuard<'_>, off: u64, seq: u32) -> bool {
        if seq & 1 == 1 {
            return false;
        }
        let Ok(off) = usize::try_from(off) else {
            return false;
        };
        let a = &self.arena;
        if off >= a.len() {
            return false;
        }
        let class = self.slabs.class_of(off);
        let Some(ci) = self.slabs.classes.get(class as usize).copied() else {
            return false;
        };
        if class == 0 || ci.size < HDR {
            return false;
        }
        let in_page = off % self.slabs.page_size;
        if !in_page.is_multiple_of(ci.size) || in_page / ci.size >= ci.per_page {
            return false;
        }
        // The chunk lies inside its page, which lies inside the arena.
        if off + ci.size > a.len() {
            return false;
        }
        let h = item::read_header(a, off);
        if h.seq != seq || h.state != item::LINKED || h.class != class {
            return false;
        }
        if self.access_already_noted(off) {
            // The hint would change nothing: no write, so none of the checks below that
            // guard it (the key's buckets, validation). A hot item read one-sidedly
            // again and again costs its server one header read per hint.
            return true;
        }
        let klen = h.key_len as usize;
        if klen == 0 || klen > KEY_MAX_LEN || HDR + klen > ci.size {
            return false;
        }
        let mut key = [0u8; KEY_MAX_LEN];
        a.read(item::key_off(off), &mut key[..klen]);
        let kh = self.index.hash(&key[..klen]);
        for b in [kh.b1, kh.b2] {
            let v = self.index.read_begin(b);
            let points_here = (0..index::SLOTS).any(|i| {
                self.index
                    .slot(b, i)
                    .is_some_and(|s| s.off == off && s.tag == kh.tag && s.class == class)
            });
            if points_here {
                // Linked (the bucket did not change while we looked) and the header is
                // the one we checked (seq unchanged): record the access.
                if !self.validate(off, seq, b, v) {
                    return false;
                }
                self.touch_access(off);
                return true;
            }
        }
        false
    }

    /// A reader met a dead item: remove it if its buckets are free right now.
    fn reclaim_if_dead(&self, kh: &KeyHash, off: usize) {
        if !self.index.try_lock_pair(kh) {
            return;
        }
        let mut freed = None;
        if let Some((b, i)) = self.slot_pointing_at(kh, off) {
            let h = item::read_header(&self.arena, off);
            if h.state == item::LINKED && self.dead(&h, self.clock.now()).is_some() {
                self.unlink_at(b, i, off, Removal::Lookup);
                freed = Some(off);
            }
        }
        self.index.unlock_pair(kh);
        if let Some(off) = freed {
            self.free_item(off);
        }
    }

    fn slot_pointing_at(&self, kh: &KeyHash, off: usize) -> Option<(usize, usize)> {
        for b in [kh.b1, kh.b2] {
            for i in 0..index::SLOTS {
                if self.index.slot(b, i).is_some_and(|s| s.off == off) {
                    return Some((b, i));
                }
            }
        }
        None
    }

    /// Remove slot (b, i) which points at the live item `off` (bucket lock held). The
    /// caller frees the item afterwards.
    fn unlink_at(&self, b: usize, i: usize, off: usize, why: Removal) {
        let h = item::read_header(&self.arena, off);
        self.index.set_slot(b, i, None);
        item::set_state(&self.arena, off, item::UNLINKED);
        self.account(&h, -1);
        let k = &self.slabs.counters[h.class as usize];
        let fetched = h.iflags & item::F_FETCHED != 0;
        match why {
            Removal::Client | Removal::Lookup => {}
            Removal::Reclaimed => {
                self.c.reclaimed.fetch_add(1, Ordering::Relaxed);
                k.reclaimed.fetch_add(1, Ordering::Relaxed);
                if !fetched {
                    self.c.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                    k.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                }
            }
            Removal::Evicted | Removal::IndexFull | Removal::PageMove => {
                let now = self.clock.now();
                self.c.evictions.fetch_add(1, Ordering::Relaxed);
                k.evicted.fetch_add(1, Ordering::Relaxed);
                k.evicted_time.store(
                    now.saturating_sub(h.atime.max(h.time)) as u64,
                    Ordering::Relaxed,
                );
                if h.exptime != 0 {
                    k.evicted_nonzero.fetch_add(1, Ordering::Relaxed);
                }
                if !fetched {
                    self.c.evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                    k.evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                }
                if h.atime >= now.saturating_sub(60) && fetched {
                    self.c.evicted_active.fetch_add(1, Ordering::Relaxed);
                    k.evicted_active.fetch_add(1, Ordering::Relaxed);
                }
                match why {
                    Removal::IndexFull => {
                        self.c.index_evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    Removal::PageMove => {
                        self.c
                            .slab_reassign_evictions
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Link the filled item `off` into slot (b, i) (bucket lock held).
    fn link_at(&self, b: usize, i: usize, off: usize, tag: u16, stored: bool) {
        let h = item::read_header(&self.arena, off);
        item::set_state(&self.arena, off, item::LINKED);
        let class = self.slabs.class_of(off);
        self.index
            .set_slot(b, i, Some(index::Slot { tag, class, off }));
        if stored {
            self.c.total_items.fetch_add(1, Ordering::Relaxed);
        }
        if h.exptime != 0 {
            self.slabs.note_due(off, h.exptime);
        }
        self.queue_push(off, &h);
        self.account(&h, 1);
    }

    /// Item and byte counts, store-wide and per class, for an item entering (+1) or
    /// leaving (-1) the index.
    fn account(&self, h: &Header, sign: i64) {
        let total = self.item_total(h) as i64;
        self.c.curr_items.fetch_add(sign, Ordering::Relaxed);
        self.c.bytes.fetch_add(sign * total, Ordering::Relaxed);
        let k = &self.slabs.counters[h.class as usize];
        k.items.fetch_add(sign as u64, Ordering::Relaxed);
        k.requested
            .fetch_add((sign * total) as u64, Ordering::Relaxed);
    }

    // ----- allocation ---------------------------------------------------------------

    /// Would memcached 1.6 call this item too large? Its header, key + NUL, value + CRLF,
    /// the flags suffix and the CAS field count against `-I`; matching that exactly keeps
    /// the too-large boundary identical for clients.
    pub(crate) fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.memcached_item_size(key_len, value_len, flags) > self.cfg.item_size_max
    }

    fn memcached_item_size(&self, key_len: usize, value_len: usize, flags: u32) -> usize {
        48 + key_len
            + 1
            + if flags != 0 { 4 } else { 0 }
            + value_len.saturating_add(2)
            + if self.cfg.use_cas { 8 } else { 0 }
    }

    /// Allocate an item owned by `owner`, which must be (or point at) `self`.
    pub(crate) fn alloc_item<'s>(
        &self,
        owner: Owner<'s>,
        key: &[u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'s>, AllocError> {
        debug_assert!(std::ptr::eq(&*owner, self));
        if key.is_empty() || key.len() > KEY_MAX_LEN || value_len > u32::MAX as usize - 8 {
            return Err(AllocError::TooLarge);
        }
        if self.too_large(key.len(), value_len, flags) {
            return Err(AllocError::TooLarge);
        }
        let klen = key.len();
        let max_chunk = self.slabs.max_chunk();
        let chunked = HDR + klen + value_len > max_chunk;
        let payload = max_chunk - HDR;
        let nchain = if chunked {
            value_len.div_ceil(payload)
        } else {
            0
        };
        let head_size = if chunked {
            (HDR + klen).next_multiple_of(8) + 8 * nchain
        } else {
            HDR + klen + value_len
        };
        let class = self
            .slabs
            .class_for(head_size)
            .ok_or(AllocError::TooLarge)?;
        let head = self.alloc_chunk(class)?;
        let mut it = NewItem {
            owner,
            off: head,
            chain: Vec::new(),
            value_len,
            key_len: klen,
        };
        let a = &self.arena;
        item::write_fields(
            a,
            head,
            &Header {
                class,
                key_len: klen as u8,
                value_len: value_len as u32,
                flags,
                exptime,
                ..Header::default()
            },
        );
        a.u8_at(head + item::OFF_IFLAGS)
            .store(if chunked { item::F_CHUNKED } else { 0 }, Ordering::Relaxed);
        a.u32_at(head + item::OFF_ATIME)
            .store(self.clock.now(), Ordering::Relaxed);
        a.write(item::key_off(head), key);
        if chunked {
            let table = item::chain_off(head, klen);
            let mut left = value_len;
            for i in 0..nchain {
                let take = left.min(payload);
                let cls = self
                    .slabs
                    .class_for(HDR + take)
                    .ok_or(AllocError::TooLarge)?;
                // On failure `it` drops and frees what was taken so far.
                let c = self.alloc_chunk(cls)?;
                it.chain.push(c);
                item::write_fields(
                    a,
                    c,
                    &Header {
                        class: cls,
                        value_len: take as u32,
                        cas: head as u64,
                        ..Header::default()
                    },
                );
                a.u8_at(c + item::OFF_IFLAGS).store(0, Ordering::Relaxed);
                item::set_state(a, c, item::CHAINED);
                item::seq_end(a, c);
                a.u64_at(table + 8 * i).store(c as u64, Ordering::Relaxed);
                left -= take;
            }
        }
        Ok(it)
    }

    /// Take a chunk of `class`: free list, then a fresh page, then eviction. The chunk is
    /// returned ALLOCATED with an odd seq (readers holding a stale pointer to it retry).
    fn alloc_chunk(&self, class: u8) -> Result<usize, AllocError> {
        let ci = self.slabs.classes[class as usize];
        let mut deferred = Vec::new();
        let got = {
            let mut st = self.slabs.lock(class);
            let mut got = st.free.pop();
            if got.is_none() {
                if let Some(page) = self.slabs.take_page(!st.pages.is_empty()) {
                    self.carve(&ci, &mut st, page);
                    got = st.free.pop();
                }
            }
            if got.is_none() && self.cfg.evict {
                got = self.evict_one(&ci, &mut st, &mut deferred);
            }
            if let Some(off) = got {
                item::set_state(&self.arena, off, item::ALLOCATED);
                item::seq_begin(&self.arena, off);
            }
            got
        };
        for off in deferred {
            self.free_chunk(off);
        }
        match got {
            Some(off) => Ok(off),
            None => {
                self.c.outofmemory.fetch_add(1, Ordering::Relaxed);
                self.slabs.counters[class as usize]
                    .outofmemory
                    .fetch_add(1, Ordering::Relaxed);
                self.wake_maintenance();
                Err(AllocError::OutOfMemory)
            }
        }
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

    pub(crate) fn count_page_move(&self) {
        self.c.slabs_moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Remove the item at `off` if it is still linked (and, for the sweeper, still dead),
    /// waiting for its bucket locks. Call with no class lock held.
    pub(crate) fn remove_at_location(&self, off: usize, swept: bool) -> bool {
        let a = &self.arena;
        let Some(kh) = self.key_hash_at(off) else {
            return false;
        };
        self.index.lock_pair(&kh);
        let mut removed = false;
        if let Some((b, i)) = self.slot_pointing_at(&kh, off) {
            let h = item::read_header(a, off);
            if h.state == item::LINKED && (!swept || self.is_dead(&h, self.clock.now())) {
                self.unlink_at(
                    b,
                    i,
                    off,
                    if swept {
                        Removal::Reclaimed
                    } else {
                        Removal::PageMove
                    },
                );
                removed = true;
            }
        }
        self.index.unlock_pair(&kh);
        if removed {
            self.free_item(off);
        }
        removed
    }

    pub(crate) fn carve_page(&self, ci: &ClassInfo, st: &mut ClassState, page: u32) {
        self.carve(ci, st, page)
    }

    /// Give `page` to a class: mark every chunk boundary FREE and push the chunks.
    fn carve(&self, ci: &ClassInfo, st: &mut ClassState, page: u32) {
        for i in (0..ci.per_page).rev() {
            let off = self.slabs.chunk_off(ci, page, i);
            item::set_state(&self.arena, off, item::FREE);
            let s = self.arena.u32_at(off + item::OFF_SEQ);
            let v = s.load(Ordering::Relaxed);
            s.store(v.wrapping_add(v & 1), Ordering::Relaxed);
            st.free.push(off);
        }
        self.slabs.page_draining[page as usize].store(false, Ordering::Relaxed);
        self.slabs.page_class[page as usize].store(ci.id, Ordering::Release);
        st.pages.push(page);
    }

    /// Evict from the front of the class's queue (class lock held): skip stale entries,
    /// give an item read since it was queued a second chance (back of the queue, bit
    /// cleared), reclaim a dead item, evict the first cold one. Buckets are only
    /// try-locked here, so a thread that holds a bucket lock and allocates can never
    /// deadlock with an evictor. Chunks of other classes freed on the way go to
    /// `deferred`.
    fn evict_one(
        &self,
        ci: &ClassInfo,
        st: &mut ClassState,
        deferred: &mut Vec<usize>,
    ) -> Option<usize> {
        let a = &self.arena;
        let now = self.clock.now();
        // Every entry at most twice (once more after a second chance), then give up:
        // with everything pinned or locked the allocation fails instead of spinning.
        for _ in 0..2 * st.queue.len() + 2 {
            let e = st.pop_entry()?;
            let Some((victim, h)) = self.queued_item(ci, e) else {
                continue;
            };
            let off = e.off();
            let dead = self.dead(&h, now).is_some();
            if !dead && h.iflags & item::F_REFERENCED != 0 {
                a.u8_at(victim + item::OFF_IFLAGS)
                    .fetch_and(!item::F_REFERENCED, Ordering::Relaxed);
                st.queue.push_back(e);
                continue;
            }
            let why = if dead {
                Removal::Reclaimed
            } else {
                Removal::Evicted
            };
            // A pinned item is being sent from: leave it (and its memory) alone.
            if self.pins.is_pinned(victim) || !self.unlink_by_location(victim, why) {
                st.queue.push_back(e);
                continue;
            }
            // Pinned between the check and the unlink: its last unpin frees it.
            if self.pins.defer_free(victim) {
                continue;
            }
            // The victim and its chain are ours now. Chunks of this class are reused or
            // pushed here (we hold its lock); others are freed by the caller.
            let mut mine = None;
            for c in self.item_chunks(victim) {
                if self.slabs.class_of(c) == ci.id {
                    item::set_state(a, c, item::FREE);
                    if c == off && mine.is_none() {
                        mine = Some(c);
                    } else {
                        st.free.push(c);
                    }
                } else {
                    deferred.push(c);
                }
            }
            if let Some(c) = mine {
                return Some(c);
            }
            if let Some(c) = st.free.pop() {
                return Some(c);
            }
        }
        None
    }

    /// The linked item a queue entry of class `ci` names, with its head's header, or
    /// None if the entry is stale (chunk freed, reused, re-carved; item replaced).
    fn queued_item(&self, ci: &ClassInfo, e: QueueEntry) -> Option<(usize, Header)> {
        let a = &self.arena;
        let off = e.off();
        if off >= a.len()
            || self.slabs.class_of(off) != ci.id
            || !(off % self.slabs.page_size).is_multiple_of(ci.size)
        {
            return None;
        }
        let head = match item::state(a, off) {
            item::LINKED => off,
            // Part of a large item: the entry stands for the item that owns it.
            item::CHAINED => {
                let head = a.u64_at(off + item::OFF_CAS).load(Ordering::Relaxed) as usize;
                if !head.is_multiple_of(8)
                    || head + HDR > a.len()
                    || item::state(a, head) != item::LINKED
                {
                    return None;
                }
                head
            }
            _ => return None,
        };
        let h = item::read_header(a, head);
        (e.cas_matches(h.cas) && (head != off || h.class == ci.id)).then_some((head, h))
    }

    /// Queue a just-linked (or re-CASed) item for eviction: its head in the head's
    /// class, and for a chained item its first chunk in each class of its chain. Takes
    /// class locks (bucket lock -> class lock is the allowed order).
    fn queue_push(&self, head: usize, h: &Header) {
        if h.iflags & item::F_CHUNKED == 0 {
            // The common case: one chunk, no chain table to read (and no Vec per SET).
            let class = self.slabs.class_of(head);
            if class != 0 {
                self.slabs
                    .lock(class)
                    .queue
                    .push_back(QueueEntry::new(head, h.cas));
            }
            return;
        }
        let mut done: [u8; 3] = [0; 3];
        for c in self.item_chunks(head) {
            let class = self.slabs.class_of(c);
            if class == 0 || done.contains(&class) {
                continue;
            }
            if let Some(slot) = done.iter_mut().find(|d| **d == 0) {
                *slot = class;
            }
            self.slabs
                .lock(class)
                .queue
                .push_back(QueueEntry::new(c, h.cas));
        }
    }

    /// Drop the stale entries of every class queue past its threshold (maintenance
    /// thread). The checks run without the class lock, on a copy: writers and evictors
    /// go on meanwhile, and since they only pop the front and push the back, the queue
    /// afterwards is the copy minus what was popped, then what was pushed. (An entry
    /// once stale stays stale: its chunk's item was unlinked or re-CASed, and a newer
    /// entry names whatever the chunk holds now.) `force`: every queue, past its
    /// threshold or not. Returns the entries dropped.
    pub(crate) fn compact_queues(&self, force: bool) -> usize {
        // One compaction at a time: a second one would reconcile against a queue whose
        // middle the first has changed.
        let _one = self.compacting.lock().unwrap_or_else(|e| e.into_inner());
        let mut dropped = 0;
        for ci in &self.slabs.classes[1..] {
            let (copy, popped) = {
                let st = self.slabs.lock(ci.id);
                if st.queue.is_empty()
                    || (!force && st.queue.len() < st.compact_threshold(ci.per_page))
                {
                    continue;
                }
                (st.queue.iter().copied().collect::<Vec<_>>(), st.popped)
            };
            let live: Vec<bool> = copy
                .iter()
                .map(|&e| self.queued_item(ci, e).is_some())
                .collect();
            let mut st = self.slabs.lock(ci.id);
            let gone = ((st.popped - popped) as usize).min(copy.len());
            let newer = st.queue.split_off(copy.len() - gone);
            let mut queue: VecDeque<QueueEntry> = copy[gone..]
                .iter()
                .zip(&live[gone..])
                .filter_map(|(&e, &ok)| ok.then_some(e))
                .collect();
            dropped += copy.len() - gone - queue.len();
            st.kept = queue.len();
            queue.extend(newer);
            st.queue = queue;
        }
        dropped
    }

    /// The value of an item as (arena offset, length) pieces in value order: one for a
    /// normal item (`chain` empty), one per chained chunk for a large one. Empty pieces
    /// are left out. The one place that knows how a value is spread over its chunks.
    pub(crate) fn value_segments<'a>(
        &self,
        head: usize,
        key_len: usize,
        value_len: usize,
        chain: &'a [usize],
    ) -> impl Iterator<Item = (usize, usize)> + 'a {
        let payload = self.slabs.max_chunk() - HDR;
        let single = chain
            .is_empty()
            .then(|| (item::value_off(head, key_len), value_len));
        let mut left = value_len;
        let chained = chain.iter().map(move |&c| {
            let take = left.min(payload);
            left -= take;
            (c + HDR, take)
        });
        single.into_iter().chain(chained).filter(|s| s.1 > 0)
    }

    /// Every chunk of an item: the head and its chain.
    pub(crate) fn item_chunks(&self, off: usize) -> Vec<usize> {
        let a = &self.arena;
        let mut v = vec![off];
        let h = item::read_header(a, off);
        if h.iflags & item::F_CHUNKED != 0 {
            let payload = self.slabs.max_chunk() - HDR;
            let n = (h.value_len as usize).div_ceil(payload);
            let table = item::chain_off(off, h.key_len as usize);
            for i in 0..n {
                v.push(a.u64_at(table + 8 * i).load(Ordering::Relaxed) as usize);
            }
        }
        v
    }

    /// Where the key of the item at `off` is indexed (None if the header is not an item's).
    fn key_hash_at(&self, off: usize) -> Option<KeyHash> {
        let klen = item::read_header(&self.arena, off).key_len as usize;
        // The chunk may have been reused (even re-carved) since the caller looked at it:
        // treat its header as untrusted.
        if klen == 0 || klen > KEY_MAX_LEN || item::key_off(off) + klen > self.arena.len() {
            return None;
        }
        let mut key = [0u8; KEY_MAX_LEN];
        self.arena.read(item::key_off(off), &mut key[..klen]);
        Some(self.index.hash(&key[..klen]))
    }

    /// Unlink the LINKED item at `off` if its buckets can be locked right now and still
    /// point at it. On success the item is UNLINKED and owned by the caller.
    fn unlink_by_location(&self, off: usize, why: Removal) -> bool {
        let a = &self.arena;
        let Some(kh) = self.key_hash_at(off) else {
            return false;
        };
        if !self.index.try_lock_pair(&kh) {
            return false;
        }
        let ok = match self.slot_pointing_at(&kh, off) {
            Some((b, i)) if item::state(a, off) == item::LINKED => {
                self.unlink_at(b, i, off, why);
                true
            }
            _ => false,
        };
        self.index.unlock_pair(&kh);
        ok
    }

    /// Free an UNLINKED (or never linked) item and its chain. Takes class locks; call
    /// with no class lock held.
    /// A pinned item is not freed here: its last `PinnedItem` frees it (see `pins.rs`).
    pub(crate) fn free_item(&self, off: usize) {
        if self.pins.defer_free(off) {
            return;
        }
        for c in self.item_chunks(off) {
            self.free_chunk(c);
        }
    }

    fn free_chunk(&self, off: usize) {
        let class = self.slabs.class_of(off);
        if class == 0 {
            return;
        }
        let mut st = self.slabs.lock(class);
        item::set_state(&self.arena, off, item::FREE);
        let page = self.slabs.page_of(off);
        if !self.slabs.page_draining[page].load(Ordering::Acquire) {
            st.free.push(off);
        }
    }

    fn oldest_age(&self, class: u8, now: u32) -> u64 {
        // The first current entries of the queue: the next eviction candidates.
        let ci = self.slabs.classes[class as usize];
        let st = self.slabs.lock(class);
        let oldest = st
            .queue
            .iter()
            .take(64)
            .filter_map(|&e| self.queued_item(&ci, e))
            .map(|(_, h)| h.atime.max(h.time))
            .min()
            .unwrap_or(now);
        now.saturating_sub(oldest) as u64
    }

    pub(crate) fn wake_maintenance(&self) {
        let (m, cv) = &self.wake;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_one();
    }
}

/// Who keeps the store alive for a `NewItem`: a borrow (`Store::alloc`, `Txn::alloc`) or
/// a share of the internals (`Store::alloc_pending`, which must not borrow the store).
pub(crate) enum Owner<'s> {
    Borrowed(&'s Inner),
    Shared(Arc<Inner>),
}

impl std::ops::Deref for Owner<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        match self {
            Owner::Borrowed(i) => i,
            Owner::Shared(a) => a,
        }
    }
}

/// An allocated, not yet linked item. Dropping it frees its memory.
pub struct NewItem<'s> {
    pub(crate) owner: Owner<'s>,
    pub(crate) off: usize,
    pub(crate) chain: Vec<usize>,
    value_len: usize,
    key_len: usize,
}

impl NewItem<'_> {
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// The value's memory as (arena offset, length) pieces, in value order.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.owner
            .value_segments(self.off, self.key_len, self.value_len, &self.chain)
    }

    /// Copy `bytes` into the value at `offset`. Bytes past the value's end are ignored.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset.saturating_add(bytes.len()).min(self.value_len);
        if offset >= end {
            return;
        }
        let a = &self.owner.arena;
        let mut pos = 0;
        for (at, len) in self.segments() {
            let (lo, hi) = (offset.max(pos), end.min(pos + len));
            if lo < hi {
                a.write(at + (lo - pos), &bytes[lo - offset..hi - offset]);
            }
            pos += len;
            if pos >= end {
                break;
            }
        }
    }

    /// Append the value written so far (all of it) to `out`.
    pub(crate) fn read_value(&self, out: &mut Vec<u8>) {
        for (at, len) in self.segments() {
            self.owner.arena.read_into(at, len, out);
        }
    }

    /// The key this item was allocated for.
    pub fn key(&self) -> Vec<u8> {
        let mut k = vec![0u8; self.key_len];
        self.owner.arena.read(item::key_off(self.off), &mut k);
        k
    }

    /// Fill the value from consecutive parts (append/prepend build values this way).
    pub fn write_parts(&mut self, parts: &[&[u8]]) {
        let mut at = 0;
        for p in parts {
            self.write(at, p);
            at += p.len();
        }
    }

    /// crc32c of key and value.
    fn checksum(&self) -> u32 {
        let a = &self.owner.arena;
        let crc = a.crc(0, item::key_off(self.off), self.key_len);
        self.segments()
            .fold(crc, |crc, (at, len)| a.crc(crc, at, len))
    }
}

impl Drop for NewItem<'_> {
    fn drop(&mut self) {
        if self.off != usize::MAX {
            item::seq_end(&self.owner.arena, self.off);
            self.owner.free_chunk(self.off);
            for &c in &self.chain {
                self.owner.free_chunk(c);
            }
        }
    }
}

/// One key's buckets, locked for writing. See `Store::transact`.
pub struct Txn<'s> {
    inner: &'s Inner,
    key_buf: [u8; KEY_MAX_LEN],
    key_len: usize,
    kh: KeyHash,
    /// The live item: bucket, slot, offset.
    cur: Option<(usize, usize, usize)>,
    /// Items unlinked in this transaction, freed after the buckets are unlocked.
    to_free: Vec<usize>,
}

impl<'s> Txn<'s> {
    /// Find the key's live item; a dead one found on the way is removed.
    fn find_live(&mut self) -> Option<(usize, usize, usize)> {
        let inner = self.inner;
        let a = &inner.arena;
        let now = inner.clock.now();
        for b in [self.kh.b1, self.kh.b2] {
            for i in 0..index::SLOTS {
                let Some(s) = inner.index.slot(b, i) else {
                    continue;
                };
                if s.tag != self.kh.tag || item::state(a, s.off) != item::LINKED {
                    continue;
                }
                let h = item::read_header(a, s.off);
                if h.key_len as usize != self.key_len || !a.eq(item::key_off(s.off), self.key()) {
                    continue;
                }
                if let Some(flushed) = inner.dead(&h, now) {
                    inner.count_dead_lookup(flushed);
                    inner.unlink_at(b, i, s.off, Removal::Lookup);
                    self.to_free.push(s.off);
                    return None;
                }
                return Some((b, i, s.off));
            }
        }
        None
    }

    pub fn key(&self) -> &[u8] {
        &self.key_buf[..self.key_len]
    }

    /// Arena offset of the live item.
    pub(crate) fn current_off(&self) -> Option<usize> {
        self.cur.map(|(_, _, off)| off)
    }

    /// The live item under this key (expired and flushed items count as absent).
    pub fn item(&self) -> Option<ItemInfo> {
        let (_, _, off) = self.cur?;
        Some(self.inner.info(&item::read_header(&self.inner.arena, off)))
    }

    /// Call `f` with the live item's value as slices of item memory (no copy), valid for
    /// the call: the buckets stay locked, so nothing can change or free the item.
    pub fn with_value_slices<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> Option<R> {
        let (_, _, off) = self.cur?;
        let h = item::read_header(&self.inner.arena, off);
        let chunks = self.inner.item_chunks(off);
        let a = &self.inner.arena;
        let slices: Vec<&[u8]> = self
            .inner
            .value_segments(off, h.key_len as usize, h.value_len as usize, &chunks[1..])
            .map(|(o, n)| a.stable_bytes(o, n))
            .collect();
        Some(f(&slices))
    }

    /// Append the live item's value to `out`.
    pub fn read_value(&self, out: &mut Vec<u8>) {
        let Some((_, _, off)) = self.cur else { return };
        let h = item::read_header(&self.inner.arena, off);
        let size = self.inner.slabs.classes[h.class as usize].size;
        // Under the bucket lock the item cannot change, so this cannot fail.
        let ok = self.inner.copy_value(off, &h, size, out);
        debug_assert!(ok);
    }

    /// Allocate an item for this key (see `Store::alloc`).
    pub fn alloc(
        &self,
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'s>, AllocError> {
        let inner = self.inner;
        inner.alloc_item(
            Owner::Borrowed(inner),
            self.key(),
            value_len,
            flags,
            exptime,
        )
    }

    /// Link `item`, replacing the current one. Returns its CAS.
    pub fn link(&mut self, item: NewItem<'s>, opts: LinkOptions) -> u64 {
        self.link_counted(item, opts, true)
    }

    /// `link`, counting the item in `total_items` only if `stored` (memcached counts
    /// stores; an `incr`/`decr` it does in place is not one).
    pub(crate) fn link_counted(
        &mut self,
        mut item: NewItem<'s>,
        opts: LinkOptions,
        stored: bool,
    ) -> u64 {
        let inner = self.inner;
        let a = &inner.arena;
        let off = item.off;
        let cas = opts.explicit_cas.unwrap_or_else(|| inner.next_cas());
        let crc = item.checksum();
        a.u64_at(off + item::OFF_CAS).store(cas, Ordering::Relaxed);
        a.u32_at(off + item::OFF_TIME)
            .store(inner.clock.now(), Ordering::Relaxed);
        a.u32_at(off + item::OFF_CRC).store(crc, Ordering::Relaxed);
        let mut marks = 0;
        if opts.stale {
            marks |= item::F_STALE;
        }
        if opts.token_sent {
            marks |= item::F_TOKEN_SENT;
        }
        a.u8_at(off + item::OFF_IFLAGS)
            .fetch_or(marks, Ordering::Relaxed);
        item::seq_end(a, off);
        item.off = usize::MAX; // linked: no longer freed on drop
        let (b, i) = match self.cur.take() {
            Some((b, i, old)) => {
                inner.unlink_at(b, i, old, Removal::Client);
                self.to_free.push(old);
                (b, i)
            }
            None => self.free_slot(),
        };
        inner.link_at(b, i, off, self.kh.tag, stored);
        self.cur = Some((b, i, off));
        if inner.cfg.use_cas {
            cas
        } else {
            0
        }
    }

    /// An empty slot for a new key: in its first bucket while that has at least
    /// `FIRST_BUCKET_SPARE` empty slots (a lookup reads the first bucket first, so a hit
    /// there costs one bucket read), else in the emptier of the two (two choices keep
    /// the buckets even: see `index_power`). When both are full, the coldest occupant of
    /// the two buckets is evicted.
    fn free_slot(&mut self) -> (usize, usize) {
        let inner = self.inner;
        let empty = |b: usize| (0..index::SLOTS).filter(move |&i| inner.index.slot(b, i).is_none());
        let (b1, b2) = (self.kh.b1, self.kh.b2);
        let free1 = empty(b1).count();
        let b = if free1 < FIRST_BUCKET_SPARE && empty(b2).count() > free1 {
            b2
        } else {
            b1
        };
        if let Some(i) = empty(b).next() {
            return (b, i);
        }
        let a = &inner.arena;
        let mut best: Option<(usize, usize, usize, (bool, u32))> = None;
        for b in [self.kh.b1, self.kh.b2] {
            for i in 0..index::SLOTS {
                let Some(s) = inner.index.slot(b, i) else {
                    continue;
                };
                let h = item::read_header(a, s.off);
                let rank = (h.iflags & item::F_REFERENCED != 0, h.atime.max(h.time));
                if best.is_none_or(|x| rank < x.3) {
                    best = Some((b, i, s.off, rank));
                }
            }
        }
        let (b, i, off, _) = best.unwrap_or((self.kh.b1, 0, 0, (false, 0)));
        if let Some(s) = inner.index.slot(b, i) {
            let h = item::read_header(a, s.off);
            let why = if inner.dead(&h, inner.clock.now()).is_some() {
                Removal::Reclaimed
            } else {
                Removal::IndexFull
            };
            inner.unlink_at(b, i, off, why);
            self.to_free.push(off);
        }
        (b, i)
    }

    /// Remove the current item. Returns whether there was one.
    pub fn unlink(&mut self) -> bool {
        match self.cur.take() {
            Some((b, i, off)) => {
                self.inner.unlink_at(b, i, off, Removal::Client);
                self.to_free.push(off);
                true
            }
            None => false,
        }
    }

    /// Modify the live item's header in place inside its seqlock.
    fn modify(&mut self, f: impl FnOnce(&Arena, usize)) {
        let Some((_, _, off)) = self.cur else { return };
        let a = &self.inner.arena;
        item::seq_begin(a, off);
        f(a, off);
        item::seq_end(a, off);
    }

    /// Change the live item's exptime in place.
    pub fn set_exptime(&mut self, exptime: u32) {
        self.modify(|a, off| {
            a.u32_at(off + item::OFF_EXPTIME)
                .store(exptime, Ordering::Relaxed)
        });
        if let (Some((_, _, off)), true) = (self.cur, exptime != 0) {
            self.inner.slabs.note_due(off, exptime);
        }
    }

    /// Set or clear the meta-protocol stale / token-sent marks in place.
    pub fn set_marks(&mut self, stale: Option<bool>, token_sent: Option<bool>) {
        let Some((_, _, off)) = self.cur else { return };
        let f = self.inner.arena.u8_at(off + item::OFF_IFLAGS);
        for (want, bit) in [(stale, item::F_STALE), (token_sent, item::F_TOKEN_SENT)] {
            match want {
                Some(true) => {
                    f.fetch_or(bit, Ordering::Relaxed);
                }
                Some(false) => {
                    f.fetch_and(!bit, Ordering::Relaxed);
                }
                None => {}
            }
        }
    }

    /// Mark whether the live item's key was given base64-encoded (meta `b`).
    pub fn set_key_binary(&mut self, binary: bool) {
        let Some((_, _, off)) = self.cur else { return };
        let f = self.inner.arena.u8_at(off + item::OFF_IFLAGS);
        if binary {
            f.fetch_or(item::F_KEY_BINARY, Ordering::Relaxed);
        } else {
            f.fetch_and(!item::F_KEY_BINARY, Ordering::Relaxed);
        }
    }

    /// Give the live item a new CAS (fresh, or `explicit`). Returns it.
    pub fn bump_cas(&mut self, explicit: Option<u64>) -> u64 {
        if self.cur.is_none() {
            return 0;
        }
        let cas = explicit.unwrap_or_else(|| self.inner.next_cas());
        self.modify(|a, off| a.u64_at(off + item::OFF_CAS).store(cas, Ordering::Relaxed));
        // The queue entry names the item by its CAS: queue it again (at the back, as
        // memcached bumps an item it modifies).
        if let Some((_, _, off)) = self.cur {
            let h = item::read_header(&self.inner.arena, off);
            self.inner.queue_push(off, &h);
        }
        if self.inner.cfg.use_cas {
            cas
        } else {
            0
        }
    }

    /// Make the item recently used for eviction without counting a fetch.
    pub(crate) fn mark_referenced(&mut self) {
        if let Some((_, _, off)) = self.cur {
            self.inner
                .arena
                .u8_at(off + item::OFF_IFLAGS)
                .fetch_or(item::F_REFERENCED, Ordering::Relaxed);
        }
    }

    /// Record an access (fetched bit, last-access time).
    pub fn mark_fetched(&mut self) {
        if let Some((_, _, off)) = self.cur {
            self.inner.touch_access(off);
        }
    }
}

/// Grace periods for page moves.
///
/// A lock-free reader may hold an item offset obtained from the index while that item is
/// removed. Reusing the chunk for another item of the same class is harmless (the seqlock
/// catches it), but re-carving its page for another class would shift chunk boundaries
/// under the reader's atomic access-bit writes. So a reader brackets its lookup with
/// `enter`/exit, and a page is re-carved only after `synchronize` has seen every reader
/// that started before the page was emptied leave. Two sets of counters (by epoch parity)
/// let `synchronize` wait for old readers only, so a steady stream of new readers cannot
/// starve it.
pub(crate) struct Grace {
    epoch: AtomicU64,
    active: [[Padded; GRACE_STRIPES]; 2],
    sync: Mutex<()>,
}

const GRACE_STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicU64);

impl Default for Grace {
    fn default() -> Self {
        Grace {
            epoch: AtomicU64::new(0),
            active: Default::default(),
            sync: Mutex::new(()),
        }
    }
}

pub(crate) struct GraceGuard<'g> {
    grace: &'g Grace,
    parity: usize,
    stripe: usize,
}

impl Drop for GraceGuard<'_> {
    fn drop(&mut self) {
        self.grace.active[self.parity][self.stripe]
            .0
            .fetch_sub(1, Ordering::Release);
    }
}

fn stripe() -> usize {
    use std::cell::Cell;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) });
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) as usize % GRACE_STRIPES);
        }
        s.get()
    })
}

impl Grace {
    pub(crate) fn enter(&self) -> GraceGuard<'_> {
        let stripe = stripe();
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            let parity = (e & 1) as usize;
            self.active[parity][stripe].0.fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == e {
                return GraceGuard {
                    grace: self,
                    parity,
                    stripe,
                };
            }
            self.active[parity][stripe].0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Wait until every reader that entered before this call has left.
    pub(crate) fn synchronize(&self) {
        let _one_at_a_time = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        let e = self.epoch.fetch_add(1, Ordering::SeqCst);
        let old = (e & 1) as usize;
        let mut spins = 0;
        while self.active[old]
            .iter()
            .map(|p| p.0.load(Ordering::SeqCst))
            .sum::<u64>()
            != 0
        {
            index::backoff(&mut spins);
        }
    }
}

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::arena::{Allocate, Arena};
use crate::index::{self, Index, KeyHash};
use crate::item::{self, Header, HDR};
use crate::pins::Pins;
use crate::slab::{self, ClassInfo, ClassState, QueueEntry, Slabs};
use crate::stats::{ItemClassStats, SlabClassStats, StoreStats};
use crate::KEY_MAX_LEN;

#[cfg(test)]
mod tests {
    use crate::{SetMode, Store, StoreConfig};

    #[test]
    fn compaction_leaves_exactly_the_live_items_queued_after_overwrites() {
        let s = Store::new(StoreConfig {
            memory_limit: 4 << 20,
            background_sweeper: false,
            slab_automove: false,
            ..StoreConfig::default()
        })
        .unwrap();
        for round in 0..2000 {
            for k in 0..100 {
                let v = format!("{round}");
                s.store(
                    SetMode::Set,
                    format!("k{k}").as_bytes(),
                    v.as_bytes(),
                    0,
                    0,
                    0,
                );
            }
        }
        assert_eq!(s.stats().evictions, 0);
        s.inner.compact_queues(true);
        let class = s.slabs.class_for(40 + 3 + 4).unwrap();
        let st = s.slabs.lock(class);
        assert!(!st.pages.is_empty());
        // Exactly the live items are left, each once.
        assert_eq!(st.queue.len(), 100);
    }

    #[test]
    fn compaction_racing_writers_and_evictions_keeps_every_live_item_queued_once() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let s = Store::new(StoreConfig {
            memory_limit: 4 << 20,
            background_sweeper: false,
            slab_automove: false,
            ..StoreConfig::default()
        })
        .unwrap();
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let writers: Vec<_> = (0..2u64)
                .map(|t| {
                    let s = &s;
                    sc.spawn(move || {
                        let mut x = t + 1;
                        for _ in 0..150_000 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let key = format!("k{}", x % 60_000);
                            let value = vec![b'v'; (x % 300) as usize];
                            s.store(SetMode::Set, key.as_bytes(), &value, 0, 0, 0);
                        }
                    })
                })
                .collect();
            sc.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    s.inner.compact_queues(true);
                }
            });
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
        assert!(s.stats().evictions > 0);
        s.inner.compact_queues(true);
        for ci in &s.slabs.classes[1..] {
            let st = s.slabs.lock(ci.id);
            let items = s.slabs.counters[ci.id as usize]
                .items
                .load(Ordering::Relaxed);
            assert_eq!(st.queue.len() as u64, items, "class {}", ci.id);
        }
    }
}
