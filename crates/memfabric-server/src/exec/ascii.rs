//! Classic ascii commands and ascii line framing (meta commands are handed to `meta`).
//!
//! `process_one` frames one request with `memfabric_proto::ascii::parse`, runs it against
//! the store and appends memcached 1.6.18's reply. Where memcached's answer depends on a
//! feature we do not have (watch, metadump, extstore, TLS), we answer as memcached does
//! with that feature disabled; `lru mode`/`lru temp_ttl` are accepted and have no effect
//! (the store evicts from one queue per class: it has no LRU segments).

use memfabric_proto::ascii::{
    self, reply, write_number_line, write_stat, write_value_header, write_version, DetailCmd,
    ErrorReply, Keys, Limits, LruCrawlerRequest, Parse, Request, StatsRequest, StoreCmd,
    StoreRequest, Verb, KEY_MAX_LEN, MAX_VERBOSITY_LEVEL,
};
use memfabric_store::{
    ArithStatus, DeleteStatus, PendingItem, ReassignStatus, SetMode, StoreStatus,
};

use super::{ExecCtx, Fetched, Finish, Receiving, Resume, Session, Step, RECEIVE_IN_PLACE_FROM};
use crate::command::{self, Arith, Delivery, Retrieval, StoreAccounting, StoreArgs};
use crate::counters::ClassStat;
use crate::outqueue::OutQueue;

/// Per-connection ascii state.
#[derive(Default)]
pub struct AsciiState {
    /// How many bytes at the start of the pending input are known to hold no newline
    /// (from the last `NeedMore`), so a long multiget line arriving in pieces is scanned
    /// once rather than once per read.
    scanned: usize,
    /// A retrieval under way: its keys are served from the pending input as they come
    /// (and as the output drains).
    get: Option<GetStream>,
}

impl AsciiState {
    /// A retrieval is being served.
    pub fn in_request(&self) -> bool {
        self.get.is_some()
    }
}

/// A `get`/`gets`/`gat`/`gats` whose keys are being served. The input at hand starts at
/// the next key (the verb and the keys already served were consumed).
#[derive(Clone, Copy, Debug)]
struct GetStream {
    cas: bool,
    /// `gat`/`gats`: the new exptime.
    touch: Option<u32>,
    /// Where the line ends, once its newline has arrived: the bytes of key text left, and
    /// the bytes after it (a `\r`, text after a NUL, the `\n`) to drop with `END`.
    end: Option<(usize, usize)>,
    /// The line (still arriving) had a NUL or a bad key: drop the rest of it.
    discard: bool,
    /// A bad key was answered with the error: the line ends without `END`.
    failed: bool,
}

/// A multiget line still arriving is served key by key once this much of it is
/// buffered (memcached buffers any length; we keep no more than this of one line).
pub const GET_STREAM_FROM: usize = 64 << 10;

/// The parts of a storage command line kept while its value arrives.
pub struct StoreHeader {
    cmd: StoreCmd,
    key: Vec<u8>,
    cas: u64,
    noreply: bool,
}

/// Largest slab class id memcached accepts in `lru_crawler crawl` (POWER_LARGEST).
const MAX_SLAB_CLASS: u32 = 63;

/// The framing limits of this server.
pub fn limits(ctx: &ExecCtx<'_>) -> Limits {
    let s = &ctx.shared.settings;
    Limits {
        max_line: s.max_line,
        // Longer multiget lines are served as they arrive (`GET_STREAM_FROM`), so the
        // parser never sees one this long.
        max_multiget_line: ascii::DEFAULT_MAX_MULTIGET_LINE,
        item_size_max: s.store.item_size_max,
    }
}

