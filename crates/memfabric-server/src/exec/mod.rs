//! Command execution: bytes in, replies out.
//!
//! `process` is what a worker calls with a connection's buffered input. It picks the
//! protocol from the first byte (0x80 = binary, anything else = ascii, as memcached's
//! auto-negotiation does), frames and runs as many requests as are complete, and appends
//! the replies to `out`. It never blocks and never panics on input.
//!
//! Files: `ascii.rs` (classic text commands and line framing), `meta.rs` (mg ms md ma mn
//! me), `binary.rs` (binary protocol), `auth.rs` (the `-Y` handshake), `sasl.rs` (binary
//! SASL, `-S`). Each exposes a `process_one` with the same shape.

use memfabric_store::{ItemInfo, PendingItem, PrefetchHint};

use crate::command::holds::Ticket;
use crate::command::{self, Delivery, Lookup, Retrieval, Value};

use crate::outqueue::OutQueue;

use crate::settings::ProtocolChoice;
pub use crate::shared::{ExecCtx, Shared, Transport};

pub mod ascii;
pub mod auth;
pub mod binary;
pub mod meta;
pub mod sasl;

/// Which protocol a connection speaks, decided by its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Ascii,
    Binary,
}

/// Per-connection protocol state.
#[derive(Default)]
pub struct Session {
    pub proto: Option<Proto>,
    /// Bytes of input still to be discarded (data of a rejected storage command).
    pub swallow: usize,
    /// A large value arriving straight into item memory.
    pub receiving: Option<Receiving>,
    pub ascii: ascii::AsciiState,
    pub binary: binary::BinaryState,
    /// Commands whose reply is not ready, in the order their holes stand in the reply
    /// queue, with what completes each.
    pub parked: Vec<(Ticket, Resume)>,
    /// An `lru_crawler metadump` being streamed: nothing after it runs until it ends.
    pub dump: Option<memfabric_store::DumpCursor>,
    /// Where the connection is in the `-Y` handshake (unused without `-Y`).
    pub auth: auth::AuthState,
    /// Where the connection is in SASL (unused without `-S`).
    pub sasl: sasl::SaslState,
}

/// Metadump bytes produced per turn: the output cap, checked before each turn, bounds
/// what a client that does not read can make us hold.
const DUMP_TURN: usize = 64 << 10;

/// Pending commands one connection may have before it stops running requests (until one
/// completes): bounds the work a client can leave waiting.
pub const MAX_PARKED: usize = 64;

/// What completes a command that answered "pending": the retrieval again, now that its
/// result is ready, encoded as its front end does.
pub enum Resume {
    /// One key of an ascii get/gets/gat/gats.
    AsciiValue {
        key: Vec<u8>,
        cas: bool,
        touch: Option<u32>,
    },
    /// A binary GET*/GAT* request (its header and key).
    Binary(binary::HeldGet),
    /// A meta `mg` line, run again.
    Meta { line: Vec<u8> },
}

impl Session {
    /// Commands waiting for their result.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// A request is part way through (a multiget being served, a value arriving).
    pub fn in_request(&self) -> bool {
        self.receiving.is_some() || self.ascii.in_request()
    }

    /// A value being received into item memory has fully arrived, or a metadump has more
    /// to send (`process` goes on with either, even with no further input).
    pub fn received(&self) -> bool {
        self.receiving.as_ref().is_some_and(Receiving::complete) || self.dump.is_some()
    }

    /// Values being received into item memory (0 or 1).
    pub fn receiving_values(&self) -> usize {
        usize::from(self.receiving.is_some())
    }

    /// Bytes of item memory held for values still arriving (counted in `-m`).
    pub fn receiving_bytes(&self) -> usize {
        self.receiving.as_ref().map_or(0, |r| r.item.value_len())
    }
}

/// A storage command's value being received straight into the item it will become
/// (allocated from the store, so it counts in `-m` like memcached's half-read items),
/// instead of being buffered whole in the connection. The item is freed if the
/// connection dies first.
pub struct Receiving {
    item: PendingItem,
    /// Value bytes written so far.
    filled: usize,
    /// Bytes that must follow the value (ascii's `\r\n`), and how many arrived.
    trailer: &'static [u8],
    trailer_seen: usize,
    /// The trailer bytes as they arrived (a trailer is at most `\r\n`).
    trailer_got: [u8; 2],
    /// What to do with the item once it is complete.
    finish: Finish,
}

