//! The store's side of the flash tier: items evicted to flash, reads of flash slots
//! (lock-free, then verified), promotion back to RAM for commands that modify a flash
//! item, and the writer thread (page writes and FIFO reclaim).
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::flash::format::{self, RecordHeader};
use crate::flash::{DeviceRead, Fetch, Flash, FlashStats, Job, Planned, CHAINED_SLOT_CLASS};
use crate::index::{self, FlashSlot, KeyHash, FLASH_REFERENCED};
use crate::item::{self, Header, HDR};
use crate::KEY_MAX_LEN;

use super::options::{ItemInfo, LinkOptions};
use super::state::{Inner, Store};
use super::txn::Txn;

/// The flash slots of a key's two buckets whose tag matches (up to all 14 slots).
#[derive(Clone, Copy, Debug, Default)]
pub struct FlashCandidates {
    n: usize,
    slots: [(usize, usize, u64); 2 * index::SLOTS],
}

impl FlashCandidates {
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn push(&mut self, b: usize, i: usize, raw: u64) {
        if self.n < self.slots.len() {
            self.slots[self.n] = (b, i, raw);
            self.n += 1;
        }
    }

    fn iter(&self) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        self.slots[..self.n].iter().copied()
    }

    fn get(&self, i: usize) -> Option<(usize, usize, u64)> {
        self.slots[..self.n].get(i).copied()
    }
}

/// An item read from flash: its metadata and value, and the slot it was read through.
#[derive(Clone, Debug)]
pub struct FlashHit {
    pub info: ItemInfo,
    pub value: Vec<u8>,
    slot: (usize, usize, u64),
    /// Its page's reclaim count when it was read (`Flash::page_gen`).
    gen: u64,
}

/// A record read through a flash slot.
enum FlashRecord {
    /// The key's record (owned copy).
    Item(Header, Vec<u8>),
    /// Another key's record (a tag collision).
    Other,
    /// Not a readable record (page reused or torn, crc mismatch, I/O error).
    Bad,
}

impl Store {
    /// Is there a flash tier?
    pub fn has_flash(&self) -> bool {
        self.flash.is_some()
    }

    /// The flash slots `key` may be in (empty when there is no flash tier). Lock-free,
    /// reads only the index: a RAM miss asks this before going to flash.
    pub fn flash_candidates(&self, key: &[u8]) -> FlashCandidates {
        let mut c = FlashCandidates::default();
        if self.flash.is_none() || key.is_empty() || key.len() > KEY_MAX_LEN {
            return c;
        }
        let kh = self.index.hash(key);
        for b in [kh.b1, kh.b2] {
            loop {
                let v = self.index.read_begin(b);
                let before = c.n;
                for i in 0..index::SLOTS {
                    let raw = self.index.raw_slot(b, i);
                    if FlashSlot::decode(raw).is_some_and(|s| s.tag == kh.tag) {
                        c.push(b, i, raw);
                    }
                }
                if self.index.read_validate(b, v) {
                    break;
                }
                c.n = before;
            }
        }
        c
    }

    /// Read `key` from flash through `cands` (blocking): see [`FlashReader::read`].
    pub fn read_flash(&self, key: &[u8], cands: &FlashCandidates) -> Option<FlashHit> {
        self.inner.read_flash(key, cands)
    }

    /// A handle that reads from flash and may outlive a borrow of the store (I/O threads).
    pub fn flash_reader(&self) -> FlashReader {
        FlashReader(Arc::clone(&self.inner))
    }

    /// The most a read through `cands` can return (the largest candidate's chunk size).
    pub fn flash_read_bytes(&self, cands: &FlashCandidates) -> usize {
        let chained = self
            .flash
            .as_ref()
            .map_or(0, |f| f.max_chained_value().min(self.cfg.item_size_max));
        cands
            .iter()
            .filter_map(|(_, _, raw)| FlashSlot::decode(raw))
            .map(|s| match s.class {
                CHAINED_SLOT_CLASS => chained,
                c => self.slabs.classes.get(c as usize).map_or(0, |c| c.size),
            })
            .max()
            .unwrap_or(0)
    }

