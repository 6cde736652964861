//! The binary protocol: frame a request with `memfabric_proto::binary`, run it against
//! the store, append the reply.
//!
//! Behaviour follows memcached 1.6.18's `proto_bin.c` as observed on the wire: replies
//! echo the request's opcode (quiet variants included) and opaque; quiet commands send
//! nothing on success (quiet gets nothing on a miss) but always send errors; malformed
//! requests get "Invalid arguments" (or "Unknown command" when key + extras exceed the
//! body) and the connection is closed; a value larger than the item size limit gets
//! "Too large." and is discarded as it arrives, never buffered.
use memfabric_proto::binary::{
    self as bp, Command, Frame, FrameError, Request, RequestHeader, Status, StoreHead, StoreOp,
};
use memfabric_store::{
    ArithOptions, ArithStatus, DeleteStatus, Found, GetOptions, PendingItem, SetMode, StoreStatus,
};

use super::{ExecCtx, Finish, Receiving, Session, Step};
use crate::counters::ClassStat;
use crate::outqueue::OutQueue;

/// First byte of every binary request.
pub const REQUEST_MAGIC: u8 = bp::REQUEST_MAGIC;

/// Per-connection binary state. Empty: every request is framed from the input alone,
/// so replies do not depend on how the input was split into reads.
#[derive(Default)]
pub struct BinaryState {}

/// Run the request at the start of `input` (see `exec::process`).
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    queue: &mut OutQueue,
) -> Step {
    let frame = match bp::parse_request(input) {
        Ok(frame) => frame,
        Err(FrameError::BadMagic(_)) => {
            // memcached closes without a word.
            ctx.stats.protocol_errors.incr();
            return Step::Close;
        }
        Err(FrameError::Rejected { header, status }) => {
            ctx.stats.protocol_errors.incr();
            bp::write_error(queue.bytes(), header.opcode, header.opaque, status);
            return Step::Close;
        }
    };
    match frame {
        Frame::NeedMore(n) => Step::NeedMore(n),
        Frame::ValuePending {
            header,
            head,
            total,
        } => {
            if head.value_len <= ctx.shared.store.config().item_size_max {
                if head.value_len >= super::RECEIVE_IN_PLACE_FROM {
                    // Large: receive it straight into the item it will become.
                    return receive_value(ctx, sess, header, &head, total, queue.bytes());
                }
                // It may fit: buffer it (bounded by the receive-in-place threshold) and
                // let the store decide once it is all here.
                return Step::NeedMore(total);
            }
            // It can never fit: answer now and drop the value as it arrives.
            reply_too_large(ctx, &header, &head, queue.bytes());
            consume(sess, input, total as u64)
        }
        Frame::Request { request, len } => {
            let flow = match request.command {
                // Retrievals may queue a large value pinned; the rest write bytes.
                Command::Get { key, return_key } => {
                    get(ctx, &request, key, None, return_key, queue);
                    Flow::Continue
                }
                Command::GetAndTouch {
                    key,
                    exptime,
                    return_key,
                } => {
                    get(ctx, &request, key, Some(exptime), return_key, queue);
                    Flow::Continue
                }
                _ => execute(ctx, &request, queue.bytes()),
            };
            match flow {
                Flow::Continue => consume(sess, input, len),
                Flow::Close => Step::Close,
            }
        }
    }
}

/// Use `len` bytes of input: what is here now, the rest swallowed as it arrives.
fn consume(sess: &mut Session, input: &[u8], len: u64) -> Step {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    let now = len.min(input.len());
    sess.swallow = len - now;
    Step::Done(now)
}

enum Flow {
    Continue,
    Close,
}