/// Frame and run one request at the start of `input`. See `exec::Step`.
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut OutQueue,
) -> Step {
    if let Some(g) = sess.ascii.get {
        return serve_keys(ctx, sess, g, input, 0, out);
    }
    if ctx.shared.holds.is_some() {
        if let Some(step) = debug_release(ctx, input, out) {
            return step;
        }
    }
    let limits = limits(ctx);
    match ascii::parse(input, &limits, sess.ascii.scanned) {
        Parse::Incomplete { need, scanned } => {
            sess.ascii.scanned = scanned;
            if need == 0 && input.len() >= GET_STREAM_FROM {
                // Only a multiget line may grow this long (the parser closes others).
                if let Some((cas, verb_len)) = ascii::multiget_prefix(input) {
                    sess.ascii.scanned = 0;
                    let g = GetStream {
                        cas,
                        touch: None,
                        end: None,
                        discard: false,
                        failed: false,
                    };
                    return serve_keys(ctx, sess, g, input, verb_len, out);
                }
            }
            if need >= RECEIVE_IN_PLACE_FROM {
                if let Some(p) = ascii::pending_store(input, &limits) {
                    if p.value_len >= RECEIVE_IN_PLACE_FROM {
                        sess.ascii.scanned = 0;
                        return receive_value(ctx, sess, p, out.bytes());
                    }
                }
            }
            Step::NeedMore(need)
        }
        Parse::Close(_) => {
            sess.ascii.scanned = 0;
            ctx.stats.protocol_errors.incr();
            Step::Close
        }
        Parse::Complete { req, len } => {
            sess.ascii.scanned = 0;
            match req {
                Request::Get { keys, cas } => {
                    start_get(ctx, sess, keys, cas, None, len, input, out)
                }
                Request::Gat { exptime, keys, cas } => {
                    let touch = Some(ctx.shared.store.clock().exptime(exptime.into()));
                    start_get(ctx, sess, keys, cas, touch, len, input, out)
                }
                // The meta executor frames its own request (and data block) from the
                // same input.
                Request::Meta => super::meta::process_one(ctx, sess, input, out),
                req => execute(ctx, sess, req, len, input, out.bytes()),
            }
        }
    }
}

/// `debug release` (only with the test store, `--debug-hold-keys`): complete every held
/// retrieval, answering `RELEASED <n>`; `debug held`: how many are held (`HELD <n>`).
fn debug_release(ctx: &ExecCtx<'_>, input: &[u8], out: &mut OutQueue) -> Option<Step> {
    let holds = ctx.shared.holds.as_ref()?;
    let line_end = |rest: &[u8]| match rest {
        [b'\r', b'\n', ..] => Some(2),
        [b'\n', ..] => Some(1),
        _ => None,
    };
    if let Some(rest) = input.strip_prefix(b"debug release".as_slice()) {
        let len = 13 + line_end(rest)?;
        let n = holds.release_all();
        out.bytes()
            .extend_from_slice(format!("RELEASED {n}\r\n").as_bytes());
        return Some(Step::Done(len));
    }
    let rest = input.strip_prefix(b"debug held".as_slice())?;
    let len = 10 + line_end(rest)?;
    out.bytes()
        .extend_from_slice(format!("HELD {}\r\n", holds.held()).as_bytes());
    Some(Step::Done(len))
}

/// Append `line` unless the request said `noreply`.
fn answer(noreply: bool, line: &[u8], out: &mut Vec<u8>) {
    if !noreply {
        out.extend_from_slice(line);
    }
}