/// How a protocol completes a received value.
pub enum Finish {
    Ascii(ascii::StoreHeader),
    Binary(binary::StoreHeader),
    Meta(meta::StoreHeader),
}

impl Receiving {
    pub fn new(item: PendingItem, trailer: &'static [u8], finish: Finish) -> Receiving {
        Receiving {
            item,
            filled: 0,
            trailer,
            trailer_seen: 0,
            trailer_got: [0; 2],
            finish,
        }
    }

    /// Take value (then trailer) bytes from `input`; returns how many were used.
    fn take(&mut self, input: &[u8]) -> usize {
        let want = self.item.value_len() - self.filled;
        let n = want.min(input.len());
        self.item.write(self.filled, &input[..n]);
        self.filled += n;
        // Checksummed as it arrives, while the rest is still on its way.
        self.item.fold_checksum(self.filled);
        let mut used = n;
        while used < input.len() && self.trailer_seen < self.trailer.len() {
            if let Some(b) = self.trailer_got.get_mut(self.trailer_seen) {
                *b = input[used];
            }
            self.trailer_seen += 1;
            used += 1;
        }
        used
    }

    /// The trailer bytes that arrived are the expected ones.
    fn trailer_ok(&self) -> bool {
        self.trailer_got.get(..self.trailer_seen) == self.trailer.get(..self.trailer_seen)
    }

    /// Value bytes still to arrive.
    pub fn remaining(&self) -> usize {
        self.item.value_len() - self.filled
    }

    /// The value and what must follow it have all arrived.
    pub fn complete(&self) -> bool {
        self.filled == self.item.value_len() && self.trailer_seen == self.trailer.len()
    }

    /// The next part of the value still to arrive, for the connection to read the socket
    /// into directly (no copy through its read buffer); `None` once the value is whole.
    pub fn unfilled_mut(&mut self) -> Option<&mut [u8]> {
        let mut skip = self.filled;
        for piece in self.item.value_slices_mut() {
            if skip < piece.len() {
                return Some(&mut piece[skip..]);
            }
            skip -= piece.len();
        }
        None
    }

    /// `n` bytes were read into `unfilled_mut`.
    pub fn advance(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.item.value_len());
        self.item.fold_checksum(self.filled);
    }
}

/// Use `len` bytes of input for one binary request: what is here now, the rest
/// swallowed as it arrives.
fn consume(sess: &mut Session, input: &[u8], len: u64) -> Step {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    let now = len.min(input.len());
    sess.swallow = len - now;
    Step::Done(now)
}

/// Outcome of one `process_one` call.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// One request was handled using this many bytes of input (its reply, if any, is in
    /// `out`).
    Done(usize),
    /// The next request is incomplete: at least this many bytes of input are needed in
    /// total (0 if not yet known). Nothing was consumed.
    NeedMore(usize),
    /// Send what is in `out`, then close the connection. Input is ignored.
    Close,
    /// The request is under way but not finished: this many bytes of input were used,
    /// and it continues (from the session's state) once the output has drained (a
    /// multiget that reached the output cap).
    Yield(usize),
    /// The request is under way and needs more input: this many bytes were used (a
    /// multiget line served as it arrives).
    Waiting(usize),
}

/// Result of `process`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of input used; the caller drops them and keeps the rest.
    pub consumed: usize,
    /// Flush `out` and close.
    pub close: bool,
    /// Total input bytes the pending request needs, when known (lets the caller size its
    /// read buffer for a large value).
    pub need: usize,
    /// Stopped with complete input left because of the `-R` budget or the output
    /// high-water mark: the caller should call again later (memcached's conn_yields).
    pub yielded: bool,
}

/// Start loading the store memory the next request in `input` will touch (`command::
/// prefetch`), when one starts there and names a key; the hint is for
/// `command::prefetch_item`.
pub fn prefetch(shared: &Shared, sess: &Session, input: &[u8]) -> Option<PrefetchHint> {
    if sess.swallow > 0 || sess.receiving.is_some() {
        return None;
    }
    command::prefetch(shared, memfabric_proto::key_hint::first_key(input)?)
}