fn execute(ctx: &mut ExecCtx<'_>, req: &Request<'_>, out: &mut Vec<u8>) -> Flow {
    let h = &req.header;
    let quiet = req.quiet();
    match req.command {
        // Run by `process_one` with the reply queue.
        Command::Get { .. } | Command::GetAndTouch { .. } => {}
        Command::Touch { key, exptime } => touch(ctx, h, key, exptime, out),
        Command::Store { head, value } => store(ctx, h, &head, value, quiet, out),
        Command::Delete { key } => delete(ctx, h, key, quiet, out),
        Command::Arith {
            incr,
            key,
            delta,
            initial,
            exptime,
        } => arith(ctx, h, incr, key, delta, initial, exptime, quiet, out),
        Command::Flush { exptime } => {
            if !ctx.shared.settings.flush_enabled {
                // `-F`: memcached refuses with an auth error, even to FLUSHQ, and does
                // not count it.
                bp::write_error(out, h.opcode, h.opaque, Status::AuthError);
                return Flow::Continue;
            }
            ctx.stats.cmd_flush.incr();
            let store = &ctx.shared.store;
            // memcached: a zero exptime (or none) flushes now.
            let at = exptime
                .filter(|&e| e > 0)
                .map(|e| store.clock().exptime(i64::from(e)));
            store.flush_all(at);
            if !quiet {
                bp::write_ok(out, h.opcode, h.opaque, 0);
            }
        }
        Command::Noop => bp::write_ok(out, h.opcode, h.opaque, 0),
        Command::Version => bp::write_response(
            out,
            h.opcode,
            h.opaque,
            Status::Success,
            0,
            &[],
            &[],
            crate::counters::VERSION.as_bytes(),
        ),
        Command::Quit => {
            if !quiet {
                bp::write_ok(out, h.opcode, h.opaque, 0);
            }
            return Flow::Close;
        }
        Command::Stat { group } => stat(ctx, h, group, out),
        Command::Unknown => bp::write_error(out, h.opcode, h.opaque, Status::UnknownCommand),
    }
    Flow::Continue
}

/// GET GETQ GETK GETKQ, and with `touch` GAT GATQ GATK GATKQ. A large value is queued
/// pinned and written from item memory.
fn get(
    ctx: &mut ExecCtx<'_>,
    request: &Request<'_>,
    key: &[u8],
    touch: Option<u32>,
    return_key: bool,
    queue: &mut OutQueue,
) {
    let h = &request.header;
    let quiet = request.quiet();
    let store = &ctx.shared.store;
    let opts = GetOptions {
        touch: touch.map(|e| store.clock().exptime(i64::from(e))),
        ..GetOptions::default()
    };
    let reply_key: &[u8] = if return_key { key } else { &[] };
    let (op, opaque) = (h.opcode, h.opaque);
    let hit = super::fetch(store, key, opts, queue, |info, out| {
        bp::write_hit_header(
            out,
            op,
            opaque,
            info.cas,
            info.flags,
            reply_key,
            info.value_len,
        )
    });
    let out = queue.bytes();
    let s = ctx.stats;
    let class = hit.map(|i| i.class_id);
    // memcached counts GAT as a touch, not a get.
    if touch.is_some() {
        s.cmd_touch.incr();
        if hit.is_some() {
            s.count(ClassStat::TouchHits, class)
        } else {
            s.touch_misses.incr()
        }
    } else {
        s.cmd_get.incr();
        if hit.is_some() {
            s.count(ClassStat::GetHits, class)
        } else {
            s.get_misses.incr()
        }
    }
    if hit.is_none() && !quiet {
        if return_key {
            bp::write_key_miss(out, op, opaque, key);
        } else {
            bp::write_error(out, op, opaque, Status::KeyNotFound);
        }
    }
}

/// TOUCH: new exptime; the reply carries the flags and CAS but no value.
fn touch(ctx: &mut ExecCtx<'_>, h: &RequestHeader, key: &[u8], exptime: u32, out: &mut Vec<u8>) {
    let store = &ctx.shared.store;
    let exptime = store.clock().exptime(i64::from(exptime));
    // Through a transaction rather than `Store::touch`: the reply needs the flags and CAS,
    // and copying the value only to drop it would be waste.
    let hit = store.transact(key, |t| {
        let info = t.item()?;
        t.set_exptime(exptime);
        t.mark_fetched();
        Some(info)
    });
    ctx.stats.cmd_touch.incr();
    match hit {
        Some(info) => {
            ctx.stats.count(ClassStat::TouchHits, Some(info.class_id));
            bp::write_hit_header(out, h.opcode, h.opaque, info.cas, info.flags, &[], 0);
        }
        None => {
            ctx.stats.touch_misses.incr();
            bp::write_error(out, h.opcode, h.opaque, Status::KeyNotFound);
        }
    }
}

