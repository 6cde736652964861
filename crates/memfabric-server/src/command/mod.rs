//! The command layer: one function per memcached command, shared by every front end.
//!
//! A front end (ascii, meta, binary — over TCP, unix sockets and UDP — and the UCX path)
//! parses its wire format into the typed arguments below, calls the command, and encodes
//! the typed outcome in its own format. The command does the store call, memcached's
//! counters for it (including where memcached counts differently per protocol, which the
//! caller states as a typed argument, never by duplicating the command), and the side
//! effects memcached attaches to it (a failed SET unlinks the old value).
//!
//! A retrieval may answer [`Lookup::Pending`]: its result is not ready (a value on a slower
//! tier; today only keys held by the `--debug-hold-keys` test store, see [`holds`]). The
//! front end keeps its place in the reply order and asks again when the worker is told
//! the result is ready ([`crate::shared::Inbox`]).
use std::sync::atomic::Ordering;

use memfabric_proto::ec_fragment::{self, FragmentHeader, WriteId};
use memfabric_store::{
    AllocError, ArithOptions, ArithStatus, DeleteStatus, Found, GetOptions, ItemInfo, PendingItem,
    PinnedItem, PrefetchHint, SetMode, StoreStatus,
};

use crate::counters::{ClassStat, VERSION};
use crate::shared::ExecCtx;

pub mod holds;
pub mod meta;
pub mod stats;

/// How a retrieval counts: memcached counts a get-and-touch as a touch, not as a get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retrieval {
    Get,
    /// Get and set this absolute exptime (0 = never expires).
    Touch(u32),
}

impl Retrieval {
    fn touch(self) -> Option<u32> {
        match self {
            Retrieval::Get => None,
            Retrieval::Touch(e) => Some(e),
        }
    }
}

/// How a front end wants a hit's value delivered.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    /// Values up to this many bytes are copied after the reply header.
    pub copy_limit: usize,
    /// Larger values: pinned (written from item memory by the caller) or only reported
    /// (`Value::Large`; the UCX path then sends them from item memory under the lock).
    pub pin_large: bool,
    /// Record the access for eviction (meta's `mg ... q` without `u` turns it off).
    pub bump: bool,
}

/// Where a hit's value is.
pub enum Value {
    /// Copied into the caller's buffer right after the header.
    Copied,
    /// Too large to copy; pinned in item memory until the pin is dropped.
    Pinned(PinnedItem),
    /// Too large to copy and not pinned (`Delivery::pin_large` was false).
    Large,
}

/// The outcome of a lookup.
pub enum Lookup {
    Hit(ItemInfo, Value),
    Miss,
    /// Not ready yet: the caller keeps its reply's place and retries when `ticket` is
    /// reported ready to its worker. Never returned to a caller that cannot wait.
    Pending(holds::Ticket),
}

/// Look `key` up without counting it (meta's optimistic path decides afterwards whether
/// the lookup stands). A hit runs `header(info, out)` and, for a small value, copies the
/// value after it; see [`Delivery`]. A large value pinned is looked up again under its
/// lock after the first look recorded the access: gone in between is a miss.
pub fn lookup(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    how: Retrieval,
    delivery: Delivery,
    out: &mut Vec<u8>,
    mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
) -> Lookup {
    if let Some(ticket) = holds::hold(ctx, key) {
        return Lookup::Pending(ticket);
    }
    let store = &ctx.shared.store;
    let opts = GetOptions {
        touch: how.touch(),
        bump: delivery.bump,
        copy_limit: delivery.copy_limit,
    };
    let mut large = false;
    let hit = store.get_into(key, &opts, out, |info, out| {
        large = info.value_len as usize > opts.copy_limit;
        if !large {
            header(info, out);
        }
    });
    let Some(info) = hit else {
        return flash_lookup(ctx, key, out, header);
    };
    if !large {
        return Lookup::Hit(info, Value::Copied);
    }
    if !delivery.pin_large {
        return Lookup::Hit(info, Value::Large);
    }
    let quiet = GetOptions {
        bump: false,
        ..GetOptions::default()
    };
    match store.get_pinned(key, &quiet) {
        Some((info, pin)) => {
            header(&info, out);
            Lookup::Hit(info, Value::Pinned(pin))
        }
        None => Lookup::Miss,
    }
}

