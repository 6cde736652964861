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
use memfabric_store::{ArithStatus, DeleteStatus, PendingItem, SetMode, StoreStatus};

use super::{consume, ExecCtx, Fetched, Finish, Receiving, Resume, Session, Step};
use crate::command::{self, Arith, Retrieval, StoreAccounting, StoreArgs};
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
    if ctx.shared.settings.sasl.is_some() {
        // -S: SASL requests, and everything before authentication.
        if let Some(step) = super::sasl::process_one(ctx, sess, input, queue.bytes()) {
            return step;
        }
    }
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
                    get(ctx, sess, &request, key, None, return_key, queue);
                    Flow::Continue
                }
                Command::GetAndTouch {
                    key,
                    exptime,
                    return_key,
                } => {
                    get(ctx, sess, &request, key, Some(exptime), return_key, queue);
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
        // memcached: a zero exptime (or none) flushes now.
        Command::Flush { exptime } => match command::flush_all(ctx, exptime.unwrap_or(0), false) {
            Ok(()) => {
                if !quiet {
                    bp::write_ok(out, h.opcode, h.opaque, 0);
                }
            }
            // `-F`: memcached refuses with an auth error, even to FLUSHQ, and does not
            // count it.
            Err(command::FlushDisabled) => {
                bp::write_error(out, h.opcode, h.opaque, Status::AuthError)
            }
        },
        Command::Noop => bp::write_ok(out, h.opcode, h.opaque, 0),
        Command::Version => bp::write_response(
            out,
            h.opcode,
            h.opaque,
            Status::Success,
            0,
            &[],
            &[],
            command::version().as_bytes(),
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

/// A binary retrieval waiting for its result: what its reply needs.
pub struct HeldGet {
    header: RequestHeader,
    quiet: bool,
    key: Vec<u8>,
    touch: Option<u32>,
    return_key: bool,
}

/// GET GETQ GETK GETKQ, and with `touch` GAT GATQ GATK GATKQ. A large value is queued
/// pinned and written from item memory; one that is not ready keeps its place.
fn get(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    request: &Request<'_>,
    key: &[u8],
    touch: Option<u32>,
    return_key: bool,
    queue: &mut OutQueue,
) {
    let clock = ctx.shared.store.clock();
    let held = HeldGet {
        header: request.header,
        quiet: request.quiet(),
        key: Vec::new(),
        touch: touch.map(|e| clock.exptime(i64::from(e))),
        return_key,
    };
    if let Some(ticket) = answer_get(ctx, &held, key, queue) {
        let held = HeldGet {
            key: key.to_vec(),
            ..held
        };
        super::park(sess, ticket, Resume::Binary(held), queue);
    }
}

/// Complete a retrieval whose result is ready (`exec::resume`).
pub fn resume_get(ctx: &ExecCtx<'_>, held: &HeldGet, queue: &mut OutQueue) {
    // A context that cannot wait never gets a ticket.
    let _ = answer_get(ctx, held, &held.key, queue);
}

/// Look the key up and answer; returns the ticket if the result is not ready.
fn answer_get(
    ctx: &ExecCtx<'_>,
    held: &HeldGet,
    key: &[u8],
    queue: &mut OutQueue,
) -> Option<command::holds::Ticket> {
    let h = &held.header;
    let how = held.touch.map_or(Retrieval::Get, Retrieval::Touch);
    let reply_key: &[u8] = if held.return_key { key } else { &[] };
    let (op, opaque) = (h.opcode, h.opaque);
    let fetched = super::fetch(ctx, key, how, true, queue, |info, out| {
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
    match fetched {
        Fetched::Hit(_) => {}
        Fetched::Pending(ticket) => return Some(ticket),
        Fetched::Miss if held.quiet => {}
        Fetched::Miss if held.return_key => bp::write_key_miss(queue.bytes(), op, opaque, key),
        Fetched::Miss => bp::write_error(queue.bytes(), op, opaque, Status::KeyNotFound),
    }
    None
}

/// TOUCH: new exptime; the reply carries the flags and CAS but no value.
fn touch(ctx: &mut ExecCtx<'_>, h: &RequestHeader, key: &[u8], exptime: u32, out: &mut Vec<u8>) {
    let exptime = ctx.shared.store.clock().exptime(i64::from(exptime));
    match command::touch(ctx, key, exptime) {
        Some(info) => bp::write_hit_header(out, h.opcode, h.opaque, info.cas, info.flags, &[], 0),
        None => bp::write_error(out, h.opcode, h.opaque, Status::KeyNotFound),
    }
}

/// The reply to a value larger than any item can be.
fn reply_too_large(ctx: &ExecCtx<'_>, h: &RequestHeader, head: &StoreHead<'_>, out: &mut Vec<u8>) {
    command::refuse_too_large(ctx, &store_args(ctx, h, head.op, head.key, 0, 0));
    bp::write_error(out, h.opcode, h.opaque, Status::TooLarge);
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

/// A storage request's arguments (`exptime` as sent). set/add/replace with a CAS are
/// compare-and-swap (the store switches mode itself). Under `-C` a storage request's CAS
/// is ignored, as memcached ignores it (its items have no CAS to set or compare; a
/// delete or incr with one still answers "exists").
fn store_args<'k>(
    ctx: &ExecCtx<'_>,
    h: &RequestHeader,
    op: StoreOp,
    key: &'k [u8],
    flags: u32,
    exptime: u32,
) -> StoreArgs<'k> {
    let cas = if ctx.shared.settings.use_cas {
        h.cas
    } else {
        0
    };
    StoreArgs {
        mode: set_mode(op),
        key,
        flags,
        // The wire exptime is unsigned: memcached never sees a negative one here.
        exptime: ctx.shared.store.clock().exptime(i64::from(exptime)),
        cas,
        counts_as_cas: cas != 0 && matches!(op, StoreOp::Set | StoreOp::Add | StoreOp::Replace),
        accounting: StoreAccounting::Binary,
        keep_newer_write: false,
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
    let args = store_args(ctx, h, head.op, head.key, head.flags, head.exptime);
    let status = command::store(ctx, &args, value);
    answer_store(h, head.op, status, quiet, out);
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
    let before_value = total - head.value_len;
    let args = store_args(ctx, &header, head.op, head.key, head.flags, head.exptime);
    match command::alloc_pending(ctx, &args, head.value_len) {
        Ok(item) => {
            let pending = StoreHeader {
                header,
                op: head.op,
                key: head.key.to_vec(),
            };
            sess.receiving = Some(Receiving::new(item, b"", Finish::Binary(pending)));
            Step::Done(before_value)
        }
        Err(refused) => {
            // Answered now; the value is discarded as it arrives.
            answer_store(&header, head.op, refused, header.quiet(), out);
            sess.swallow = head.value_len;
            Step::Done(before_value)
        }
    }
}

/// The value of a `receive_value` request is here: store it and answer.
pub fn finish_store(ctx: &mut ExecCtx<'_>, p: StoreHeader, item: PendingItem, out: &mut Vec<u8>) {
    // The flags and exptime are in the item already.
    let args = store_args(ctx, &p.header, p.op, &p.key, 0, 0);
    let status = command::store_pending(ctx, &args, item);
    answer_store(&p.header, p.op, status, p.header.quiet(), out);
}

/// memcached's text when it cannot allocate the item for a storage command (binary
/// replies carry the ascii error minus its "SERVER_ERROR " prefix).
const OOM_STORE: &str = "Out of memory allocating item";
const OOM_INCR: &str = "Out of memory incrementing value";
const OOM_CREATE: &str = "Out of memory allocating new item";

/// Answer a storage request's outcome (counted by the command).
fn answer_store(
    h: &RequestHeader,
    op: StoreOp,
    status: StoreStatus,
    quiet: bool,
    out: &mut Vec<u8>,
) {
    let (opcode, opaque) = (h.opcode, h.opaque);
    let error = match status {
        StoreStatus::Stored { cas } => {
            if !quiet {
                bp::write_ok(out, opcode, opaque, cas);
            }
            return;
        }
        StoreStatus::Exists => Status::KeyExists,
        StoreStatus::NotFound => Status::KeyNotFound,
        // memcached reports a refused add as "exists" and a refused replace as "not
        // found"; only append/prepend say "not stored".
        StoreStatus::NotStored => match op {
            StoreOp::Add => Status::KeyExists,
            StoreOp::Replace => Status::KeyNotFound,
            _ => Status::NotStored,
        },
        StoreStatus::TooLarge => Status::TooLarge,
        StoreStatus::OutOfMemory => {
            return bp::write_error_text(out, opcode, opaque, Status::OutOfMemory, OOM_STORE)
        }
    };
    bp::write_error(out, opcode, opaque, error);
}

fn delete(ctx: &mut ExecCtx<'_>, h: &RequestHeader, key: &[u8], quiet: bool, out: &mut Vec<u8>) {
    match command::delete(ctx, key, h.cas) {
        DeleteStatus::Deleted => {
            if !quiet {
                bp::write_ok(out, h.opcode, h.opaque, 0);
            }
        }
        DeleteStatus::NotFound => bp::write_error(out, h.opcode, h.opaque, Status::KeyNotFound),
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
    let (op, opaque) = (h.opcode, h.opaque);
    let clock = ctx.shared.store.clock();
    let a = Arith {
        incr,
        delta,
        cas: h.cas,
        create: (exptime != bp::ARITH_NO_CREATE)
            .then(|| (initial, 0, clock.exptime(i64::from(exptime)))),
    };
    let done = command::arith(ctx, key, a);
    match done.status {
        ArithStatus::Value { value, cas } => {
            if !quiet {
                bp::write_counter(out, op, opaque, cas, value);
            }
        }
        ArithStatus::NotFound => bp::write_error(out, op, opaque, Status::KeyNotFound),
        ArithStatus::NonNumeric => bp::write_error(out, op, opaque, Status::DeltaBadValue),
        ArithStatus::Exists => bp::write_error(out, op, opaque, Status::KeyExists),
        ArithStatus::OutOfMemory => {
            let text = if done.created { OOM_CREATE } else { OOM_INCR };
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
