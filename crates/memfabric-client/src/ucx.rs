//! The UCX active-message transport (`ucx://host:port`), speaking memfabricd's fabric
//! protocol (docs/fabric-protocol.md).
//!
//! One UCX worker per transport (so per `Client`, per thread) carries the requests to
//! every server of the pool. Connecting: a TCP connection to the server's `--ucx-port`
//! carries HELLO (our worker address) and WELCOME (the server worker's address, our
//! session id, the eager limit); then requests go as active messages, each with an opaque
//! id, so any number can be in flight. The TCP connection stays open as a lifeline: when
//! it closes, the server is gone and everything in flight to it fails at once.
//!
//! Values up to the server's eager limit travel inside the message; larger ones by
//! rendezvous (the server pulls a SET's value straight into item memory; we pull a GET's
//! value from the server's item memory into our buffer).
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memfabric_proto::ucx_wire::{self as fp, Opcode, Status};
use memfabric_ucx as mf;
use mio::{Events, Interest, Poll, Token};

use crate::addr::ServerAddr;
use crate::error::Error;
use crate::onesided::{Fallback, GetRead, Remote, Step};
use crate::op::{Op, Reply, StoreMode, StoreStatus, Value};
use crate::transport::{Completion, ConnId, GetMode, Transport};
use memfabric_proto::onesided as os;

/// Response values of at least this many bytes stay in UCX's receive buffer (no copy).
const HOLD_MIN: usize = 2048;

/// Token of request sends: their completion only releases the buffers.
const SEND_TOKEN: mf::Token = 0;
/// Tokens of one-sided reads: this bit, the GET's opaque shifted by 2, the read's part.
const RMA_TOKEN: mf::Token = 1 << 63;
/// Access hints are sent once this many one-sided hits are pending (or when idle).
const HINT_BATCH: usize = 256;
/// A lifeline seen open this recently is not asked again before a one-sided GET.
const LIFELINE_FRESH: Duration = Duration::from_micros(20);
/// Pending access hints are also sent at least this often while GETs keep the transport
/// busy.
const HINT_MAX_AGE: Duration = Duration::from_millis(50);
/// Slots of the table of items already hinted in the current batch (direct-mapped): an
/// item read again before the batch goes out is not hinted twice. The server needs one
/// hint per item per batch to keep it from the eviction tail (memcached itself bumps an
/// item at most once a minute); more only cost it CPU.
const HINTED_SLOTS: usize = 1024;
/// An empty slot of that table (an odd seq is never an item's).
const NOT_HINTED: (u64, u32) = (u64::MAX, 1);
const EFD: Token = Token(usize::MAX - 1);
/// How long a wait spins on the UCX worker before sleeping on its event fd: a shared
/// memory round trip takes microseconds, a wake-up tens of them.
const SPIN: Duration = Duration::from_millis(2);

/// The process's UCX context, created on first use.
fn context() -> Result<Arc<mf::Context>, Error> {
    static CTX: Mutex<Option<Arc<mf::Context>>> = Mutex::new(None);
    let mut g = CTX.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = g.as_ref() {
        return Ok(Arc::clone(c));
    }
    let c = mf::Context::new("memfabric-client")
        .map_err(|e| Error::Protocol(format!("UCX unavailable: {e}")))?;
    *g = Some(Arc::clone(&c));
    Ok(c)
}

/// A request value handed to UCX without a copy.
struct BytesBuf(Bytes);

impl mf::SendBuf for BytesBuf {
    fn slices(&self) -> Vec<&[u8]> {
        vec![&self.0[..]]
    }
}

struct Conn {
    server: String,
    ep: Option<mf::Endpoint>,
    lifeline: TcpStream,
    session: u32,
    eager_max: usize,
    /// Set when GETs to this server are read one-sidedly.
    rma: Option<Rma>,
    /// Active-message requests in flight on this connection.
    am_inflight: usize,
}

/// A server's memory as this endpoint reads it.
struct Rma {
    remote: Remote,
    arena: mf::RemoteKey,
    index: mf::RemoteKey,
    /// Access hints not yet sent: (item offset, seq) of one-sided hits.
    hints: Vec<(u64, u32)>,
    /// Items in `hints` (most of them: a direct-mapped table, see `HINTED_SLOTS`).
    hinted: Box<[(u64, u32)]>,
    /// The server's memory is mapped into this process: reads are plain copies.
    mapped: bool,
    /// Last time the lifeline was seen open (one-sided GETs check it first).
    alive_at: Instant,
}

/// A GET being read one-sidedly.
struct OneSidedGet {
    conn: ConnId,
    id: u64,
    want_cas: bool,
    read: GetRead,
}

/// How GETs were served, for `Transport::counters`.
#[derive(Default)]
struct GetCounters {
    onesided_hits: u64,
    twosided: u64,
    retries: u64,
    /// GETs sent two-sided because earlier requests on their connection were in flight.
    ordered: u64,
    fallbacks: HashMap<Fallback, u64>,
    hints_sent: u64,
    hint_messages: u64,
    onesided_conns: u64,
    twosided_conns: u64,
}

/// How the waits of `progress` on the event fd ended, for `Transport::counters`.
#[derive(Default)]
struct WaitCounters {
    /// Waits ended by an event (the UCX event fd or a lifeline).
    by_event: u64,
    /// Waits ended by their timeout, after which UCX had work: an event that did not wake
    /// us (a missed wake-up the timeout hid). Should stay 0.
    by_timer: u64,
}

struct InFlight {
    conn: ConnId,
    id: u64,
    opcode: Opcode,
    /// A plain get reports CAS 0 (as over TCP); gets and gat report the item's.
    want_cas: bool,
}