    /// Does `hit` still stand: is its slot still the key's flash slot it was read
    /// through? (A command resumed after a flash read answers with the value read only
    /// if nothing replaced or removed it meanwhile.)
    pub fn flash_hit_current(&self, hit: &FlashHit) -> bool {
        let (b, i, raw) = hit.slot;
        self.slot_still_names(b, i, raw, hit.gen)
    }

    /// Change which items go to flash (`extstore item_size` / `extstore low_ttl`).
    pub fn set_flash_admission(&self, item_min: Option<usize>, low_ttl: Option<u32>) {
        if let Some(f) = self.flash.as_ref() {
            f.set_admission(item_min, low_ttl);
        }
    }

    /// The flash tier's counters, when there is one.
    pub fn flash_stats(&self) -> Option<FlashStats> {
        self.flash.as_ref().map(|f| f.stats())
    }

    /// For tests: the keys that more than one index slot names (RAM or flash), which must
    /// never happen. Walks the whole index and reads every flash slot's record: slow, and
    /// only meaningful while nothing writes.
    #[doc(hidden)]
    pub fn keys_named_twice(&self) -> Vec<Vec<u8>> {
        let mut seen = std::collections::HashMap::<Vec<u8>, u32>::new();
        for b in 0..self.index.buckets() {
            for i in 0..index::SLOTS {
                let raw = self.index.raw_slot(b, i);
                let key = if let Some(s) = index::Slot::decode(raw) {
                    let h = item::read_header(&self.arena, s.off);
                    let mut k = vec![0u8; (h.key_len as usize).min(KEY_MAX_LEN)];
                    self.arena.read(item::key_off(s.off), &mut k);
                    k
                } else if let Some(fs) = FlashSlot::decode(raw) {
                    let (Some(fl), Some(len)) = (
                        self.flash.as_ref(),
                        match fs.class {
                            CHAINED_SLOT_CLASS => self.flash.as_ref().map(|f| f.head_read_len()),
                            c => self.slabs.classes.get(c as usize).map(|c| c.size),
                        },
                    ) else {
                        continue;
                    };
                    match fl.read(fs.loc, len) {
                        Fetch::Bytes(bytes) => match format::parse_record(&bytes) {
                            Some(r) => r.key.to_vec(),
                            None => continue,
                        },
                        Fetch::Failed => continue,
                    }
                } else {
                    continue;
                };
                *seen.entry(key).or_default() += 1;
            }
        }
        seen.into_iter().filter(|e| e.1 > 1).map(|e| e.0).collect()
    }
}

/// Reads from the flash tier for threads that do not borrow the `Store`.
#[derive(Clone)]
pub struct FlashReader(Arc<Inner>);

impl FlashReader {
    /// Read `key` from flash through `cands` (blocking, with `pread`: an I/O thread
    /// calls this, or a caller that cannot wait). A record that is damaged, dead or gone
    /// clears its slot and reads as a miss; `None` is a miss.
    pub fn read(&self, key: &[u8], cands: &FlashCandidates) -> Option<FlashHit> {
        self.0.read_flash(key, cands)
    }

    /// Start a lookup of `key` through `cands` whose device reads the caller does
    /// (an I/O engine): drive it with [`FlashReader::advance`].
    pub fn lookup(&self, key: Vec<u8>, cands: FlashCandidates) -> FlashLookup {
        self.0.lookup(key, cands)
    }

    /// Take a lookup as far as it goes without the device: `done` is the result of the
    /// read the previous step asked for (`None` the first time). Returns the next read
    /// to do, or the lookup's result.
    pub fn advance(
        &self,
        lk: &mut FlashLookup,
        done: Option<std::io::Result<(Vec<u8>, usize)>>,
    ) -> LookupStep {
        self.0.advance(lk, done)
    }

    /// Where a device read goes (for an I/O engine).
    pub fn device_file(&self, d: &DeviceRead) -> Option<&std::fs::File> {
        self.0.flash.as_ref().map(|f| f.device_file(d))
    }

    /// Do a device read here, with `pread`.
    pub fn device_read(&self, d: &DeviceRead) -> std::io::Result<(Vec<u8>, usize)> {
        match self.0.flash.as_ref() {
            Some(f) => f.device_read(d),
            None => Err(std::io::Error::other("no flash tier")),
        }
    }

    /// The tier's first file (an I/O engine's start-up probe reads it).
    pub fn first_file(&self) -> Option<&std::fs::File> {
        self.0.flash.as_ref().and_then(|f| f.first_file())
    }
}