fn execute(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    req: Request<'_>,
    len: usize,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let shared = ctx.shared;
    let store = &shared.store;
    match req {
        // Served by `process_one`.
        Request::Meta | Request::Get { .. } | Request::Gat { .. } => {}
        Request::Store(s) => store_value(ctx, &s, out),
        Request::StoreTooLarge {
            cmd,
            key,
            noreply,
            data_len,
        } => {
            command::refuse_too_large(ctx, &store_args(ctx, cmd, key, 0, 0, 0));
            answer(noreply, reply::TOO_LARGE, out);
            // Discard the data block without buffering it: what is here now, and the rest
            // as it arrives.
            let here = input.len().saturating_sub(len).min(data_len);
            sess.swallow = data_len - here;
            return Step::Done(len + here);
        }
        Request::Delete { key, noreply } => {
            let line = match command::delete(ctx, key, 0) {
                DeleteStatus::Deleted => reply::DELETED,
                // Exists needs a CAS, which the classic delete never gives.
                DeleteStatus::NotFound | DeleteStatus::Exists => reply::NOT_FOUND,
            };
            answer(noreply, line, out);
        }
        Request::Arith {
            incr,
            key,
            delta,
            noreply,
        } => arith(ctx, incr, key, delta, noreply, out),
        Request::Touch {
            key,
            exptime,
            noreply,
        } => {
            let exptime = store.clock().exptime(exptime.into());
            let line = match command::touch(ctx, key, exptime) {
                Some(_) => reply::TOUCHED,
                None => reply::NOT_FOUND,
            };
            answer(noreply, line, out);
        }
        Request::FlushAll { delay, noreply } => {
            // memcached treats a delay of 0 or less as "now".
            let delay = u32::try_from(delay).unwrap_or(0);
            let line = match command::flush_all(ctx, delay, true) {
                Ok(()) => reply::OK,
                Err(command::FlushDisabled) => reply::FLUSH_DISABLED,
            };
            answer(noreply, line, out);
        }
        Request::Stats(s) => stats(ctx, s, out),
        Request::Version => write_version(out, command::version()),
        Request::Verbosity { level, noreply } => {
            command::verbosity(ctx, level.min(MAX_VERBOSITY_LEVEL));
            answer(noreply, reply::OK, out);
        }
        // Replies queued before it are still sent (memcached's close_after_write).
        Request::Quit => return Step::Close,
        Request::Shutdown { graceful } => {
            if !shared.settings.enable_shutdown {
                out.extend_from_slice(reply::SHUTDOWN_DISABLED);
            } else if graceful.is_some() {
                // Graceful or not, our workers flush and close their connections.
                shared.request_shutdown();
                return Step::Close;
            } else {
                out.extend_from_slice(reply::SHUTDOWN_BAD_MODE);
            }
        }
        Request::Extstore { setting, value } => {
            let ok = command::extstore(ctx.shared, setting, value);
            out.extend_from_slice(if ok { reply::OK } else { reply::ERROR });
        }
        Request::CacheMemlimit { megabytes, noreply } => {
            let line = if megabytes < 8 {
                reply::MEMLIMIT_TOO_SMALL
            } else if megabytes > 1_000_000_000 {
                reply::MEMLIMIT_NOT_MEGABYTES
            } else if store.set_memory_limit(megabytes as usize * (1 << 20)) {
                reply::OK
            } else {
                // The arena reserves room for twice the starting limit; beyond that it
                // cannot grow (it is registered for RDMA as one region).
                reply::MEMLIMIT_ADJUST_FAILED
            };
            answer(noreply, line, out);
        }
        Request::SlabsReassign { .. } if !ctx.shared.settings.slab_reassign => {
            // -o no_slab_reassign, checked before the arguments as memcached does.
            out.extend_from_slice(b"CLIENT_ERROR slab reassignment disabled\r\n");
        }
        Request::SlabsReassign { classes } => {
            let line: &[u8] = match classes {
                None => b"CLIENT_ERROR bad command line format\r\n",
                Some((src, dst)) => match store.slabs_reassign(src, dst) {
                    ReassignStatus::Ok => reply::OK,
                    ReassignStatus::Busy => b"BUSY currently processing reassign request\r\n",
                    ReassignStatus::BadClass => b"BADCLASS invalid src or dst class id\r\n",
                    ReassignStatus::NoSpare => b"NOSPARE source class has no spare pages\r\n",
                    ReassignStatus::Same => b"SAME src and dst class are identical\r\n",
                },
            };
            out.extend_from_slice(line);
        }
        // The level turns the store's page mover on or off (its rule is its own at 1 and
        // 2, docs/store.md); a ratio is accepted as memcached does and changes nothing.
        Request::SlabsAutomove { setting, noreply } => {
            if let memfabric_proto::ascii::Automove::Level(level) = setting {
                ctx.shared
                    .slab_automove
                    .store(level, std::sync::atomic::Ordering::Relaxed);
                store.set_automove(level > 0 && ctx.shared.settings.slab_reassign);
            }
            answer(noreply, reply::OK, out)
        }
        Request::LruCrawler(LruCrawlerRequest::Metadump(classes)) => {
            return metadump(ctx, sess, classes, len, out);
        }
        Request::LruCrawler(c) => lru_crawler(ctx, c, out),
        Request::LruTune { noreply, .. } => answer(noreply, reply::OK, out),
        // The store's per-class eviction queue has no segments to switch: accepted as memcached
        // (with its LRU maintainer, the 1.6 default) accepts them, with no effect.
        Request::LruMode { noreply, .. } | Request::LruTempTtl { noreply, .. } => {
            answer(noreply, reply::OK, out)
        }
        Request::Watch { noreply } => answer(noreply, reply::WATCH_DISABLED, out),
        Request::RefreshCerts { noreply } => match command::refresh_certs(ctx.shared) {
            // memcached: "OK" is the one reply noreply silences.
            Ok(()) if noreply => {}
            Ok(()) => out.extend_from_slice(b"OK\r\n"),
            Err(message) => {
                out.extend_from_slice(message.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        },
        Request::Invalid {
            verb,
            error,
            noreply,
        } => {
            ctx.stats.protocol_errors.incr();
            match verb {
                // memcached counts a set whose data block was bad (it read it).
                // (The request's size is gone by now: counted in the total only.)
                Verb::Store(_) if error == ErrorReply::BadDataChunk => {
                    ctx.stats.count(ClassStat::SetCmds, None)
                }
                // flush_all is counted, and refused when disabled, before its argument
                // is parsed.
                Verb::FlushAll => {
                    ctx.stats.cmd_flush.incr();
                    if !shared.settings.flush_enabled {
                        answer(noreply, reply::FLUSH_DISABLED, out);
                        return Step::Done(len);
                    }
                }
                _ => {}
            }
            answer(noreply, error.as_bytes(), out);
        }
    }
    Step::Done(len)
}

/// get, gets, gat, gats whose whole line is here: one `VALUE` block per hit, then `END`,
/// produced key by key while the output has room (`serve_keys`).
///
/// A key longer than 250 bytes fails the whole command with nothing but the error (keys
/// before it are looked up and counted, as in memcached). Deliberate difference:
/// memcached 1.6.18 then also discards the replies of earlier pipelined requests that it
/// has not written yet (so how many replies a client gets depends on timing). We keep
/// them: a client waiting for those replies would hang.
#[allow(clippy::too_many_arguments)]
fn start_get(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    keys: Keys<'_>,
    cas: bool,
    touch: Option<u32>,
    line_len: usize,
    input: &[u8],
    out: &mut OutQueue,
) -> Step {
    // Where the key text stands in the line (the line ends at `line_len`).
    let text_start = (keys.raw().as_ptr() as usize).saturating_sub(input.as_ptr() as usize);
    let text_end = text_start + keys.raw().len();
    if keys.iter().any(|k| k.len() > KEY_MAX_LEN) {
        // Looked up only to be counted: nothing may wait.
        let counting = ExecCtx {
            shared: ctx.shared,
            stats: ctx.stats,
            transport: ctx.transport,
            conn_id: ctx.conn_id,
            waiter: None,
            completion: None,
        };
        let delivery = Delivery {
            copy_limit: 0,
            pin_large: false,
            bump: true,
        };
        let mut scratch = Vec::new();
        for key in keys.iter().take_while(|k| k.len() <= KEY_MAX_LEN) {
            scratch.clear();
            let _ = command::get(
                &counting,
                key,
                retrieval(touch),
                delivery,
                &mut scratch,
                |_, _| {},
            );
        }
        ctx.stats.protocol_errors.incr();
        out.bytes()
            .extend_from_slice(ErrorReply::BadFormat.as_bytes());
        return Step::Done(line_len);
    }
    let g = GetStream {
        cas,
        touch,
        end: Some((text_end - text_start, line_len - text_end)),
        discard: false,
        failed: false,
    };
    serve_keys(ctx, sess, g, input, text_start, out)
}

/// Serve the keys of retrieval `g` from `input[pos..]` until the line ends (then `END`),
/// the input runs out (a line still arriving), or the output is full. Keeps `g` in the
/// session while the command is unfinished. Each call scans its input once.
fn serve_keys(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    mut g: GetStream,
    input: &[u8],
    mut pos: usize,
    out: &mut OutQueue,
) -> Step {
    if g.end.is_none() {
        if let Some(nl) = input[pos..].iter().position(|&b| b == b'\n') {
            let line = &input[pos..pos + nl];
            // memcached's command text: one trailing `\r` dropped, cut at a NUL.
            let mut text = line.strip_suffix(b"\r").unwrap_or(line).len();
            if g.discard {
                text = 0;
            } else if let Some(z) = line[..text].iter().position(|&b| b == 0) {
                text = z;
            }
            g.end = Some((text, nl + 1 - text));
        }
    }
    // Where the key text that can be served now ends; whether the line ends there; and
    // whether a NUL (after which nothing is part of the command) ends it.
    let (text_end, nul_cut) = match g.end {
        Some((text, _)) => (pos + text, false),
        None if g.discard => (pos, false),
        None => {
            let rest = &input[pos..];
            match rest.iter().position(|&b| b == 0) {
                Some(z) => (pos + z, true),
                // Only keys followed by a space are known to be whole.
                None => (
                    pos + rest.iter().rposition(|&b| b == b' ').unwrap_or(0),
                    false,
                ),
            }
        }
    };
    let tail = g.end.map(|(_, tail)| tail);
    while let Some(start) = input[pos..text_end].iter().position(|&b| b != b' ') {
        let key_start = pos + start;
        pos = input[key_start..text_end]
            .iter()
            .position(|&b| b == b' ')
            .map_or(text_end, |i| key_start + i);
        let key = &input[key_start..pos];
        if key.len() > KEY_MAX_LEN {
            // Only a line served as it arrived gets here (`start_get` checks whole
            // lines first): what was served is gone, so the error follows it.
            return bad_streamed_key(ctx, sess, g, text_end, tail, out);
        }
        get_one(ctx, sess, key, g.cas, g.touch, out);
        if super::output_full(ctx.shared, out) || super::parked_full(sess) {
            if let Some(t) = tail {
                g.end = Some((text_end - pos, t));
            }
            sess.ascii.get = Some(g);
            return Step::Yield(pos);
        }
    }
    if let Some(t) = tail {
        sess.ascii.get = None;
        if !g.failed {
            out.bytes().extend_from_slice(reply::END);
        }
        return Step::Done(text_end + t);
    }
    g.discard |= nul_cut;
    pos = if g.discard { input.len() } else { text_end };
    // A key longer than any key can be, still without its end: the line is bad. (What
    // waits is the spaces before it, the key, and maybe the `\r` of the line's end.)
    if !g.discard {
        let partial = &input[pos..];
        let start = partial
            .iter()
            .position(|&b| b != b' ')
            .unwrap_or(partial.len());
        let partial = &partial[start..];
        if partial.strip_suffix(b"\r").unwrap_or(partial).len() > KEY_MAX_LEN {
            return bad_streamed_key(ctx, sess, g, input.len(), None, out);
        }
    }
    sess.ascii.get = Some(g);
    Step::Waiting(pos)
}

/// A too-long key in a multiget served as it arrived: the error, and the rest of the
/// line (up to `text_end`, then its `tail` if the line's end is known) is dropped.
fn bad_streamed_key(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    mut g: GetStream,
    text_end: usize,
    tail: Option<usize>,
    out: &mut OutQueue,
) -> Step {
    ctx.stats.protocol_errors.incr();
    out.bytes()
        .extend_from_slice(ErrorReply::BadFormat.as_bytes());
    match tail {
        Some(t) => {
            sess.ascii.get = None;
            Step::Done(text_end + t)
        }
        None => {
            g.discard = true;
            g.failed = true;
            sess.ascii.get = Some(g);
            Step::Waiting(text_end)
        }
    }
}

fn retrieval(touch: Option<u32>) -> Retrieval {
    touch.map_or(Retrieval::Get, Retrieval::Touch)
}

/// Look one key up and queue its `VALUE` block: small values are copied, large ones
/// queued pinned and written from item memory. A key whose value is not ready keeps its
/// place in the reply (`Resume::AsciiValue`).
pub fn get_one(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    key: &[u8],
    cas: bool,
    touch: Option<u32>,
    out: &mut OutQueue,
) {
    let fetched = super::fetch(ctx, key, retrieval(touch), true, out, |info, out| {
        let len = info.value_len as usize;
        write_value_header(out, key, info.flags, len, cas.then_some(info.cas));
    });
    match fetched {
        Fetched::Hit(_) => out.bytes().extend_from_slice(b"\r\n"),
        Fetched::Miss => {}
        Fetched::Pending(ticket) => super::park(
            sess,
            ticket,
            Resume::AsciiValue {
                key: key.to_vec(),
                cas,
                touch,
            },
            out,
        ),
    }
}

fn set_mode(cmd: StoreCmd) -> SetMode {
    match cmd {
        StoreCmd::Set => SetMode::Set,
        StoreCmd::Add => SetMode::Add,
        StoreCmd::Replace => SetMode::Replace,
        StoreCmd::Append => SetMode::Append,
        StoreCmd::Prepend => SetMode::Prepend,
        StoreCmd::Cas => SetMode::Cas,
    }
}

/// A storage command's arguments; `exptime` as the client sent it.
fn store_args<'k>(
    ctx: &ExecCtx<'_>,
    cmd: StoreCmd,
    key: &'k [u8],
    flags: u32,
    exptime: i32,
    cas: u64,
) -> StoreArgs<'k> {
    StoreArgs {
        mode: set_mode(cmd),
        key,
        flags,
        exptime: ctx.shared.store.clock().exptime(exptime.into()),
        cas,
        counts_as_cas: cmd == StoreCmd::Cas,
        accounting: StoreAccounting::Text,
        keep_newer_write: false,
    }
}