pub struct UcxTransport {
    w: mf::Worker,
    get_mode: GetMode,
    access_hints: bool,
    onesided: HashMap<u64, OneSidedGet>,
    /// RMA reads that completed inside the call that posted them.
    local_events: std::collections::VecDeque<mf::Event>,
    counters: GetCounters,
    waits: WaitCounters,
    last_hint_flush: Instant,
    /// Access hints gathered and not yet sent, over all connections.
    pending_hints: usize,
    address: Vec<u8>,
    poll: Poll,
    events: Events,
    conns: HashMap<ConnId, Conn>,
    next_conn: ConnId,
    inflight: HashMap<u64, InFlight>,
    /// Responses whose value is still arriving by rendezvous (keyed by opaque).
    receiving: HashMap<u64, fp::Response>,
    next_opaque: u64,
    /// Completions produced outside `progress` (closes), delivered by the next one.
    deferred: Vec<Completion>,
    /// Connections whose endpoint UCX reported failed, for the next `progress`.
    failed_conns: Vec<ConnId>,
    /// Reused between progress rounds.
    events_buf: std::collections::VecDeque<mf::Event>,
    last_lifeline_check: Instant,
}

impl UcxTransport {
    pub fn new(get_mode: GetMode, access_hints: bool) -> Result<UcxTransport, Error> {
        let ctx = context()?;
        let ucx = |e: mf::Error| Error::Protocol(format!("UCX: {e}"));
        let mut w = mf::Worker::new(&ctx).map_err(ucx)?;
        // Responses' values stay in UCX's receive buffers (no copy): a Value's Bytes owns
        // the buffer and gives it back when dropped.
        w.set_am_handler_holding(fp::AM_RESPONSE, HOLD_MIN)
            .map_err(ucx)?;
        // Earlier servers' reachability probe: received and ignored.
        w.set_am_handler(fp::AM_PROBE).map_err(ucx)?;
        let address = w.address().map_err(ucx)?;
        let poll = Poll::new().map_err(|e| Error::Protocol(format!("poll: {e}")))?;
        let efd = w.event_fd().map_err(ucx)?;
        poll.registry()
            .register(&mut mio::unix::SourceFd(&efd), EFD, Interest::READABLE)
            .map_err(|e| Error::Protocol(format!("poll: {e}")))?;
        Ok(UcxTransport {
            w,
            get_mode,
            access_hints,
            onesided: HashMap::new(),
            local_events: std::collections::VecDeque::new(),
            counters: GetCounters::default(),
            waits: WaitCounters::default(),
            last_hint_flush: Instant::now(),
            pending_hints: 0,
            address,
            poll,
            events: Events::with_capacity(64),
            conns: HashMap::new(),
            next_conn: 0,
            inflight: HashMap::new(),
            receiving: HashMap::new(),
            next_opaque: 1,
            deferred: Vec::new(),
            failed_conns: Vec::new(),
            events_buf: std::collections::VecDeque::new(),
            last_lifeline_check: Instant::now(),
        })
    }

