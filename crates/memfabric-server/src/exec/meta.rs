//! Meta commands: mg ms md ma mn me, executed as memcached 1.6.18 does.
//!
//! The parser (`memfabric_proto::meta`) turns a line into a request; this file runs it
//! through the command layer and writes the reply. Plain lookups, stores, deletes and
//! arithmetic are the shared commands (`command::get`, `command::delete`,
//! `command::arith`); meta's own semantics (an `ms` that compares its CAS up front or
//! invalidates, an `md` that compares or invalidates, an `ma` that creates its counter)
//! are `command::meta`. What stays here inside `Store::transact` is what memcached does
//! while it writes the reply: return flags are echoed in the order the client sent them,
//! and the item-changing flags (`T`, `N`, `R`'s win token) apply in that same pass, so a
//! `t` before a `T` shows the old TTL (`mg_locked`, and `ma` with `N`/`T`/`t`).
use memfabric_proto::meta::{
    self as wire, ArithMode, MetaCommand, MetaError, MetaRequest, StoreMode,
};
use memfabric_store::{
    ArithOptions, ArithStatus, Clock, DeleteStatus, ItemInfo, LinkOptions, PendingItem, SetMode,
    StoreStatus,
};

use super::{ExecCtx, Fetched, Finish, Receiving, Resume, Session, Step};
use crate::command::meta::{ArithDone, MetaDelete, MetaStore};
use crate::command::{self, Retrieval};
use crate::counters::ClassStat;
use crate::outqueue::OutQueue;

// The replies meta shares with the classic commands.
use memfabric_proto::ascii::reply::{
    NON_NUMERIC, OUT_OF_MEMORY as ARITH_NO_MEMORY, OUT_OF_MEMORY_STORING as NO_MEMORY, TOO_LARGE,
};
use memfabric_proto::ascii::ErrorReply;

const BAD_CHUNK: &[u8] = ErrorReply::BadDataChunk.as_bytes();
const VIVIFY_NO_MEMORY: &[u8] = b"SERVER_ERROR Out of memory allocating new item\r\n";

/// Called by `ascii::process_one` when `input` starts with a meta command and holds a
/// complete line. Same contract as `ascii::process_one`.
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    queue: &mut OutQueue,
) -> Step {
    let Some((line, line_len)) = wire::split_line(input) else {
        return Step::NeedMore(0);
    };
    let req = match wire::parse(line) {
        Ok(r) => r,
        Err(e) => {
            ctx.stats.protocol_errors.incr();
            wire::push_error(queue.bytes(), e.error);
            // A rejected `ms` whose length was understood: its data block follows and
            // must not be read as commands.
            sess.swallow = e.swallow;
            return Step::Done(line_len);
        }
    };
    let out = queue.bytes();
    match req.command {
        MetaCommand::Noop => out.extend_from_slice(wire::NOOP_REPLY),
        MetaCommand::Debug => debug(ctx, &req, out),
        // A retrieval may queue a large value pinned.
        MetaCommand::Get => get(ctx, sess, &req, &input[..line_len], queue),
        MetaCommand::Set => return set(ctx, sess, &req, input, line_len, out),
        MetaCommand::Delete => delete(ctx, &req, out),
        MetaCommand::Arith => arith(ctx, &req, out),
    }
    Step::Done(line_len)
}

// ----- time as memcached shows it -----------------------------------------------------

/// Absolute expiry for a protocol TTL (negative = already expired, as memcached).
fn abs_exptime(clock: &Clock, ttl: i32) -> u32 {
    clock.exptime(ttl as i64)
}

/// memcached's `process_started`: it backdates its start by `ITEM_UPDATE_INTERVAL` (60 s)
/// and 2 s more; the store's clock backdates by the 2 s only.
fn memcached_started(clock: &Clock) -> u32 {
    clock.started().saturating_sub(60)
}