/// memcached's text when it cannot allocate the item for a storage command (binary
/// replies carry the ascii error minus its "SERVER_ERROR " prefix).
const OOM_STORE: &str = "Out of memory allocating item";
const OOM_INCR: &str = "Out of memory incrementing value";
const OOM_CREATE: &str = "Out of memory allocating new item";

/// The reply to a value larger than any item can be.
fn reply_too_large(ctx: &ExecCtx<'_>, h: &RequestHeader, head: &StoreHead<'_>, out: &mut Vec<u8>) {
    bp::write_error(out, h.opcode, h.opaque, Status::TooLarge);
    forget_on_failed_set(ctx, head);
}

/// memcached unlinks the old item when a SET cannot even allocate its new one, so that
/// a failed set never leaves stale data readable.
fn forget_on_failed_set(ctx: &ExecCtx<'_>, head: &StoreHead<'_>) {
    if head.op == StoreOp::Set {
        let _ = ctx.shared.store.delete(head.key, 0);
    }
}

fn set_mode(op: StoreOp) -> SetMode {
    match op {
        StoreOp::Set => SetMode::Set,
        StoreOp::Add => SetMode::Add,
        StoreOp::Replace => SetMode::Replace,
        StoreOp::Append => SetMode::Append,
        StoreOp::Prepend => SetMode::Prepend,
    }
}

fn store(
    ctx: &mut ExecCtx<'_>,
    h: &RequestHeader,
    head: &StoreHead<'_>,
    value: &[u8],
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let store = &ctx.shared.store;
    // The wire exptime is unsigned: memcached never sees a negative one here.
    let exptime = store.clock().exptime(i64::from(head.exptime));
    let found = store.store_found(
        set_mode(head.op),
        head.key,
        value,
        head.flags,
        exptime,
        h.cas,
    );
    let class = store.item_class(head.key.len(), value.len());
    answer_store(ctx, h, head, found, class, quiet, out);
}

/// The parts of a storage request kept while its value arrives.
pub struct StoreHeader {
    header: RequestHeader,
    op: StoreOp,
    key: Vec<u8>,
}

/// A storage request whose large value has not arrived yet: allocate its item now (so
/// the memory counts in `-m`, as memcached's does) and receive the value into it.
fn receive_value(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    header: RequestHeader,
    head: &StoreHead<'_>,
    total: usize,
    out: &mut Vec<u8>,
) -> Step {
    let store = &ctx.shared.store;
    let exptime = store.clock().exptime(i64::from(head.exptime));
    let before_value = total - head.value_len;
    match store.alloc_pending(head.key, head.value_len, head.flags, exptime) {
        Ok(item) => {
            let pending = StoreHeader {
                header,
                op: head.op,
                key: head.key.to_vec(),
            };
            sess.receiving = Some(Receiving::new(item, b"", Finish::Binary(pending)));
            Step::Done(before_value)
        }
        Err(e) => {
            // Answered now; the value is discarded as it arrives.
            let refused = Found::unfound(e.into());
            answer_store(ctx, &header, head, refused, None, header.quiet(), out);
            sess.swallow = head.value_len;
            Step::Done(before_value)
        }
    }
}

/// The value of a `receive_value` request is here: store it and answer.
pub fn finish_store(ctx: &mut ExecCtx<'_>, p: StoreHeader, item: PendingItem, out: &mut Vec<u8>) {
    let store = &ctx.shared.store;
    let class = store.item_class(p.key.len(), item.value_len());
    let found = store.store_pending_found(set_mode(p.op), item, p.header.cas);
    let head = StoreHead {
        op: p.op,
        key: &p.key,
        flags: 0,
        exptime: 0,
        value_len: 0,
    };
    answer_store(ctx, &p.header, &head, found, class, p.header.quiet(), out);
}