/// A key not in RAM may be on flash: a caller that can wait gets `Pending` while a read
/// thread reads it (the command resumes with the result in `ctx.completion`); one that
/// cannot wait reads it here. A hit's value is always copied (`Value::Copied`): it is
/// not in item memory. (Touching retrievals never get here: under the key's lock the
/// store brings a flash item back to RAM itself.)
fn flash_lookup(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    out: &mut Vec<u8>,
    mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
) -> Lookup {
    let store = &ctx.shared.store;
    if !store.has_flash() {
        return Lookup::Miss;
    }
    let cands = store.flash_candidates(key);
    if cands.is_empty() {
        return Lookup::Miss;
    }
    let mut serve = |hit: &memfabric_store::FlashHit, out: &mut Vec<u8>| {
        header(&hit.info, out);
        out.extend_from_slice(&hit.value);
        Lookup::Hit(hit.info, Value::Copied)
    };
    match ctx.completion {
        Some(crate::pending::Completion::Flash(Some(hit), _)) if store.flash_hit_current(hit) => {
            return serve(hit, out);
        }
        // The read found nothing there.
        Some(crate::pending::Completion::Flash(None, _)) => return Lookup::Miss,
        // Replaced or moved since it was read: read it again, here.
        Some(_) => {}
        None => {
            let pool = ctx.shared.flash_reads.as_ref();
            let waits = ctx.waiter.zip(pool);
            let hold = waits.and_then(|(_, p)| p.reserve(store.flash_read_bytes(&cands) as u64));
            if let (Some((w, pool)), Some(hold)) = (waits, hold) {
                let ticket = crate::pending::next_ticket();
                let job = crate::flash_reads::ReadJob {
                    key: key.to_vec(),
                    cands,
                    inbox: std::sync::Arc::clone(w.inbox),
                    target: w.target,
                    ticket,
                    hold,
                };
                if pool.submit(job) {
                    let bytes = store.flash_read_bytes(&cands);
                    return Lookup::Pending(holds::Ticket(ticket, bytes));
                }
            }
        }
    }
    match store.read_flash(key, &cands) {
        Some(hit) => serve(&hit, out),
        None => Lookup::Miss,
    }
}

/// `extstore <setting> <value>`: change a flash tier setting at run time, as memcached
/// does (with or without a flash tier). False for an unknown setting or a value that
/// does not parse; a number that does not parse sets 0 first, as memcached's parsers do.
pub fn extstore(shared: &crate::shared::Shared, setting: &[u8], value: &[u8]) -> bool {
    use memfabric_proto::number::{safe_strtod, safe_strtoul};
    let e = &shared.ext;
    let num = |a: &std::sync::atomic::AtomicU32| {
        let v = safe_strtoul(value);
        a.store(v.unwrap_or(0), Ordering::Relaxed);
        v.is_some()
    };
    match setting {
        b"item_size" => {
            let v = safe_strtoul(value);
            e.item_size
                .store(u64::from(v.unwrap_or(0)), Ordering::Relaxed);
            shared
                .store
                .set_flash_admission(Some(v.unwrap_or(0) as usize), None);
            v.is_some()
        }
        b"low_ttl" => {
            let ok = num(&e.low_ttl);
            let t = e.low_ttl.load(Ordering::Relaxed);
            shared.store.set_flash_admission(None, Some(t));
            ok
        }
        b"item_age" => num(&e.item_age),
        b"recache_rate" => num(&e.recache_rate),
        b"compact_under" => num(&e.compact_under),
        b"drop_under" => num(&e.drop_under),
        b"max_sleep" => num(&e.max_sleep),
        b"max_frag" => {
            let v = safe_strtod(value);
            e.max_frag
                .store(v.unwrap_or(0.0).to_bits(), Ordering::Relaxed);
            v.is_some()
        }
        b"drop_unread" => match safe_strtoul(value) {
            Some(v) => {
                e.drop_unread.store(v != 0, Ordering::Relaxed);
                true
            }
            None => false,
        },
        _ => false,
    }
}