fn store_value(ctx: &ExecCtx<'_>, s: &StoreRequest<'_>, out: &mut Vec<u8>) {
    let args = store_args(ctx, s.cmd, s.key, s.flags, s.exptime, s.cas);
    let status = command::store(ctx, &args, s.value);
    answer_store(s.noreply, status, out);
}

/// A storage command whose large value has not arrived yet: allocate its item now
/// (memcached does too, so the memory counts in `-m`) and receive the value into it.
fn receive_value(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    p: ascii::PendingStore<'_>,
    out: &mut Vec<u8>,
) -> Step {
    let r = p.req;
    let args = store_args(ctx, r.cmd, r.key, r.flags, r.exptime, r.cas);
    match command::alloc_pending(ctx, &args, p.value_len) {
        Ok(item) => {
            let header = StoreHeader {
                cmd: r.cmd,
                key: r.key.to_vec(),
                cas: r.cas,
                noreply: r.noreply,
            };
            sess.receiving = Some(Receiving::new(item, b"\r\n", Finish::Ascii(header)));
        }
        Err(refused) => {
            // Answered now; the data block is discarded as it arrives.
            answer_store(r.noreply, refused, out);
            sess.swallow = p.value_len + 2;
        }
    }
    Step::Done(p.line_len)
}

/// The value of a `receive_value` command is here (and `trailer_ok` says whether the
/// two bytes after it were `\r\n`): store it and answer.
pub fn finish_store(
    ctx: &ExecCtx<'_>,
    h: StoreHeader,
    item: PendingItem,
    trailer_ok: bool,
    out: &mut Vec<u8>,
) {
    if !trailer_ok {
        // As for a buffered data block: counted as a set, the item is not stored.
        let class = ctx.shared.store.item_class(h.key.len(), item.value_len());
        command::bad_data(ctx, class);
        answer(h.noreply, ErrorReply::BadDataChunk.as_bytes(), out);
        return;
    }
    // The exptime and flags are in the item already.
    let args = store_args(ctx, h.cmd, &h.key, 0, 0, h.cas);
    let status = command::store_pending(ctx, &args, item);
    answer_store(h.noreply, status, out);
}