/// Count a storage request's outcome and answer it. `new_class`: the slab class of the
/// request's item (memcached counts `cmd_set` there, CAS results in the old item's).
fn answer_store(
    ctx: &mut ExecCtx<'_>,
    h: &RequestHeader,
    head: &StoreHead<'_>,
    found: Found<StoreStatus>,
    new_class: Option<u8>,
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let status = found.status;
    // set/add/replace with a CAS are compare-and-swap (the store switches mode itself).
    let is_cas = h.cas != 0 && matches!(head.op, StoreOp::Set | StoreOp::Add | StoreOp::Replace);
    let s = ctx.stats;
    // memcached counts a set once the item is allocated, whatever happens next. Its
    // binary path does not count store_too_large / store_no_memory (ascii does).
    if !matches!(status, StoreStatus::TooLarge | StoreStatus::OutOfMemory) {
        s.count(ClassStat::SetCmds, new_class);
    }
    let (op, opaque) = (h.opcode, h.opaque);
    match status {
        StoreStatus::Stored { cas } => {
            if is_cas {
                s.count(ClassStat::CasHits, found.class_id);
            }
            if !quiet {
                bp::write_ok(out, op, opaque, cas);
            }
        }
        StoreStatus::Exists => {
            if is_cas {
                s.count(ClassStat::CasBadval, found.class_id);
            }
            bp::write_error(out, op, opaque, Status::KeyExists);
        }
        StoreStatus::NotFound => {
            if is_cas {
                s.cas_misses.incr();
            }
            bp::write_error(out, op, opaque, Status::KeyNotFound);
        }
        StoreStatus::NotStored => {
            // memcached reports a refused add as "exists" and a refused replace as
            // "not found"; only append/prepend say "not stored".
            let status = match head.op {
                StoreOp::Add => Status::KeyExists,
                StoreOp::Replace => Status::KeyNotFound,
                _ => Status::NotStored,
            };
            bp::write_error(out, op, opaque, status);
        }
        StoreStatus::TooLarge => reply_too_large(ctx, h, head, out),
        StoreStatus::OutOfMemory => {
            bp::write_error_text(out, op, opaque, Status::OutOfMemory, OOM_STORE);
            forget_on_failed_set(ctx, head);
        }
    }
}

fn delete(ctx: &mut ExecCtx<'_>, h: &RequestHeader, key: &[u8], quiet: bool, out: &mut Vec<u8>) {
    let found = ctx.shared.store.delete_found(key, h.cas);
    match found.status {
        DeleteStatus::Deleted => {
            ctx.stats.count(ClassStat::DeleteHits, found.class_id);
            if !quiet {
                bp::write_ok(out, h.opcode, h.opaque, 0);
            }
        }
        DeleteStatus::NotFound => {
            ctx.stats.delete_misses.incr();
            bp::write_error(out, h.opcode, h.opaque, Status::KeyNotFound);
        }
        DeleteStatus::Exists => bp::write_error(out, h.opcode, h.opaque, Status::KeyExists),
    }
}

#[allow(clippy::too_many_arguments)]
fn arith(
    ctx: &mut ExecCtx<'_>,
    h: &RequestHeader,
    incr: bool,
    key: &[u8],
    delta: u64,
    initial: u64,
    exptime: u32,
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let store = &ctx.shared.store;
    let s = ctx.stats;
    let (op, opaque) = (h.opcode, h.opaque);
    let first = ArithOptions {
        cas: h.cas,
        create: None,
    };
    // Two steps so that the counters match memcached: a hit counts as a hit, a miss that
    // creates the item counts as neither, a miss that may not create counts as a miss.
    let found = store.arith_found(key, incr, delta, &first);
    let (status, created) = match found.status {
        ArithStatus::NotFound if exptime != bp::ARITH_NO_CREATE => {
            let create = ArithOptions {
                // memcached ignores the CAS when it creates the item.
                cas: 0,
                create: Some((initial, 0, store.clock().exptime(i64::from(exptime)))),
            };
            (store.arith(key, incr, delta, &create), true)
        }
        status => (status, false),
    };
    match status {
        ArithStatus::Value { value, cas } => {
            if !created {
                let what = if incr {
                    ClassStat::IncrHits
                } else {
                    ClassStat::DecrHits
                };
                s.count(what, found.class_id)
            }
            if !quiet {
                bp::write_counter(out, op, opaque, cas, value);
            }
        }
        ArithStatus::NotFound => {
            if incr {
                s.incr_misses.incr()
            } else {
                s.decr_misses.incr()
            }
            bp::write_error(out, op, opaque, Status::KeyNotFound);
        }
        ArithStatus::NonNumeric => bp::write_error(out, op, opaque, Status::DeltaBadValue),
        ArithStatus::Exists => bp::write_error(out, op, opaque, Status::KeyExists),
        ArithStatus::OutOfMemory => {
            let text = if created { OOM_CREATE } else { OOM_INCR };
            bp::write_error_text(out, op, opaque, Status::OutOfMemory, text);
        }
    }
}