/// get, gets, gat, gats (ascii), GET*/GAT* (binary), `mg`'s plain path, UCX GET/GAT:
/// [`lookup`] and memcached's counters for it.
pub fn get(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    how: Retrieval,
    delivery: Delivery,
    out: &mut Vec<u8>,
    header: impl FnMut(&ItemInfo, &mut Vec<u8>),
) -> Lookup {
    let found = lookup(ctx, key, how, delivery, out, header);
    match &found {
        Lookup::Hit(info, _) => count_retrieval(ctx, how, Some(info.class_id)),
        Lookup::Miss => count_retrieval(ctx, how, None),
        // Counted when it completes.
        Lookup::Pending(_) => {}
    }
    found
}

/// Count one retrieval: `hit` is the slab class of the item found.
/// Start loading the store memory a request for `key` will touch first (a hint: no
/// effect on any result, no counter); the returned hint takes it one step further
/// ([`prefetch_item`]).
pub fn prefetch(shared: &crate::shared::Shared, key: &[u8]) -> Option<PrefetchHint> {
    shared.store.prefetch(key)
}

/// The second step of [`prefetch`]: the item itself.
pub fn prefetch_item(shared: &crate::shared::Shared, hint: &PrefetchHint) {
    shared.store.prefetch_item(hint);
}

pub fn count_retrieval(ctx: &ExecCtx<'_>, how: Retrieval, hit: Option<u8>) {
    let s = ctx.stats;
    match (how, hit) {
        (Retrieval::Get, Some(class)) => {
            s.cmd_get.incr();
            s.count(ClassStat::GetHits, Some(class));
        }
        (Retrieval::Get, None) => {
            s.cmd_get.incr();
            s.get_misses.incr();
        }
        (Retrieval::Touch(_), Some(class)) => {
            s.cmd_touch.incr();
            s.count(ClassStat::TouchHits, Some(class));
        }
        (Retrieval::Touch(_), None) => {
            s.cmd_touch.incr();
            s.touch_misses.incr();
        }
    }
}

/// touch (ascii), TOUCH (binary), UCX TOUCH: set a new absolute exptime. Returns the
/// item (flags and CAS, for replies that carry them) or `None` for a miss.
pub fn touch(ctx: &ExecCtx<'_>, key: &[u8], exptime: u32) -> Option<ItemInfo> {
    // Through a transaction rather than `Store::touch`: replies may need the flags and
    // CAS, and copying the value only to drop it would be waste.
    let hit = ctx.shared.store.transact(key, |t| {
        let info = t.item()?;
        t.set_exptime(exptime);
        t.mark_fetched();
        Some(info)
    });
    count_retrieval(ctx, Retrieval::Touch(exptime), hit.map(|i| i.class_id));
    hit
}

/// UCX TTL: how long `key` still lives, its value left unread (a replicated pool's read
/// repair asks before it writes a copy back, so the copy expires when the original does).
/// `None`: a miss; `Some(None)`: no expiry. Counted as a get, as memcached counts an `mg`.
pub fn ttl(ctx: &ExecCtx<'_>, key: &[u8]) -> Option<Option<u32>> {
    let store = &ctx.shared.store;
    let hit = store.transact(key, |t| t.item());
    count_retrieval(ctx, Retrieval::Get, hit.map(|i| i.class_id));
    hit.map(|i| match i.exptime {
        0 => None,
        // An item whose time is up is not found; in its last second, 0 is left.
        e => Some(e.saturating_sub(store.clock().now())),
    })
}

/// delete (ascii), DELETE (binary), `md` without flags, UCX DELETE. `cas` 0: any value.
/// A CAS mismatch (`Exists`) is counted as memcached does: not at all.
pub fn delete(ctx: &ExecCtx<'_>, key: &[u8], cas: u64) -> DeleteStatus {
    let found = ctx.shared.store.delete_found(key, cas);
    match found.status {
        DeleteStatus::Deleted => ctx.stats.count(ClassStat::DeleteHits, found.class_id),
        DeleteStatus::NotFound => ctx.stats.delete_misses.incr(),
        DeleteStatus::Exists => {}
    }
    found.status
}