    /// HELLO / WELCOME over the bootstrap connection.
    fn bootstrap(
        &self,
        addr: &ServerAddr,
        timeout: Duration,
    ) -> Result<(TcpStream, fp::Welcome), Error> {
        let server = addr.to_string();
        let io = |e: std::io::Error| Error::Io {
            server: server.clone(),
            msg: e.to_string(),
        };
        let deadline = Instant::now() + timeout;
        let sa = (addr.host.as_str(), addr.port)
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| Error::Config(format!("cannot resolve {server}")))?;
        let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(io)?;
        let _ = s.set_nodelay(true);
        let left = |d: Instant| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        s.set_write_timeout(Some(left(deadline))).map_err(io)?;
        let hello = fp::Hello {
            version: fp::VERSION,
            worker_address: self.address.clone(),
        };
        s.write_all(&hello.encode()).map_err(io)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let welcome = loop {
            if Instant::now() >= deadline {
                return Err(Error::Timeout { server });
            }
            s.set_read_timeout(Some(left(deadline))).map_err(io)?;
            let n = match s.read(&mut chunk) {
                Ok(0) => {
                    return Err(Error::Io {
                        server,
                        msg: "closed during the UCX handshake".into(),
                    })
                }
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout { server })
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            buf.extend_from_slice(&chunk[..n]);
            match fp::decode_welcome(&buf) {
                Ok(Some((w, _))) => break w,
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(format!("{server}: bad WELCOME: {e}"))),
            }
        };
        match welcome.status {
            fp::WELCOME_OK => Ok((s, welcome)),
            fp::WELCOME_BAD_VERSION => Err(Error::Protocol(format!(
                "{server}: fabric protocol version {} not supported (server speaks {})",
                fp::VERSION,
                welcome.version
            ))),
            _ => Err(Error::ServerDown { server }),
        }
    }

    fn fail_conn(&mut self, conn: ConnId, msg: &str, done: &mut Vec<Completion>) {
        let Some(mut c) = self.conns.remove(&conn) else {
            return;
        };
        let _ = self
            .poll
            .registry()
            .deregister(&mut mio::unix::SourceFd(&c.lifeline.as_raw_fd()));
        if let Some(ep) = c.ep.take() {
            self.w.close(ep, true);
        }
        let err = || {
            if msg.is_empty() {
                Error::Closed
            } else {
                Error::Io {
                    server: c.server.clone(),
                    msg: msg.to_string(),
                }
            }
        };
        // Every request in flight on the connection, two-sided or one-sided, fails.
        let ids: Vec<(u64, u64)> = self
            .inflight
            .iter()
            .filter(|(_, f)| f.conn == conn)
            .map(|(&o, f)| (o, f.id))
            .chain(
                self.onesided
                    .iter()
                    .filter(|(_, g)| g.conn == conn)
                    .map(|(&o, g)| (o, g.id)),
            )
            .collect();
        for (opaque, id) in ids {
            self.inflight.remove(&opaque);
            self.onesided.remove(&opaque);
            self.receiving.remove(&opaque);
            done.push(Completion {
                id,
                result: Err(err()),
            });
        }
    }

    /// Lifelines that closed or failed: their servers are gone.
    fn check_lifelines(&mut self, done: &mut Vec<Completion>, failed: &mut Vec<ConnId>) {
        self.last_lifeline_check = Instant::now();
        let dead: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| !lifeline_open(&c.lifeline))
            .map(|(&id, _)| id)
            .collect();
        for id in dead {
            self.fail_conn(id, "server closed the connection", done);
            failed.push(id);
        }
    }

    fn handle(&mut self, e: mf::Event, done: &mut Vec<Completion>) {
        match e {
            mf::Event::Am(msg) if msg.id != fp::AM_RESPONSE => {}
            mf::Event::Am(msg) => {
                let Ok(r) = fp::decode_response(&msg.header) else {
                    return; // not ours to answer; the request will time out
                };
                if !self.inflight.contains_key(&r.opaque) {
                    return;
                }
                match msg.data {
                    mf::AmData::None => self.finish(r, Bytes::new(), done),
                    mf::AmData::Eager(v) => self.finish(r, Bytes::from(v), done),
                    mf::AmData::Held(h) => self.finish(r, Bytes::from_owner(h), done),
                    mf::AmData::Rndv(d) => {
                        let len = d.len();
                        match self.w.recv_rndv(d, Box::new(vec![0u8; len]), r.opaque) {
                            Ok(mf::Posted::Pending) => {
                                self.receiving.insert(r.opaque, r);
                            }
                            Ok(mf::Posted::Done(buf)) => {
                                let v = buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b);
                                self.finish_pulled(r, v.unwrap_or_default(), done);
                            }
                            Err(e) => self.fail_request(r.opaque, e, done),
                        }
                    }
                }
            }
            mf::Event::Done { token, result, buf } => {
                if token == SEND_TOKEN {
                    return;
                }
                if token & RMA_TOKEN != 0 {
                    let data = match result {
                        Ok(()) => buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b),
                        Err(_) => None,
                    };
                    self.onesided_read_done(
                        (token & !RMA_TOKEN) >> 2,
                        (token & 3) as u8,
                        data,
                        done,
                    );
                    return;
                }
                let Some(r) = self.receiving.remove(&token) else {
                    return;
                };
                match result {
                    Ok(()) => {
                        let v = buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b);
                        self.finish_pulled(r, v.unwrap_or_default(), done);
                    }
                    Err(e) => self.fail_request(token, e, done),
                }
            }
            mf::Event::EpFailed { ep, error } => {
                let dead = self
                    .conns
                    .iter()
                    .find_map(|(&id, c)| (c.ep.as_ref().map(|e| e.id()) == Some(ep)).then_some(id));
                if let Some(id) = dead {
                    self.fail_conn(id, &format!("UCX endpoint failed: {error}"), done);
                    self.failed_conns.push(id);
                }
            }
            mf::Event::ConnRequest(_) => {}
        }
    }

    /// A value pulled by rendezvous from the server's memory. The server lets go of that
    /// memory when it ends a session it gave up on (a stalled client), after closing the
    /// lifeline; a value pulled after that may be torn, so it counts only while the
    /// lifeline is still open.
    fn finish_pulled(&mut self, r: fp::Response, v: Vec<u8>, done: &mut Vec<Completion>) {
        let open = self
            .inflight
            .get(&r.opaque)
            .and_then(|f| self.conns.get(&f.conn))
            .is_some_and(|c| lifeline_open(&c.lifeline));
        if open {
            self.finish(r, Bytes::from(v), done);
            return;
        }
        let msg = "server ended the session during the transfer".to_string();
        self.fail_inflight(r.opaque, msg, done);
    }

    /// Remove a request from the in-flight table (and its connection's count).
    fn take_inflight(&mut self, opaque: u64) -> Option<InFlight> {
        let f = self.inflight.remove(&opaque)?;
        if let Some(c) = self.conns.get_mut(&f.conn) {
            c.am_inflight = c.am_inflight.saturating_sub(1);
        }
        Some(f)
    }

    fn fail_request(&mut self, opaque: u64, e: mf::Error, done: &mut Vec<Completion>) {
        self.fail_inflight(opaque, format!("UCX transfer failed: {e}"), done);
    }

    /// Complete an in-flight request with an I/O error naming its server.
    fn fail_inflight(&mut self, opaque: u64, msg: String, done: &mut Vec<Completion>) {
        if let Some(f) = self.take_inflight(opaque) {
            let server = self
                .conns
                .get(&f.conn)
                .map(|c| c.server.clone())
                .unwrap_or_default();
            done.push(Completion {
                id: f.id,
                result: Err(Error::Io { server, msg }),
            });
        }
    }

    fn finish(&mut self, r: fp::Response, data: Bytes, done: &mut Vec<Completion>) {
        let Some(f) = self.take_inflight(r.opaque) else {
            return;
        };
        let mut r = r;
        if !f.want_cas {
            r.cas = 0;
        }
        done.push(Completion {
            id: f.id,
            result: reply_of(f.opcode, &r, data),
        });
    }

    /// Send `op` as an active message (the two-sided path of every operation).
    fn send_am(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::Closed);
        };
        let want_cas = !matches!(op, Op::Get { cas: false, .. });
        let (opcode, item_flags, exptime, cas, key, value) = request_of(op);
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        let value_len = value.as_ref().map_or(0, |v| v.len());
        let header = fp::Request {
            opcode,
            flags: 0,
            session: c.session,
            opaque,
            item_flags,
            exptime,
            cas,
            value_len: value_len as u64,
            key: &key,
        }
        .to_vec();
        let how = mf::SendHow {
            proto: if value_len > c.eager_max {
                mf::Proto::Rndv
            } else {
                mf::Proto::Eager
            },
            reply: true,
        };
        let Some(ep) = c.ep.as_ref() else {
            return Err(Error::Closed);
        };
        // Fast path for eager requests: sent inside the call, nothing to keep alive.
        let sent_now = if how.proto == mf::Proto::Eager {
            let v = value.as_deref().unwrap_or(&[]);
            self.w.am_send_now(ep, fp::AM_REQUEST, &header, v, true)
        } else {
            Ok(false)
        };
        let sent = match sent_now {
            Ok(true) => Ok(()),
            Ok(false) => {
                let data = value
                    .filter(|v| !v.is_empty())
                    .map(|v| Box::new(BytesBuf(v)) as Box<dyn mf::SendBuf>);
                self.w
                    .am_send(ep, fp::AM_REQUEST, header, data, how, SEND_TOKEN)
                    .map(|_| ())
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok(()) => {
                let f = InFlight {
                    conn,
                    id,
                    opcode,
                    want_cas,
                };
                self.inflight.insert(opaque, f);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.am_inflight += 1;
                }
                Ok(())
            }
            Err(e) => Err(Error::Io {
                server: c.server.clone(),
                msg: format!("UCX send: {e}"),
            }),
        }
    }

    /// Drive the one-sided GETs in flight on `conn` to completion (their completions are
    /// delivered by the next `progress`), so that a request submitted after them cannot
    /// overtake them. Bounded: a server that stops answering fails them by its timeouts.
    fn finish_onesided(&mut self, conn: ConnId) {
        let pending = |t: &Self| t.onesided.values().any(|g| g.conn == conn);
        if !pending(self) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut done = Vec::new();
        let mut events = std::collections::VecDeque::new();
        while pending(self) && Instant::now() < deadline {
            self.w.progress();
            self.w.drain_into(&mut events);
            events.extend(self.local_events.drain(..));
            while let Some(e) = events.pop_front() {
                self.handle(e, &mut done);
            }
        }
        self.deferred.append(&mut done);
    }

    /// Whether `conn`'s lifeline is still open: one non-blocking peek, at most once per
    /// `LIFELINE_FRESH` (a dead process's sockets close at once, so this bounds how long
    /// after a server's death its memory can still be read).
    fn lifeline_alive(&mut self, conn: ConnId) -> bool {
        let Some(c) = self.conns.get_mut(&conn) else {
            return false;
        };
        let now = Instant::now();
        if c.rma
            .as_ref()
            .is_some_and(|r| now.duration_since(r.alive_at) < LIFELINE_FRESH)
        {
            return true;
        }
        let alive = lifeline_open(&c.lifeline);
        if let (true, Some(r)) = (alive, c.rma.as_mut()) {
            r.alive_at = now;
        }
        alive
    }

    fn has_work(&self) -> bool {
        !self.inflight.is_empty() || !self.onesided.is_empty()
    }

    /// Decide at connect whether GETs to this server go one-sided, and learn its geometry
    /// from the control block (one RMA read). Any failure leaves the server two-sided.
    fn setup_rma(
        &mut self,
        ep: &mut mf::Endpoint,
        welcome: &fp::Welcome,
        timeout: Duration,
    ) -> Option<Rma> {
        if self.get_mode == GetMode::TwoSided || welcome.index_len <= os::CTL_BYTES as u64 {
            return None;
        }
        let arena = ep.unpack_rkey(&welcome.arena_rkey).ok()?;
        let index = ep.unpack_rkey(&welcome.index_rkey).ok()?;
        // Same-host shared memory: mapped here, read with plain copies.
        let mapped = ep.map_region(arena, welcome.arena_base, welcome.arena_len as usize)
            && ep.map_region(index, welcome.index_base, welcome.index_len as usize);
        if self.get_mode == GetMode::Auto && !mapped && !has_native_get_lane(ep) {
            return None;
        }
        let ctl_addr = welcome.index_base + welcome.index_len - os::CTL_BYTES as u64;
        let block = self.read_now(ep, ctl_addr, index, os::CTL_BYTES, timeout)?;
        let (geo, _) = os::decode_control(&block).ok()?;
        if geo.index_len() != welcome.index_len || geo.arena_len > welcome.arena_len {
            return None;
        }
        let ours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let theirs = welcome.started_unix as i64 + welcome.clock as i64;
        Some(Rma {
            remote: Remote {
                geo,
                arena_base: welcome.arena_base,
                arena_len: welcome.arena_len,
                index_base: welcome.index_base,
                clock_offset: theirs - ours,
            },
            mapped,
            arena,
            index,
            hints: Vec::new(),
            hinted: vec![NOT_HINTED; HINTED_SLOTS].into_boxed_slice(),
            alive_at: Instant::now(),
        })
    }

    /// One RMA read, waited for (connect time only).
    fn read_now(
        &mut self,
        ep: &mf::Endpoint,
        addr: u64,
        rkey: mf::RemoteKey,
        len: usize,
        timeout: Duration,
    ) -> Option<Vec<u8>> {
        const TOKEN: mf::Token = RMA_TOKEN | 3;
        let take = |b: Option<Box<dyn std::any::Any>>| {
            b.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b)
        };
        match self
            .w
            .get(ep, addr, rkey, Box::new(vec![0u8; len]), TOKEN)
            .ok()?
        {
            mf::Posted::Done(b) => take(b),
            mf::Posted::Pending => {
                let deadline = Instant::now() + timeout;
                let mut events = std::collections::VecDeque::new();
                while Instant::now() < deadline {
                    self.w.progress();
                    self.w.drain_into(&mut events);
                    while let Some(e) = events.pop_front() {
                        match e {
                            mf::Event::Done {
                                token: TOKEN,
                                result,
                                buf,
                            } => {
                                return result.ok().and_then(|()| take(buf));
                            }
                            other => self.local_events.push_back(other),
                        }
                    }
                }
                None
            }
        }
    }

    /// Post the reads of a one-sided GET's next round as UCX `get`s (reads from mapped
    /// memory never come here: `onesided_get_mapped` does them inline).
    fn post_reads(&mut self, conn: ConnId, opaque: u64, reads: &[crate::onesided::Read]) -> bool {
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_ref()) else {
            return false;
        };
        for r in reads {
            let rkey = if r.arena { rma.arena } else { rma.index };
            let token = RMA_TOKEN | (opaque << 2) | r.part as u64;
            match self
                .w
                .get(ep, r.addr, rkey, Box::new(vec![0u8; r.len]), token)
            {
                Ok(mf::Posted::Pending) => {}
                Ok(mf::Posted::Done(buf)) => self.local_events.push_back(mf::Event::Done {
                    token,
                    result: Ok(()),
                    buf,
                }),
                Err(e) => self.local_events.push_back(mf::Event::Done {
                    token,
                    result: Err(e),
                    buf: None,
                }),
            }
        }
        true
    }

    /// Act on what a one-sided GET's state machine says.
    fn onesided_step(&mut self, opaque: u64, step: Step, done: &mut Vec<Completion>) {
        match step {
            Step::Wait => {}
            Step::Post(reads) => {
                let conn = self.onesided.get(&opaque).map(|g| g.conn);
                if !conn.is_some_and(|c| self.post_reads(c, opaque, &reads)) {
                    self.onesided_fallback(opaque, Fallback::ReadError, done);
                }
            }
            Step::Hit { ok, chunk, hint } => {
                let Some(g) = self.onesided.remove(&opaque) else {
                    return;
                };
                self.counters.retries += g.read.retries as u64;
                self.onesided_hit(g.conn, g.id, g.want_cas, ok, chunk, hint, done);
            }
            Step::Fallback(why) => self.onesided_fallback(opaque, why, done),
        }
    }

    /// A one-sided GET from memory mapped into this process (same-host shared memory):
    /// every round of reads is a plain copy, so the whole read runs here, at once, with
    /// none of the request machinery.
    fn onesided_get_mapped(
        &mut self,
        conn: ConnId,
        id: u64,
        key: &[u8],
        want_cas: bool,
        done: &mut Vec<Completion>,
    ) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_ref()) else {
            return;
        };
        let (mut read, mut step) = GetRead::new(&rma.remote, key.to_vec());
        let outcome = loop {
            match step {
                Step::Post(reads) => {
                    step = Step::Wait;
                    for r in &reads {
                        let rkey = if r.arena { rma.arena } else { rma.index };
                        let mut buf = vec![0u8; r.len];
                        let ok = ep.read_mapped(rkey, r.addr, &mut buf);
                        step = read.on_read(&rma.remote, r.part, ok.then_some(buf));
                    }
                }
                // Every read of the round is in: a state machine that still waits is
                // confused; the server answers instead.
                Step::Wait => break Err(Fallback::ReadError),
                Step::Hit { ok, chunk, hint } => break Ok((ok, chunk, hint)),
                Step::Fallback(why) => break Err(why),
            }
        };
        self.counters.retries += read.retries as u64;
        match outcome {
            Ok((ok, chunk, hint)) => self.onesided_hit(conn, id, want_cas, ok, chunk, hint, done),
            Err(why) => {
                let key = read.key().to_vec();
                self.serve_twosided(conn, id, key, want_cas, why, done);
            }
        }
    }

    /// Complete a one-sided hit and note its access hint.
    #[allow(clippy::too_many_arguments)]
    fn onesided_hit(
        &mut self,
        conn: ConnId,
        id: u64,
        want_cas: bool,
        ok: os::ItemOk,
        chunk: Vec<u8>,
        hint: (u64, u32),
        done: &mut Vec<Completion>,
    ) {
        self.counters.onesided_hits += 1;
        // A header that already shows this second's access needs no hint.
        let c = self
            .conns
            .get_mut(&conn)
            .filter(|_| self.access_hints && !ok.access_noted);
        if let Some(rma) = c.and_then(|c| c.rma.as_mut()) {
            let slot = ((hint.0 >> 3) ^ u64::from(hint.1)) as usize % HINTED_SLOTS;
            if rma.hinted[slot] != hint {
                rma.hinted[slot] = hint;
                rma.hints.push(hint);
                self.pending_hints += 1;
                if rma.hints.len() >= HINT_BATCH {
                    self.send_hints(conn);
                }
            }
        }
        let data = Bytes::from(chunk).slice(ok.value);
        done.push(Completion {
            id,
            result: Ok(Reply::Value(Some(Value {
                data,
                flags: ok.flags,
                cas: if want_cas { ok.cas } else { 0 },
            }))),
        });
    }

    fn onesided_read_done(
        &mut self,
        opaque: u64,
        part: u8,
        data: Option<Vec<u8>>,
        done: &mut Vec<Completion>,
    ) {
        let Some(g) = self.onesided.get_mut(&opaque) else {
            return; // its connection failed meanwhile
        };
        let Some(rma) = self.conns.get(&g.conn).and_then(|c| c.rma.as_ref()) else {
            return;
        };
        let step = g.read.on_read(&rma.remote, part, data);
        self.onesided_step(opaque, step, done);
    }

    /// Serve a one-sided GET two-sided after all.
    fn onesided_fallback(&mut self, opaque: u64, why: Fallback, done: &mut Vec<Completion>) {
        let Some(g) = self.onesided.remove(&opaque) else {
            return;
        };
        self.counters.retries += g.read.retries as u64;
        let key = g.read.key().to_vec();
        self.serve_twosided(g.conn, g.id, key, g.want_cas, why, done);
    }

    /// Send a GET that one-sided reads could not serve as an active message.
    fn serve_twosided(
        &mut self,
        conn: ConnId,
        id: u64,
        key: Vec<u8>,
        cas: bool,
        why: Fallback,
        done: &mut Vec<Completion>,
    ) {
        *self.counters.fallbacks.entry(why).or_default() += 1;
        if let Err(e) = self.send_am(conn, id, Op::Get { key, cas }) {
            done.push(Completion { id, result: Err(e) });
        }
    }

    /// Send the pending access hints of `conn` (fire and forget).
    fn send_hints(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_mut()) else {
            return;
        };
        // A new batch: every item may be hinted again.
        rma.hinted.fill(NOT_HINTED);
        while !rma.hints.is_empty() {
            let n = rma.hints.len().min(os::HINTS_MAX);
            self.pending_hints = self.pending_hints.saturating_sub(n);
            let mut data = Vec::with_capacity(n * os::HINT_BYTES);
            for (off, seq) in rma.hints.drain(..n) {
                os::encode_hint(&mut data, off, seq);
            }
            let header = os::encode_hints_header(c.session, n as u32);
            let how = mf::SendHow {
                proto: mf::Proto::Eager,
                reply: false,
            };
            let data = Box::new(BytesBuf(Bytes::from(data))) as Box<dyn mf::SendBuf>;
            // Hints are advisory: one that cannot be sent is dropped.
            if self
                .w
                .am_send(ep, fp::AM_HINTS, header, Some(data), how, SEND_TOKEN)
                .is_ok()
            {
                self.counters.hints_sent += n as u64;
                self.counters.hint_messages += 1;
            }
        }
    }

    fn send_all_hints(&mut self) {
        self.last_hint_flush = Instant::now();
        let conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.rma.as_ref().is_some_and(|r| !r.hints.is_empty()))
            .map(|(&id, _)| id)
            .collect();
        for id in conns {
            self.send_hints(id);
        }
    }
}