/// Answer a storage command's outcome (counted by the command).
fn answer_store(noreply: bool, status: StoreStatus, out: &mut Vec<u8>) {
    let line = match status {
        StoreStatus::Stored { .. } => reply::STORED,
        StoreStatus::NotStored => reply::NOT_STORED,
        StoreStatus::Exists => reply::EXISTS,
        StoreStatus::NotFound => reply::NOT_FOUND,
        StoreStatus::TooLarge => reply::TOO_LARGE,
        StoreStatus::OutOfMemory => reply::OUT_OF_MEMORY_STORING,
    };
    answer(noreply, line, out);
}

fn arith(ctx: &ExecCtx<'_>, incr: bool, key: &[u8], delta: u64, noreply: bool, out: &mut Vec<u8>) {
    let a = Arith {
        incr,
        delta,
        cas: 0,
        create: None,
    };
    match command::arith(ctx, key, a).status {
        ArithStatus::Value { value, .. } => {
            if !noreply {
                write_number_line(out, value);
            }
        }
        ArithStatus::NotFound => answer(noreply, reply::NOT_FOUND, out),
        ArithStatus::NonNumeric => answer(noreply, reply::NON_NUMERIC, out),
        ArithStatus::OutOfMemory => answer(noreply, reply::OUT_OF_MEMORY, out),
        // Only possible with a CAS, which the classic commands never give.
        ArithStatus::Exists => answer(noreply, reply::EXISTS, out),
    }
}