/// A lookup of one key on flash, one candidate slot at a time (the chained item's
/// pieces one after another), whose device reads are done by its driver.
pub struct FlashLookup {
    key: Vec<u8>,
    kh: KeyHash,
    cands: FlashCandidates,
    next: usize,
    cur: Option<((usize, usize, u64), RecordRead)>,
    waiting: Option<DeviceRead>,
}

/// What a lookup needs next.
pub enum LookupStep {
    /// This device read (into memory from `flash::aligned`), then `advance` again.
    Read(DeviceRead),
    /// The lookup's result: the item, or a miss.
    Done(Option<FlashHit>),
}

/// Reading the record one flash slot names: the record (or a chained item's head), then
/// the chained item's pieces in order.
struct RecordRead {
    fs: FlashSlot,
    stage: RecordStage,
    /// The reclaim count of the record's page before it was read (`Flash::page_gen`).
    gen: u64,
}

enum RecordStage {
    Head,
    Pieces {
        h: Header,
        crc: u32,
        pieces: Vec<(u64, u32)>,
        value: Vec<u8>,
    },
}

impl Inner {
    /// Read `key` from flash through `cands`, doing the device reads here.
    fn read_flash(&self, key: &[u8], cands: &FlashCandidates) -> Option<FlashHit> {
        let fl = self.flash.as_ref()?;
        let mut lk = self.lookup(key.to_vec(), *cands);
        let mut done = None;
        loop {
            match self.advance(&mut lk, done.take()) {
                LookupStep::Done(hit) => return hit,
                LookupStep::Read(d) => done = Some(fl.device_read(&d)),
            }
        }
    }

    fn lookup(&self, key: Vec<u8>, cands: FlashCandidates) -> FlashLookup {
        if let Some(fl) = self.flash.as_ref() {
            fl.c.reads.fetch_add(1, Ordering::Relaxed);
        }
        FlashLookup {
            kh: self.index.hash(&key),
            key,
            cands,
            next: 0,
            cur: None,
            waiting: None,
        }
    }

    fn advance(
        &self,
        lk: &mut FlashLookup,
        done: Option<std::io::Result<(Vec<u8>, usize)>>,
    ) -> LookupStep {
        let Some(fl) = self.flash.as_ref() else {
            return LookupStep::Done(None);
        };
        let mut got = match (lk.waiting.take(), done) {
            (Some(d), Some(r)) => Some(fl.finish_read(&d, r)),
            _ => None,
        };
        loop {
            if lk.cur.is_none() {
                let Some(c) = lk.cands.get(lk.next) else {
                    fl.c.misses.fetch_add(1, Ordering::Relaxed);
                    return LookupStep::Done(None);
                };
                lk.next += 1;
                match FlashSlot::decode(c.2) {
                    Some(fs) => {
                        let rr = RecordRead {
                            fs,
                            stage: RecordStage::Head,
                            gen: fl.page_gen(fs.loc),
                        };
                        lk.cur = Some((c, rr));
                    }
                    None => continue,
                }
                got = None;
            }
            let Some((c, rr)) = lk.cur.as_mut() else {
                continue;
            };
            let outcome = got.take().and_then(|f| self.record_feed(rr, &lk.key, f));
            let Some(rec) = outcome else {
                // The next read this record needs.
                let Some((loc, len)) = self.record_need(rr, lk.key.len()) else {
                    let (b, i, raw) = *c;
                    lk.cur = None;
                    self.clear_flash_slot(&lk.kh, b, i, raw);
                    continue;
                };
                match fl.plan_read(loc, len) {
                    Planned::Ready(f) => got = Some(f),
                    Planned::Device(d) => {
                        lk.waiting = Some(d);
                        return LookupStep::Read(d);
                    }
                }
                continue;
            };
            let (b, i, raw) = *c;
            let gen = rr.gen;
            lk.cur = None;
            // Read through a slot that changed meanwhile (the item replaced, removed or
            // moved; its page reclaimed, even if filled again with the same key at the
            // same place): nothing to serve, nor to clear.
            let current = self.slot_still_names(b, i, raw, gen);
            match rec {
                FlashRecord::Other => continue,
                FlashRecord::Bad => {
                    if current {
                        self.clear_flash_slot(&lk.kh, b, i, raw);
                    }
                    continue;
                }
                FlashRecord::Item(h, value) => {
                    if !current {
                        continue;
                    }
                    if let Some(flushed) = self.dead(&h, self.clock.now()) {
                        self.count_dead_lookup(flushed);
                        self.clear_flash_slot(&lk.kh, b, i, raw);
                        return LookupStep::Done(None);
                    }
                    self.index.mark_flash_referenced(b, i, raw);
                    fl.c.objects_read.fetch_add(1, Ordering::Relaxed);
                    fl.c.bytes_read
                        .fetch_add(value.len() as u64, Ordering::Relaxed);
                    return LookupStep::Done(Some(FlashHit {
                        info: self.info(&h),
                        value,
                        slot: (b, i, raw),
                        gen,
                    }));
                }
            }
        }
    }