/// memcached keeps times relative to its start; an "already expired" exptime is its
/// relative time 1. Our absolute times map onto that scale so that the odd numbers
/// memcached prints for such items (a wrapped `t`: `mg k N-1 t` gives 1 minus its
/// relative now, -61 and less) come out the same. A live item's numbers do not depend on
/// where the scale starts.
fn rel_time(clock: &Clock, abs: u32) -> u32 {
    let started = memcached_started(clock);
    if abs > clock.started() {
        abs - started
    } else {
        1
    }
}

/// memcached's `current_time`: now on the scale of [`rel_time`].
fn rel_now(clock: &Clock) -> u32 {
    clock.now().saturating_sub(memcached_started(clock))
}

/// The `t` value: `None` (printed -1) for never, else memcached's 32-bit
/// `exptime - current_time`.
fn ttl_remaining(clock: &Clock, exptime: u32) -> Option<u32> {
    if exptime == 0 {
        return None;
    }
    Some(rel_time(clock, exptime).wrapping_sub(rel_now(clock)))
}

// ----- me -----------------------------------------------------------------------------

fn debug(ctx: &mut ExecCtx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let store = &ctx.shared.store;
    match store.peek(&req.key) {
        Some(info) => {
            let clock = store.clock();
            let now = clock.now();
            let exp = if info.exptime == 0 {
                -1
            } else {
                // memcached prints `current_time - exptime` as a C int: negative while
                // the item lives.
                rel_now(clock).wrapping_sub(rel_time(clock, info.exptime)) as i32 as i64
            };
            let d = wire::DebugInfo {
                exp,
                la: now.wrapping_sub(info.last_access) as u64,
                cas: info.cas,
                fetched: info.fetched,
                class_id: info.class_id,
                size: store.memcached_item_size(req.key.len(), info.value_len as usize, info.flags)
                    as u64,
            };
            wire::push_debug(out, &req.key, info.key_binary, &d);
        }
        None => {
            out.extend_from_slice(wire::EN);
            out.extend_from_slice(wire::CRLF);
        }
    }
    ctx.stats.meta_cmds.incr();
}

// ----- mg -----------------------------------------------------------------------------

/// What writing an `mg` hit line decided.
struct MgHit {
    /// The item's exptime after `T`/`N`.
    exptime: u32,
    /// The client won the recache token (a `W` was written).
    won: bool,
    /// A `T` was seen (counts as a touch, not a get).
    touched: bool,
}

/// Write an `mg` hit's reply line ("VA <len> <flags>\r\n" or "HD <flags>\r\n"),
/// applying `T`, `N` and `R` in flag order as memcached does.
fn mg_hit_line(
    clock: &Clock,
    req: &MetaRequest<'_>,
    info: &ItemInfo,
    created: bool,
    out: &mut Vec<u8>,
) -> Result<MgHit, (MetaError, u32)> {
    let f = &req.flags;
    if f.value {
        wire::push_value_header(out, info.value_len as usize);
    } else {
        out.extend_from_slice(wire::HD);
    }
    let mut hit = MgHit {
        exptime: info.exptime,
        won: false,
        touched: false,
    };
    for tok in f.tokens() {
        match tok[0] {
            b'T' => {
                hit.touched = true;
                hit.exptime = abs_exptime(clock, f.ttl.unwrap_or(0));
            }
            b'N' if created => {
                hit.exptime = abs_exptime(clock, f.vivify.unwrap_or(0));
                hit.won = true;
            }
            b'R' => {
                let threshold = abs_exptime(clock, f.recache.unwrap_or(0));
                if !info.token_sent && !created && hit.exptime != 0 && hit.exptime < threshold {
                    hit.won = true;
                }
            }
            b's' => wire::push_flag_u64(out, b's', info.value_len as u64),
            b't' => wire::push_ttl(out, ttl_remaining(clock, hit.exptime)),
            b'c' => wire::push_flag_u64(out, b'c', info.cas),
            b'f' => wire::push_flag_u64(out, b'f', info.flags as u64),
            b'l' => {
                wire::push_flag_u64(out, b'l', clock.now().wrapping_sub(info.last_access) as u64)
            }
            b'h' => wire::push_flag_u64(out, b'h', info.fetched as u64),
            b'O' => {
                if tok.len() > wire::OPAQUE_MAX_LEN {
                    return Err((MetaError::OpaqueTooLong, hit.exptime));
                }
                wire::push_opaque(out, tok);
            }
            b'k' => wire::push_key(out, &req.key, info.key_binary),
            _ => {}
        }
    }
    // Z before W is impossible by construction, and memcached writes Z, X, W in this
    // order so that a client never sees a win together with "already won".
    if info.token_sent {
        wire::push_flag(out, b'Z');
    }
    if info.stale {
        wire::push_flag(out, b'X');
        if !info.token_sent {
            hit.won = true;
        }
    }
    if hit.won {
        wire::push_flag(out, b'W');
    }
    out.extend_from_slice(wire::CRLF);
    Ok(hit)
}

