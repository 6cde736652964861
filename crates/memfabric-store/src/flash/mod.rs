//! The flash tier: a log of pages on files or devices that items evicted from RAM go to.
//!
//! The index keeps pointing at an item that moved to flash: its slot gets the flash bit
//! and a flash location instead of an arena offset (`index::FlashSlot`), so a flash item
//! costs no DRAM but its 8-byte slot. A location is `page · page_size + offset`; pages
//! are the store's page size (1 MiB by default), filled in memory (a write buffer) and
//! written once, whole. Pages are reused oldest first (FIFO): before a page is reused,
//! the writer reads it back and, for every record whose slot still points at it, either
//! re-admits it into the page being filled (the slot's referenced bit says it was read
//! since it went to flash; bounded by `FlashConfig::reinsert_percent`) or clears the slot.
//! Nothing ever compacts.
//!
//! Reads verify the record (`format::parse_record`: crc over header, key and value) and
//! its key; a location whose page was reused, torn or lost reads as a miss, never as
//! another value. See `docs/flash.md`.
//!
//! Lock order: class lock → bucket locks → the tier's write state. The write state is
//! innermost: nothing is locked while it is held.
pub mod format;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub mod uring;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use format::{PageHeader, RecordHeader, PAGE_HDR};

/// Configuration of the flash tier (memcached's `ext_*` options where they apply).
#[derive(Clone, Debug)]
pub struct FlashConfig {
    /// Files or devices and how many bytes of each to use (`-o ext_path=FILE:SIZE`).
    pub files: Vec<(PathBuf, u64)>,
    /// Items smaller than this (key + value + header) stay in RAM (`ext_item_size`).
    pub item_min: usize,
    /// Items with less than this many seconds to live are not written (`ext_low_ttl`).
    pub low_ttl: u32,
    /// Bytes per second admitted to flash at most; 0 = no limit. Items over budget are
    /// evicted as without a flash tier (a SET never waits for flash).
    pub write_budget: u64,
    /// Pages buffered in memory (filling and waiting to be written); at least 2
    /// (`ext_wbuf_size` / page size).
    pub write_buffers: usize,
    /// Try `O_DIRECT` (falls back to buffered I/O where the file system refuses it).
    pub direct_io: bool,
    /// At reclaim, re-admit read-since-written records up to this share of a page.
    pub reinsert_percent: u32,
    /// At start, index what a previous run left on flash (`--flash-recover`); off starts
    /// empty and erases the old pages' headers, so that nothing of theirs comes back.
    pub recover: bool,
}

impl Default for FlashConfig {
    fn default() -> Self {
        FlashConfig {
            files: Vec::new(),
            item_min: 512,
            low_ttl: 0,
            write_budget: 0,
            write_buffers: 4,
            direct_io: true,
            reinsert_percent: 10,
            recover: true,
        }
    }
}

/// Counters of the flash tier (memcached's `extstore_*` names where one exists).
#[derive(Default)]
pub struct FlashCounters {
    pub page_allocs: AtomicU64,
    pub page_reclaims: AtomicU64,
    pub objects_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub objects_read: AtomicU64,
    pub bytes_read: AtomicU64,
    pub objects_evicted: AtomicU64,
    pub bytes_evicted: AtomicU64,
    pub objects_used: AtomicU64,
    pub bytes_used: AtomicU64,
    /// Page bytes written to the device (write amplification's numerator).
    pub device_bytes_written: AtomicU64,
    /// Bytes of items admitted from RAM eviction (write amplification's denominator).
    pub admitted_bytes: AtomicU64,
    pub reinserted: AtomicU64,
    pub dropped_budget: AtomicU64,
    pub dropped_no_buffer: AtomicU64,
    /// Chained items larger than the write buffers can ever hold (`ext_wbuf_size`).
    pub dropped_too_large: AtomicU64,
    /// Chained items written (head and pieces).
    pub chained_written: AtomicU64,
    pub write_errors: AtomicU64,
    pub read_errors: AtomicU64,
    pub badcrc: AtomicU64,
    pub misses: AtomicU64,
    pub reads: AtomicU64,
    pub recached: AtomicU64,
    /// Flash copies dropped unread because a plain SET replaced their key.
    pub overwritten: AtomicU64,
    /// Invalidations that could not be recorded (memory for them exhausted): a restart
    /// after a crash may bring those records back.
    pub invalidations_lost: AtomicU64,
    /// Partial pages written so that recent changes survive a crash.
    pub snapshots: AtomicU64,
    /// Items indexed again at start from what a previous run left on flash.
    pub recovered: AtomicU64,
    /// Flash items whose index slot a new RAM item took (both buckets of its key full):
    /// the index is too small for RAM and flash together (`-o hashpower`).
    pub index_drops: AtomicU64,
    /// How long the start-up scan and re-indexing took (microseconds).
    pub recovery_us: AtomicU64,
}

/// A snapshot for `stats`.
#[derive(Clone, Debug, Default)]
pub struct FlashStats {
    pub limit_bytes: u64,
    pub page_size: u64,
    pub pages: u64,
    pub pages_free: u64,
    pub pages_used: u64,
    pub pages_buffered: u64,
    /// Ready pages the writer keeps (`WriteState::ready_want`).
    pub pages_reserved: u64,
    pub page_allocs: u64,
    pub page_reclaims: u64,
    pub objects_written: u64,
    pub bytes_written: u64,
    pub objects_read: u64,
    pub bytes_read: u64,
    pub objects_evicted: u64,
    pub bytes_evicted: u64,
    pub objects_used: u64,
    pub bytes_used: u64,
    pub device_bytes_written: u64,
    pub admitted_bytes: u64,
    pub reinserted: u64,
    pub dropped_budget: u64,
    pub dropped_no_buffer: u64,
    pub dropped_too_large: u64,
    pub chained_written: u64,
    pub chained_used: u64,
    pub write_errors: u64,
    pub read_errors: u64,
    pub badcrc: u64,
    pub misses: u64,
    pub reads: u64,
    pub recached: u64,
    pub overwritten: u64,
    pub invalidations_lost: u64,
    pub snapshots: u64,
    pub recovered: u64,
    pub index_drops: u64,
    pub recovery_us: u64,
    pub direct_io: bool,
    pub item_min: u64,
    pub write_budget: u64,
}

struct FlashFile {
    file: File,
    first_page: u32,
    pages: u32,
    direct: bool,
}