    /// Does flash slot (b, i) still hold `raw` (whatever its referenced bit), with its
    /// page not reclaimed since its reclaim count was `gen`? (What was read through it
    /// is then what it names.)
    fn slot_still_names(&self, b: usize, i: usize, raw: u64, gen: u64) -> bool {
        let now = self.index.raw_slot(b, i);
        // The slot word is stored after a release fence (`Index::set_raw_slot`): seeing a
        // slot stored after a reclaim means seeing that reclaim's count too.
        std::sync::atomic::fence(Ordering::Acquire);
        let page_gen = self.flash.as_ref().map_or(0, |f| {
            FlashSlot::decode(raw).map_or(u64::MAX, |fs| f.page_gen(fs.loc))
        });
        now & !FLASH_REFERENCED == raw & !FLASH_REFERENCED && page_gen == gen
    }

    /// Read and verify the record a flash slot names (doing the device reads here);
    /// compare its key with `key`. For writers holding the key's bucket locks: the page
    /// cannot be reclaimed meanwhile (its reclaim takes those locks).
    fn read_record(&self, raw: u64, key: &[u8]) -> FlashRecord {
        let (Some(fl), Some(fs)) = (self.flash.as_ref(), FlashSlot::decode(raw)) else {
            return FlashRecord::Bad;
        };
        let mut rr = RecordRead {
            fs,
            stage: RecordStage::Head,
            gen: fl.page_gen(fs.loc),
        };
        loop {
            let Some((loc, len)) = self.record_need(&rr, key.len()) else {
                return FlashRecord::Bad;
            };
            if let Some(r) = self.record_feed(&mut rr, key, fl.read(loc, len)) {
                return r;
            }
        }
    }

    /// The read a record needs next: where, how many bytes. `None` when its slot names
    /// no class it can be read by.
    fn record_need(&self, rr: &RecordRead, key_len: usize) -> Option<(u64, usize)> {
        let fl = self.flash.as_ref()?;
        match &rr.stage {
            RecordStage::Head => {
                let len = match rr.fs.class {
                    CHAINED_SLOT_CLASS => fl.head_read_len(),
                    c => self.slabs.classes.get(c as usize)?.size,
                };
                Some((rr.fs.loc, len))
            }
            RecordStage::Pieces { pieces, value, .. } => {
                // Pieces come in order: the next is the one after what is read.
                let mut at = 0;
                let mut idx = 0;
                while idx < pieces.len() && at + pieces[idx].1 as usize <= value.len() {
                    at += pieces[idx].1 as usize;
                    idx += 1;
                }
                let (loc, len) = *pieces.get(idx)?;
                Some((loc, format::record_len(key_len, len as usize)))
            }
        }
    }

