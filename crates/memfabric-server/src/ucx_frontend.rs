//! The UCX data path of memfabricd (docs/fabric-protocol.md).
//!
//! A client opens a TCP connection to `--ucx-port` and sends HELLO with its UCX worker
//! address. The listener hands the connection to a worker thread round-robin, as it does
//! TCP connections; that worker creates a UCX endpoint to the client, answers WELCOME
//! (its own worker address, the session id, the eager limit and the registered arena's
//! rkey), and from then on serves the client's active messages in the same event loop as
//! its sockets. The TCP connection stays open as the session's lifeline: when it closes,
//! the client is gone, and its endpoint and anything in flight are dropped. (UCX 1.13's
//! shared-memory transports cannot report a dead peer, so UCX's own error handling is
//! not relied on.)
//!
//! Values up to the eager limit travel with their request or response. Larger SET values
//! come by rendezvous and are received straight into a freshly allocated item (a
//! `PendingItem`), which is linked only once every byte has arrived; larger GET values
//! are sent from the item's own memory, pinned until the send completes.
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memfabric_proto::ucx_wire::{self as fp, Opcode, Request, Response, Status};
use memfabric_store::{
    ArithStatus, DeleteStatus, GetOptions, PendingItem, PinnedItem, SetMode, StoreStatus,
};
use memfabric_ucx as mf;
use mio::{Interest, Registry, Token};

use crate::command::{self, Arith, Delivery, Lookup, Retrieval, StoreAccounting, StoreArgs};
use crate::counters::ThreadStats;
use crate::exec::{ExecCtx, Shared, Transport};
use crate::shared::{Inbox, Target, Waiter};

/// mio tokens of UCX bootstrap/lifeline connections start here (far above TCP conns).
pub const TOKEN_BASE: usize = 1 << 40;
/// The worker's UCX event fd.
pub const EFD_TOKEN: Token = Token(usize::MAX - 10);
/// The fabric's deadline timer (HELLO and transfer deadlines).
const TIMER_TOKEN: Token = Token(usize::MAX - 11);
/// How often deadlines are checked while any is pending.
const TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// Longest HELLO accepted (its worker address is bounded by `fp::BLOB_MAX`).
const HELLO_MAX: usize = 16 + fp::BLOB_MAX;

/// GET values from this size up to the eager limit are sent in place from item memory.
const IN_PLACE_MIN: usize = 1024;

/// Token of response sends: nothing to do on completion but drop the buffer.
const SEND_TOKEN: mf::Token = 0;

/// One client: its lifeline socket and, after HELLO, its endpoint.
struct Client {
    stream: mio::net::TcpStream,
    inbuf: Vec<u8>,
    /// Unsent WELCOME bytes.
    outbuf: Vec<u8>,
    /// WELCOME said no: close once it is sent.
    refused: bool,
    session: Option<(u32, mf::Endpoint)>,
    /// When the bootstrap connection was accepted (HELLO deadline).
    accepted: Instant,
    /// Rendezvous bytes in flight to and from this session.
    inflight: u64,
    /// Requests waiting for `inflight` to fall (in arrival order), and their size.
    waiting: VecDeque<mf::AmMessage>,
    waiting_bytes: u64,
}

/// A rendezvous send in flight (a large GET value, pinned, or a large stats text).
struct Sending {
    session: u32,
    bytes: u64,
    started: Instant,
    /// Lets go of the item's pin when the session ends before the send does.
    pin: Option<mf::Detach>,
}

/// A rendezvous receive in flight.
struct Receiving {
    session: u32,
    bytes: u64,
    started: Instant,
    opcode: Opcode,
    opaque: u64,
    noreply: bool,
    cas: u64,
    flags: u32,
    exptime: u32,
    key: Vec<u8>,
}

/// A pending item as a receive target: UCX writes the value into item memory.
struct ItemTarget(PendingItem);

impl mf::RecvBuf for ItemTarget {
    fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        self.0.value_slices_mut()
    }
}

/// A pinned item as a send source: UCX reads the value from item memory.
struct PinnedSource(PinnedItem);

impl mf::SendBuf for PinnedSource {
    fn slices(&self) -> Vec<&[u8]> {
        self.0.value_slices()
    }
}

/// A worker thread's share of the fabric: its UCX worker and its clients.
pub struct FabricWorker {
    fs: Arc<SharedRef>,
    w: mf::Worker,
    clients: HashMap<Token, Client>,
    by_session: HashMap<u32, Token>,
    next_client: usize,
    receiving: HashMap<mf::Token, Receiving>,
    sending: HashMap<mf::Token, Sending>,
    next_token: mf::Token,
    worker_index: u32,
    /// Deadlines: armed while a client has not said HELLO or a transfer is in flight.
    timer: nix::sys::timerfd::TimerFd,
    timer_armed: bool,
    /// Reused between progress rounds.
    events_buf: std::collections::VecDeque<mf::Event>,
    /// Reused for eager GET values.
    scratch: Vec<u8>,
    /// Where this worker hears that a pending command is ready.
    inbox: Option<Arc<Inbox>>,
    /// Retrievals waiting for their result, by ticket.
    held: HashMap<u64, HeldRequest>,
}

/// A request that answered "pending": enough to run it again when it is ready.
struct HeldRequest {
    opcode: Opcode,
    flags: u8,
    session: u32,
    opaque: u64,
    exptime: u32,
    key: Vec<u8>,
}

/// What a fabric worker needs from the server (kept behind one Arc).
pub struct SharedRef(pub Arc<Shared>);

impl FabricWorker {
    /// Create this thread's UCX worker and register its event fd with `registry`.
    pub fn new(
        shared: &Arc<Shared>,
        worker_index: u32,
        registry: &Registry,
    ) -> io::Result<Option<FabricWorker>> {
        let Some(fs) = shared.fabric.as_ref() else {
            return Ok(None);
        };
        let mut w = mf::Worker::new(&fs.ctx).map_err(io::Error::other)?;
        w.set_am_handler(fp::AM_REQUEST).map_err(io::Error::other)?;
        w.set_am_handler(fp::AM_HINTS).map_err(io::Error::other)?;
        let efd = w.event_fd().map_err(io::Error::other)?;
        registry.register(
            &mut mio::unix::SourceFd(&efd),
            EFD_TOKEN,
            Interest::READABLE,
        )?;
        use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        {
            use std::os::fd::{AsFd, AsRawFd};
            registry.register(
                &mut mio::unix::SourceFd(&timer.as_fd().as_raw_fd()),
                TIMER_TOKEN,
                Interest::READABLE,
            )?;
        }
        Ok(Some(FabricWorker {
            fs: Arc::new(SharedRef(Arc::clone(shared))),
            w,
            clients: HashMap::new(),
            by_session: HashMap::new(),
            next_client: 0,
            receiving: HashMap::new(),
            sending: HashMap::new(),
            next_token: 1,
            worker_index,
            timer,
            timer_armed: false,
            events_buf: std::collections::VecDeque::new(),
            scratch: Vec::new(),
            inbox: None,
            held: HashMap::new(),
        }))
    }