/// An incr or decr.
#[derive(Clone, Copy, Debug)]
pub struct Arith {
    pub incr: bool,
    pub delta: u64,
    /// Only if the item's CAS is this (0: any).
    pub cas: u64,
    /// On a miss, create the item with this (initial value, flags, absolute exptime)
    /// (binary INCR/DECR; the classic commands never create).
    pub create: Option<(u64, u32, u32)>,
}

/// The outcome of [`arith`].
#[derive(Clone, Copy, Debug)]
pub struct ArithDone {
    pub status: ArithStatus,
    /// The item did not exist and was created with the initial value.
    pub created: bool,
}

/// incr/decr (ascii), INCR/DECR (binary), UCX INCR/DECR. Counted as memcached does: a hit
/// as a hit, a miss that creates the item as neither, a miss that may not create as a
/// miss.
pub fn arith(ctx: &ExecCtx<'_>, key: &[u8], a: Arith) -> ArithDone {
    let store = &ctx.shared.store;
    let first = ArithOptions {
        cas: a.cas,
        create: None,
    };
    let found = store.arith_found(key, a.incr, a.delta, &first);
    let (status, created) = match (found.status, a.create) {
        (ArithStatus::NotFound, Some(create)) => {
            // memcached ignores the CAS when it creates the item.
            let opts = ArithOptions {
                cas: 0,
                create: Some(create),
            };
            (store.arith(key, a.incr, a.delta, &opts), true)
        }
        (status, _) => (status, false),
    };
    let s = ctx.stats;
    match status {
        ArithStatus::Value { .. } if !created => {
            let what = if a.incr {
                ClassStat::IncrHits
            } else {
                ClassStat::DecrHits
            };
            s.count(what, found.class_id);
        }
        ArithStatus::NotFound if a.incr => s.incr_misses.incr(),
        ArithStatus::NotFound => s.decr_misses.incr(),
        _ => {}
    }
    ArithDone { status, created }
}

/// How memcached counts a storage command's refusals, which differs by protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreAccounting {
    /// ascii and meta (and the UCX path): `store_too_large` / `store_no_memory` count.
    Text,
    /// memcached's binary path counts neither.
    Binary,
}

/// A storage command's arguments (the value travels separately).
#[derive(Clone, Copy, Debug)]
pub struct StoreArgs<'k> {
    pub mode: SetMode,
    pub key: &'k [u8],
    pub flags: u32,
    /// Absolute exptime (0 = never).
    pub exptime: u32,
    /// Compare with this CAS (0: none). With `SetMode::Set/Add/Replace` and a CAS the
    /// store compares too.
    pub cas: u64,
    /// Count the outcome as a compare-and-swap (`cas_hits`, `cas_badval`, `cas_misses`).
    pub counts_as_cas: bool,
    pub accounting: StoreAccounting,
    /// A set of an erasure-coded fragment that must not replace a fragment of a newer
    /// write (the UCX front end's `FLAG_KEEP_NEWER_WRITE`): see [`newer_write_kept`].
    pub keep_newer_write: bool,
}

/// The write a set under `keep_newer_write` brings, if the rule applies to it: a plain
/// set (no CAS) whose value starts with a fragment header. Anything else is stored as
/// its command says.
fn ordered_write(a: &StoreArgs<'_>, value_prefix: &[u8]) -> Option<WriteId> {
    if !a.keep_newer_write || a.mode != SetMode::Set || a.cas != 0 {
        return None;
    }
    fragment_write(value_prefix)
}