    /// Take the bytes of the read `record_need` asked for: the record's outcome, or
    /// `None` when it needs another read (a chained item's next piece).
    fn record_feed(&self, rr: &mut RecordRead, key: &[u8], got: Fetch) -> Option<FlashRecord> {
        let fl = self.flash.as_ref()?;
        let Fetch::Bytes(bytes) = got else {
            return Some(FlashRecord::Bad);
        };
        match &mut rr.stage {
            RecordStage::Head => {
                let Some(r) = format::parse_record(&bytes) else {
                    // Another key's record torn the same way would look the same: count
                    // it as a bad read only when the bytes claim to be this key.
                    if bytes.get(item::OFF_KEYLEN).copied() == Some(key.len() as u8)
                        && bytes.get(HDR..HDR + key.len()) == Some(key)
                    {
                        fl.c.badcrc.fetch_add(1, Ordering::Relaxed);
                    }
                    return Some(FlashRecord::Bad);
                };
                if r.key != key {
                    return Some(FlashRecord::Other);
                }
                // A head where a record was expected, or the other way round: not what
                // the slot was made for (its page reused).
                let chained = r.h.iflags & item::F_CHUNKED != 0;
                if chained != (rr.fs.class == CHAINED_SLOT_CLASS) {
                    return Some(FlashRecord::Bad);
                }
                let h = Header {
                    seq: 0,
                    state: item::LINKED,
                    class: r.h.class,
                    key_len: r.h.key_len,
                    iflags: r.h.iflags & !item::F_CHUNKED,
                    cas: r.h.cas,
                    value_len: r.h.value_len,
                    flags: r.h.flags,
                    exptime: r.h.exptime,
                    time: r.h.time,
                    crc: 0,
                    atime: 0,
                };
                if !chained {
                    return Some(FlashRecord::Item(h, r.value.to_vec()));
                }
                let Some((crc, pieces)) = format::parse_chain_table(r.value) else {
                    fl.c.badcrc.fetch_add(1, Ordering::Relaxed);
                    return Some(FlashRecord::Bad);
                };
                let total: usize = pieces.iter().map(|p| p.1 as usize).sum();
                if pieces.is_empty() || total > fl.max_chained_value() {
                    fl.c.badcrc.fetch_add(1, Ordering::Relaxed);
                    return Some(FlashRecord::Bad);
                }
                rr.stage = RecordStage::Pieces {
                    h,
                    crc,
                    pieces,
                    value: Vec::with_capacity(total),
                };
                None
            }
            RecordStage::Pieces {
                h,
                crc,
                pieces,
                value,
            } => {
                let mut at = 0;
                let mut idx = 0;
                while idx < pieces.len() && at + pieces[idx].1 as usize <= value.len() {
                    at += pieces[idx].1 as usize;
                    idx += 1;
                }
                let want = pieces.get(idx).map_or(0, |p| p.1 as usize);
                match format::parse_piece(&bytes, key, h.cas, idx as u32) {
                    Some(p) if p.len() == want => value.extend_from_slice(p),
                    _ => {
                        fl.c.badcrc.fetch_add(1, Ordering::Relaxed);
                        return Some(FlashRecord::Bad);
                    }
                }
                if idx + 1 < pieces.len() {
                    return None;
                }
                if memfabric_checksum::crc32c(value) != *crc {
                    fl.c.badcrc.fetch_add(1, Ordering::Relaxed);
                    return Some(FlashRecord::Bad);
                }
                let mut h = *h;
                h.value_len = value.len() as u32;
                Some(FlashRecord::Item(h, std::mem::take(value)))
            }
        }
    }

    /// Clear flash slot (b, i) if it still holds `raw` (ignoring its referenced bit).
    fn clear_flash_slot(&self, kh: &KeyHash, b: usize, i: usize, raw: u64) {
        self.index.lock_pair(kh);
        if self.index.raw_slot(b, i) & !FLASH_REFERENCED == raw & !FLASH_REFERENCED {
            self.index.set_raw_slot(b, i, 0);
            self.forget_flash_slot(raw);
        }
        self.index.unlock_pair(kh);
    }

    /// A flash slot was cleared or overwritten: its record no longer counts as used, and
    /// a restart must not bring it back.
    pub(super) fn forget_flash_slot(&self, raw: u64) {
        if let (Some(fl), Some(fs)) = (self.flash.as_ref(), FlashSlot::decode(raw)) {
            fl.forget_slot(fs.class, fs.loc, self.class_size(fs.class));
            fl.invalidate(fs.loc);
        }
    }

    /// The chunk size of slab class `class` (0 for a class that does not exist).
    fn class_size(&self, class: u8) -> usize {
        self.slabs.classes.get(class as usize).map_or(0, |c| c.size)
    }