    fn shared(&self) -> &Shared {
        &self.fs.0
    }

    /// Where the worker hears that pending commands are ready (its inbox).
    pub fn set_inbox(&mut self, inbox: Arc<Inbox>) {
        self.inbox = Some(inbox);
    }

    /// Pending request `ticket` is ready: run it again (it completes now) and answer it.
    pub fn complete(&mut self, stats: &ThreadStats, ticket: u64) {
        let Some(h) = self.held.remove(&ticket) else {
            return;
        };
        if !self.by_session.contains_key(&h.session) {
            // Its client is gone.
            return;
        }
        let shared = Arc::clone(&self.fs);
        let mut ctx = ExecCtx {
            shared: &shared.0,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(h.session),
            waiter: None,
        };
        let req = Request {
            opcode: h.opcode,
            flags: h.flags,
            session: h.session,
            opaque: h.opaque,
            item_flags: 0,
            exptime: h.exptime,
            cas: 0,
            value_len: 0,
            key: &h.key,
        };
        let noreply = req.flags & fp::FLAG_NOREPLY != 0;
        self.execute(&mut ctx, &req, noreply);
    }

    /// Take a new bootstrap connection from the listener.
    pub fn add_client(&mut self, registry: &Registry, mut stream: mio::net::TcpStream) {
        let token = Token(TOKEN_BASE + self.next_client);
        self.next_client = (self.next_client + 1) % (1 << 30);
        if let Err(e) =
            registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!("cannot register a UCX bootstrap connection: {e}");
            // The listener counted it toward `-c`.
            self.shared()
                .curr_connections
                .fetch_sub(1, Ordering::SeqCst);
            return;
        }
        self.clients.insert(
            token,
            Client {
                stream,
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                refused: false,
                session: None,
                accepted: Instant::now(),
                inflight: 0,
                waiting: VecDeque::new(),
                waiting_bytes: 0,
            },
        );
        self.arm_timer();
    }

    /// Keep the deadline timer ticking while there is a deadline to watch.
    fn arm_timer(&mut self) {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        let settings = &self.shared().settings;
        let watch_hello =
            settings.ucx_hello_timeout > 0 && self.clients.values().any(|c| c.session.is_none());
        let watch_transfers = settings.ucx_transfer_timeout > 0
            && !(self.sending.is_empty() && self.receiving.is_empty());
        let want = watch_hello || watch_transfers;
        if want == self.timer_armed {
            return;
        }
        let r = if want {
            self.timer.set(
                Expiration::Interval(TimeSpec::from_duration(TICK)),
                TimerSetTimeFlags::empty(),
            )
        } else {
            self.timer.unset()
        };
        match r {
            Ok(()) => self.timer_armed = want,
            Err(e) => tracing::warn!("UCX deadline timer: {e}"),
        }
    }

    /// The deadline timer fired: close bootstrap connections that did not say HELLO in
    /// time, and end sessions whose transfers outlived the transfer deadline (UCX 1.13
    /// cannot cancel one request: closing the endpoint cancels them all).
    fn on_timer(&mut self, registry: &Registry) {
        let _ = self.timer.wait();
        let settings = &self.fs.0.settings;
        let now = Instant::now();
        let hello = Duration::from_secs(u64::from(settings.ucx_hello_timeout));
        let transfer = Duration::from_secs(u64::from(settings.ucx_transfer_timeout));
        if !hello.is_zero() {
            let late: Vec<Token> = self
                .clients
                .iter()
                .filter(|(_, c)| c.session.is_none() && now.duration_since(c.accepted) > hello)
                .map(|(t, _)| *t)
                .collect();
            for t in late {
                if let Some(fs) = self.shared().fabric.as_ref() {
                    fs.hello_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                self.drop_client(registry, t);
            }
        }
        if !transfer.is_zero() {
            let mut late: Vec<u32> = self
                .sending
                .values()
                .filter(|x| now.duration_since(x.started) > transfer)
                .map(|x| x.session)
                .chain(
                    self.receiving
                        .values()
                        .filter(|x| now.duration_since(x.started) > transfer)
                        .map(|x| x.session),
                )
                .collect();
            late.sort_unstable();
            late.dedup();
            for id in late {
                let Some(&t) = self.by_session.get(&id) else {
                    continue;
                };
                if let Some(fs) = self.shared().fabric.as_ref() {
                    fs.transfer_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(
                    "ucx session {id}: a transfer took longer than {}s; closing the session",
                    transfer.as_secs()
                );
                self.drop_client(registry, t);
            }
        }
        self.arm_timer();
    }

    /// Before sleeping: `false` if UCX has work right now (do not block).
    pub fn arm(&mut self) -> bool {
        matches!(self.w.arm(), Ok(true))
    }

    /// A bootstrap/lifeline socket is ready.
    pub fn drive_stream(&mut self, registry: &Registry, token: Token) {
        if token == TIMER_TOKEN {
            self.on_timer(registry);
            return;
        }
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let mut closed = false;
        let mut buf = [0u8; 4096];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    if c.session.is_some() || c.inbuf.len() + n > HELLO_MAX {
                        // Nothing may follow HELLO: a confused or hostile peer.
                        closed = true;
                        break;
                    }
                    c.inbuf.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        if !closed && c.session.is_none() && !c.inbuf.is_empty() {
            match fp::decode_hello(&c.inbuf) {
                Ok(None) => {}
                Ok(Some((hello, used))) if used == c.inbuf.len() => {
                    self.welcome(token, hello);
                }
                // Bytes after HELLO, or not a HELLO at all.
                Ok(Some(_)) | Err(_) => closed = true,
            }
        }
        if !closed {
            closed = !self.flush_out(token);
        }
        if closed {
            self.drop_client(registry, token);
        }
    }

    /// Answer a HELLO: connect to the client's worker and queue WELCOME (a refusal is
    /// sent too; `flush_out` then drops the client).
    fn welcome(&mut self, token: Token, hello: fp::Hello) {
        let shared = Arc::clone(&self.fs);
        let shared = &shared.0;
        let fs = shared
            .fabric
            .as_ref()
            .expect("fabric worker without fabric");
        let mut reply = fp::Welcome {
            version: fp::VERSION,
            ..Default::default()
        };
        if hello.version != fp::VERSION {
            reply.status = fp::WELCOME_BAD_VERSION;
        } else {
            match (self.connect_client(&hello.worker_address), self.w.address()) {
                (Ok(ep), Ok(addr)) => {
                    reply.peer_errors = ep.peer_errors();
                    if ep.peer_errors() {
                        fs.peer_error_sessions.fetch_add(1, Ordering::Relaxed);
                    }
                    let id = fs.next_session.fetch_add(1, Ordering::Relaxed);
                    let store = &shared.store;
                    reply.session = id;
                    reply.eager_max = fs.eager_max as u32;
                    reply.item_size_max = store.config().item_size_max as u64;
                    reply.clock = store.clock().now();
                    reply.started_unix = u64::from(store.clock().started());
                    reply.arena_base = fs.arena.base;
                    reply.arena_len = fs.arena.len;
                    reply.index_base = fs.index.base;
                    reply.index_len = fs.index.len;
                    reply.worker_address = addr;
                    reply.arena_rkey = fs.arena.rkey.clone();
                    reply.index_rkey = fs.index.rkey.clone();
                    fs.curr_sessions.fetch_add(1, Ordering::Relaxed);
                    fs.total_sessions.fetch_add(1, Ordering::Relaxed);
                    self.by_session.insert(id, token);
                    if let Some(c) = self.clients.get_mut(&token) {
                        c.session = Some((id, ep));
                    }
                    tracing::debug!(
                        "ucx session {id} on worker {} (client address {} bytes)",
                        self.worker_index,
                        hello.worker_address.len()
                    );
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::debug!("cannot connect to a UCX client: {e}");
                    reply.status = fp::WELCOME_REFUSED;
                }
            }
        }
        if let Some(c) = self.clients.get_mut(&token) {
            c.inbuf.clear();
            c.outbuf.extend_from_slice(&reply.encode());
            c.refused = reply.status != fp::WELCOME_OK;
        }
    }

    /// An endpoint to a client: with UCX peer-failure handling when the transports in use
    /// support it (then a client that dies mid-transfer has its transfers cancelled and
    /// their items freed at once), otherwise without (UCX 1.13's shared-memory transports;
    /// the lifeline still ends the session). UCX refuses to create the endpoint in peer
    /// mode when no transport can carry it so.
    ///
    /// Nothing is sent on the endpoint here: the client's endpoint to us wires the pair up
    /// when the client first sends. (A probe sent from here made us open the transport
    /// connection to the client ourselves, and UCX 1.13 aborts the process when that
    /// fails mid wire-up, as it does for a client that died after HELLO.)
    fn connect_client(&mut self, address: &[u8]) -> mf::Result<mf::Endpoint> {
        self.w.set_peer_errors(true);
        let ep = self.w.connect_address(address).or_else(|_| {
            self.w.set_peer_errors(false);
            self.w.connect_address(address)
        });
        self.w.set_peer_errors(false);
        ep
    }

    /// Write queued WELCOME bytes. `false` if the socket failed.
    fn flush_out(&mut self, token: Token) -> bool {
        let Some(c) = self.clients.get_mut(&token) else {
            return false;
        };
        while !c.outbuf.is_empty() {
            match c.stream.write(&c.outbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    c.outbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        // A refused client has been told; now let it go.
        !c.refused
    }

    /// A pinned send is over (done, or given up with its session): count the pin gone.
    fn unpinned(&self, x: &Sending) {
        if let (Some(fs), Some(_)) = (self.shared().fabric.as_ref(), x.pin.as_ref()) {
            fs.pins.fetch_sub(1, Ordering::Relaxed);
            fs.pinned_bytes.fetch_sub(x.bytes, Ordering::Relaxed);
        }
    }

    fn drop_client(&mut self, registry: &Registry, token: Token) {
        let Some(mut c) = self.clients.remove(&token) else {
            return;
        };
        let _ = registry.deregister(&mut c.stream);
        // Closed first: a client still alive (stalled) sees its session end before any
        // pinned memory below is let go, and does not trust a value it pulls after that.
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        // The bootstrap connection (and the session it became) held a `-c` slot.
        self.shared()
            .curr_connections
            .fetch_sub(1, Ordering::SeqCst);
        // Requests still waiting are dropped unanswered (the client is gone, or is told
        // by the lifeline closing); their rendezvous descriptors go back to UCX.
        c.waiting.clear();
        if let Some((id, ep)) = c.session.take() {
            self.by_session.remove(&id);
            let receiving = self.receiving.values().filter(|r| r.session == id).count();
            let sending = self.sending.values().filter(|r| r.session == id).count();
            if let Some(fs) = self.shared().fabric.as_ref() {
                fs.curr_sessions.fetch_sub(1, Ordering::Relaxed);
                // Without peer-failure handling UCX can neither cancel nor fail a receive
                // from a gone peer: it is orphaned (counted until UCX completes it).
                if receiving > 0 && !ep.peer_errors() {
                    fs.orphaned_receives
                        .fetch_add(receiving as u64, Ordering::Relaxed);
                }
                fs.receives_cancelled
                    .fetch_add(receiving as u64, Ordering::Relaxed);
                fs.sends_cancelled
                    .fetch_add(sending as u64, Ordering::Relaxed);
            }
            // The peer is gone (or given up on): a forced close completes every transfer
            // in flight to it with an error, which frees pending items and unpins items.
            // Without peer-failure handling UCX completes none of them; sends then let go
            // of their items' pins here (UCX keeps reading, if ever, from mapped memory).
            self.w.close(ep, true);
            let gone: Vec<mf::Token> = self
                .sending
                .iter()
                .filter(|(_, x)| x.session == id)
                .map(|(t, _)| *t)
                .collect();
            for t in gone {
                if let Some(x) = self.sending.remove(&t) {
                    if let Some(d) = x.pin.as_ref() {
                        d.detach();
                    }
                    self.unpinned(&x);
                }
            }
            tracing::debug!(
                "ucx session {id} closed ({receiving} receives, {sending} sends in flight)"
            );
        }
    }

    /// Progress UCX until it is idle and serve what arrived. Returns whether anything
    /// happened.
    pub fn progress(&mut self, registry: &Registry, stats: &ThreadStats) -> bool {
        let mut active = false;
        let mut events = std::mem::take(&mut self.events_buf);
        for _ in 0..64 {
            let n = self.w.progress();
            self.w.drain_into(&mut events);
            if n == 0 && events.is_empty() {
                break;
            }
            active = true;
            while let Some(e) = events.pop_front() {
                self.handle(registry, stats, e);
            }
        }
        self.events_buf = events;
        active
    }

    fn handle(&mut self, registry: &Registry, stats: &ThreadStats, e: mf::Event) {
        match e {
            mf::Event::Am(msg) if msg.id == fp::AM_HINTS => self.hints(stats, msg),
            mf::Event::Am(msg) => self.request(registry, stats, msg, false),
            mf::Event::Done { token, result, buf } => {
                if token == SEND_TOKEN {
                    return; // the response buffer is released here
                }
                if let Some(x) = self.sending.remove(&token) {
                    // The item's pin (or the text) goes with the buffer, before the counts.
                    drop(buf);
                    if let Err(e) = result {
                        tracing::debug!("ucx send to session {} failed: {e}", x.session);
                    }
                    self.unpinned(&x);
                    self.transfer_done(registry, stats, x.session, x.bytes);
                    return;
                }
                if let Some(r) = self.receiving.remove(&token) {
                    if let Some(fs) = self.shared().fabric.as_ref() {
                        fs.receives.fetch_sub(1, Ordering::Relaxed);
                        fs.receiving_bytes.fetch_sub(r.bytes, Ordering::Relaxed);
                    }
                    let (session, bytes) = (r.session, r.bytes);
                    self.received(stats, r, result, buf);
                    self.transfer_done(registry, stats, session, bytes);
                }
            }
            mf::Event::EpFailed { ep, error } => {
                // The peer is gone (UCX noticed before the lifeline did): end its session.
                tracing::debug!("ucx endpoint {ep} failed: {error}");
                let dead = self.clients.iter().find_map(|(t, c)| {
                    let (_, e) = c.session.as_ref()?;
                    (e.id() == ep).then_some(*t)
                });
                if let Some(t) = dead {
                    self.drop_client(registry, t);
                }
            }
            mf::Event::ConnRequest(_) => {}
        }
    }

    /// Send a response that carries only a status.
    fn respond_status(&mut self, session: u32, op: Opcode, opaque: u64, status: Status) {
        self.respond(session, Response::status_only(op, opaque, status), None);
    }

    /// Send a response (with optional data) to a session.
    fn respond(&mut self, session: u32, r: Response, data: Option<Box<dyn mf::SendBuf>>) {
        let Some(ep) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        let header = r.to_bytes();
        // Fast path: most eager responses complete inside the call, with no copies of
        // header or value into owned buffers. (Rendezvous replies go by `send_rndv`.)
        let now = match &data {
            None => self.w.am_send_now(ep, fp::AM_RESPONSE, &header, &[], false),
            Some(d) => match d.slices().as_slice() {
                [one] => self.w.am_send_now(ep, fp::AM_RESPONSE, &header, one, false),
                _ => Ok(false),
            },
        };
        match now {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                tracing::debug!("ucx send to session {session} failed: {e}");
                return;
            }
        }
        let how = mf::SendHow {
            proto: mf::Proto::Eager,
            reply: false,
        };
        if let Err(e) = self
            .w
            .am_send(ep, fp::AM_RESPONSE, header.to_vec(), data, how, SEND_TOKEN)
        {
            tracing::debug!("ucx send to session {session} failed: {e}");
        }
    }

    /// Access hints from a one-sided reader: the items it read, marked as used so that
    /// eviction does not take what is hot only remotely. Advisory and unanswered; a
    /// malformed batch or one from an unknown session is dropped and counted.
    fn hints(&mut self, stats: &ThreadStats, msg: mf::AmMessage) {
        let data: &[u8] = match &msg.data {
            mf::AmData::None => &[],
            mf::AmData::Eager(v) => v,
            mf::AmData::Held(h) => h.as_ref(),
            // Hints are small and always eager; a rendezvous one is not worth pulling.
            mf::AmData::Rndv(_) => {
                stats.protocol_errors.incr();
                return;
            }
        };
        let Some((session, hints)) = memfabric_proto::onesided::decode_hints(&msg.header, data)
        else {
            stats.protocol_errors.incr();
            return;
        };
        if !self.by_session.contains_key(&session) {
            stats.protocol_errors.incr();
            return;
        }
        let hints: Vec<(u64, u32)> = hints.collect();
        let taken = self.fs.0.store.note_remote_accesses(&hints) as u64;
        if let Some(fs) = self.fs.0.fabric.as_ref() {
            fs.hints_taken.fetch_add(taken, Ordering::Relaxed);
            fs.hints_stale
                .fetch_add(hints.len() as u64 - taken, Ordering::Relaxed);
        }
    }

    /// A rendezvous transfer of `session` finished: serve what waited for it.
    fn transfer_done(
        &mut self,
        registry: &Registry,
        stats: &ThreadStats,
        session: u32,
        bytes: u64,
    ) {
        let cap = self.shared().settings.ucx_session_inflight_max;
        if let Some(c) = self
            .by_session
            .get(&session)
            .and_then(|t| self.clients.get_mut(t))
        {
            c.inflight = c.inflight.saturating_sub(bytes);
        }
        while let Some(c) = self
            .by_session
            .get(&session)
            .and_then(|t| self.clients.get_mut(t))
        {
            let Some(front) = c.waiting.front() else {
                break;
            };
            let (op, rndv) = waiting_shape(front);
            if must_wait(c.inflight, cap, op, rndv) {
                break;
            }
            let Some(msg) = c.waiting.pop_front() else {
                break;
            };
            c.waiting_bytes = c.waiting_bytes.saturating_sub(waiting_size(&msg));
            self.request(registry, stats, msg, true);
        }
        self.arm_timer();
    }

    /// Park a request of `session` until its transfers in flight fall under the cap; a
    /// session that piles up more than the cap in waiting requests is closed.
    fn defer(&mut self, registry: &Registry, session: u32, msg: mf::AmMessage) {
        let cap = self.shared().settings.ucx_session_inflight_max;
        let Some(&t) = self.by_session.get(&session) else {
            return;
        };
        let Some(c) = self.clients.get_mut(&t) else {
            return;
        };
        c.waiting_bytes += waiting_size(&msg);
        c.waiting.push_back(msg);
        let over = c.waiting_bytes > cap.max(1 << 20) || c.waiting.len() > WAITING_MAX;
        if let Some(fs) = self.fs.0.fabric.as_ref() {
            fs.requests_deferred.fetch_add(1, Ordering::Relaxed);
            if over {
                fs.sessions_overflowed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if over {
            tracing::info!(
                "ucx session {session}: more requests waiting than --ucx-session-inflight-max \
                 allows; closing the session"
            );
            self.drop_client(registry, t);
        }
    }

    fn request(
        &mut self,
        registry: &Registry,
        stats: &ThreadStats,
        msg: mf::AmMessage,
        replayed: bool,
    ) {
        let shared = Arc::clone(&self.fs);
        let shared = &shared.0;
        let Some(ids) = fp::request_ids(&msg.header) else {
            stats.protocol_errors.incr();
            return;
        };
        let known = self.by_session.contains_key(&ids.session);
        if known && !replayed {
            let cap = shared.settings.ucx_session_inflight_max;
            let wait = self
                .by_session
                .get(&ids.session)
                .and_then(|t| self.clients.get(t))
                .is_some_and(|c| {
                    let (op, rndv) = waiting_shape(&msg);
                    !c.waiting.is_empty() || must_wait(c.inflight, cap, op, rndv)
                });
            if wait {
                self.defer(registry, ids.session, msg);
                return;
            }
        }
        let req = match fp::decode_request(&msg.header) {
            Ok(r) if known => r,
            other => {
                stats.protocol_errors.incr();
                let status = match other {
                    Ok(_) => Status::UnknownSession,
                    Err(fp::DecodeError::UnknownOpcode(_)) => Status::UnknownCommand,
                    Err(_) => Status::Invalid,
                };
                let op = Opcode::from_u8(ids.opcode).unwrap_or(Opcode::Noop);
                let r = Response::status_only(op, ids.opaque, status);
                if known {
                    self.respond(ids.session, r, None);
                } else if msg.has_reply_ep() {
                    let _ = self.w.reply(&msg, fp::AM_RESPONSE, r.encode(), SEND_TOKEN);
                }
                return;
            }
        };
        let session = req.session;
        let (data_len, data) = match msg.data {
            mf::AmData::None => (0, None),
            mf::AmData::Eager(v) => (v.len(), Some(Ok(v))),
            // The server registers copying handlers; a held buffer is copied here.
            mf::AmData::Held(h) => (h.as_ref().len(), Some(Ok(h.as_ref().to_vec()))),
            mf::AmData::Rndv(d) => (d.len(), Some(Err(d))),
        };
        let noreply = req.flags & fp::FLAG_NOREPLY != 0;
        let keyed = !matches!(
            req.opcode,
            Opcode::FlushAll | Opcode::Stats | Opcode::Version | Opcode::Noop
        );
        if keyed && req.key.is_empty() {
            stats.protocol_errors.incr();
            self.respond_status(session, req.opcode, req.opaque, Status::Invalid);
            return;
        }
        let carries_value = matches!(
            req.opcode,
            Opcode::Set
                | Opcode::Add
                | Opcode::Replace
                | Opcode::Append
                | Opcode::Prepend
                | Opcode::Cas
        );
        if req.value_len != data_len as u64 || (!carries_value && data_len != 0) {
            stats.protocol_errors.incr();
            self.respond_status(session, req.opcode, req.opaque, Status::Invalid);
            return;
        }
        // A session may have as many requests waiting as a connection may; past that
        // they complete at once.
        let held = self.held.values().filter(|h| h.session == session).count();
        let inbox = self.inbox.clone();
        let waiter = inbox
            .as_ref()
            .filter(|_| held < crate::exec::MAX_PARKED)
            .map(|inbox| Waiter {
                inbox,
                target: Target::Ucx,
            });
        let mut ctx = ExecCtx {
            shared,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(session),
            waiter,
        };
        if carries_value {
            match data {
                None => self.store_value(&mut ctx, &req, &[], noreply),
                Some(Ok(v)) => self.store_value(&mut ctx, &req, &v, noreply),
                Some(Err(d)) => self.receive_value(&mut ctx, &req, d, noreply),
            }
            return;
        }
        self.execute(&mut ctx, &req, noreply);
    }

    /// Store a value that is already here.
    fn store_value(
        &mut self,
        ctx: &mut ExecCtx<'_>,
        req: &Request<'_>,
        value: &[u8],
        noreply: bool,
    ) {
        let exptime = ctx.shared.store.clock().exptime(i64::from(req.exptime));
        let args = store_args(req.opcode, req.key, req.item_flags, exptime, req.cas);
        let status = command::store(ctx, &args, value);
        self.answer_store(req.session, req.opcode, req.opaque, status, noreply);
    }

    /// A value arriving by rendezvous: allocate the item and receive into it (append and
    /// prepend, which build a new value from the old one, receive into a buffer).
    fn receive_value(
        &mut self,
        ctx: &mut ExecCtx<'_>,
        req: &Request<'_>,
        d: mf::RndvData,
        noreply: bool,
    ) {
        let store = &ctx.shared.store;
        let exptime = store.clock().exptime(i64::from(req.exptime));
        let args = store_args(req.opcode, req.key, req.item_flags, exptime, req.cas);
        let len = d.len();
        let target: Box<dyn mf::RecvBuf> = if matches!(req.opcode, Opcode::Append | Opcode::Prepend)
        {
            if len > store.config().item_size_max {
                drop(d);
                command::refuse_too_large(ctx, &args);
                let status = StoreStatus::TooLarge;
                self.answer_store(req.session, req.opcode, req.opaque, status, noreply);
                return;
            }
            Box::new(vec![0u8; len])
        } else {
            match command::alloc_pending(ctx, &args, len) {
                Ok(p) => Box::new(ItemTarget(p)),
                Err(status) => {
                    drop(d); // tells the sender to give up the transfer
                    self.answer_store(req.session, req.opcode, req.opaque, status, noreply);
                    return;
                }
            }
        };
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let r = Receiving {
            session: req.session,
            bytes: len as u64,
            started: Instant::now(),
            opcode: req.opcode,
            opaque: req.opaque,
            noreply,
            cas: req.cas,
            flags: req.item_flags,
            exptime,
            key: req.key.to_vec(),
        };
        match self.w.recv_rndv(d, target, token) {
            Ok(mf::Posted::Pending) => {
                if let Some(fs) = ctx.shared.fabric.as_ref() {
                    fs.receives.fetch_add(1, Ordering::Relaxed);
                    fs.receiving_bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                if let Some(c) = self
                    .by_session
                    .get(&req.session)
                    .and_then(|t| self.clients.get_mut(t))
                {
                    c.inflight += len as u64;
                }
                self.receiving.insert(token, r);
                self.arm_timer();
            }
            Ok(mf::Posted::Done(buf)) => self.received(ctx.stats, r, Ok(()), buf),
            Err(e) => self.received(ctx.stats, r, Err(e), None),
        }
    }

    /// A rendezvous receive finished: link the item (or give up on it).
    fn received(
        &mut self,
        stats: &ThreadStats,
        r: Receiving,
        result: mf::Result<()>,
        buf: Option<Box<dyn std::any::Any>>,
    ) {
        let shared = Arc::clone(&self.fs);
        let ctx = ExecCtx {
            shared: &shared.0,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(r.session),
            waiter: None,
        };
        tracing::trace!("ucx receive for session {} done: {result:?}", r.session);
        if !self.by_session.contains_key(&r.session) {
            // Completed after its session ended: no longer orphaned if it was counted.
            if let Some(fs) = shared.0.fabric.as_ref() {
                let _ =
                    fs.orphaned_receives
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
        if let Err(e) = result {
            // The item (inside buf) is dropped unlinked: nothing half-written is visible.
            drop(buf);
            tracing::debug!("ucx receive for session {} failed: {e}", r.session);
            self.respond_status(r.session, r.opcode, r.opaque, Status::Failed);
            return;
        }
        let args = store_args(r.opcode, &r.key, r.flags, r.exptime, r.cas);
        let status = match buf {
            Some(b) => match b.downcast::<ItemTarget>() {
                Ok(item) => command::store_pending(&ctx, &args, item.0),
                Err(b) => match b.downcast::<Vec<u8>>() {
                    Ok(v) => command::store(&ctx, &args, &v),
                    Err(_) => StoreStatus::NotStored,
                },
            },
            None => StoreStatus::NotStored,
        };
        self.answer_store(r.session, r.opcode, r.opaque, status, r.noreply);
    }

    /// Answer a storage outcome (counted by the command), as the binary protocol does.
    fn answer_store(
        &mut self,
        session: u32,
        op: Opcode,
        opaque: u64,
        status: StoreStatus,
        noreply: bool,
    ) {
        let st = match status {
            StoreStatus::Stored { cas } => {
                if noreply {
                    return;
                }
                let mut r = Response::status_only(op, opaque, Status::Ok);
                r.cas = cas;
                self.respond(session, r, None);
                return;
            }
            StoreStatus::Exists => Status::Exists,
            StoreStatus::NotFound => Status::NotFound,
            StoreStatus::NotStored => Status::NotStored,
            StoreStatus::TooLarge => Status::TooLarge,
            StoreStatus::OutOfMemory => Status::NoMemory,
        };
        self.respond_status(session, op, opaque, st);
    }

    /// Everything but storage.
    fn execute(&mut self, ctx: &mut ExecCtx<'_>, req: &Request<'_>, noreply: bool) {
        let shared = ctx.shared;
        let store = &shared.store;
        let (session, op, opaque) = (req.session, req.opcode, req.opaque);
        let ok = Response::status_only(op, opaque, Status::Ok);
        match op {
            Opcode::Get | Opcode::Gat => {
                let eager_max = shared.fabric.as_ref().map_or(usize::MAX, |f| f.eager_max);
                let how = if op == Opcode::Gat {
                    Retrieval::Touch(store.clock().exptime(i64::from(req.exptime)))
                } else {
                    Retrieval::Get
                };
                // Small values are copied out lock-free; larger eager ones are sent in place
                // from item memory under the bucket lock (one copy fewer); larger still by
                // rendezvous from the pinned item.
                let delivery = Delivery {
                    copy_limit: eager_max.min(IN_PLACE_MIN - 1),
                    pin_large: false,
                    bump: true,
                };
                // The value lands in a buffer reused across requests; it is copied into an
                // owned one only if UCX cannot send it at once.
                let mut value = std::mem::take(&mut self.scratch);
                value.clear();
                let found = command::get(ctx, req.key, how, delivery, &mut value, |_, _| {});
                let info = match found {
                    Lookup::Hit(info, _) => info,
                    Lookup::Miss => {
                        self.scratch = value;
                        self.respond_status(session, op, opaque, Status::NotFound);
                        return;
                    }
                    Lookup::Pending(ticket) => {
                        self.scratch = value;
                        let held = HeldRequest {
                            opcode: op,
                            flags: req.flags,
                            session,
                            opaque,
                            exptime: req.exptime,
                            key: req.key.to_vec(),
                        };
                        self.held.insert(ticket.0, held);
                        return;
                    }
                };
                let mut r = Response {
                    opcode: op,
                    status: Status::Ok,
                    item_flags: info.flags,
                    opaque,
                    cas: info.cas,
                    value: u64::from(info.value_len),
                };
                let len = info.value_len as usize;
                if len <= delivery.copy_limit {
                    self.respond_value(session, r, &value);
                    self.scratch = value;
                    return;
                }
                self.scratch = value;
                if len <= eager_max {
                    self.respond_in_place(store, session, r, req.key);
                    return;
                }
                // Large: send from the item itself, pinned until the send completes.
                let quiet = GetOptions {
                    touch: None,
                    bump: false,
                    ..GetOptions::default()
                };
                match store.get_pinned(req.key, &quiet) {
                    Some((info, pin)) => {
                        r.item_flags = info.flags;
                        r.cas = info.cas;
                        r.value = u64::from(info.value_len);
                        let len = r.value;
                        let mapped = Box::new(Arc::clone(&self.fs));
                        // SAFETY: the pinned value lies in the store's arena, a mapping owned
                        // by the store that `mapped` (the server's shared state) keeps alive
                        // and that is never unmapped while the store lives.
                        let (data, detach) =
                            unsafe { mf::Detachable::new(Box::new(PinnedSource(pin)), mapped) };
                        self.send_rndv(session, r, Box::new(data), len, Some(detach));
                    }
                    // Deleted between the two looks: a miss is a correct answer.
                    None => self.respond_status(session, op, opaque, Status::NotFound),
                }
            }
            Opcode::Delete => {
                let st = match command::delete(ctx, req.key, req.cas) {
                    DeleteStatus::Deleted => Status::Ok,
                    DeleteStatus::NotFound => Status::NotFound,
                    DeleteStatus::Exists => Status::Exists,
                };
                if !(noreply && st == Status::Ok) {
                    self.respond_status(session, op, opaque, st);
                }
            }
            Opcode::Incr | Opcode::Decr => {
                let a = Arith {
                    incr: op == Opcode::Incr,
                    delta: req.cas,
                    cas: 0,
                    create: None,
                };
                let r = match command::arith(ctx, req.key, a).status {
                    ArithStatus::Value { value, cas } => Response { cas, value, ..ok },
                    ArithStatus::NotFound => Response::status_only(op, opaque, Status::NotFound),
                    ArithStatus::NonNumeric => {
                        Response::status_only(op, opaque, Status::NonNumeric)
                    }
                    ArithStatus::Exists => Response::status_only(op, opaque, Status::Exists),
                    ArithStatus::OutOfMemory => Response::status_only(op, opaque, Status::NoMemory),
                };
                if !(noreply && r.status == Status::Ok) {
                    self.respond(session, r, None);
                }
            }
            Opcode::Touch => {
                let exptime = store.clock().exptime(i64::from(req.exptime));
                let st = match command::touch(ctx, req.key, exptime) {
                    Some(_) => Status::Ok,
                    None => Status::NotFound,
                };
                if !(noreply && st == Status::Ok) {
                    self.respond_status(session, op, opaque, st);
                }
            }
            Opcode::FlushAll => match command::flush_all(ctx, req.exptime, false) {
                Ok(()) => {
                    if !noreply {
                        self.respond(session, ok, None);
                    }
                }
                Err(command::FlushDisabled) => {
                    self.respond_status(session, op, opaque, Status::Invalid)
                }
            },
            Opcode::Stats => {
                let group = String::from_utf8_lossy(req.key).into_owned();
                let pairs = command::stats::collect(ctx, &group);
                match pairs {
                    Some(pairs) => {
                        let mut text = Vec::new();
                        for (k, v) in pairs {
                            text.extend_from_slice(k.as_bytes());
                            text.push(b' ');
                            text.extend_from_slice(v.as_bytes());
                            text.push(b'\n');
                        }
                        let r = Response {
                            value: text.len() as u64,
                            ..ok
                        };
                        self.send_text(session, r, text);
                    }
                    None => self.respond_status(session, op, opaque, Status::NotFound),
                }
            }
            Opcode::Version => {
                let text = command::version().as_bytes().to_vec();
                let r = Response {
                    value: text.len() as u64,
                    ..ok
                };
                self.send_text(session, r, text);
            }
            Opcode::Noop => self.respond(session, ok, None),
            Opcode::Set
            | Opcode::Add
            | Opcode::Replace
            | Opcode::Append
            | Opcode::Prepend
            | Opcode::Cas => {
                unreachable!("storage requests are handled by store_value/receive_value")
            }
        }
    }

    /// Send an eager response whose value is borrowed: sent at once when UCX can, else
    /// copied into an owned buffer for an asynchronous send.
    fn respond_value(&mut self, session: u32, r: Response, value: &[u8]) {
        let Some(ep) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        match self
            .w
            .am_send_now(ep, fp::AM_RESPONSE, &r.to_bytes(), value, false)
        {
            Ok(true) => {}
            Ok(false) => {
                let data =
                    (!value.is_empty()).then(|| Box::new(value.to_vec()) as Box<dyn mf::SendBuf>);
                self.respond(session, r, data);
            }
            Err(e) => tracing::debug!("ucx send to session {session} failed: {e}"),
        }
    }

    /// Send a GET response straight from item memory: UCX copies the value out of the
    /// item while its buckets are locked (so it cannot change under the copy). If UCX
    /// cannot send at once, the value is copied into an owned buffer instead.
    fn respond_in_place(
        &mut self,
        store: &memfabric_store::Store,
        session: u32,
        r: Response,
        key: &[u8],
    ) {
        let Some(ep) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        let w = &mut self.w;
        let outcome = store.with_locked_value(key, |info, slices| {
            let r = Response {
                item_flags: info.flags,
                cas: info.cas,
                value: u64::from(info.value_len),
                ..r
            };
            if let [one] = slices {
                if let Ok(true) = w.am_send_now(ep, fp::AM_RESPONSE, &r.to_bytes(), one, false) {
                    return None;
                }
            }
            Some((r, slices.concat()))
        });
        match outcome {
            Some(None) => {}
            Some(Some((r, v))) => self.respond(session, r, Some(Box::new(v))),
            // Deleted between the two looks: a miss is a correct answer.
            None => {
                let miss = Response::status_only(r.opcode, r.opaque, Status::NotFound);
                self.respond(session, miss, None);
            }
        }
    }

    /// Send a text payload (stats, version), by rendezvous when it is large.
    fn send_text(&mut self, session: u32, r: Response, text: Vec<u8>) {
        let eager_max = self
            .shared()
            .fabric
            .as_ref()
            .map_or(usize::MAX, |f| f.eager_max);
        if text.len() > eager_max {
            let len = text.len() as u64;
            self.send_rndv(session, r, Box::new(text), len, None);
            return;
        }
        let data = (!text.is_empty()).then(|| Box::new(text) as Box<dyn mf::SendBuf>);
        self.respond(session, r, data);
    }

    /// Send a response whose data goes by rendezvous, tracked until it completes: its
    /// bytes count toward the session's bytes in flight, a pinned item toward the pins,
    /// and the transfer deadline applies.
    fn send_rndv(
        &mut self,
        session: u32,
        r: Response,
        data: Box<dyn mf::SendBuf>,
        bytes: u64,
        pin: Option<mf::Detach>,
    ) {
        let Some(&t) = self.by_session.get(&session) else {
            return;
        };
        let Some((_, ep)) = self.clients.get(&t).and_then(|c| c.session.as_ref()) else {
            return;
        };
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let how = mf::SendHow {
            proto: mf::Proto::Rndv,
            reply: false,
        };
        match self.w.am_send(
            ep,
            fp::AM_RESPONSE,
            r.to_bytes().to_vec(),
            Some(data),
            how,
            token,
        ) {
            Ok(mf::Posted::Pending) => {
                let pinned = pin.is_some();
                self.sending.insert(
                    token,
                    Sending {
                        session,
                        bytes,
                        started: Instant::now(),
                        pin,
                    },
                );
                if let Some(c) = self.clients.get_mut(&t) {
                    c.inflight += bytes;
                }
                if let Some(fs) = self.fs.0.fabric.as_ref() {
                    if pinned {
                        fs.pins.fetch_add(1, Ordering::Relaxed);
                        fs.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
                    }
                }
                self.arm_timer();
            }
            Ok(mf::Posted::Done(_)) => {}
            Err(e) => tracing::debug!("ucx send to session {session} failed: {e}"),
        }
    }

    /// Shutdown: close every client.
    pub fn close_all(&mut self, registry: &Registry) {
        let tokens: Vec<Token> = self.clients.keys().copied().collect();
        for t in tokens {
            self.drop_client(registry, t);
        }
    }

    /// Whether `token` is one of ours.
    pub fn owns(token: Token) -> bool {
        token.0 >= TOKEN_BASE && token != EFD_TOKEN
    }
}

/// Most requests one session may have waiting (besides the byte cap).
const WAITING_MAX: usize = 65536;

/// A waiting request's opcode and, for a value coming by rendezvous, its length.
fn waiting_shape(msg: &mf::AmMessage) -> (Option<Opcode>, Option<usize>) {
    let op = fp::request_ids(&msg.header).and_then(|ids| Opcode::from_u8(ids.opcode).ok());
    let rndv = match &msg.data {
        mf::AmData::Rndv(d) => Some(d.len()),
        _ => None,
    };
    (op, rndv)
}

/// What a waiting request costs to keep: its header and any eager data.
fn waiting_size(msg: &mf::AmMessage) -> u64 {
    let data = match &msg.data {
        mf::AmData::Eager(v) => v.len(),
        mf::AmData::Held(h) => h.as_ref().len(),
        mf::AmData::None | mf::AmData::Rndv(_) => 0,
    };
    (msg.header.len() + data + 64) as u64
}

/// Whether a request must wait for the session's rendezvous bytes in flight to fall: a
/// GET while they are at the cap (its reply may be large), a value by rendezvous that
/// would take them past it. With nothing in flight everything goes (one transfer larger
/// than the cap must still be possible).
fn must_wait(inflight: u64, cap: u64, op: Option<Opcode>, rndv: Option<usize>) -> bool {
    if inflight == 0 {
        return false;
    }
    if let Some(n) = rndv {
        return inflight.saturating_add(n as u64) > cap;
    }
    matches!(op, Some(Opcode::Get | Opcode::Gat)) && inflight >= cap
}

/// The endpoint of a live session. A free function over the two maps, so that callers
/// can hold it while they use the UCX worker (another field of `FabricWorker`).
fn session_ep<'a>(
    by_session: &HashMap<u32, Token>,
    clients: &'a HashMap<Token, Client>,
    session: u32,
) -> Option<&'a mf::Endpoint> {
    let t = by_session.get(&session)?;
    clients.get(t)?.session.as_ref().map(|(_, ep)| ep)
}

fn set_mode(op: Opcode) -> SetMode {
    match op {
        Opcode::Add => SetMode::Add,
        Opcode::Replace => SetMode::Replace,
        Opcode::Append => SetMode::Append,
        Opcode::Prepend => SetMode::Prepend,
        Opcode::Cas => SetMode::Cas,
        _ => SetMode::Set,
    }
}

/// A storage request's arguments (`exptime` absolute). As in the binary protocol, set,
/// add and replace with a CAS are compare-and-swap.
fn store_args(op: Opcode, key: &[u8], flags: u32, exptime: u32, cas: u64) -> StoreArgs<'_> {
    StoreArgs {
        mode: set_mode(op),
        key,
        flags,
        exptime,
        cas,
        counts_as_cas: op == Opcode::Cas
            || (cas != 0 && matches!(op, Opcode::Set | Opcode::Add | Opcode::Replace)),
        accounting: StoreAccounting::Text,
    }
}

#[cfg(test)]
mod layout_tests {
    use memfabric_proto::onesided as client_side;
    use memfabric_store::remote as store_side;

    /// The store writes the one-sided format and the client decodes it from its own copy
    /// of the layout (it must not depend on the store): both must agree.
    #[test]
    fn store_and_client_agree_on_the_one_sided_layout() {
        assert_eq!(store_side::CTL_BYTES, client_side::CTL_BYTES);
        assert_eq!(store_side::CTL_MAGIC, client_side::CTL_MAGIC);
        assert_eq!(store_side::CTL_LAYOUT, client_side::CTL_LAYOUT);
        assert_eq!(store_side::CTL_LIVE, client_side::CTL_LIVE);
        assert_eq!(store_side::BUCKET_BYTES, client_side::BUCKET_BYTES);
        assert_eq!(store_side::SLOTS, client_side::SLOTS);
        assert_eq!(store_side::ITEM_HDR, client_side::ITEM_HDR);
        assert_eq!(store_side::STATE_LINKED, client_side::STATE_LINKED);
        assert_eq!(store_side::IFLAG_CHUNKED, client_side::IFLAG_CHUNKED);
        assert_eq!(store_side::IFLAG_FETCHED, client_side::IFLAG_FETCHED);
        assert_eq!(store_side::IFLAG_REFERENCED, client_side::IFLAG_REFERENCED);
        let fields = [
            (store_side::ITEM_OFF_SEQ, 0),
            (store_side::ITEM_OFF_STATE, 4),
            (store_side::ITEM_OFF_KEY_LEN, 6),
            (store_side::ITEM_OFF_IFLAGS, 7),
            (store_side::ITEM_OFF_CAS, 8),
            (store_side::ITEM_OFF_VALUE_LEN, 16),
            (store_side::ITEM_OFF_FLAGS, 20),
            (store_side::ITEM_OFF_EXPTIME, 24),
            (store_side::ITEM_OFF_TIME, 28),
            (store_side::ITEM_OFF_CRC, 32),
            (store_side::ITEM_OFF_ATIME, 36),
        ];
        for (store_off, client_off) in fields {
            assert_eq!(store_off, client_off);
        }
        assert_eq!(
            store_side::index_len(12) as u64,
            client_side::Geometry {
                hash_seed: 0,
                hashpower: 12,
                chunk_sizes: vec![0, 88],
                page_size: 1 << 20,
                arena_len: 0,
            }
            .index_len()
        );
    }
}