/// The stripe of the write the value a key holds (`old`, as slices of item memory) is a
/// fragment of, if that write is newer than `new`: then it stays. Two clients that
/// code-write one key at once reach its servers in different orders; each server keeping
/// the newest write (stripe order) leaves every server holding the same one, where "the
/// last to arrive" left some with one write and some with the other, fewer than k of
/// either (docs/resilience.md, the write hole). The writer told so writes again with a
/// newer stripe, so a write made after another, by a client whose clock is behind, still
/// ends up the value.
fn newer_write_kept(old: &[&[u8]], new: WriteId) -> Option<u64> {
    let mut head = [0u8; ec_fragment::HEADER_LEN];
    let mut filled = 0;
    for s in old {
        let n = s.len().min(head.len() - filled);
        head[filled..filled + n].copy_from_slice(&s[..n]);
        filled += n;
        if filled == head.len() {
            break;
        }
    }
    FragmentHeader::peek(&head[..filled])
        .ok()
        .map(|(h, _)| h.write())
        .filter(|old| *old > new)
        .map(|old| old.stripe)
}

/// set/add/replace/append/prepend/cas with the whole value at hand.
pub fn store(ctx: &ExecCtx<'_>, a: &StoreArgs<'_>, value: &[u8]) -> StoreStatus {
    store_keeping_newer(ctx, a, value).0
}

/// [`store`], also giving the stripe of the newer write a `keep_newer_write` set found
/// and kept (0 when none was: the status says what happened).
pub fn store_keeping_newer(
    ctx: &ExecCtx<'_>,
    a: &StoreArgs<'_>,
    value: &[u8],
) -> (StoreStatus, u64) {
    let store = &ctx.shared.store;
    let (found, kept) = match ordered_write(a, value) {
        Some(new) => set_unless_newer(ctx, a.key, value, a.flags, a.exptime, new),
        None => (
            store.store_found(a.mode, a.key, value, a.flags, a.exptime, a.cas),
            0,
        ),
    };
    let class = store.item_class(a.key.len(), value.len());
    (stored(ctx, a, found, class), kept)
}

/// A plain set of fragment `value` of write `new`, unless the key holds a fragment of a
/// newer write: then that stays, and its stripe is returned (0 when the value was
/// stored or refused for another reason). Shared by the UCX front end (through
/// [`store_keeping_newer`]) and meta's `ms ... K` ([`meta::store`]).
fn set_unless_newer(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    value: &[u8],
    flags: u32,
    exptime: u32,
    new: WriteId,
) -> (Found<StoreStatus>, u64) {
    let kept = std::cell::Cell::new(0);
    let found = ctx
        .shared
        .store
        .store_found_unless(key, value, flags, exptime, |old| {
            newer_write_kept(old, new).map(|s| kept.set(s)).is_some()
        });
    (found, kept.get())
}

/// The write a value brings if it is an erasure-coded fragment (its header checks).
fn fragment_write(value_prefix: &[u8]) -> Option<WriteId> {
    FragmentHeader::peek(value_prefix)
        .ok()
        .map(|(h, _)| h.write())
}

/// Allocate the item a storage command's large value will be received into (so the
/// memory counts in `-m` while it arrives, as memcached's half-read items do). On
/// failure the command is answered now: the returned status is its outcome, counted.
pub fn alloc_pending(
    ctx: &ExecCtx<'_>,
    a: &StoreArgs<'_>,
    value_len: usize,
) -> Result<PendingItem, StoreStatus> {
    ctx.shared
        .store
        .alloc_pending(a.key, value_len, a.flags, a.exptime)
        .map_err(|e: AllocError| stored(ctx, a, Found::unfound(e.into()), None))
}

/// A storage command whose value was received into `item` (from [`alloc_pending`]).
pub fn store_pending(ctx: &ExecCtx<'_>, a: &StoreArgs<'_>, item: PendingItem) -> StoreStatus {
    store_pending_keeping_newer(ctx, a, item).0
}

/// [`store_pending`], also giving the stripe of a newer write kept (as
/// [`store_keeping_newer`]).
pub fn store_pending_keeping_newer(
    ctx: &ExecCtx<'_>,
    a: &StoreArgs<'_>,
    item: PendingItem,
) -> (StoreStatus, u64) {
    let store = &ctx.shared.store;
    let class = store.item_class(a.key.len(), item.value_len());
    let head = item.value_prefix(ec_fragment::HEADER_LEN);
    let kept = std::cell::Cell::new(0);
    let found = match ordered_write(a, &head) {
        Some(new) => store.store_pending_unless(item, |old| {
            newer_write_kept(old, new).map(|s| kept.set(s)).is_some()
        }),
        None => store.store_pending_found(a.mode, item, a.cas),
    };
    (stored(ctx, a, found, class), kept.get())
}