/// `EN` with the opaque and key echoed (nothing at all under `q`).
fn mg_miss(req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let f = &req.flags;
    if f.opaque_too_long() {
        wire::push_error(out, MetaError::OpaqueTooLong);
        return;
    }
    if f.quiet {
        return;
    }
    out.extend_from_slice(wire::EN);
    push_echo_flags(req, out);
    out.extend_from_slice(wire::CRLF);
}

/// The opaque and key return flags, in request order.
fn push_echo_flags(req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    for tok in req.flags.tokens() {
        match tok[0] {
            b'O' => wire::push_opaque(out, tok),
            b'k' => wire::push_key(out, &req.key, req.flags.base64),
            _ => {}
        }
    }
}

enum MgOutcome {
    /// `class`: the item's slab class (per-class stats).
    Hit {
        touched: bool,
        class: u8,
    },
    Miss,
    Error,
    /// The key is on flash and a read thread reads it: the `mg` runs again, in its
    /// place, with the item read.
    Pending(command::holds::Ticket),
}

fn get(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    req: &MetaRequest<'_>,
    line: &[u8],
    queue: &mut OutQueue,
) {
    if let Some(ticket) = command::holds::hold(ctx, &req.key) {
        // Not ready: the whole `mg` runs again, in its place, once it is.
        let resume = Resume::Meta {
            line: line.to_vec(),
        };
        return super::park(sess, ticket, resume, queue);
    }
    let f = &req.flags;
    let outcome = if f.value && f.vivify.is_none() && f.recache.is_none() && f.ttl.is_none() {
        mg_lockless(ctx, req, queue).unwrap_or_else(|| mg_locked(ctx, req, queue.bytes()))
    } else {
        mg_locked(ctx, req, queue.bytes())
    };
    match outcome {
        // `Touch`'s exptime does not matter for counting.
        MgOutcome::Hit {
            touched: true,
            class,
        } => command::count_retrieval(ctx, Retrieval::Touch(0), Some(class)),
        MgOutcome::Hit {
            touched: false,
            class,
        } => command::count_retrieval(ctx, Retrieval::Get, Some(class)),
        MgOutcome::Miss => command::count_retrieval(ctx, Retrieval::Get, None),
        MgOutcome::Error => {}
        // Counted when it runs again.
        MgOutcome::Pending(ticket) => {
            let resume = Resume::Meta {
                line: line.to_vec(),
            };
            super::park(sess, ticket, resume, queue);
        }
    }
}