fn stats(ctx: &ExecCtx<'_>, s: StatsRequest<'_>, out: &mut Vec<u8>) {
    let group = match s {
        StatsRequest::General => "",
        StatsRequest::Reset => {
            crate::command::stats::reset(ctx);
            out.extend_from_slice(reply::RESET);
            return;
        }
        // Per-prefix stats are not kept: "on"/"off" are accepted and "dump" lists none.
        StatsRequest::Detail(DetailCmd::On | DetailCmd::Off) => {
            out.extend_from_slice(reply::OK);
            return;
        }
        StatsRequest::Detail(DetailCmd::Dump) => {
            out.extend_from_slice(reply::END);
            return;
        }
        StatsRequest::Cachedump(args) => {
            cachedump(ctx, args, out);
            return;
        }
        StatsRequest::Group(g) => match std::str::from_utf8(g) {
            Ok(g) => g,
            Err(_) => {
                out.extend_from_slice(reply::ERROR);
                return;
            }
        },
    };
    match crate::command::stats::collect(ctx, group) {
        Some(pairs) => {
            for (k, v) in &pairs {
                write_stat(out, k, v);
            }
            out.extend_from_slice(reply::END);
        }
        None => out.extend_from_slice(reply::ERROR),
    }
}

/// `lru_crawler metadump <all|hash|classes>`: starts the dump (`Session::dump`), which
/// `exec::process` streams a chunk at a time as the client reads, ending with `END`.
/// Commands after it are answered after it, in order.
fn metadump(
    ctx: &ExecCtx<'_>,
    sess: &mut Session,
    classes: &[u8],
    len: usize,
    out: &mut Vec<u8>,
) -> Step {
    let shared = ctx.shared;
    let refuse = if !shared.store.sweeping() {
        Some(reply::CRAWLER_DISABLED)
    } else if !shared.settings.dump_enabled || ctx.transport == crate::shared::Transport::Udp {
        // Over UDP memcached's crawler writes to an unconnected socket: nothing arrives.
        Some(reply::METADUMP_DISABLED)
    } else {
        None
    };
    if let Some(line) = refuse {
        out.extend_from_slice(line);
        return Step::Done(len);
    }
    let classes = match classes {
        // memcached walks the hash table for `hash`; the item set is the same.
        b"all" | b"hash" => Vec::new(),
        list => {
            let mut ids = Vec::new();
            for id in list.split(|&b| b == b',').filter(|s| !s.is_empty()) {
                match ascii::parse_u32(id) {
                    Some(n @ 1..=MAX_SLAB_CLASS) => ids.push(n as u8),
                    _ => {
                        out.extend_from_slice(reply::CRAWLER_BADCLASS);
                        return Step::Done(len);
                    }
                }
            }
            if ids.is_empty() {
                out.extend_from_slice(b"NOTSTARTED no items to crawl\r\n");
                return Step::Done(len);
            }
            ids
        }
    };
    sess.dump = Some(memfabric_store::DumpCursor::new(classes));
    // The dump runs from `exec::process` before anything after it.
    Step::Yield(len)
}