/// Copied reply bytes a connection may queue before it stops running requests (pinned
/// values count only toward `max_pending_output`: their memory is item memory).
pub const MAX_COPIED_OUTPUT: usize = 256 << 10;

/// Has `out` reached the connection's output cap? Checked between requests and between
/// the keys of a multiget, so that a client that does not read its replies cannot make
/// the server buffer without bound (docs/connections.md).
pub fn output_full(shared: &Shared, out: &OutQueue) -> bool {
    // Replies still owed count with the bytes they may take (a flash read's value will
    // be a copy).
    out.len() + out.reserved() >= shared.settings.max_pending_output
        || out.len() + out.reserved() - out.pinned_bytes() >= MAX_COPIED_OUTPUT
}

/// Run every complete request in `input`, appending replies to `out`.
/// Stops early after `max_requests` requests (fairness, `-R`) or when `out` passes the
/// high-water mark; the caller calls again later.
pub fn process(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut OutQueue,
    max_requests: usize,
) -> Progress {
    let mut progress = Progress::default();
    let mut handled = 0;
    loop {
        if sess.receiving.as_ref().is_some_and(Receiving::complete) {
            // Completed by reads straight into the item (`Conn`), or by the input below.
            if let Some(r) = sess.receiving.take() {
                finish_receiving(ctx, r, out);
            }
            handled += 1;
        }
        if let Some(cursor) = sess.dump.as_mut() {
            if output_full(ctx.shared, out) {
                progress.yielded = true;
                break;
            }
            if !ctx.shared.store.metadump(cursor, out.bytes(), DUMP_TURN) {
                // More next turn, once the client has read this much.
                progress.yielded = true;
                break;
            }
            out.bytes().extend_from_slice(b"END\r\n");
            sess.dump = None;
        }
        if progress.consumed >= input.len() {
            break;
        }
        let rest = &input[progress.consumed..];
        if sess.swallow > 0 {
            let n = sess.swallow.min(rest.len());
            sess.swallow -= n;
            progress.consumed += n;
            continue;
        }
        if let Some(r) = sess.receiving.as_mut() {
            // Finished at the top of the loop when this completes it.
            progress.consumed += r.take(rest);
            continue;
        }
        if handled >= max_requests || output_full(ctx.shared, out) || parked_full(sess) {
            progress.yielded = true;
            break;
        }
        let step = if ctx.shared.settings.auth.is_some() && !sess.auth.done {
            // With -Y nothing but the handshake runs until it succeeds.
            auth::process_one(ctx, sess, rest, out)
        } else {
            let proto = match sess.proto {
                Some(p) => p,
                None => {
                    let p = match ctx.shared.settings.protocol {
                        ProtocolChoice::Ascii => Proto::Ascii,
                        ProtocolChoice::Binary => Proto::Binary,
                        ProtocolChoice::Auto if rest[0] == binary::REQUEST_MAGIC => Proto::Binary,
                        ProtocolChoice::Auto => Proto::Ascii,
                    };
                    sess.proto = Some(p);
                    p
                }
            };
            match proto {
                Proto::Ascii => ascii::process_one(ctx, sess, rest, out),
                Proto::Binary => binary::process_one(ctx, sess, rest, out),
            }
        };
        match step {
            Step::Done(n) => {
                progress.consumed += n;
                handled += 1;
            }
            Step::Yield(n) => {
                progress.consumed += n;
                progress.yielded = true;
                break;
            }
            Step::Waiting(n) => {
                progress.consumed += n;
                break;
            }
            Step::NeedMore(n) => {
                progress.need = n;
                break;
            }
            Step::Close => {
                progress.close = true;
                break;
            }
        }
    }
    if sess.receiving.is_some() {
        progress.need = 0;
    }
    progress
}

/// Values at least this long are written from item memory (pinned), not copied.
pub const PIN_VALUES_FROM: usize = 16 << 10;
/// Storage requests whose value has not fully arrived and is at least this long receive
/// it straight into item memory (`Receiving`) instead of the read buffer, on every
/// protocol.
pub const RECEIVE_IN_PLACE_FROM: usize = 16 << 10;