impl Drop for UcxTransport {
    fn drop(&mut self) {
        // Endpoints close (flushing what was sent, and finishing their wire-up) before
        // the lifelines go: the server force-closes its endpoint when the lifeline
        // closes, and UCX 1.13 aborts the process (an assertion in its TCP transport) when
        // an endpoint still wiring up fails under it. Then the worker goes.
        let mut conns: Vec<Conn> = self.conns.drain().map(|(_, c)| c).collect();
        for c in &mut conns {
            if let Some(ep) = c.ep.take() {
                self.w.close(ep, false);
            }
        }
        self.w.finish_closes(Duration::from_secs(2));
        drop(conns);
    }
}

/// Turn a response into the client's reply.
fn reply_of(op: Opcode, r: &fp::Response, data: Bytes) -> Result<Reply, Error> {
    use Status as S;
    match (r.status, op) {
        (S::TooLarge, _) => return Err(Error::TooLarge),
        (S::NoMemory, _) => return Err(Error::Server("out of memory storing object".into())),
        (S::Invalid, _) => return Err(Error::Client("bad command line format".into())),
        (S::UnknownCommand, _) => return Err(Error::Client("ERROR".into())),
        (S::UnknownSession, _) => {
            return Err(Error::Protocol("server does not know this session".into()))
        }
        (S::Failed, _) => return Err(Error::Server("value transfer failed".into())),
        (S::NonNumeric, _) => {
            return Err(Error::Client(
                "cannot increment or decrement non-numeric value".into(),
            ))
        }
        _ => {}
    }
    Ok(match op {
        Opcode::Get | Opcode::Gat => match r.status {
            S::Ok => Reply::Value(Some(Value {
                data,
                flags: r.item_flags,
                cas: r.cas,
            })),
            _ => Reply::Value(None),
        },
        Opcode::Set
        | Opcode::Add
        | Opcode::Replace
        | Opcode::Append
        | Opcode::Prepend
        | Opcode::Cas => Reply::Stored(match r.status {
            S::Ok => StoreStatus::Stored { cas: r.cas },
            S::Exists => StoreStatus::Exists,
            S::NotFound => StoreStatus::NotFound,
            _ => StoreStatus::NotStored,
        }),
        Opcode::Delete => Reply::Deleted(r.status == S::Ok),
        Opcode::Incr | Opcode::Decr => Reply::Counter((r.status == S::Ok).then_some(r.value)),
        Opcode::Touch => Reply::Touched(r.status == S::Ok),
        Opcode::FlushAll | Opcode::Noop => Reply::Ok,
        Opcode::Stats => {
            if r.status != S::Ok {
                return Err(Error::Client("ERROR".into()));
            }
            let text = String::from_utf8_lossy(&data);
            Reply::Stats(
                text.lines()
                    .filter_map(|l| l.split_once(' '))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        }
        Opcode::Version => Reply::Version(String::from_utf8_lossy(&data).into_owned()),
    })
}

/// The fabric request for an operation: opcode, flags, exptime, cas/delta, key, value.
fn request_of(op: Op) -> (Opcode, u32, u32, u64, Vec<u8>, Option<Bytes>) {
    match op {
        Op::Get { key, .. } => (Opcode::Get, 0, 0, 0, key, None),
        Op::Gat { key, exptime } => (Opcode::Gat, 0, exptime, 0, key, None),
        Op::Store {
            mode,
            key,
            value,
            flags,
            exptime,
            cas,
        } => {
            let opcode = match mode {
                StoreMode::Set => Opcode::Set,
                StoreMode::Add => Opcode::Add,
                StoreMode::Replace => Opcode::Replace,
                StoreMode::Append => Opcode::Append,
                StoreMode::Prepend => Opcode::Prepend,
                StoreMode::Cas => Opcode::Cas,
            };
            (opcode, flags, exptime, cas, key, Some(value))
        }
        Op::Delete { key } => (Opcode::Delete, 0, 0, 0, key, None),
        Op::Arith { key, delta, incr } => {
            let opcode = if incr { Opcode::Incr } else { Opcode::Decr };
            (opcode, 0, 0, delta, key, None)
        }
        Op::Touch { key, exptime } => (Opcode::Touch, 0, exptime, 0, key, None),
        Op::FlushAll { delay } => (Opcode::FlushAll, 0, delay, 0, Vec::new(), None),
        Op::Stats { group } => (
            Opcode::Stats,
            0,
            0,
            0,
            group.unwrap_or_default().into_bytes(),
            None,
        ),
        Op::Version => (Opcode::Version, 0, 0, 0, Vec::new(), None),
        Op::Noop => (Opcode::Noop, 0, 0, 0, Vec::new(), None),
    }
}

impl Transport for UcxTransport {
    fn connect(&mut self, addr: &ServerAddr, timeout: Duration) -> Result<ConnId, Error> {
        let (lifeline, welcome) = self.bootstrap(addr, timeout)?;
        // Same error-handling mode as the server's endpoint to us, or UCX cannot pair them.
        self.w.set_peer_errors(welcome.peer_errors);
        let mut ep = self
            .w
            .connect_address(&welcome.worker_address)
            .map_err(|e| Error::Io {
                server: addr.to_string(),
                msg: format!("UCX connect: {e}"),
            })?;
        let rma = self.setup_rma(&mut ep, &welcome, timeout);
        if rma.is_some() {
            self.counters.onesided_conns += 1;
        } else {
            self.counters.twosided_conns += 1;
        }
        lifeline.set_nonblocking(true).map_err(|e| Error::Io {
            server: addr.to_string(),
            msg: e.to_string(),
        })?;
        let id = self.next_conn;
        self.next_conn += 1;
        let _ = self.poll.registry().register(
            &mut mio::unix::SourceFd(&lifeline.as_raw_fd()),
            Token(id),
            Interest::READABLE,
        );
        self.conns.insert(
            id,
            Conn {
                server: addr.to_string(),
                ep: Some(ep),
                lifeline,
                session: welcome.session,
                eager_max: welcome.eager_max as usize,
                rma,
                am_inflight: 0,
            },
        );
        Ok(id)
    }

    fn submit(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::Closed);
        };
        if op.key().is_some_and(|k| !crate::op::valid_key(k)) {
            // Same rule as the TCP transport, so a key works on every transport or none.
            return Err(Error::InvalidKey);
        }
        // Requests on a connection take effect in order. A one-sided GET reads memory the
        // moment it runs, so it may start only when no earlier request is still on its way
        // to the server; and any other request waits until the one-sided GETs before it
        // are done (over shared memory, microseconds).
        let one_sided = matches!(op, Op::Get { .. }) && c.rma.is_some() && c.am_inflight == 0;
        if let (Op::Get { key, cas }, true) = (&op, one_sided) {
            // The server's memory stays readable after the server dies (we map it): ask
            // the lifeline first, so that a dead server's stale items are never served.
            // (The kernel closes a dead process's sockets at once.)
            if !self.lifeline_alive(conn) {
                // Fails like a request in flight when the lifeline closes: at the next
                // progress, with the connection reported failed (the pool marks it down).
                let server = self.conns.get(&conn).map(|c| c.server.clone());
                let mut done = Vec::new();
                self.fail_conn(conn, "server closed the connection", &mut done);
                done.push(Completion {
                    id,
                    result: Err(Error::Io {
                        server: server.unwrap_or_default(),
                        msg: "server closed the connection".into(),
                    }),
                });
                self.deferred.append(&mut done);
                self.failed_conns.push(conn);
                return Ok(());
            }
            let Some(rma) = self.conns.get(&conn).and_then(|c| c.rma.as_ref()) else {
                return Err(Error::Closed);
            };
            if rma.mapped {
                let mut done = Vec::new();
                self.onesided_get_mapped(conn, id, key, *cas, &mut done);
                self.deferred.append(&mut done);
                return Ok(());
            }
            let (read, step) = GetRead::new(&rma.remote, key.clone());
            let opaque = self.next_opaque;
            self.next_opaque += 1;
            let g = OneSidedGet {
                conn,
                id,
                want_cas: *cas,
                read,
            };
            self.onesided.insert(opaque, g);
            // Results (even of reads that complete at once) are handled by `progress`;
            // a GET that cannot start its reads is served two-sided at once.
            let mut done = Vec::new();
            self.onesided_step(opaque, step, &mut done);
            self.deferred.append(&mut done);
            return Ok(());
        }
        if matches!(op, Op::Get { .. }) {
            self.counters.twosided += 1;
            if c.rma.is_some() {
                self.counters.ordered += 1;
            }
        }
        self.finish_onesided(conn);
        self.send_am(conn, id, op)
    }
    fn counters(&self) -> Vec<(String, u64)> {
        let c = &self.counters;
        let mut v = vec![
            ("get_onesided_hits".to_string(), c.onesided_hits),
            ("get_twosided".to_string(), c.twosided),
            ("get_onesided_retries".to_string(), c.retries),
            ("get_twosided_ordered".to_string(), c.ordered),
        ];
        for f in Fallback::ALL {
            v.push((
                format!("get_onesided_fallback_{}", f.name()),
                c.fallbacks.get(&f).copied().unwrap_or(0),
            ));
        }
        v.push(("onesided_hints_sent".into(), c.hints_sent));
        v.push(("onesided_hint_messages".into(), c.hint_messages));
        v.push(("conns_onesided".into(), c.onesided_conns));
        v.push(("conns_twosided".into(), c.twosided_conns));
        v.push(("ucx_waits_by_event".into(), self.waits.by_event));
        v.push(("ucx_waits_by_timer".into(), self.waits.by_timer));
        v
    }

    fn progress(
        &mut self,
        timeout: Duration,
        done: &mut Vec<Completion>,
        failed: &mut Vec<ConnId>,
    ) -> Result<(), Error> {
        let start = Instant::now();
        if self.pending_hints > 0 && start.duration_since(self.last_hint_flush) >= HINT_MAX_AGE {
            self.send_all_hints();
        }
        done.append(&mut self.deferred);
        let mut events = std::mem::take(&mut self.events_buf);
        let mut rounds: u32 = 0;
        // The last wait on the event fd ended by its timeout, not by an event.
        let mut woke_by_timer = false;
        let result = loop {
            // Progress until UCX is idle.
            loop {
                let n = self.w.progress();
                self.w.drain_into(&mut events);
                events.extend(self.local_events.drain(..));
                if n == 0 && events.is_empty() {
                    break;
                }
                if std::mem::take(&mut woke_by_timer) {
                    self.waits.by_timer += 1;
                }
                while let Some(e) = events.pop_front() {
                    self.handle(e, done);
                }
            }
            failed.append(&mut self.failed_conns);
            if !done.is_empty() || !failed.is_empty() {
                break Ok(());
            }
            // Clock reads cost as much as a progress round: look at the clock (deadline,
            // lifelines) only every few rounds while spinning.
            rounds = rounds.wrapping_add(1);
            if !timeout.is_zero() && !rounds.is_multiple_of(32) {
                std::hint::spin_loop();
                continue;
            }
            if self.last_lifeline_check.elapsed() >= Duration::from_millis(1) {
                self.check_lifelines(done, failed);
                if !done.is_empty() || !failed.is_empty() {
                    break Ok(());
                }
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                break Ok(());
            }
            if elapsed < SPIN && self.has_work() {
                // Give the core away between spins: a server on this host (or another
                // thread of ours) that our send woke is often queued on this very core,
                // and would otherwise wait for our spin to end before it can answer
                // (the "slow UCX mode" of docs/benchmarks.md: replies ~2 ms late).
                std::thread::yield_now();
                continue;
            }
            // Idle: the access hints gathered so far go out before we sleep, and UCX is
            // progressed once more (the sends may need it) before it is armed.
            if self.pending_hints > 0 {
                self.send_all_hints();
                continue;
            }
            // Sleep on the UCX event fd and the lifelines.
            if !self.local_events.is_empty() || !matches!(self.w.arm(), Ok(true)) {
                continue;
            }
            let wait = (timeout - elapsed).min(Duration::from_millis(100));
            match self.poll.poll(&mut self.events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(Error::Protocol(format!("poll: {e}"))),
            }
            if self.events.is_empty() {
                woke_by_timer = true;
            } else {
                self.waits.by_event += 1;
            }
            if self.events.iter().any(|ev| ev.token() != EFD) {
                self.check_lifelines(done, failed);
            }
        };
        self.events_buf = events;
        result
    }

    fn close(&mut self, conn: ConnId) {
        // Called when a server timed out: it may be hung, so this must not wait for it
        // (unlike Drop, which lets closes finish first).
        let mut done = Vec::new();
        self.fail_conn(conn, "", &mut done);
        self.deferred.append(&mut done);
    }
}

/// Whether a session's lifeline (non-blocking) is still open: nothing to read yet. EOF, an
/// error, or bytes (which the protocol never sends after WELCOME) mean the server is gone.
fn lifeline_open(lifeline: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match lifeline.peek(&mut buf) {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

/// Whether UCX gave `ep` a lane that reads natively, without the server's CPU (RDMA
/// verbs, cma, knem, xpmem). Over TCP UCX only emulates RMA with active messages that the
/// server's worker must progress, which is slower than asking it.
fn has_native_get_lane(ep: &mf::Endpoint) -> bool {
    ep.describe()
        .lines()
        .any(|l| l.trim_start_matches(['#', ' ']).starts_with("get["))
}
