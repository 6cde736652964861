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
//!
//! This file: the worker's UCX state and its place in the worker's event loop (progress,
//! events, arming the event fd). `session.rs`: bootstrap connections and sessions;
//! `requests.rs`: decoding, flow control and running requests through the command layer;
//! `replies.rs`: encoding and sending responses.
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memfabric_proto::ucx_wire::{self as fp, Opcode, Request, Response, Status};
use memfabric_store::{ArithStatus, DeleteStatus, GetOptions, PendingItem, SetMode, StoreStatus};
use memfabric_ucx as mf;
use mio::{Interest, Registry, Token};

use crate::command::{self, Arith, Delivery, Lookup, Retrieval, StoreAccounting, StoreArgs};
use crate::counters::ThreadStats;
use crate::exec::{ExecCtx, Shared, Transport};
use crate::shared::{Inbox, Target, Waiter};

mod replies;
mod requests;
mod session;

use requests::{behind_a_receive, must_wait, waiting_shape, waiting_size};
use session::session_ep;

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
    /// With `-Y`: the HELLO held back (its worker address not yet shown to UCX) and the
    /// nonce of the challenge sent for it, until the client's proof comes.
    challenged: Option<(fp::Hello, [u8; fp::NONCE_LEN])>,
    session: Option<(u32, mf::Endpoint)>,
    /// When the bootstrap connection was accepted (HELLO deadline).
    accepted: Instant,
    /// Rendezvous bytes in flight to and from this session.
    inflight: u64,
    /// Requests waiting for `inflight` to fall, or for a value of their key still
    /// arriving (in arrival order), and their size.
    waiting: VecDeque<mf::AmMessage>,
    waiting_bytes: u64,
    /// Keys of the values this session is sending by rendezvous (received, then stored,
    /// after requests sent behind them have arrived), and how many of each.
    receiving_keys: HashMap<Box<[u8]>, u32>,
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
    /// Since when this worker has had no UCX client, transfer or held request.
    quiet_since: Option<std::time::Instant>,
    /// Quiet for at least `UCX_LINGER` (until something makes it busy again).
    dormant: bool,
    /// Endpoint closes in progress, and since when that number has not changed.
    closes_seen: Option<(usize, std::time::Instant)>,
    /// Sessions ended because a transfer on their endpoint failed (the newest
    /// `FAILED_SESSIONS_KEPT`): rendezvous offers still coming from them are abandoned,
    /// not received or released (see `mf::RndvData::abandon`).
    failed_sessions: VecDeque<u32>,
}

/// How many failed sessions are remembered: offers from one stop within a progress round
/// or two of its failure (the sender is dead); this is ample.
const FAILED_SESSIONS_KEPT: usize = 256;

/// How long endpoint closes that make no progress keep the worker attending to UCX. A
/// close can hang for good: UCX 1.13 never completes the force-close of a shared-memory
/// endpoint whose peer died with its receive FIFO full (our replies still queued for
/// it). Past this the worker may go dormant as if the close had finished; the close's
/// state stays allocated (a few hundred bytes per dead client) until the process exits.
const UCX_CLOSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a worker keeps arming and progressing UCX after its last client, transfer
/// and endpoint close are gone (for messages still in flight from a departed peer).
const UCX_LINGER: std::time::Duration = std::time::Duration::from_millis(100);

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

impl AsRef<memfabric_store::Store> for SharedRef {
    fn as_ref(&self) -> &memfabric_store::Store {
        &self.0.store
    }
}

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
            // Quiet since long enough: nothing to attend to before a first client.
            quiet_since: std::time::Instant::now().checked_sub(UCX_LINGER),
            dormant: false,
            closes_seen: None,
            failed_sessions: VecDeque::new(),
        }))
    }

    fn shared(&self) -> &Shared {
        &self.fs.0
    }

    /// Where the worker hears that pending commands are ready (its inbox).
    pub fn set_inbox(&mut self, inbox: Arc<Inbox>) {
        self.inbox = Some(inbox);
    }

    /// Whether UCX needs this worker's attention (arming before a sleep, progress after a
    /// wake-up): while it has clients, transfers, held requests or endpoints closing, and
    /// for `UCX_LINGER` after. A worker that never had a UCX client (or not for a while)
    /// spends nothing on UCX per TCP request: arming reads UCX's event fd, one system
    /// call per sleep.
    pub fn in_use(&mut self) -> bool {
        let busy = !self.clients.is_empty()
            || !self.receiving.is_empty()
            || !self.sending.is_empty()
            || !self.held.is_empty()
            || self.closes_progressing();
        if busy {
            self.quiet_since = None;
            self.dormant = false;
            return true;
        }
        if self.dormant {
            // Quiet for longer than the linger already: no need to read the clock (this
            // is asked twice per worker loop, for TCP requests too).
            return false;
        }
        let now = std::time::Instant::now();
        let lingering = now.duration_since(*self.quiet_since.get_or_insert(now)) < UCX_LINGER;
        self.dormant = !lingering;
        lingering
    }

    /// Whether endpoint closes are in progress and have not all been stuck for
    /// `UCX_CLOSE_PATIENCE` (the clock is read only while closes are pending).
    fn closes_progressing(&mut self) -> bool {
        let n = self.w.closing();
        if n == 0 {
            self.closes_seen = None;
            return false;
        }
        let now = std::time::Instant::now();
        match self.closes_seen {
            Some((seen, since)) if seen == n => now.duration_since(since) < UCX_CLOSE_PATIENCE,
            _ => {
                self.closes_seen = Some((n, now));
                true
            }
        }
    }

    /// Before sleeping: `false` if UCX has work right now (do not block).
    pub fn arm(&mut self) -> bool {
        matches!(self.w.arm(), Ok(true))
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
            // Sessions whose transfers failed end before anything else of this round is
            // served: a request of theirs queued ahead of the failure must not be
            // received from a destroyed endpoint.
            let failed: Vec<u32> = events
                .iter()
                .filter_map(|e| match e {
                    mf::Event::Done {
                        token,
                        result: Err(_),
                        ..
                    } => self
                        .receiving
                        .get(token)
                        .map(|r| r.session)
                        .or_else(|| self.sending.get(token).map(|x| x.session)),
                    _ => None,
                })
                .collect();
            for session in failed {
                self.transfer_failed(registry, session);
            }
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
                    self.receive_ended(session, &r.key);
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