/// The outcome of [`fetch`].
pub enum Fetched {
    Hit(ItemInfo),
    Miss,
    /// The reply's place must be kept (`park`) until the result is ready.
    Pending(Ticket),
}

/// Look `key` up for a reply into `out` (`command::get`, counted): on a hit `header`
/// writes the reply's header, then a small value is copied after it and a large one
/// (`PIN_VALUES_FROM`) is queued pinned, to be written from item memory.
pub fn fetch(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    how: Retrieval,
    bump: bool,
    out: &mut OutQueue,
    header: impl FnMut(&ItemInfo, &mut Vec<u8>),
) -> Fetched {
    fetch_with(ctx, key, how, bump, true, out, header)
}

/// [`fetch`], counted or not (meta's optimistic path counts once it knows the lookup
/// stands).
pub fn fetch_with(
    ctx: &ExecCtx<'_>,
    key: &[u8],
    how: Retrieval,
    bump: bool,
    counted: bool,
    out: &mut OutQueue,
    header: impl FnMut(&ItemInfo, &mut Vec<u8>),
) -> Fetched {
    let delivery = Delivery {
        copy_limit: PIN_VALUES_FROM - 1,
        pin_large: true,
        bump,
    };
    let found = if counted {
        command::get(ctx, key, how, delivery, out.bytes(), header)
    } else {
        command::lookup(ctx, key, how, delivery, out.bytes(), header)
    };
    match found {
        Lookup::Hit(info, Value::Pinned(pin)) => {
            out.push_pinned(pin);
            Fetched::Hit(info)
        }
        Lookup::Hit(info, _) => Fetched::Hit(info),
        Lookup::Miss => Fetched::Miss,
        Lookup::Pending(ticket) => Fetched::Pending(ticket),
    }
}

/// Keep the place of a reply that is not ready, and what completes it.
pub fn park(sess: &mut Session, ticket: Ticket, resume: Resume, out: &mut OutQueue) {
    out.push_hole(ticket.0, ticket.1);
    sess.parked.push((ticket, resume));
}

/// The connection has as many pending commands as it may.
pub fn parked_full(sess: &Session) -> bool {
    sess.parked.len() >= MAX_PARKED
}

/// Pending command `ticket` can complete: run what completes it and put its reply in its
/// place. Returns false when the session has no such command (it was a previous
/// connection's on a reused token).
pub fn resume(ctx: &ExecCtx<'_>, sess: &mut Session, ticket: u64, out: &mut OutQueue) -> bool {
    let Some(at) = sess.parked.iter().position(|(t, _)| t.0 == ticket) else {
        return false;
    };
    let (_, what) = sess.parked.remove(at);
    // The result is ready now: the command completes without waiting again.
    let now = ExecCtx {
        shared: ctx.shared,
        stats: ctx.stats,
        transport: ctx.transport,
        conn_id: ctx.conn_id,
        waiter: None,
        completion: ctx.completion,
    };
    let mut reply = OutQueue::new();
    let mut scratch = Session::default();
    match what {
        Resume::AsciiValue { key, cas, touch } => {
            ascii::get_one(&now, &mut scratch, &key, cas, touch, &mut reply)
        }
        Resume::Binary(held) => binary::resume_get(&now, &held, &mut reply),
        Resume::Meta { line } => {
            let mut now = now;
            let _ = meta::process_one(&mut now, &mut scratch, &line, &mut reply);
        }
    }
    out.fill(ticket, reply)
}

/// A received value is complete: store it and answer as its protocol does.
fn finish_receiving(ctx: &mut ExecCtx<'_>, r: Receiving, out: &mut OutQueue) {
    let trailer_ok = r.trailer_ok();
    let trailer = r.trailer_got;
    let trailer = &trailer[..r.trailer_seen];
    match r.finish {
        Finish::Ascii(h) => ascii::finish_store(ctx, h, r.item, trailer_ok, out.bytes()),
        Finish::Binary(h) => binary::finish_store(ctx, h, r.item, out.bytes()),
        Finish::Meta(h) => meta::finish_store(ctx, h, r.item, trailer, out.bytes()),
    }
}