/// STAT: one packet per statistic, then an empty terminator.
///
/// memcached's binary STAT knows fewer groups than ascii `stats`: "reset", "settings" and
/// "detail" match as prefixes, "items", "slabs", "sizes" exactly; anything else (even
/// "conns") is "Not found".
fn stat(ctx: &mut ExecCtx<'_>, h: &RequestHeader, group: &[u8], out: &mut Vec<u8>) {
    let opaque = h.opaque;
    let not_found = |out: &mut Vec<u8>| bp::write_error(out, h.opcode, opaque, Status::KeyNotFound);
    let emit = |out: &mut Vec<u8>, pairs: &[(String, String)]| {
        for (k, v) in pairs {
            bp::write_stat(out, opaque, k.as_bytes(), v.as_bytes());
        }
    };
    let terminate = |out: &mut Vec<u8>| bp::write_stat(out, opaque, &[], &[]);
    let ctx: &ExecCtx<'_> = ctx;
    if group.is_empty() {
        emit(
            out,
            &crate::command::stats::collect(ctx, "").unwrap_or_default(),
        );
    } else if group.starts_with(b"reset") {
        crate::command::stats::reset(ctx);
    } else if group.starts_with(b"settings") {
        emit(
            out,
            &crate::command::stats::collect(ctx, "settings").unwrap_or_default(),
        );
    } else if let Some(sub) = group.strip_prefix(b"detail") {
        if sub.starts_with(b" dump") {
            // Prefix statistics are not recorded, so the dump is memcached's empty one
            // unless the stats module learns to produce it.
            let pairs = crate::command::stats::collect(ctx, "detail dump")
                .unwrap_or_else(|| vec![("detailed".into(), "END\r\n".into())]);
            emit(out, &pairs);
        } else if sub.starts_with(b" on") || sub.starts_with(b" off") {
            // Accepted, as memcached does; the setting is not tracked here.
        } else {
            return not_found(out);
        }
    } else {
        match group {
            b"items" | b"slabs" | b"sizes" => {
                let name = std::str::from_utf8(group).unwrap_or_default();
                match crate::command::stats::collect(ctx, name) {
                    Some(pairs) => emit(out, &pairs),
                    None => return not_found(out),
                }
            }
            b"sizes_enable" | b"sizes_disable" => {
                let name = std::str::from_utf8(group).unwrap_or_default();
                match crate::command::stats::collect(ctx, name) {
                    // memcached sends these without a terminator.
                    Some(pairs) => return emit(out, &pairs),
                    None => return not_found(out),
                }
            }
            _ => return not_found(out),
        }
    }
    terminate(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_magic_is_0x80() {
        assert_eq!(REQUEST_MAGIC, 0x80);
    }

    #[test]
    fn consume_swallows_what_is_not_yet_here() {
        let mut sess = Session::default();
        assert_eq!(consume(&mut sess, &[0; 30], 100), Step::Done(30));
        assert_eq!(sess.swallow, 70);
        assert_eq!(consume(&mut sess, &[0; 30], 24), Step::Done(24));
        assert_eq!(sess.swallow, 0);
    }
}
