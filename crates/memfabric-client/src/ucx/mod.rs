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
//!
//! This file holds the transport's state (connections, requests in flight, counters) and
//! the `Transport` entry points; the work is split by concern: `connect` (bootstrap and
//! lifelines), `requests` (two-sided requests and their completion), `rma` (one-sided
//! GETs and access hints), `wait` (progress, spinning and sleeping on the event fd).

mod connect;
mod moves;
mod requests;
mod rma;
mod wait;

use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use memfabric_proto::ucx_wire::{self as fp, Opcode};
use memfabric_ucx as mf;
use mio::{Events, Interest, Poll, Token};

use crate::addr::ServerAddr;
use crate::error::Error;
use crate::onesided::{Fallback, GetRead, Remote};
use crate::op::Op;
use crate::transport::{Completion, ConnId, GetMode, Transport};
use connect::context;

/// The UCX library this process runs (its own version string, e.g. "1.13.1").
pub use memfabric_ucx::version as library_version;

/// Response values of at least this many bytes stay in UCX's receive buffer (no copy).
const HOLD_MIN: usize = 2048;

/// Token of request sends: their completion only releases the buffers.
const SEND_TOKEN: mf::Token = 0;

/// Tokens of one-sided reads: this bit, the GET's opaque shifted by 2, the read's part.
const RMA_TOKEN: mf::Token = 1 << 63;

/// The UCX event fd's token in the transport's poll (a lifeline's token is its `ConnId`).
const EFD: Token = Token(usize::MAX - 1);

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
    /// The server's instance id from its WELCOME (as `stats fabric` names it).
    instance: String,
    /// The server asked us to move to another of its workers (another transport tier).
    moving: Option<Moving>,
}

/// A move the server asked for (docs/fabric-protocol.md 1.6): the endpoint to the new
/// worker is open; requests submitted meanwhile wait here until every request sent on
/// the old endpoint is answered, then the old endpoint closes and they go on the new one.
struct Moving {
    ep: mf::Endpoint,
    welcome: fp::Welcome,
    queued: std::collections::VecDeque<(u64, Op)>,
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
    /// Moves to another of a server's workers made, and refused (unreachable).
    moves: u64,
    moves_refused: u64,
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
    /// Events for the next wait: RMA reads that completed inside the call that posted
    /// them, and whatever arrived while a connect waited for its READY.
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
    /// Who to be to a server that challenges the bootstrap (`-Y`).
    credentials: Option<crate::transport::Credentials>,
    /// Connections with a move in progress (`Conn::moving`) or waiting for its READY
    /// (`moves_awaiting_ready`), as an upper bound: checked after each progress round
    /// only while it is not 0.
    moves_pending: usize,
    /// Moves whose server promised a READY on its new endpoint that has not come: the
    /// move's frame and until when to wait for it (then the move goes ahead without).
    moves_awaiting_ready: HashMap<ConnId, (fp::Welcome, Instant)>,
    /// READYs that came before the move or connection they belong to (a few, newest
    /// last; older ones are forgotten).
    readies_seen: std::collections::VecDeque<fp::Ready>,
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
        // A server's READY on the endpoint it made to us (earlier servers sent this id
        // empty, as a probe: ignored).
        w.set_am_handler(fp::AM_READY).map_err(ucx)?;
        // A server moving our session to another of its workers.
        w.set_am_handler(fp::AM_MOVE).map_err(ucx)?;
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
            credentials: None,
            moves_pending: 0,
            moves_awaiting_ready: HashMap::new(),
            readies_seen: std::collections::VecDeque::new(),
        })
    }
}

/// How long a dropped transport waits for its requests in flight.
const DROP_SETTLE: Duration = Duration::from_secs(1);

impl Drop for UcxTransport {
    fn drop(&mut self) {
        // Requests still in flight (copies a quorum write did not wait for, calls given
        // up on) finish first, for a bounded time: a server whose reply or rendezvous
        // is on its way when our endpoint closes is left with sends to a closed endpoint,
        // which UCX 1.13 never drops (seen over shared memory: that server's worker then
        // cannot sleep, memfabricd's `ucx_stalled_waits`).
        let limit = Instant::now() + DROP_SETTLE;
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        while self.has_work() && Instant::now() < limit {
            if self
                .wait(Duration::from_millis(10), &mut done, &mut failed)
                .is_err()
            {
                break;
            }
            for conn in failed.drain(..) {
                self.fail_conn(conn, "", &mut done);
            }
            done.clear();
        }
        // Endpoints close (flushing what was sent, and finishing their wire-up) before
        // the lifelines go: the server force-closes its endpoint when the lifeline
        // closes, and UCX 1.13 aborts the process (an assertion in its TCP transport) when
        // an endpoint still wiring up fails under it. Then the worker goes.
        let mut conns: Vec<Conn> = self.conns.drain().map(|(_, c)| c).collect();
        // A move still waiting for its READY: the server's endpoint on the new worker may
        // have reached us already, and UCX then made an endpoint of ours for it that we do
        // not hold, still wiring up (UCX 1.13 aborts the process when the worker is
        // destroyed with it so). Ours is made now and adopts it, to be closed like the
        // others.
        let awaiting: Vec<fp::Welcome> = self
            .moves_awaiting_ready
            .drain()
            .map(|(_, (w, _))| w)
            .collect();
        for w in awaiting {
            self.w.set_peer_errors(w.peer_errors);
            if let Ok(ep) = self.w.connect_address(&w.worker_address) {
                self.w.close(ep, false);
            }
        }
        for c in &mut conns {
            if let Some(ep) = c.ep.take() {
                self.w.close(ep, false);
            }
            if let Some(m) = c.moving.take() {
                self.w.close(m.ep, false);
            }
        }
        self.w.finish_closes(Duration::from_secs(2));
        drop(conns);
    }
}

impl Transport for UcxTransport {
    fn connect(&mut self, addr: &ServerAddr, timeout: Duration) -> Result<ConnId, Error> {
        self.connect_server(addr, timeout)
    }

    fn submit(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::Closed);
        };
        if op.key().is_some_and(|k| !crate::op::valid_key(k)) {
            // Same rule as the TCP transport, so a key works on every transport or none.
            return Err(Error::InvalidKey);
        }
        if c.moving.is_some() {
            // Sent once the old endpoint has drained (in submission order).
            if let Some(m) = self.conns.get_mut(&conn).and_then(|c| c.moving.as_mut()) {
                m.queued.push_back((id, op));
            }
            return Ok(());
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
        v.push(("ucx_moves".into(), c.moves));
        v.push(("ucx_moves_refused".into(), c.moves_refused));
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
        self.wait(timeout, done, failed)
    }

    fn instance(&self, conn: ConnId) -> Option<String> {
        self.conns.get(&conn).map(|c| c.instance.clone())
    }

    fn close(&mut self, conn: ConnId) {
        // Called when a server timed out: it may be hung, so this must not wait for it
        // (unlike Drop, which lets closes finish first).
        let mut done = Vec::new();
        self.fail_conn(conn, "", &mut done);
        self.deferred.append(&mut done);
    }
}