/// A page being filled, or sealed and waiting to be written.
pub(crate) struct OpenPage {
    page: u32,
    seq: u64,
    /// Backing memory; the page is `buf[start..start + page_size]` (4096-aligned).
    buf: Vec<u8>,
    start: usize,
    used: usize,
    records: u32,
    summary: Vec<u8>,
}

impl OpenPage {
    fn bytes(&self, page_size: usize) -> &[u8] {
        &self.buf[self.start..self.start + page_size]
    }
}

struct WriteState {
    current: Option<OpenPage>,
    /// Sealed pages, oldest first; the writer writes the front one.
    sealed: VecDeque<Arc<OpenPage>>,
    /// Page buffers to reuse.
    spare: Vec<Vec<u8>>,
    /// Pages that hold nothing any slot points at.
    ready: VecDeque<u32>,
    /// How many ready pages the writer keeps by reclaiming the oldest: `READY_LOW`, raised
    /// to the pages the largest chained item dropped for want of them needed (its pieces'
    /// fresh pages, and its head's when that opened one), so that once the tier has cycled,
    /// items of several pages still reach it rather than being dropped every time; at
    /// most `ready_cap`. It never shrinks (until a restart): what it keeps empty is a few
    /// pages, at most a quarter of the tier.
    ready_want: usize,
    /// Pages on flash, oldest first (the reclaim order).
    on_flash: VecDeque<u32>,
    /// Pages whose write failed, and when they may be tried again.
    failed: VecDeque<(u32, Instant)>,
    /// Page buffers that exist (current + sealed + spare), at most `write_buffers`.
    buffers: usize,
    next_seq: u64,
    /// Invalidations and flushes waiting for a page to be filled (encoded summary entries).
    pending: Vec<u8>,
    /// The page being filled changed since it was last written (partially or whole).
    dirty_since: Option<Instant>,
    tokens: f64,
    refilled: Instant,
    shutdown: bool,
}

/// Ready pages the writer keeps in reserve by reclaiming the oldest ones (at least;
/// see `WriteState::ready_want`).
const READY_LOW: usize = 2;
/// How long a page whose write failed stays out of use.
const FAILED_RETRY: Duration = Duration::from_secs(30);
/// The page being filled is written (as far as it is filled) when it has changed and
/// this long has passed: what a crash can lose of recent changes.
const SNAPSHOT_AFTER: Duration = Duration::from_millis(250);
/// Invalidations kept waiting for a page at most (bytes of summary entries).
const PENDING_MAX: usize = 64 << 10;

pub(crate) struct Flash {
    pub(crate) page_size: usize,
    pages: u32,
    files: Vec<FlashFile>,
    pub(crate) cfg: FlashConfig,
    st: Mutex<WriteState>,
    wake: Condvar,
    /// `ext_item_size` and `ext_low_ttl`, changeable at run time (`extstore` command).
    item_min: std::sync::atomic::AtomicUsize,
    low_ttl: std::sync::atomic::AtomicU32,
    pub(crate) c: FlashCounters,
    last_error_log: Mutex<Option<Instant>>,
    /// The chained items on flash: head location -> bytes counted in `bytes_used` (a
    /// slot cannot say how large a chained item is; each is over half a page, so there
    /// are fewer of them than pages in the tier).
    chained: Mutex<std::collections::HashMap<u64, u64>>,
    /// Per page, how many times it was reclaimed: a lock-free reader notes it before it
    /// reads and checks it after, so a record read from a page that was reclaimed and
    /// filled again meanwhile is never taken for what a slot names now (the same key can
    /// land at the same place, making the slot word itself the same).
    page_gen: Vec<AtomicU64>,
}

/// The slot class of a chained item's head (slab classes are 0..61): read
/// `Flash::head_read_len` bytes there.
pub(crate) const CHAINED_SLOT_CLASS: u8 = 63;
/// A chained item's first piece goes into the page its head is in only if that page
/// has room for at least this much of it.
const MIN_FIRST_PIECE: usize = 4096;
/// Pieces of a chained item a read accepts (whatever the write buffers of the run that
/// wrote it): 1 GiB, memcached's largest `-I`, in 1 MiB pages.
const MAX_READ_PIECES: usize = 1024;

/// Memory for `len` bytes starting at a 4096-aligned address (for `O_DIRECT`), as the
/// backing vector and the offset the aligned bytes start at.
pub(crate) fn aligned(len: usize) -> (Vec<u8>, usize) {
    let buf = vec![0u8; len + 4096];
    let start = buf.as_ptr().align_offset(4096).min(4096);
    (buf, start)
}

/// Where a read landed.
pub(crate) enum Fetch {
    Bytes(Vec<u8>),
    /// Nothing readable there (beyond the tier, short read, I/O error).
    Failed,
}

/// What a read takes (`Flash::plan_read`).
pub(crate) enum Planned {
    /// Done without the device: a page still in memory, or nothing readable there.
    Ready(Fetch),
    /// One read from a file, for an I/O engine to do.
    Device(DeviceRead),
}

/// One read from a flash file: `len` bytes at `pos` of file `file` (4 KiB-aligned in
/// both for `O_DIRECT`) into memory aligned to 4 KiB (`aligned`), of which the caller
/// wants `want` bytes from `skip` on.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRead {
    loc: u64,
    file: usize,
    pub(crate) pos: u64,
    pub(crate) len: usize,
    skip: usize,
    want: usize,
}