/// The common `mg <key> v ...`: one optimistic read, no lock. `None` when the item turns
/// out to be stale with no win token handed out yet (handing one out changes the item,
/// so the locked path redoes the request), or for an over-long opaque.
/// A large value is queued pinned and written from item memory.
fn mg_lockless(
    ctx: &mut ExecCtx<'_>,
    req: &MetaRequest<'_>,
    queue: &mut OutQueue,
) -> Option<MgOutcome> {
    if req.flags.opaque_too_long() {
        // Rare: whether it counts as a miss depends on the lookup; let the locked path
        // sort it out.
        return None;
    }
    let clock = ctx.shared.store.clock();
    let start = queue.mark();
    let bump = !req.flags.no_update;
    let hit = super::fetch_with(
        ctx,
        &req.key,
        Retrieval::Get,
        bump,
        false,
        queue,
        |info, out| {
            // Without T/N/R and with the opaque checked, this cannot fail.
            let _ = mg_hit_line(clock, req, info, false, out);
        },
    );
    match hit {
        // Held keys were held by `get` already: this is a flash read.
        Fetched::Pending(ticket) => Some(MgOutcome::Pending(ticket)),
        Fetched::Hit(info) if info.stale && !info.token_sent => {
            // Handing out the win token changes the item: the locked path redoes it.
            queue.truncate(start);
            None
        }
        Fetched::Hit(info) => {
            queue.bytes().extend_from_slice(wire::CRLF);
            Some(MgOutcome::Hit {
                touched: false,
                class: info.class_id,
            })
        }
        Fetched::Miss => {
            mg_miss(req, queue.bytes());
            Some(MgOutcome::Miss)
        }
    }
}

/// `mg` under the key's lock: vivify, recache, touch and the win token.
fn mg_locked(ctx: &mut ExecCtx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) -> MgOutcome {
    let store = &ctx.shared.store;
    let clock = store.clock();
    let f = &req.flags;
    let start = out.len();
    store.transact(&req.key, |t| {
        let mut info = t.item();
        let mut created = false;
        if info.is_none() && f.vivify.is_some() {
            // An empty placeholder; its TTL is set by the N flag in the reply loop.
            if let Ok(item) = t.alloc(0, 0, 0) {
                t.link(item, LinkOptions::default());
                info = t.item();
                created = info.is_some();
            }
        }
        let Some(info) = info else {
            // memcached counts the miss before it looks at the opaque.
            mg_miss(req, out);
            return MgOutcome::Miss;
        };
        match mg_hit_line(clock, req, &info, created, out) {
            Ok(hit) => {
                if hit.exptime != info.exptime {
                    t.set_exptime(hit.exptime);
                }
                if hit.won {
                    t.set_marks(None, Some(true));
                }
                if f.value {
                    t.read_value(out);
                    out.extend_from_slice(wire::CRLF);
                }
                if !f.no_update {
                    t.mark_fetched();
                }
                MgOutcome::Hit {
                    touched: hit.touched,
                    class: info.class_id,
                }
            }
            Err((e, exptime)) => {
                // memcached changed the TTL in place before it met the bad opaque.
                if exptime != info.exptime {
                    t.set_exptime(exptime);
                }
                out.truncate(start);
                wire::push_error(out, e);
                MgOutcome::Error
            }
        }
    })
}

// ----- ms -----------------------------------------------------------------------------

/// An `ms`'s arguments for the command layer.
fn meta_store_args<'k>(ctx: &ExecCtx<'_>, req: &'k MetaRequest<'_>) -> MetaStore<'k> {
    let f = &req.flags;
    // Parsing validated the mode.
    let mode = match f.store_mode().unwrap_or(StoreMode::Set) {
        StoreMode::Set => SetMode::Set,
        StoreMode::Add => SetMode::Add,
        StoreMode::Replace => SetMode::Replace,
        StoreMode::Append => SetMode::Append,
        StoreMode::Prepend => SetMode::Prepend,
    };
    MetaStore {
        key: &req.key,
        mode,
        flags: f.client_flags,
        exptime: f
            .ttl
            .map_or(0, |t| abs_exptime(ctx.shared.store.clock(), t)),
        cas: f.cas,
        invalidate: f.invalidate,
        base64_key: f.base64,
        keep_newer_write: f.keep_newer_write,
    }
}