fn lru_crawler(ctx: &ExecCtx<'_>, c: LruCrawlerRequest<'_>, out: &mut Vec<u8>) {
    // Our background sweeper plays the part of memcached's LRU crawler.
    let store = &ctx.shared.store;
    let running = store.sweeping();
    let line = match c {
        LruCrawlerRequest::Crawl(_) if !running => reply::CRAWLER_DISABLED,
        // The sweeper already reclaims expired items of every class continuously.
        LruCrawlerRequest::Crawl(classes) => crawl_reply(classes),
        LruCrawlerRequest::Metadump(_) => unreachable!("handled by metadump"),
        // Accepted as memcached does; the sweeper paces itself.
        LruCrawlerRequest::Tocrawl(_) | LruCrawlerRequest::Sleep(_) => reply::OK,
        // As memcached's crawler thread: started only if stopped (memcached answers this
        // error when it already runs), stopped whatever its state. Stopped, expired
        // items are reclaimed only when a lookup or an eviction meets them.
        LruCrawlerRequest::Enable if !store.set_sweeping(true) => reply::CRAWLER_START_FAILED,
        LruCrawlerRequest::Enable => reply::OK,
        LruCrawlerRequest::Disable => {
            store.set_sweeping(false);
            reply::OK
        }
    };
    out.extend_from_slice(line);
}