impl Flash {
    /// Open (create) the files and size them. Contents from a previous run are ignored:
    /// every page is rewritten whole before anything points at it.
    pub(crate) fn open(cfg: FlashConfig, page_size: usize) -> io::Result<Flash> {
        if cfg.files.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no flash files",
            ));
        }
        let mut files = Vec::new();
        let mut first_page = 0u32;
        for (path, size) in &cfg.files {
            let pages = (size / page_size as u64).min(u32::MAX as u64 / 2) as u32;
            if pages == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: {size} bytes is less than one {page_size}-byte page",
                        path.display()
                    ),
                ));
            }
            let open = |direct: bool| {
                let mut o = OpenOptions::new();
                o.read(true).write(true).create(true).truncate(false);
                if direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                o.open(path)
            };
            let plain = open(false).map_err(|e| with_path(e, path))?;
            let need = pages as u64 * page_size as u64;
            let meta = plain.metadata().map_err(|e| with_path(e, path))?;
            if meta.is_file() && meta.len() < need {
                plain.set_len(need).map_err(|e| with_path(e, path))?;
            }
            let (file, direct) = match cfg.direct_io.then(|| open(true)) {
                Some(Ok(f)) if direct_io_works(&f) => (f, true),
                _ => (plain, false),
            };
            files.push(FlashFile {
                file,
                first_page,
                pages,
                direct,
            });
            first_page = first_page
                .checked_add(pages)
                .ok_or_else(|| io::Error::other("flash tier too large"))?;
        }
        let total = first_page;
        // 40 bits of 8-byte units in a slot: 8 TiB of flash.
        if total as u64 * page_size as u64 >= 1u64 << 43 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "flash tier larger than 8 TiB",
            ));
        }
        let buffers = cfg.write_buffers.max(2);
        Ok(Flash {
            page_size,
            pages: total,
            files,
            st: Mutex::new(WriteState {
                current: None,
                sealed: VecDeque::new(),
                spare: Vec::new(),
                ready: (0..total).collect(),
                ready_want: READY_LOW,
                on_flash: VecDeque::new(),
                failed: VecDeque::new(),
                buffers: 0,
                next_seq: 1,
                pending: Vec::new(),
                dirty_since: None,
                tokens: 0.0,
                refilled: Instant::now(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            item_min: std::sync::atomic::AtomicUsize::new(cfg.item_min),
            low_ttl: std::sync::atomic::AtomicU32::new(cfg.low_ttl),
            c: FlashCounters::default(),
            last_error_log: Mutex::new(None),
            chained: Mutex::new(Default::default()),
            page_gen: (0..total).map(|_| AtomicU64::new(0)).collect(),
            cfg: FlashConfig {
                write_buffers: buffers,
                ..cfg
            },
        })
    }

    fn lock(&self) -> MutexGuard<'_, WriteState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chained_lock(&self) -> MutexGuard<'_, std::collections::HashMap<u64, u64>> {
        self.chained.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pieces a chained item written now has at most: one in its head's page, then one
    /// per fresh page, and those pages must all be write buffers at once.
    fn max_pieces(&self) -> usize {
        self.cfg.write_buffers
    }

    /// The most ready pages the writer keeps: enough for the largest chained item (its
    /// pieces and its head need as many pages at once), but never more than a quarter of
    /// the tier: more would evict live items early for values a small tier holds few of.
    /// An item needing more than this is dropped every time once the tier has cycled.
    fn ready_cap(&self) -> usize {
        self.max_pieces()
            .min(self.pages as usize / 4)
            .max(READY_LOW)
    }

    /// Bytes to read for a chained item's head (its key and chain table at their
    /// largest). Bounded by `MAX_READ_PIECES`, not by this run's write buffers, so that
    /// heads a previous run wrote with more buffers are read whole.
    pub(crate) fn head_read_len(&self) -> usize {
        let pieces = self.max_pieces().max(MAX_READ_PIECES);
        format::record_len(crate::KEY_MAX_LEN, format::chain_table_len(pieces))
    }

    /// The largest value a chained item on flash can have (what a read of one may
    /// return): any run's, as `head_read_len`.
    pub(crate) fn max_chained_value(&self) -> usize {
        self.max_pieces().max(MAX_READ_PIECES) * self.page_size
    }

    /// How many times the page of `loc` was reclaimed (see `page_gen`).
    pub(crate) fn page_gen(&self, loc: u64) -> u64 {
        self.page_gen
            .get((loc / self.page_size as u64) as usize)
            .map_or(u64::MAX, |g| g.load(Ordering::SeqCst))
    }

    /// A chained item registered at `loc` counting `bytes` (restart).
    pub(crate) fn note_chained(&self, loc: u64, bytes: u64) {
        self.chained_lock().insert(loc, bytes);
    }

    /// A flash slot goes away (cleared, replaced, reclaimed): its record no longer
    /// counts as used. `class_size` is its class's chunk size (for a record); returns the
    /// bytes it counted.
    pub(crate) fn forget_slot(&self, class: u8, loc: u64, class_size: usize) -> usize {
        let bytes = if class == CHAINED_SLOT_CLASS {
            self.chained_lock().remove(&loc).unwrap_or(0) as usize
        } else {
            class_size
        };
        self.forget(bytes);
        bytes
    }

    pub(crate) fn direct_io(&self) -> bool {
        self.files.iter().all(|f| f.direct)
    }

    /// `extstore item_size` / `extstore low_ttl` at run time.
    pub(crate) fn set_admission(&self, item_min: Option<usize>, low_ttl: Option<u32>) {
        if let Some(n) = item_min {
            self.item_min.store(n, Ordering::Relaxed);
        }
        if let Some(t) = low_ttl {
            self.low_ttl.store(t, Ordering::Relaxed);
        }
    }

    /// Does an item of this size and expiry go to flash at all? (`chained`: its value
    /// is spread over several chunks; `append_chained` decides whether it fits.)
    pub(crate) fn admits(&self, total_len: usize, exptime: u32, now: u32, chained: bool) -> bool {
        let rec = format::record_len(0, total_len - crate::item::HDR);
        if total_len < self.item_min.load(Ordering::Relaxed)
            || (!chained && rec + format::summary_len(255) + PAGE_HDR > self.page_size)
        {
            return false;
        }
        exptime == 0 || exptime > now.saturating_add(self.low_ttl.load(Ordering::Relaxed))
    }

    /// Append a record to the page being filled. Returns its location, or `None` when it
    /// cannot go to flash now (no buffer free because the writer is behind, or over the
    /// write budget); the caller then evicts it as usual.
    /// `accounted`: what the record counts in `bytes_used` (its class's chunk size, what
    /// is subtracted when it leaves).
    pub(crate) fn append(
        &self,
        h: &RecordHeader,
        key: &[u8],
        value: &[&[u8]],
        accounted: usize,
    ) -> Option<u64> {
        let vlen: usize = value.iter().map(|v| v.len()).sum();
        let rec = format::record_len(key.len(), vlen);
        let sum = format::summary_len(key.len());
        let mut st = self.lock();
        if st.shutdown {
            return None;
        }
        if !self.spend_budget(&mut st, rec) {
            return None;
        }
        let fits = |p: &OpenPage| p.used + rec + p.summary.len() + sum <= self.page_size;
        if st.current.as_ref().is_some_and(|p| !fits(p)) {
            self.seal(&mut st);
        }
        if st.current.is_none() && !self.open_page(&mut st) {
            self.c.dropped_no_buffer.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let ps = self.page_size;
        let p = st.current.as_mut()?;
        let off = p.used;
        let (start, page_no) = (p.start, p.page);
        format::put_record(&mut p.buf[start + off..start + off + rec], h, key, value);
        format::put_summary(&mut p.summary, off as u32, h, key);
        p.used += rec;
        p.records += 1;
        st.dirty_since.get_or_insert_with(Instant::now);
        self.c.objects_written.fetch_add(1, Ordering::Relaxed);
        self.c
            .bytes_written
            .fetch_add(rec as u64, Ordering::Relaxed);
        self.c.objects_used.fetch_add(1, Ordering::Relaxed);
        self.c
            .bytes_used
            .fetch_add(accounted as u64, Ordering::Relaxed);
        Some(page_no as u64 * ps as u64 + off as u64)
    }

    /// Append a chained item: its head in the page being filled (or a fresh one), then
    /// its value in pieces, in what is left of that page and in as many fresh pages as
    /// it needs, all while holding the write state, so that nothing else lands between
    /// them (format.rs has the layout). Every buffer and page it needs is checked for
    /// before anything is written: `None` (the caller evicts it as usual) when the
    /// writer is behind, over the write budget, or when the item is larger than the
    /// write buffers can ever hold.
    pub(crate) fn append_chained(
        &self,
        h: &RecordHeader,
        key: &[u8],
        value: &[&[u8]],
    ) -> Option<u64> {
        let ps = self.page_size;
        let vlen: usize = value.iter().map(|v| v.len()).sum();
        let piece_hdr = format::record_len(key.len(), 0);
        let fresh_room = (ps - PAGE_HDR).saturating_sub(piece_hdr) & !7;
        if fresh_room == 0 || vlen == 0 || vlen.div_ceil(fresh_room) >= self.max_pieces() {
            self.c.dropped_too_large.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let entry = format::chained_summary_len(key.len());
        // Outside the lock: the whole value's crc, for the head's chain table.
        let crc = value
            .iter()
            .fold(0u32, |c, v| memfabric_checksum::crc32c_append(c, v));
        let mut st = self.lock();
        if st.shutdown {
            return None;
        }
        // The head goes into the page being filled, or a fresh one; planned with room
        // for the most pieces there can be, so the real head (as many entries as the
        // plan has pieces) is never larger than what was planned for.
        let head_max = format::record_len(key.len(), format::chain_table_len(self.max_pieces()));
        let fits = |p: &OpenPage| p.used + head_max + p.summary.len() + entry <= ps;
        if st.current.as_ref().is_some_and(|p| !fits(p)) {
            self.seal(&mut st);
        }
        // A head that opens a page takes a ready page of its own, before its pieces do.
        let head_took_a_page = st.current.is_none();
        if head_took_a_page && !self.open_page(&mut st) {
            self.c.dropped_no_buffer.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let room = {
            let p = st.current.as_ref()?;
            ps.checked_sub(p.used + head_max + p.summary.len() + entry)?
        };
        let first = room.saturating_sub(piece_hdr) & !7;
        let first_here = first >= MIN_FIRST_PIECE.min(vlen);
        let mut plan = Vec::new();
        if first_here {
            plan.push(first.min(vlen));
        }
        let mut left = vlen - plan.iter().sum::<usize>();
        while left > 0 {
            let n = left.min(fresh_room);
            plan.push(n);
            left -= n;
        }
        let head_len = format::record_len(key.len(), format::chain_table_len(plan.len()));
        let bytes: usize = head_len
            + plan
                .iter()
                .map(|&n| format::record_len(key.len(), n))
                .sum::<usize>();
        // The pieces that need a fresh page: one buffer and one ready page apiece
        // (checked before the budget is spent on an item that cannot be written).
        let fresh_pages = plan.len() - usize::from(first_here);
        let free_buffers = st.spare.len() + (self.cfg.write_buffers - st.buffers);
        if st.ready.len() < fresh_pages {
            let needed = fresh_pages + usize::from(head_took_a_page);
            st.ready_want = st.ready_want.max(needed.min(self.ready_cap()));
        }
        if free_buffers < fresh_pages || st.ready.len() < fresh_pages {
            self.c.dropped_no_buffer.fetch_add(1, Ordering::Relaxed);
            self.wake.notify_all();
            return None;
        }
        if !self.spend_budget(&mut st, bytes) {
            return None;
        }
        // The head's place, zeroed now: until it is written, nothing there may parse.
        let (head_page, head_off) = {
            let p = st.current.as_mut()?;
            let off = p.used;
            let start = p.start;
            p.buf[start + off..start + off + head_len].fill(0);
            p.used += head_len;
            p.records += 1;
            let mut hh = *h;
            hh.iflags |= crate::item::F_CHUNKED;
            hh.value_len = format::chain_table_len(plan.len()) as u32;
            format::put_chained_summary(&mut p.summary, off as u32, &hh, key, bytes as u64);
            (p.page, off)
        };
        let head_loc = head_page as u64 * ps as u64 + head_off as u64;
        let mut table = Vec::with_capacity(plan.len());
        let mut cursor = Segments::new(value);
        for (index, &n) in plan.iter().enumerate() {
            if index > 0 || !first_here {
                self.seal(&mut st);
                if !self.open_page_for_pieces(&mut st) {
                    // Checked above, so not expected: the head stays zeroed (it parses
                    // as nothing) and a restart is told to forget it.
                    drop(st);
                    self.c.dropped_no_buffer.fetch_add(1, Ordering::Relaxed);
                    self.invalidate(head_loc);
                    return None;
                }
            }
            let p = st.current.as_mut()?;
            let off = p.used;
            let rec = format::record_len(key.len(), n);
            let start = p.start;
            let parts = cursor.take(n);
            format::put_piece(
                &mut p.buf[start + off..start + off + rec],
                key,
                h.cas,
                index as u32,
                &parts,
            );
            p.used += rec;
            table.push((p.page as u64 * ps as u64 + off as u64, n as u32));
        }
        let tbl = format::put_chain_table(crc, &table);
        let mut hh = *h;
        hh.iflags |= crate::item::F_CHUNKED;
        hh.value_len = tbl.len() as u32;
        let written = {
            let dst = match st.current.as_mut() {
                Some(p) if p.page == head_page => Some((&mut p.buf, p.start)),
                _ => st
                    .sealed
                    .iter_mut()
                    .find(|p| p.page == head_page)
                    .and_then(Arc::get_mut)
                    .map(|p| (&mut p.buf, p.start)),
            };
            match dst {
                Some((buf, start)) => {
                    let at = start + head_off;
                    format::put_record(&mut buf[at..at + head_len], &hh, key, &[&tbl]);
                    true
                }
                None => false,
            }
        };
        if !written {
            drop(st);
            self.invalidate(head_loc);
            return None;
        }
        st.dirty_since.get_or_insert_with(Instant::now);
        drop(st);
        self.chained_lock().insert(head_loc, bytes as u64);
        self.c.objects_written.fetch_add(1, Ordering::Relaxed);
        self.c.chained_written.fetch_add(1, Ordering::Relaxed);
        self.c
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.c.objects_used.fetch_add(1, Ordering::Relaxed);
        self.c.bytes_used.fetch_add(bytes as u64, Ordering::Relaxed);
        Some(head_loc)
    }

    /// Take `bytes` from the write budget (if there is one). False, counted, when it is
    /// spent.
    fn spend_budget(&self, st: &mut WriteState, bytes: usize) -> bool {
        if self.cfg.write_budget == 0 {
            return true;
        }
        let now = Instant::now();
        let dt = now.duration_since(st.refilled).as_secs_f64();
        st.refilled = now;
        // A chained item may need more than the usual cap of two pages at once.
        let cap = (2 * self.page_size).max(bytes) as f64;
        st.tokens = (st.tokens + dt * self.cfg.write_budget as f64).min(cap);
        if st.tokens < bytes as f64 {
            self.c.dropped_budget.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        st.tokens -= bytes as f64;
        true
    }

    /// Start a page: a ready page and a buffer. False when either is missing.
    fn open_page(&self, st: &mut WriteState) -> bool {
        self.open_page_taking(st, true)
    }

    /// Start a page for a chained item's piece: it takes no waiting invalidations (the
    /// piece's room was planned on a page without them; the next page takes them).
    fn open_page_for_pieces(&self, st: &mut WriteState) -> bool {
        self.open_page_taking(st, false)
    }

    fn open_page_taking(&self, st: &mut WriteState, take_pending: bool) -> bool {
        if st.ready.is_empty() {
            self.wake.notify_all();
            return false;
        }
        let buf = match st.spare.pop() {
            Some(b) => b,
            None if st.buffers < self.cfg.write_buffers => {
                st.buffers += 1;
                aligned(self.page_size).0
            }
            None => {
                self.wake.notify_all();
                return false;
            }
        };
        let Some(page) = st.ready.pop_front() else {
            st.spare.push(buf);
            return false;
        };
        let start = buf.as_ptr().align_offset(4096).min(4096);
        let seq = st.next_seq;
        st.next_seq += 1;
        // The waiting invalidations go first (entries without a key: all the same size),
        // at most half a page of them so that records still fit.
        let room = (self.page_size - PAGE_HDR) / 2 / format::SUMMARY_FIXED * format::SUMMARY_FIXED;
        let take = if take_pending {
            st.pending.len().min(room)
        } else {
            0
        };
        let rest = st.pending.split_off(take);
        let summary = std::mem::replace(&mut st.pending, rest);
        if !summary.is_empty() {
            st.dirty_since.get_or_insert_with(Instant::now);
        }
        st.current = Some(OpenPage {
            page,
            seq,
            buf,
            start,
            used: PAGE_HDR,
            records: 0,
            summary,
        });
        self.c.page_allocs.fetch_add(1, Ordering::Relaxed);
        if st.ready.len() < st.ready_want {
            self.wake.notify_all();
        }
        true
    }

    /// Finish the page being filled (summary and header) and queue it for the writer.
    fn seal(&self, st: &mut WriteState) {
        let Some(mut p) = st.current.take() else {
            return;
        };
        let end = Self::close_image(&mut p);
        let start = p.start;
        p.buf[start + end..start + self.page_size].fill(0);
        st.dirty_since = None;
        st.sealed.push_back(Arc::new(p));
        self.wake.notify_all();
    }

    /// Write the summary after the records and the header in front of them, making the
    /// buffer a page image as far as it is filled. Returns where the image ends.
    fn close_image(p: &mut OpenPage) -> usize {
        let (start, used) = (p.start, p.used);
        let summary = std::mem::take(&mut p.summary);
        p.buf[start + used..start + used + summary.len()].copy_from_slice(&summary);
        let hdr = PageHeader {
            seq: p.seq,
            page: p.page,
            records: p.records,
            used: used as u32,
            summary_len: summary.len() as u32,
            summary_crc: memfabric_checksum::crc32c(&summary),
        };
        format::put_page_header(&mut p.buf[start..start + PAGE_HDR], &hdr);
        let end = used + summary.len();
        p.summary = summary;
        end
    }

    /// Record that the record at `loc` is no longer its key's value (so that a restart
    /// does not bring it back): an invalidation in the page being filled, or waiting for
    /// the next one.
    pub(crate) fn invalidate(&self, loc: u64) {
        let mut entry = Vec::with_capacity(format::SUMMARY_FIXED);
        format::put_invalidation(&mut entry, loc);
        self.note(&entry);
    }

    /// Record a `flush_all` (`time` 0: CAS below `cas` dead) or a delayed one, for a
    /// restart to apply.
    pub(crate) fn flush_marker(&self, time: u32, cas: u64) {
        let mut entry = Vec::with_capacity(format::SUMMARY_FIXED);
        format::put_flush(&mut entry, time, cas);
        self.note(&entry);
    }

    /// Record summary entries again (those of a page whose write failed).
    pub(crate) fn renote(&self, entries: &[u8]) {
        if !entries.is_empty() {
            self.note(entries);
        }
    }

    fn note(&self, entry: &[u8]) {
        let mut st = self.lock();
        if st.current.is_none() {
            // Open a page for it if one is free, so that the next snapshot writes it.
            self.open_page(&mut st);
        }
        let ps = self.page_size;
        if let Some(p) = st.current.as_mut() {
            if p.used + p.summary.len() + entry.len() <= ps {
                p.summary.extend_from_slice(entry);
                st.dirty_since.get_or_insert_with(Instant::now);
                return;
            }
        }
        if st.current.is_some() {
            self.seal(&mut st);
            self.open_page(&mut st);
        }
        if let Some(p) = st.current.as_mut() {
            p.summary.extend_from_slice(entry);
            st.dirty_since.get_or_insert_with(Instant::now);
        } else if st.pending.len() + entry.len() <= PENDING_MAX {
            st.pending.extend_from_slice(entry);
        } else {
            self.c.invalidations_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Read `len` bytes at `loc` (clipped to its page): from a page still in memory, or
    /// from the device (here, with `pread`).
    pub(crate) fn read(&self, loc: u64, len: usize) -> Fetch {
        match self.plan_read(loc, len) {
            Planned::Ready(f) => f,
            Planned::Device(d) => self.finish_read(&d, self.device_read(&d)),
        }
    }

    /// Do a device read here, with `pread`.
    pub(crate) fn device_read(&self, d: &DeviceRead) -> io::Result<(Vec<u8>, usize)> {
        let (mut buf, start) = aligned(d.len);
        read_full(
            &self.files[d.file].file,
            &mut buf[start..start + d.len],
            d.pos,
        )?;
        Ok((buf, start))
    }

    /// What reading `len` bytes at `loc` takes: nothing more when the page is still in
    /// memory (or the location is not readable), else one device read.
    pub(crate) fn plan_read(&self, loc: u64, len: usize) -> Planned {
        let ps = self.page_size as u64;
        let page = (loc / ps) as u32;
        let off = (loc % ps) as usize;
        if page >= self.pages || off < PAGE_HDR {
            return Planned::Ready(Fetch::Failed);
        }
        let len = len.min(self.page_size - off);
        {
            let st = self.lock();
            if st
                .current
                .as_ref()
                .is_some_and(|p| p.page == page && off + crate::item::HDR > p.used)
            {
                // Past what the page being filled holds: an earlier page's bytes.
                return Planned::Ready(Fetch::Failed);
            }
            let in_memory = st
                .current
                .as_ref()
                .filter(|p| p.page == page)
                .map(|p| p.bytes(self.page_size))
                .or_else(|| {
                    st.sealed
                        .iter()
                        .find(|p| p.page == page)
                        .map(|p| p.bytes(self.page_size))
                });
            if let Some(b) = in_memory {
                return Planned::Ready(Fetch::Bytes(b[off..off + len].to_vec()));
            }
        }
        let Some(file) = self
            .files
            .iter()
            .position(|f| page >= f.first_page && page < f.first_page + f.pages)
        else {
            return Planned::Ready(Fetch::Failed);
        };
        let f = &self.files[file];
        let pos = (page - f.first_page) as u64 * ps + off as u64;
        // O_DIRECT: whole 4 KiB blocks into 4 KiB-aligned memory.
        let (lo, hi) = if f.direct {
            (pos & !4095, (pos + len as u64).next_multiple_of(4096))
        } else {
            (pos, pos + len as u64)
        };
        Planned::Device(DeviceRead {
            loc,
            file,
            pos: lo,
            len: (hi - lo) as usize,
            skip: (pos - lo) as usize,
            want: len,
        })
    }

    /// The bytes a device read brought (`buf[start..]`, `d.len` of them), or its error
    /// (logged, counted in `flash_read_errors`).
    pub(crate) fn finish_read(&self, d: &DeviceRead, r: io::Result<(Vec<u8>, usize)>) -> Fetch {
        match r {
            Ok((mut buf, start)) if buf.len() >= start + d.skip + d.want => {
                let from = start + d.skip;
                if from == 0 && buf.len() == d.want {
                    return Fetch::Bytes(buf);
                }
                buf.copy_within(from..from + d.want, 0);
                buf.truncate(d.want);
                Fetch::Bytes(buf)
            }
            Ok(_) => Fetch::Failed,
            Err(e) => {
                self.c.read_errors.fetch_add(1, Ordering::Relaxed);
                self.log_error(format_args!("flash read at {}: {e}", d.loc));
                Fetch::Failed
            }
        }
    }

    /// The open file a device read goes to.
    pub(crate) fn device_file(&self, d: &DeviceRead) -> &File {
        &self.files[d.file].file
    }

    pub(crate) fn first_file(&self) -> Option<&File> {
        self.files.first().map(|f| &f.file)
    }

    fn file_of(&self, page: u32) -> Option<(&FlashFile, u64)> {
        let f = self
            .files
            .iter()
            .find(|f| page >= f.first_page && page < f.first_page + f.pages)?;
        Some((f, (page - f.first_page) as u64 * self.page_size as u64))
    }

    fn log_error(&self, msg: std::fmt::Arguments<'_>) {
        let mut last = self
            .last_error_log
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            *last = Some(Instant::now());
            eprintln!("memfabric flash tier: {msg}");
        }
    }

    /// The writer's next job, waiting for one: `Reclaim(page)` when the reserve of ready
    /// pages is low, `Write(page)` when a sealed page waits; `None` at shutdown once
    /// everything sealed is written.
    pub(crate) fn next_job(&self) -> Option<Job> {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            while st.failed.front().is_some_and(|&(_, t)| t <= now) {
                // Back through reclaim: what a restart could read there is erased
                // before the page is used again.
                if let Some((p, _)) = st.failed.pop_front() {
                    st.on_flash.push_front(p);
                }
            }
            if let Some(p) = st.sealed.front() {
                return Some(Job::Write(Arc::clone(p)));
            }
            if st.shutdown {
                return None;
            }
            if st.ready.len() < st.ready_want {
                if let Some(p) = st.on_flash.pop_front() {
                    return Some(Job::Reclaim(p));
                }
            }
            if st
                .dirty_since
                .is_some_and(|t| t.elapsed() >= SNAPSHOT_AFTER)
            {
                if let Some(p) = st.current.as_mut() {
                    let end = Self::close_image(p).next_multiple_of(4096);
                    let (mut img, start) = aligned(end);
                    img[start..start + end].copy_from_slice(&p.buf[p.start..p.start + end]);
                    let page = p.page;
                    st.dirty_since = None;
                    return Some(Job::Snapshot(page, img, start, end));
                }
                st.dirty_since = None;
            }
            st = self
                .wake
                .wait_timeout(st, SNAPSHOT_AFTER / 2)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Write a sealed page (the writer thread). Returns the page on failure, so that the
    /// caller clears the slots that point into it.
    pub(crate) fn write(&self, p: &Arc<OpenPage>) -> bool {
        let ok = match self.file_of(p.page) {
            Some((f, off)) => match f
                .file
                .write_all_at(p.bytes(self.page_size), off)
                .and_then(|()| f.file.sync_data())
            {
                Ok(()) => true,
                Err(e) => {
                    self.c.write_errors.fetch_add(1, Ordering::Relaxed);
                    self.log_error(format_args!("flash write of page {}: {e}", p.page));
                    false
                }
            },
            None => false,
        };
        if ok {
            self.c
                .device_bytes_written
                .fetch_add(self.page_size as u64, Ordering::Relaxed);
        }
        ok
    }

    /// Write a partial image of the page being filled (a snapshot).
    pub(crate) fn write_snapshot(&self, page: u32, img: &[u8]) {
        if let Some((f, off)) = self.file_of(page) {
            match f
                .file
                .write_all_at(img, off)
                .and_then(|()| f.file.sync_data())
            {
                Ok(()) => {
                    self.c.snapshots.fetch_add(1, Ordering::Relaxed);
                    self.c
                        .device_bytes_written
                        .fetch_add(img.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    self.c.write_errors.fetch_add(1, Ordering::Relaxed);
                    self.log_error(format_args!("flash write of page {page}: {e}"));
                }
            }
        }
    }

    /// Erase a page's header on flash (durably), so that a restart does not read what
    /// it held. False when that failed.
    pub(crate) fn erase_header(&self, page: u32) -> bool {
        let Some((f, off)) = self.file_of(page) else {
            return false;
        };
        let (buf, start) = aligned(4096);
        match f
            .file
            .write_all_at(&buf[start..start + 4096], off)
            .and_then(|()| f.file.sync_data())
        {
            Ok(()) => true,
            Err(e) => {
                self.c.write_errors.fetch_add(1, Ordering::Relaxed);
                self.log_error(format_args!("flash write of page {page}: {e}"));
                false
            }
        }
    }

    /// The written (or failed) front page leaves the queue: its buffer is reused.
    pub(crate) fn written(&self, page: u32, ok: bool) {
        let mut st = self.lock();
        if let Some(p) = st.sealed.pop_front() {
            debug_assert_eq!(p.page, page);
            match Arc::try_unwrap(p) {
                Ok(p) => st.spare.push(p.buf),
                Err(_) => st.buffers -= 1,
            }
        }
        if ok {
            st.on_flash.push_back(page);
        } else {
            st.failed.push_back((page, Instant::now() + FAILED_RETRY));
        }
    }

    /// A reclaimed page is free again; or, when its header could not be erased, out of
    /// use for a while (then reclaimed again).
    pub(crate) fn reclaimed(&self, page: u32, erased: bool) {
        let mut st = self.lock();
        if erased {
            // Before it can be filled again (it is not ready yet): see `page_gen`.
            if let Some(g) = self.page_gen.get(page as usize) {
                g.fetch_add(1, Ordering::SeqCst);
            }
            self.c.page_reclaims.fetch_add(1, Ordering::Relaxed);
            st.ready.push_back(page);
        } else {
            st.failed.push_back((page, Instant::now() + FAILED_RETRY));
        }
    }

    /// A page's header and summary as on flash, if both are whole (for reclaim and a
    /// restart: the records themselves are read only where needed).
    pub(crate) fn page_summary(&self, page: u32) -> Option<(PageHeader, Vec<u8>)> {
        let (f, off) = self.file_of(page)?;
        let (mut hb, hs) = aligned(4096);
        if let Err(e) = read_full(&f.file, &mut hb[hs..hs + 4096], off) {
            self.c.read_errors.fetch_add(1, Ordering::Relaxed);
            self.log_error(format_args!("flash read of page {page}: {e}"));
            return None;
        }
        let ph = format::parse_page_header(&hb[hs..hs + 4096], self.page_size)
            .filter(|h| h.page == page)?;
        let ps = self.page_size as u64;
        let (lo, hi) = (ph.used as u64, ph.used as u64 + ph.summary_len as u64);
        let (alo, ahi) = (lo & !4095, hi.next_multiple_of(4096).min(ps));
        let n = (ahi - alo) as usize;
        let (mut sb, ss) = aligned(n);
        if let Err(e) = read_full(&f.file, &mut sb[ss..ss + n], off + alo) {
            self.c.read_errors.fetch_add(1, Ordering::Relaxed);
            self.log_error(format_args!("flash read of page {page}: {e}"));
            return None;
        }
        let s0 = ss + (lo - alo) as usize;
        let summary = sb[s0..s0 + ph.summary_len as usize].to_vec();
        (memfabric_checksum::crc32c(&summary) == ph.summary_crc).then_some((ph, summary))
    }

    /// Stop: seal what is being filled so the writer writes it, and let the writer end.
    pub(crate) fn shutdown(&self) {
        let mut st = self.lock();
        self.seal(&mut st);
        st.shutdown = true;
        self.wake.notify_all();
    }

    pub(crate) fn stats(&self) -> FlashStats {
        let (free, used, buffered, reserved) = {
            let st = self.lock();
            (
                st.ready.len() as u64,
                st.on_flash.len() as u64,
                st.sealed.len() as u64 + st.current.is_some() as u64,
                st.ready_want as u64,
            )
        };
        let c = &self.c;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FlashStats {
            limit_bytes: self.pages as u64 * self.page_size as u64,
            page_size: self.page_size as u64,
            pages: self.pages as u64,
            pages_free: free,
            pages_used: used + buffered,
            pages_buffered: buffered,
            pages_reserved: reserved,
            page_allocs: l(&c.page_allocs),
            page_reclaims: l(&c.page_reclaims),
            objects_written: l(&c.objects_written),
            bytes_written: l(&c.bytes_written),
            objects_read: l(&c.objects_read),
            bytes_read: l(&c.bytes_read),
            objects_evicted: l(&c.objects_evicted),
            bytes_evicted: l(&c.bytes_evicted),
            objects_used: l(&c.objects_used),
            bytes_used: l(&c.bytes_used),
            device_bytes_written: l(&c.device_bytes_written),
            admitted_bytes: l(&c.admitted_bytes),
            reinserted: l(&c.reinserted),
            dropped_budget: l(&c.dropped_budget),
            dropped_no_buffer: l(&c.dropped_no_buffer),
            dropped_too_large: l(&c.dropped_too_large),
            chained_written: l(&c.chained_written),
            chained_used: self.chained_lock().len() as u64,
            write_errors: l(&c.write_errors),
            read_errors: l(&c.read_errors),
            badcrc: l(&c.badcrc),
            misses: l(&c.misses),
            reads: l(&c.reads),
            recached: l(&c.recached),
            overwritten: l(&c.overwritten),
            invalidations_lost: l(&c.invalidations_lost),
            snapshots: l(&c.snapshots),
            recovered: l(&c.recovered),
            index_drops: l(&c.index_drops),
            recovery_us: l(&c.recovery_us),
            direct_io: self.direct_io(),
            item_min: self.item_min.load(Ordering::Relaxed) as u64,
            write_budget: self.cfg.write_budget,
        }
    }

    /// A record left flash (its slot cleared or replaced): what `objects_used` counts.
    pub(crate) fn forget(&self, rec_len: usize) {
        let _ = self
            .c
            .objects_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        let _ = self
            .c
            .bytes_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(rec_len as u64))
            });
    }
}

/// An item a previous run left on flash, to index again.
pub(crate) struct Recovered {
    pub key: Vec<u8>,
    pub loc: u64,
    /// Its slot class (`CHAINED_SLOT_CLASS` for a chained item's head).
    pub class: u8,
    pub cas: u64,
    /// A chained item's bytes in `bytes_used` (0 for a record: its class says).
    pub bytes: u64,
}

/// What a restart found on flash.
pub(crate) struct Scan {
    /// The newest record of every key that no later invalidation or flush removed and
    /// that has not expired.
    pub items: Vec<Recovered>,
    /// A delayed `flush_all` still to come (the store's `flush_time` word).
    pub flush_time: Option<u32>,
    /// Pages a previous run left.
    pub pages_found: usize,
}

impl Flash {
    /// Read every page header and summary a previous run left, replay them in write
    /// order, and take the pages found into the reclaim order (the rest are free). With
    /// `recover` off: erase every page header instead (nothing comes back, ever).
    pub(crate) fn scan(&self, now: u32) -> Scan {
        let mut scan = Scan {
            items: Vec::new(),
            flush_time: None,
            pages_found: 0,
        };
        if !self.cfg.recover {
            for page in 0..self.pages {
                self.erase_header(page);
            }
            return scan;
        }
        let ps = self.page_size as u64;
        let mut found: Vec<(u64, u32, Vec<u8>)> = (0..self.pages)
            .filter_map(|page| {
                self.page_summary(page)
                    .map(|(ph, summary)| (ph.seq, page, summary))
            })
            .collect();
        found.sort_by_key(|f| f.0);
        scan.pages_found = found.len();
        let mut by_key: std::collections::HashMap<Vec<u8>, Recovered> = Default::default();
        let mut by_loc: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        let mut times: std::collections::HashMap<Vec<u8>, (u32, u32)> = Default::default();
        // Flushes apply to every record, wherever it was written relative to them (an
        // item may go to flash after a flush that already made it dead): the highest
        // flush CAS, and the latest delayed flush time that has passed.
        let (mut flush_cas, mut flushed_upto) = (0u64, 0u32);
        for (_, page, summary) in &found {
            for e in format::summary_entries(summary) {
                match e.kind {
                    format::KIND_RECORD | format::KIND_CHAINED => {
                        let off = e.off as u64;
                        if off < PAGE_HDR as u64 || off >= ps {
                            continue;
                        }
                        let loc = *page as u64 * ps + off;
                        let item = Recovered {
                            key: e.key.to_vec(),
                            loc,
                            class: if e.kind == format::KIND_CHAINED {
                                CHAINED_SLOT_CLASS
                            } else {
                                e.class
                            },
                            cas: e.cas,
                            bytes: e.bytes,
                        };
                        if let Some(old) = by_key.insert(e.key.to_vec(), item) {
                            by_loc.remove(&old.loc);
                        }
                        by_loc.insert(loc, e.key.to_vec());
                        times.insert(e.key.to_vec(), (e.time, e.exptime));
                    }
                    format::KIND_INVALIDATE => {
                        if let Some(k) = by_loc.remove(&e.cas) {
                            by_key.remove(&k);
                        }
                    }
                    format::KIND_FLUSH if e.time == 0 => {
                        flush_cas = flush_cas.max(e.cas);
                        scan.flush_time = None;
                    }
                    format::KIND_FLUSH if e.time <= now => flushed_upto = flushed_upto.max(e.time),
                    format::KIND_FLUSH => scan.flush_time = Some(e.time),
                    _ => {}
                }
            }
        }
        scan.items = by_key
            .into_values()
            .filter(|r| {
                let (time, exptime) = times.get(&r.key).copied().unwrap_or((0, 0));
                (exptime == 0 || exptime > now)
                    && r.cas >= flush_cas
                    && (flushed_upto == 0 || time > flushed_upto)
            })
            .collect();
        let mut st = self.lock();
        let on_flash: std::collections::HashSet<u32> = found.iter().map(|f| f.1).collect();
        st.on_flash = found.iter().map(|f| f.1).collect();
        st.ready = (0..self.pages).filter(|p| !on_flash.contains(p)).collect();
        st.next_seq = found.last().map_or(1, |f| f.0 + 1);
        scan
    }
}

/// What the writer thread does next.
pub(crate) enum Job {
    Write(Arc<OpenPage>),
    Reclaim(u32),
    /// Page, backing memory, where the aligned image starts, its length.
    Snapshot(u32, Vec<u8>, usize, usize),
}

impl Job {
    pub(crate) fn page_bytes(p: &Arc<OpenPage>, page_size: usize) -> (&[u8], u32) {
        (p.bytes(page_size), p.page)
    }
}

/// A value given as several slices, handed out in consecutive runs of bytes.
struct Segments<'a> {
    parts: &'a [&'a [u8]],
    at: usize,
    off: usize,
}

impl<'a> Segments<'a> {
    fn new(parts: &'a [&'a [u8]]) -> Self {
        Segments {
            parts,
            at: 0,
            off: 0,
        }
    }

    /// The next `n` bytes (fewer if the value ends), as slices of the parts.
    fn take(&mut self, mut n: usize) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        while n > 0 && self.at < self.parts.len() {
            let p = self.parts[self.at];
            let k = n.min(p.len() - self.off);
            out.push(&p[self.off..self.off + k]);
            self.off += k;
            n -= k;
            if self.off == p.len() {
                self.at += 1;
                self.off = 0;
            }
        }
        out
    }
}

fn with_path(e: io::Error, path: &std::path::Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// `read_exact_at`, with a short read (a truncated file) as an error.
fn read_full(f: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    f.read_exact_at(buf, off)
}

/// Does an `O_DIRECT` handle accept aligned reads here? (Some file systems open with
/// the flag and then fail every transfer.)
fn direct_io_works(f: &File) -> bool {
    let (mut buf, start) = aligned(4096);
    match f.read_at(&mut buf[start..start + 4096], 0) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::EINVAL),
    }
}