fn set(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    req: &MetaRequest<'_>,
    input: &[u8],
    line_len: usize,
    out: &mut Vec<u8>,
) -> Step {
    let store = &ctx.shared.store;
    let f = &req.flags;
    let data_len = req.data_len;
    // memcached allocates the item before reading the data, so a value that cannot fit
    // is refused at once and its data discarded as it arrives (never buffered).
    if store.too_large(req.key.len(), data_len, f.client_flags) {
        command::meta::refuse_too_large(ctx, &meta_store_args(ctx, req));
        out.extend_from_slice(TOO_LARGE);
        sess.swallow = data_len + 2;
        return Step::Done(line_len);
    }
    let total = line_len + data_len + 2;
    if input.len() < total {
        if data_len >= super::RECEIVE_IN_PLACE_FROM {
            return receive_value(ctx, sess, req, &input[..line_len], out);
        }
        return Step::NeedMore(total);
    }
    let data = &input[line_len..line_len + data_len];
    command::meta::count_set(ctx, req.key.len(), data_len);
    if &input[line_len + data_len..total] != b"\r\n" {
        out.extend_from_slice(BAD_CHUNK);
        return Step::Done(total);
    }
    let (status, kept) = command::meta::store(ctx, &meta_store_args(ctx, req), data);
    let (code, cas) = match status {
        StoreStatus::Stored { cas } => (wire::HD, cas),
        StoreStatus::NotStored => (wire::NS, 0),
        StoreStatus::Exists => (wire::EX, 0),
        StoreStatus::NotFound => (wire::NF, 0),
        StoreStatus::TooLarge => {
            out.extend_from_slice(TOO_LARGE);
            return Step::Done(total);
        }
        StoreStatus::OutOfMemory => {
            out.extend_from_slice(NO_MEMORY);
            return Step::Done(total);
        }
    };
    if code == wire::HD && f.quiet {
        return Step::Done(total);
    }
    out.extend_from_slice(code);
    for tok in f.tokens() {
        match tok[0] {
            b'O' => wire::push_opaque(out, tok),
            b'k' => wire::push_key(out, &req.key, f.base64),
            b'c' => wire::push_flag_u64(out, b'c', cas),
            // The newer write kept instead of this one (memfabricd's `K`).
            b'K' if kept != 0 => wire::push_flag_u64(out, b'K', kept),
            _ => {}
        }
    }
    out.extend_from_slice(wire::CRLF);
    Step::Done(total)
}

/// An `ms` whose large value has not arrived: it is received into item memory (so it
/// counts in `-m`, as memcached's half-read items do) instead of the read buffer, and
/// run through `set` once it is complete (`finish_store`).
fn receive_value(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    req: &MetaRequest<'_>,
    line: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let store = &ctx.shared.store;
    let f = &req.flags;
    let exptime = f.ttl.map_or(0, |t| abs_exptime(store.clock(), t));
    match store.alloc_pending(&req.key, req.data_len, f.client_flags, exptime) {
        Ok(item) => {
            let pending = StoreHeader {
                line: line.to_vec(),
            };
            sess.receiving = Some(Receiving::new(item, b"\r\n", Finish::Meta(pending)));
        }
        Err(_) => {
            // As `set` answers an item it cannot allocate; the data is discarded as it
            // arrives.
            command::meta::count_set(ctx, req.key.len(), req.data_len);
            command::meta::refuse_no_memory(ctx, &meta_store_args(ctx, req));
            out.extend_from_slice(NO_MEMORY);
            sess.swallow = req.data_len + 2;
        }
    }
    Step::Done(line.len())
}

/// An `ms` line kept while its value arrives.
pub struct StoreHeader {
    line: Vec<u8>,
}

/// The value of a `receive_value` request is here: run the `ms` on it. The value is
/// copied out of the pending item (and the item freed) first, so the store's own rules
/// for every mode and flag apply unchanged; the copy lives only for this call.
pub fn finish_store(
    ctx: &mut ExecCtx<'_>,
    h: StoreHeader,
    mut item: PendingItem,
    trailer: &[u8],
    out: &mut Vec<u8>,
) {
    let mut input = h.line;
    input.reserve(item.value_len() + trailer.len());
    for piece in item.value_slices_mut() {
        input.extend_from_slice(piece);
    }
    drop(item);
    input.extend_from_slice(trailer);
    let mut sess = Session::default();
    let mut queue = OutQueue::new();
    let _ = process_one(ctx, &mut sess, &input, &mut queue);
    out.extend_from_slice(&queue.take_vec());
}