    /// At start: index what a previous run left on flash (see `Flash::scan`).
    pub(super) fn recover_flash(&self) {
        let Some(fl) = self.flash.as_ref() else {
            return;
        };
        let started = std::time::Instant::now();
        let scan = fl.scan(self.clock.now());
        if let Some(t) = scan.flush_time {
            self.index.flush_time().store(t, Ordering::SeqCst);
        }
        let mut max_cas = 0;
        for r in &scan.items {
            let bytes = match r.class {
                CHAINED_SLOT_CLASS => r.bytes as usize,
                c => self.class_size(c),
            };
            if bytes == 0 {
                continue;
            }
            let kh = self.index.hash(&r.key);
            self.index.lock_pair(&kh);
            let empty =
                |b: usize| (0..index::SLOTS).filter(move |&i| self.index.raw_slot(b, i) == 0);
            let free1 = empty(kh.b1).count();
            let b = if free1 < 3 && empty(kh.b2).count() > free1 {
                kh.b2
            } else {
                kh.b1
            };
            let Some(i) = empty(b).next() else {
                // No room: it is dropped, and must not come back at a later restart.
                fl.c.index_drops.fetch_add(1, Ordering::Relaxed);
                fl.invalidate(r.loc);
                self.index.unlock_pair(&kh);
                continue;
            };
            {
                let slot = FlashSlot {
                    tag: kh.tag,
                    class: r.class,
                    loc: r.loc,
                };
                self.index.set_raw_slot(b, i, slot.encode());
                if r.class == CHAINED_SLOT_CLASS {
                    fl.note_chained(r.loc, r.bytes);
                }
                fl.c.objects_used.fetch_add(1, Ordering::Relaxed);
                fl.c.bytes_used.fetch_add(bytes as u64, Ordering::Relaxed);
                fl.c.recovered.fetch_add(1, Ordering::Relaxed);
                max_cas = max_cas.max(r.cas);
            }
            self.index.unlock_pair(&kh);
        }
        // New CAS values stay above every one the previous run gave out — those of items
        // it held in RAM too, which a client may still hold: the previous run counted up
        // from its own start, fewer than one per nanosecond, so the wall clock in
        // nanoseconds is beyond them (and beyond every recovered one, checked too).
        if scan.pages_found > 0 {
            let ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            self.next_cas.fetch_max(max_cas.max(ns), Ordering::SeqCst);
        }
        fl.c.recovery_us
            .store(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// An item being evicted from RAM (bucket locks held): write it to flash if the
    /// tier takes it. Returns the flash slot that replaces its arena slot.
    pub(super) fn evict_to_flash(&self, off: usize, h: &Header, tag: u16) -> Option<u64> {
        let fl = self.flash.as_ref()?;
        let now = self.clock.now();
        let (klen, vlen) = (h.key_len as usize, h.value_len as usize);
        let chained = h.iflags & item::F_CHUNKED != 0;
        if !fl.admits(HDR + klen + vlen, h.exptime, now, chained) || self.dead(h, now).is_some() {
            return None;
        }
        // Linked and under its bucket locks: nobody writes it meanwhile.
        let key = self.arena.stable_bytes(item::key_off(off), klen);
        let chunks = if chained {
            self.item_chunks(off)
        } else {
            vec![off]
        };
        let value: Vec<&[u8]> = self
            .value_segments(off, klen, vlen, &chunks[1..])
            .map(|(o, n)| self.arena.stable_bytes(o, n))
            .collect();
        let rh = RecordHeader {
            class: h.class,
            key_len: h.key_len,
            // The meta marks travel with it (an invalidated item stays stale).
            iflags: h.iflags & (item::F_KEY_BINARY | item::F_STALE | item::F_TOKEN_SENT),
            cas: h.cas,
            value_len: h.value_len,
            flags: h.flags,
            exptime: h.exptime,
            time: h.time,
        };
        let (loc, class) = if chained {
            (fl.append_chained(&rh, key, &value)?, CHAINED_SLOT_CLASS)
        } else {
            let size = self.slabs.classes[h.class as usize].size;
            (fl.append(&rh, key, &value, size)?, h.class)
        };
        fl.c.admitted_bytes
            .fetch_add(format::record_len(klen, vlen) as u64, Ordering::Relaxed);
        Some(FlashSlot { tag, class, loc }.encode())
    }

    /// The writer thread: write sealed pages, reclaim the oldest pages ahead of need.
    pub(super) fn flash_writer_loop(self: Arc<Inner>) {
        let Some(fl) = self.flash.as_ref() else {
            return;
        };
        let ps = fl.page_size;
        while let Some(job) = fl.next_job() {
            match job {
                Job::Write(p) => {
                    let ok = fl.write(&p);
                    let (bytes, page) = Job::page_bytes(&p, ps);
                    if !ok {
                        // Nothing may point at a page that is not on flash; what it
                        // recorded (invalidations, flushes) goes into the next page, and
                        // its records are invalidated (an earlier snapshot of it may be
                        // on flash).
                        if let Some(ph) = format::parse_page_header(bytes, ps) {
                            let (s0, s1) = (ph.used as usize, (ph.used + ph.summary_len) as usize);
                            let summary = &bytes[s0..s1];
                            self.release_page(page, summary, None);
                            fl.renote(&format::non_records(summary));
                            for e in format::summary_entries(summary).filter(|e| e.is_record()) {
                                fl.invalidate(page as u64 * ps as u64 + e.off as u64);
                            }
                        }
                    }
                    drop(p);
                    fl.written(page, ok);
                }
                Job::Reclaim(page) => {
                    // Only the summary is read; a record only to re-admit it. A summary
                    // that cannot be read: every slot into the page is found by a walk
                    // of the index instead.
                    match fl.page_summary(page) {
                        Some((_, summary)) => self.release_page(page, &summary, Some(fl)),
                        None => self.clear_page_by_index_walk(page),
                    }
                    // Nothing points into it now; a restart must not read it either.
                    let erased = fl.erase_header(page);
                    fl.reclaimed(page, erased);
                }
                Job::Snapshot(page, img, start, len) => {
                    fl.write_snapshot(page, &img[start..start + len]);
                }
            }
        }
    }

    /// Clear every flash slot that points into `page`, walking the whole index (when the
    /// page's summary cannot be read). Each bucket is locked alone: nothing else is
    /// waited for while it is held.
    fn clear_page_by_index_walk(&self, page: u32) {
        let Some(fl) = self.flash.as_ref() else {
            return;
        };
        let ps = fl.page_size as u64;
        let in_page = |raw: u64| FlashSlot::decode(raw).is_some_and(|s| s.loc / ps == page as u64);
        for b in 0..self.index.buckets() {
            if !(0..index::SLOTS).any(|i| in_page(self.index.raw_slot(b, i))) {
                continue;
            }
            self.index.lock(b);
            for i in 0..index::SLOTS {
                let raw = self.index.raw_slot(b, i);
                if in_page(raw) {
                    self.index.set_raw_slot(b, i, 0);
                    if let Some(fs) = FlashSlot::decode(raw) {
                        fl.forget_slot(fs.class, fs.loc, self.class_size(fs.class));
                        fl.c.objects_evicted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            self.index.unlock(b);
        }
    }

    /// Clear every slot that points into `page` (whose summary is `summary`), or, with
    /// `reinsert_from` (the tier to read records from), re-admit records read since they
    /// went to flash, up to the reinsertion budget.
    fn release_page(&self, page: u32, summary: &[u8], reinsert_from: Option<&Flash>) {
        let Some(fl) = self.flash.as_ref() else {
            return;
        };
        let ps = fl.page_size;
        let budget = ps * fl.cfg.reinsert_percent as usize / 100;
        let mut reinserted = 0;
        let now = self.clock.now();
        for e in format::summary_entries(summary) {
            let off = e.off as usize;
            if !e.is_record() || off < format::PAGE_HDR || off >= ps {
                continue;
            }
            let loc = page as u64 * ps as u64 + off as u64;
            let kh = self.index.hash(e.key);
            self.index.lock_pair(&kh);
            for b in [kh.b1, kh.b2] {
                for i in 0..index::SLOTS {
                    let raw = self.index.raw_slot(b, i);
                    let Some(fs) = FlashSlot::decode(raw) else {
                        continue;
                    };
                    if fs.loc != loc || fs.tag != kh.tag {
                        continue;
                    }
                    let size = self.class_size(fs.class);
                    let mut rlen = size;
                    let mut new = 0;
                    // A chained item is not re-admitted: its pieces are in the pages
                    // reclaimed next.
                    let wanted = raw & FLASH_REFERENCED != 0
                        && fs.class != CHAINED_SLOT_CLASS
                        && (e.exptime == 0 || e.exptime > now)
                        && reinserted + size <= budget;
                    if let (true, Some(src)) = (wanted, reinsert_from) {
                        if let Fetch::Bytes(b) = src.read(loc, size) {
                            if let Some(r) = format::parse_record(&b).filter(|r| r.key == e.key) {
                                rlen = format::record_len(r.key.len(), r.value.len());
                                if let Some(nloc) = fl.append(&r.h, r.key, &[r.value], size) {
                                    new = FlashSlot { loc: nloc, ..fs }.encode();
                                    reinserted += rlen;
                                    fl.c.reinserted.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                    // What it counted in `bytes_used` leaves with it.
                    let counted = fl.forget_slot(fs.class, fs.loc, size);
                    if new == 0 {
                        if fs.class == CHAINED_SLOT_CLASS {
                            rlen = counted;
                        }
                        fl.c.objects_evicted.fetch_add(1, Ordering::Relaxed);
                        fl.c.bytes_evicted.fetch_add(rlen as u64, Ordering::Relaxed);
                    }
                    self.index.set_raw_slot(b, i, new);
                }
            }
            self.index.unlock_pair(&kh);
        }
    }
}

impl Txn<'_> {
    /// The key has no RAM item and is about to be replaced whatever it holds (bucket
    /// locks held): drop the flash slots with its tag without reading them
    /// (`Store::transact_replacing`).
    pub(super) fn drop_flash_copies(&mut self) {
        let inner = self.inner();
        let Some(fl) = inner.flash.as_ref() else {
            return;
        };
        let kh = self.key_hash();
        for b in [kh.b1, kh.b2] {
            for i in 0..index::SLOTS {
                let raw = inner.index.raw_slot(b, i);
                if FlashSlot::decode(raw).is_some_and(|s| s.tag == kh.tag) {
                    inner.index.set_raw_slot(b, i, 0);
                    inner.forget_flash_slot(raw);
                    fl.c.overwritten.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The key has no RAM item but its buckets hold flash slots with its tag (bucket
    /// locks held): bring its flash record back into RAM so that the transaction sees
    /// it (a command that modifies or removes a flash item). Damaged or dead records
    /// clear their slots. Counted as `recache_from_extstore`.
    pub(super) fn promote_from_flash(&mut self) {
        let inner = self.inner();
        let Some(fl) = inner.flash.as_ref() else {
            return;
        };
        let kh = self.key_hash();
        let key = self.key().to_vec();
        for b in [kh.b1, kh.b2] {
            for i in 0..index::SLOTS {
                let raw = inner.index.raw_slot(b, i);
                if FlashSlot::decode(raw).is_none_or(|s| s.tag != kh.tag) {
                    continue;
                }
                let (h, value) = match inner.read_record(raw, &key) {
                    FlashRecord::Other => continue,
                    FlashRecord::Bad => {
                        inner.index.set_raw_slot(b, i, 0);
                        inner.forget_flash_slot(raw);
                        continue;
                    }
                    FlashRecord::Item(h, v) => (h, v),
                };
                if let Some(flushed) = inner.dead(&h, inner.clock.now()) {
                    inner.index.set_raw_slot(b, i, 0);
                    inner.forget_flash_slot(raw);
                    inner.count_dead_lookup(flushed);
                    return;
                }
                let Ok(mut it) = self.alloc(value.len(), h.flags, h.exptime) else {
                    // No memory for it now (eviction found nothing it could take): the
                    // record stays, and the command learns that the key is held
                    // (`held_on_flash`). Cleared first, the item was lost and an `add`
                    // stored over it.
                    self.set_flash_unloaded(h.cas);
                    return;
                };
                // From here the RAM copy is the key's item: the slot's record stops being it.
                inner.index.set_raw_slot(b, i, 0);
                inner.forget_flash_slot(raw);
                it.write(0, &value);
                self.link_counted(
                    it,
                    LinkOptions {
                        explicit_cas: Some(h.cas),
                        stale: h.iflags & item::F_STALE != 0,
                        token_sent: h.iflags & item::F_TOKEN_SENT != 0,
                        fetched: false,
                    },
                    false,
                );
                if h.iflags & item::F_KEY_BINARY != 0 {
                    self.set_key_binary(true);
                }
                fl.c.recached.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}