/// A storage command refused before its value was read (larger than any item can be):
/// counted, and the old value of a SET unlinked, as memcached does.
pub fn refuse_too_large(ctx: &ExecCtx<'_>, a: &StoreArgs<'_>) {
    stored(ctx, a, Found::unfound(StoreStatus::TooLarge), None);
}

/// A storage command's data block was malformed: memcached counts it as a set (it read
/// the data), stores nothing.
pub fn bad_data(ctx: &ExecCtx<'_>, new_class: Option<u8>) {
    ctx.stats.protocol_errors.incr();
    ctx.stats.count(ClassStat::SetCmds, new_class);
}

/// Count a storage command's outcome. memcached counts `cmd_set` in the class of the
/// request's item (`new_class`) once it is allocated, and CAS results in the class of
/// the item that was under the key; a SET that fails for size or memory unlinks the old
/// value, so that a client never reads stale data after a failed overwrite.
fn stored(
    ctx: &ExecCtx<'_>,
    a: &StoreArgs<'_>,
    found: Found<StoreStatus>,
    new_class: Option<u8>,
) -> StoreStatus {
    let s = ctx.stats;
    let status = found.status;
    match status {
        StoreStatus::TooLarge | StoreStatus::OutOfMemory => {
            if a.accounting == StoreAccounting::Text {
                if status == StoreStatus::TooLarge {
                    s.store_too_large.incr();
                } else {
                    s.store_no_memory.incr();
                }
            }
            // Not for a fragment set that must keep a newer write: the item there may be
            // that write's fragment.
            if a.mode == SetMode::Set && !a.keep_newer_write {
                let _ = ctx.shared.store.delete(a.key, 0);
            }
            return status;
        }
        _ => s.count(ClassStat::SetCmds, new_class),
    }
    if a.counts_as_cas {
        match status {
            StoreStatus::Stored { .. } => s.count(ClassStat::CasHits, found.class_id),
            StoreStatus::Exists => s.count(ClassStat::CasBadval, found.class_id),
            StoreStatus::NotFound => s.cas_misses.incr(),
            _ => {}
        }
    }
    status
}

/// flush_all was refused (`-F`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushDisabled;

/// flush_all (ascii), FLUSH (binary), UCX FLUSH: invalidate every item now, or at
/// `delay` seconds from now (memcached treats 0 as now). memcached's ascii path counts
/// the command even when `-F` refuses it (`count_refused`); its binary path does not.
pub fn flush_all(ctx: &ExecCtx<'_>, delay: u32, count_refused: bool) -> Result<(), FlushDisabled> {
    if !ctx.shared.settings.flush_enabled {
        if count_refused {
            ctx.stats.cmd_flush.incr();
        }
        return Err(FlushDisabled);
    }
    ctx.stats.cmd_flush.incr();
    let store = &ctx.shared.store;
    let at = (delay > 0).then(|| store.clock().exptime(delay.into()));
    store.flush_all(at);
    Ok(())
}

/// version: the memcached version we speak (clients decide by it which protocol features
/// they may use).
pub fn version() -> &'static str {
    VERSION
}

/// refresh_certs: load the TLS certificate, key and CA files again (`-Z`); the error is
/// the reply line, memcached's text (without its line end).
pub fn refresh_certs(shared: &crate::shared::Shared) -> Result<(), String> {
    match shared.settings.tls.as_ref() {
        Some(tls) => tls.refresh(),
        None => Err("Error TLS not enabled".to_string()),
    }
}

/// verbosity: set the log level at run time.
pub fn verbosity(ctx: &ExecCtx<'_>, level: u32) {
    ctx.shared.verbose.store(level, Ordering::Relaxed);
}