// ----- md -----------------------------------------------------------------------------

fn delete(ctx: &mut ExecCtx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let f = &req.flags;
    let args = MetaDelete {
        cas: f.cas,
        invalidate: f.invalidate,
        exptime: f.ttl.map(|t| abs_exptime(ctx.shared.store.clock(), t)),
    };
    let code = match command::meta::delete(ctx, &req.key, &args) {
        DeleteStatus::Deleted => wire::HD,
        DeleteStatus::NotFound => wire::NF,
        DeleteStatus::Exists => wire::EX,
    };
    if code == wire::HD && f.quiet {
        return;
    }
    out.extend_from_slice(code);
    push_echo_flags(req, out);
    out.extend_from_slice(wire::CRLF);
}

// ----- ma -----------------------------------------------------------------------------

fn arith(ctx: &mut ExecCtx<'_>, req: &MetaRequest<'_>, out: &mut Vec<u8>) {
    let store = &ctx.shared.store;
    let clock = store.clock();
    let f = &req.flags;
    let stats = ctx.stats;
    // Parsing validated the mode.
    let incr = f.arith_mode().unwrap_or(ArithMode::Incr) == ArithMode::Incr;
    let count_hit = |class: Option<u8>| {
        let what = if incr {
            ClassStat::IncrHits
        } else {
            ClassStat::DecrHits
        };
        stats.count(what, class)
    };
    let count_miss = || {
        if incr {
            stats.incr_misses.incr()
        } else {
            stats.decr_misses.incr()
        }
    };
    let start = out.len();
    // Set when the reply turned into an error (a bad opaque met after the change).
    let mut reply_error = false;
    let needs_item = f.vivify.is_some() || f.ttl.is_some() || f.has(b't');
    let done = if !needs_item {
        let a = command::Arith {
            incr,
            delta: f.delta,
            cas: f.cas.unwrap_or(0),
            create: None,
        };
        // Counted by the command (a miss too).
        match command::arith(ctx, &req.key, a).status {
            ArithStatus::Value { value, cas } => {
                let done = ArithDone::Value {
                    value,
                    cas,
                    created: false,
                };
                let mut exptime = 0;
                if let Err(e) = ma_reply(clock, req, &done, &mut exptime, out) {
                    out.truncate(start);
                    wire::push_error(out, e);
                    reply_error = true;
                }
                done
            }
            ArithStatus::NotFound => return ma_status_line(req, wire::NF, out),
            ArithStatus::NonNumeric => ArithDone::NonNumeric,
            ArithStatus::Exists => ArithDone::Exists,
            ArithStatus::OutOfMemory => ArithDone::NoMemory,
        }
    } else {
        store.transact(&req.key, |t| {
            let class = t.item().map(|i| i.class_id);
            // Created with no TTL on a miss (N): the reply loop sets it.
            let opts = ArithOptions {
                cas: f.cas.unwrap_or(0),
                create: f.vivify.map(|_| (f.initial, 0, 0)),
            };
            let done = match t.arith(incr, f.delta, &opts) {
                ArithStatus::Value { value, cas } => ArithDone::Value {
                    value,
                    cas,
                    created: class.is_none(),
                },
                ArithStatus::NotFound => ArithDone::NotFound,
                ArithStatus::Exists => ArithDone::Exists,
                ArithStatus::NonNumeric => ArithDone::NonNumeric,
                ArithStatus::OutOfMemory if class.is_none() => ArithDone::VivifyNoMemory,
                ArithStatus::OutOfMemory => ArithDone::NoMemory,
            };
            if let ArithDone::Value { created, .. } = done {
                if !created {
                    count_hit(class);
                }
                let Some(info) = t.item() else {
                    return done;
                };
                let mut exptime = info.exptime;
                let r = ma_reply(clock, req, &done, &mut exptime, out);
                // The TTL changes (T, N) happen in the reply loop, even when a bad opaque
                // later turns the reply into an error.
                if exptime != info.exptime {
                    t.set_exptime(exptime);
                }
                if let Err(e) = r {
                    out.truncate(start);
                    wire::push_error(out, e);
                    reply_error = true;
                }
            }
            done
        })
    };
    let code = match done {
        ArithDone::Value { created, .. } => {
            // Only a plain success is quiet; a counter created on a miss is reported,
            // and errors always are.
            if f.quiet && !created && !reply_error {
                out.truncate(start);
            }
            return;
        }
        ArithDone::NotFound => {
            count_miss();
            wire::NF
        }
        ArithDone::Exists => wire::EX,
        ArithDone::NonNumeric => {
            out.extend_from_slice(NON_NUMERIC);
            return;
        }
        ArithDone::NoMemory => {
            out.extend_from_slice(ARITH_NO_MEMORY);
            return;
        }
        ArithDone::VivifyNoMemory => {
            out.extend_from_slice(VIVIFY_NO_MEMORY);
            return;
        }
    };
    ma_status_line(req, code, out);
}

