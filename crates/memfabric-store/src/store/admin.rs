//! Whole-store commands: `flush_all`, reclaiming dead items, `cache_memlimit`, `slabs
//! reassign` and `stats cachedump`.
use std::sync::atomic::Ordering;

use crate::item;

use super::options::ReassignStatus;
use super::state::Store;

impl Store {
    /// Invalidate every item stored up to now (`at` = None) or up to absolute time `at`.
    /// Both words live in the index's control block, where remote readers see them.
    pub fn flush_all(&self, at: Option<u32>) {
        let now = self.clock.now();
        self.refresh_remote_clock(now);
        match at {
            Some(t) if t > now => {
                // memcached: items stored before the flush time die when it comes.
                self.index.flush_time().store(t - 1, Ordering::SeqCst);
                if let Some(f) = self.flash.as_ref() {
                    f.flush_marker(t - 1, 0);
                }
                self.slabs.all_due(t - 1);
            }
            _ => {
                let c = self.next_cas.fetch_add(1, Ordering::SeqCst) + 1;
                self.index.flush_cas().store(c, Ordering::SeqCst);
                if let Some(f) = self.flash.as_ref() {
                    f.flush_marker(0, c);
                }
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
    /// memcached's checks and answers, in its order: `-1` with no class able to spare a
    /// page is a bad class; `src` 0 (memcached's global page pool) has no spare page: our
    /// unassigned pool is memory every class takes from when it needs a page, so there
    /// is nothing to move out of it (memcached's starts empty, and answers the same).
    pub fn slabs_reassign(&self, src: i32, dst: i32) -> ReassignStatus {
        let largest = (self.slabs.classes.len() - 1) as i32;
        if src == dst {
            return ReassignStatus::Same;
        }
        let src = if src == -1 {
            // The class with the most pages among those that can spare one.
            (1..=largest)
                .filter(|&c| c != dst)
                .map(|c| (self.slabs.lock(c as u8).pages.len(), c))
                .filter(|&(pages, _)| pages >= 2)
                .max()
                .map_or(-1, |(_, c)| c)
        } else {
            src
        };
        if !(0..=largest).contains(&src) || !(0..=largest).contains(&dst) {
            return ReassignStatus::BadClass;
        }
        if src == 0 || self.slabs.lock(src as u8).pages.len() < 2 {
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
    /// many as fit in 2 MB of output, like memcached), as (key, value length, exptime),
    /// most recently linked or used first, as memcached walks its LRU from the head: the
    /// class's eviction queue from the back (each live item has one current entry there;
    /// stale ones are skipped, and a chained item is listed in its head's class only).
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
        for &e in st.queue.iter().rev() {
            let Some((off, h)) = self.queued_item(&ci, e) else {
                continue;
            };
            if off != e.off() || self.dead(&h, now).is_some() {
                continue;
            }
            let mut key = vec![0u8; h.key_len as usize];
            self.arena.read(item::key_off(off), &mut key);
            // memcached's 2 MB reply: the line "ITEM <key> [<len> b; <exptime> s]\r\n"
            // counted as written, with room left for "END\r\n" and its NUL.
            let line = key.len() + digits(h.value_len) + digits(h.exptime) + 16;
            if bytes + line + 6 > CACHEDUMP_MAX_BYTES {
                break;
            }
            bytes += line;
            v.push((key, h.value_len, h.exptime));
            if limit != 0 && v.len() >= limit {
                break;
            }
        }
        v
    }
}

/// The most `stats cachedump` answers, END included (memcached's `memlimit`).
const CACHEDUMP_MAX_BYTES: usize = 2 << 20;

/// Decimal digits of `n`.
fn digits(n: u32) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Where an `lru_crawler metadump` stands: the classes it covers and the next chunk to
/// look at. The walk is not a snapshot (as memcached's crawler is not): an item stored
/// while it runs may be listed or not, and while slab pages move between classes
/// (`slabs reassign`, automove) an item may be missed or listed twice; otherwise every
/// item linked throughout is listed once.
#[derive(Clone, Debug)]
pub struct DumpCursor {
    /// Classes to walk, ascending.
    classes: Vec<u8>,
    /// Position in `classes`, page position in that class, chunk in that page.
    class: usize,
    page: usize,
    chunk: usize,
}

/// Chunks one metadump turn looks at, live or not: a turn over a mostly empty store ends
/// within a bounded time too (the worker has other connections).
const DUMP_CHUNKS_PER_TURN: usize = 1 << 16;

impl DumpCursor {
    /// A walk of `classes` (every class when empty).
    pub fn new(mut classes: Vec<u8>) -> DumpCursor {
        if classes.is_empty() {
            classes = (1..=crate::slab::MAX_CLASSES as u8).collect();
        }
        classes.sort_unstable();
        classes.dedup();
        DumpCursor {
            classes,
            class: 0,
            page: 0,
            chunk: 0,
        }
    }
}

impl Store {
    /// Appends memcached's metadump lines (`key=<uri-encoded key> exp=<unix time or -1>
    /// la=<last access> cas=<cas> fetch=<yes|no> cls=<class> size=<bytes>\n`) for the
    /// live items after `cur` until `out` has grown by `budget` bytes, `DUMP_CHUNKS_PER_TURN`
    /// chunks were looked at, or the walk is over; true when it is over. Items are read
    /// lock-free (a class's lock only to find its next page).
    pub fn metadump(&self, cur: &mut DumpCursor, out: &mut Vec<u8>, budget: usize) -> bool {
        let start = out.len();
        let mut visited = 0;
        let now = self.clock.now();
        let mut key = Vec::with_capacity(crate::KEY_MAX_LEN);
        while let Some(&class) = cur.classes.get(cur.class) {
            let ci = self.slabs.classes.get(class as usize).copied();
            let page = ci.and_then(|ci| {
                let st = self.slabs.lock(class);
                st.pages.get(cur.page).map(|&p| (ci, p))
            });
            let Some((ci, page)) = page else {
                cur.class += 1;
                cur.page = 0;
                cur.chunk = 0;
                continue;
            };
            while cur.chunk < ci.per_page {
                if visited == DUMP_CHUNKS_PER_TURN {
                    return false;
                }
                visited += 1;
                let off = self.slabs.chunk_off(&ci, page, cur.chunk);
                cur.chunk += 1;
                if item::state(&self.arena, off) != item::LINKED {
                    continue;
                }
                let h = item::read_header(&self.arena, off);
                if !h.seq.is_multiple_of(2) || self.dead(&h, now).is_some() {
                    continue;
                }
                key.resize(h.key_len as usize, 0);
                self.arena.read(item::key_off(off), &mut key);
                // The key is the item's only if nothing rewrote the chunk meanwhile.
                if item::read_header(&self.arena, off).seq != h.seq {
                    continue;
                }
                // The same fields as the meta `me` command (memcached's item size).
                let info = self.info(&h);
                out.extend_from_slice(b"key=");
                uri_encode(&key, out);
                let exp = if info.exptime == 0 {
                    -1
                } else {
                    i64::from(info.exptime)
                };
                let fetched = if info.fetched { "yes" } else { "no" };
                let size = self.memcached_item_size(key.len(), info.value_len as usize, info.flags);
                out.extend_from_slice(
                    format!(
                        " exp={exp} la={} cas={} fetch={fetched} cls={} size={size}\n",
                        info.last_access, info.cas, info.class_id,
                    )
                    .as_bytes(),
                );
                if out.len() - start >= budget {
                    return false;
                }
            }
            cur.page += 1;
            cur.chunk = 0;
        }
        true
    }
}

/// memcached's `uriencode`: letters, digits and `-._~` as they are, every other byte as
/// `%XX` (upper-case hex).
fn uri_encode(key: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}