/// memcached's class list check: "all", or comma-separated class ids 1..=63.
fn crawl_reply(classes: &[u8]) -> &'static [u8] {
    if classes == b"all" {
        return reply::OK;
    }
    let mut any = false;
    for id in classes.split(|&b| b == b',').filter(|s| !s.is_empty()) {
        match ascii::parse_u32(id) {
            Some(1..=MAX_SLAB_CLASS) => any = true,
            _ => return reply::CRAWLER_BADCLASS,
        }
    }
    if any {
        reply::OK
    } else {
        b"NOTSTARTED no items to crawl\r\n"
    }
}

/// `stats cachedump <class> <limit>`, with memcached's validation and line format.
fn cachedump(ctx: &ExecCtx<'_>, args: Option<(&[u8], &[u8])>, out: &mut Vec<u8>) {
    if !ctx.shared.settings.dump_enabled {
        // -X, checked first as memcached does.
        out.extend_from_slice(b"CLIENT_ERROR stats cachedump not allowed\r\n");
        return;
    }
    let Some((class, limit)) = args else {
        out.extend_from_slice(b"CLIENT_ERROR bad command line\r\n");
        return;
    };
    let (Some(class), Some(limit)) = (
        memfabric_proto::ascii::parse_u32(class),
        memfabric_proto::ascii::parse_u32(limit),
    ) else {
        out.extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
        return;
    };
    // memcached's MAX_NUMBER_OF_SLAB_CLASSES.
    if class >= 64 {
        out.extend_from_slice(b"CLIENT_ERROR Illegal slab id\r\n");
        return;
    }
    for (key, len, exptime) in ctx.shared.store.cachedump(class as u8, limit as usize) {
        out.extend_from_slice(b"ITEM ");
        out.extend_from_slice(&key);
        out.extend_from_slice(format!(" [{len} b; {exptime} s]\r\n").as_bytes());
    }
    out.extend_from_slice(reply::END);
}