/// An `ma` status line (`NF`, `EX`) with the opaque and key echoed (an over-long opaque
/// is an error instead).
fn ma_status_line(req: &MetaRequest<'_>, code: &[u8], out: &mut Vec<u8>) {
    if req.flags.opaque_too_long() {
        wire::push_error(out, MetaError::OpaqueTooLong);
        return;
    }
    out.extend_from_slice(code);
    push_echo_flags(req, out);
    out.extend_from_slice(wire::CRLF);
}

/// The reply of a successful `ma`, flags in request order; `T` and `N` update `exptime`
/// as they are met. An over-long opaque is an error found mid-reply, as in memcached.
fn ma_reply(
    clock: &Clock,
    req: &MetaRequest<'_>,
    done: &ArithDone,
    exptime: &mut u32,
    out: &mut Vec<u8>,
) -> Result<(), MetaError> {
    let ArithDone::Value {
        value,
        cas,
        created,
    } = *done
    else {
        return Ok(());
    };
    let f = &req.flags;
    let mut digits = Vec::with_capacity(20);
    wire::push_u64(&mut digits, value);
    if f.value {
        wire::push_value_header(out, digits.len());
    } else {
        out.extend_from_slice(wire::HD);
    }
    for tok in f.tokens() {
        match tok[0] {
            b'c' => wire::push_flag_u64(out, b'c', cas),
            b't' => wire::push_ttl(out, ttl_remaining(clock, *exptime)),
            b'T' => *exptime = abs_exptime(clock, f.ttl.unwrap_or(0)),
            b'N' if created => *exptime = abs_exptime(clock, f.vivify.unwrap_or(0)),
            b'O' => {
                if tok.len() > wire::OPAQUE_MAX_LEN {
                    return Err(MetaError::OpaqueTooLong);
                }
                wire::push_opaque(out, tok);
            }
            b'k' => wire::push_key(out, &req.key, f.base64),
            _ => {}
        }
    }
    if f.value {
        out.extend_from_slice(wire::CRLF);
        out.extend_from_slice(&digits);
    }
    out.extend_from_slice(wire::CRLF);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_on_memcacheds_scale() {
        let clock = Clock::new();
        // A live item: what is left, wherever the scale starts.
        let left = ttl_remaining(&clock, clock.now() + 100).unwrap() as i32;
        assert!((99..=100).contains(&left), "{left}");
        // Already expired (`N-1`): relative time 1 against memcached's now, which starts
        // at 62 (`process_started` is 60 + 2 s before the start): -61, less as time goes.
        let expired = ttl_remaining(&clock, clock.exptime(-1)).unwrap() as i32;
        assert!((-63..=-61).contains(&expired), "{expired}");
        assert_eq!(ttl_remaining(&clock, 0), None);
    }
}
