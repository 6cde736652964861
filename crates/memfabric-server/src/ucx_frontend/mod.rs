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
use crate::ucx_context::{COLD, HOT};

mod replies;
mod requests;
mod session;
mod tiers;

use requests::{behind_a_receive, must_wait, waiting_shape, waiting_size};
use session::session_ep;

/// mio tokens of UCX bootstrap/lifeline connections start here (far above TCP conns).
pub const TOKEN_BASE: usize = 1 << 40;
/// The worker's UCX event fd (the hot tier's worker).
pub const EFD_TOKEN: Token = Token(usize::MAX - 10);
/// The cold tier's UCX event fd.
pub const EFD_COLD_TOKEN: Token = Token(usize::MAX - 12);
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
    challenged: Option<Box<(fp::Hello, [u8; fp::NONCE_LEN])>>,
    session: Option<Session>,
    /// When the bootstrap connection was accepted (HELLO deadline).
    accepted: Instant,
    /// Rendezvous bytes in flight to and from this session.
    inflight: u64,
    /// Requests waiting for `inflight` to fall, or for a value of their key still
    /// arriving (in arrival order), and their size.
    waiting: VecDeque<(usize, mf::AmMessage)>,
    waiting_bytes: u64,
    /// Keys of the values this session is sending by rendezvous (received, then stored,
    /// after requests sent behind them have arrived), and how many of each.
    receiving_keys: HashMap<Box<[u8]>, u32>,
}

/// A session: its endpoint on the tier that serves it, a move to the other tier in
/// progress, and how busy it is (docs/scaling.md).
struct Session {
    id: u32,
    /// The tier whose UCX worker holds `ep` (`HOT` or `COLD`).
    tier: usize,
    ep: mf::Endpoint,
    /// The client has been told to move to this tier (`fp::AM_MOVE`) and has not arrived
    /// yet: our endpoint there. Replies go on `ep` until it arrives.
    moving: Option<Box<(usize, mf::Endpoint)>>,
    /// The client's worker address, for an endpoint on the other tier.
    address: Box<[u8]>,
    /// Requests since the last policy tick; ticks in a row at or above the promotion
    /// rate; the last such tick (or the session's start).
    requests: u32,
    busy_ticks: u8,
    last_busy: Instant,
    /// No move is started before this (one just made, refused or failed).
    settle_until: Instant,
}

impl Session {
    /// The tier the session is served on, or is moving to.
    fn assigned(&self) -> usize {
        self.moving.as_ref().map_or(self.tier, |m| m.0)
    }

    /// Whether `id` is one of this session's endpoints on `tier`.
    fn has_ep(&self, tier: usize, id: mf::EpId) -> bool {
        (self.tier == tier && self.ep.id() == id)
            || self
                .moving
                .as_ref()
                .is_some_and(|m| m.0 == tier && m.1.id() == id)
    }

    /// memfabricd's own memory for one session (its client entry with this session, its
    /// lookup entry), counted in `ucx_session_bytes`.
    fn bytes(&self) -> u64 {
        (std::mem::size_of::<(Token, Client)>()
            + std::mem::size_of::<(u32, Token)>()
            + self.address.len()) as u64
    }
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
    /// The request's `FLAG_KEEP_NEWER_WRITE`.
    keep_newer_write: bool,
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
    /// This thread's UCX workers, one per tier (`HOT`, then `COLD` when there is one).
    tiers: Vec<mf::Worker>,
    /// Whether each tier's transports support UCX peer-failure handling (probed once).
    peer_errors: Vec<bool>,
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
    /// When the tier policy last looked at the sessions' request rates.
    last_policy: Instant,
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
    /// Receives whose session has ended (orphaned: UCX still owns them), and since when
    /// that number has not changed.
    orphans_seen: Option<(usize, std::time::Instant)>,
    /// Sessions ended because a transfer on their endpoint failed (the newest
    /// `FAILED_SESSIONS_KEPT`): rendezvous offers still coming from them are abandoned,
    /// not received or released (see `mf::RndvData::abandon`).
    failed_sessions: VecDeque<u32>,
    /// Sessions ended since the C heap was last trimmed, and when that was: the heap is
    /// trimmed (on the deadline timer) at most once per `TRIM_EVERY` while sessions end.
    ended_since_trim: u64,
    last_trim: std::time::Instant,
    /// Sessions each tier's worker has served since it was created (see `recycle`), and
    /// the trims in a row that found a worker to renew but could not yet.
    served: [u64; 2],
    recycle_tries: u8,
}

/// A tier's UCX worker that has served this many sessions and has none left is replaced
/// by a new one: UCX keeps what it allocated per endpoint (pools, match tables) for the
/// life of the worker, so after a crowd of clients has gone only a new worker gives it
/// back.
const RECYCLE_AFTER: u64 = 8;

/// The least time between two trims of the C heap (see `mf::release_free_heap`).
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How many failed sessions are remembered: offers from one stop within a progress round
/// or two of its failure (the sender is dead); this is ample.
const FAILED_SESSIONS_KEPT: usize = 256;

/// How long endpoint closes that make no progress keep the worker attending to UCX. A
/// close can hang for good: UCX 1.13 never completes the force-close of a shared-memory
/// endpoint whose peer died with its receive FIFO full (our replies still queued for
/// it). Past this the worker may go dormant as if the close had finished; the close's
/// state stays allocated (a few hundred bytes per dead client) until the process exits.
const UCX_CLOSE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a count of stuck-prone UCX work (`n`, not zero) has changed within the last
/// `UCX_CLOSE_PATIENCE`; `seen` remembers the count and since when it has stood.
fn changed_within_patience(seen: &mut Option<(usize, std::time::Instant)>, n: usize) -> bool {
    let now = std::time::Instant::now();
    match *seen {
        Some((count, since)) if count == n => now.duration_since(since) < UCX_CLOSE_PATIENCE,
        _ => {
            *seen = Some((n, now));
            true
        }
    }
}

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
        let mut tiers = Vec::with_capacity(2);
        let mut peer_errors = Vec::with_capacity(2);
        let contexts = std::iter::once(&fs.ctx).chain(fs.cold_ctx.as_ref());
        for (tier, ctx) in contexts.enumerate() {
            let mut w = tier_worker(ctx, registry, tier)?;
            peer_errors.push(supports_peer_errors(ctx, &mut w));
            tiers.push(w);
        }
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
            tiers,
            peer_errors,
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
            last_policy: Instant::now(),
            scratch: Vec::new(),
            inbox: None,
            held: HashMap::new(),
            // Quiet since long enough: nothing to attend to before a first client.
            quiet_since: std::time::Instant::now().checked_sub(UCX_LINGER),
            dormant: false,
            closes_seen: None,
            orphans_seen: None,
            failed_sessions: VecDeque::new(),
            ended_since_trim: 0,
            last_trim: std::time::Instant::now(),
            served: [0; 2],
            recycle_tries: 0,
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
            || self.receives_progressing()
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

    /// Whether receives are in flight that need UCX progress: any of a live session, or
    /// orphaned ones (their session ended; UCX can neither cancel nor fail them without
    /// peer-failure handling) until their number has not changed for
    /// `UCX_CLOSE_PATIENCE`. UCX 1.22 keeps a rendezvous receive from a dead
    /// shared-memory sender busy for good: without this the worker would never sleep.
    /// Orphans keep their pending items (counted in `ucx_orphaned_receives`) until UCX
    /// lets go of them, if ever.
    fn receives_progressing(&mut self) -> bool {
        if self.receiving.is_empty() {
            self.orphans_seen = None;
            return false;
        }
        if self.has_live_receives() {
            self.orphans_seen = None;
            return true;
        }
        changed_within_patience(&mut self.orphans_seen, self.receiving.len())
    }

    /// Whether a receive in flight belongs to a session still served.
    fn has_live_receives(&self) -> bool {
        self.receiving
            .values()
            .any(|r| self.by_session.contains_key(&r.session))
    }

    /// Whether endpoint closes are in progress and have not all been stuck for
    /// `UCX_CLOSE_PATIENCE` (the clock is read only while closes are pending).
    fn closes_progressing(&mut self) -> bool {
        let n: usize = self.tiers.iter().map(|w| w.closing()).sum();
        if n == 0 {
            self.closes_seen = None;
            return false;
        }
        changed_within_patience(&mut self.closes_seen, n)
    }

    /// Before sleeping: `false` if UCX has work right now (do not block).
    pub fn arm(&mut self) -> bool {
        self.tiers.iter_mut().all(|w| matches!(w.arm(), Ok(true)))
    }

    /// Progress UCX until it is idle and serve what arrived. Returns whether anything
    /// happened.
    pub fn progress(&mut self, registry: &Registry, stats: &ThreadStats) -> bool {
        let mut active = false;
        for tier in 0..self.tiers.len() {
            active |= self.progress_tier(registry, stats, tier);
        }
        active
    }

    /// `progress` for one tier's UCX worker.
    fn progress_tier(&mut self, registry: &Registry, stats: &ThreadStats, tier: usize) -> bool {
        let mut active = false;
        let mut events = std::mem::take(&mut self.events_buf);
        for _ in 0..64 {
            let n = self.tiers[tier].progress();
            self.tiers[tier].drain_into(&mut events);
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
                self.handle(registry, stats, tier, e);
            }
        }
        self.events_buf = events;
        active
    }

    fn handle(&mut self, registry: &Registry, stats: &ThreadStats, tier: usize, e: mf::Event) {
        match e {
            mf::Event::Am(msg) if msg.id == fp::AM_HINTS => self.hints(stats, msg),
            mf::Event::Am(msg) if msg.id == fp::AM_MOVE_ANSWER => {
                self.move_answer(stats, tier, msg)
            }
            mf::Event::Am(msg) => self.request(registry, stats, tier, msg, false),
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
                let dead = self
                    .clients
                    .iter()
                    .find_map(|(t, c)| c.session.as_ref()?.has_ep(tier, ep).then_some(*t));
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
        token.0 >= TOKEN_BASE && !Self::is_event_fd(token)
    }

    /// Whether `token` is one of the UCX workers' event fds.
    pub fn is_event_fd(token: Token) -> bool {
        token == EFD_TOKEN || token == EFD_COLD_TOKEN
    }
}

/// A UCX worker for `tier` on `ctx`, its handlers set and its event fd registered.
fn tier_worker(ctx: &Arc<mf::Context>, registry: &Registry, tier: usize) -> io::Result<mf::Worker> {
    let mut w = mf::Worker::new(ctx).map_err(io::Error::other)?;
    w.set_am_handler(fp::AM_REQUEST).map_err(io::Error::other)?;
    w.set_am_handler(fp::AM_HINTS).map_err(io::Error::other)?;
    w.set_am_handler(fp::AM_MOVE_ANSWER)
        .map_err(io::Error::other)?;
    let efd = w.event_fd().map_err(io::Error::other)?;
    registry.register(
        &mut mio::unix::SourceFd(&efd),
        efd_token(tier),
        Interest::READABLE,
    )?;
    Ok(w)
}

fn efd_token(tier: usize) -> Token {
    if tier == HOT {
        EFD_TOKEN
    } else {
        EFD_COLD_TOKEN
    }
}

impl FabricWorker {
    /// Replace the UCX worker of each tier that has served `RECYCLE_AFTER` sessions and
    /// has nothing left: no session on it or moving to it, no transfer of this thread in
    /// flight, no endpoint closing. Clients are told the new worker's address as before
    /// (WELCOME and moves read it when they are made). Returns whether a worker is due
    /// but has to wait (transfers or endpoint closes still running).
    pub(super) fn recycle(&mut self, registry: &Registry) -> bool {
        let idle = |me: &Self, tier: usize| {
            me.served[tier] >= RECYCLE_AFTER
                && !me.clients.values().any(|c| {
                    c.session
                        .as_ref()
                        .is_some_and(|s| s.tier == tier || s.assigned() == tier)
                })
        };
        let due = (0..self.tiers.len()).any(|t| idle(self, t));
        if !due {
            return false;
        }
        if !(self.sending.is_empty() && self.receiving.is_empty() && self.held.is_empty()) {
            return true;
        }
        let mut waiting = false;
        // Closes still running are waited for, unless they have all been stuck for
        // `UCX_CLOSE_PATIENCE` (those UCX 1.13 never finishes: see there).
        let closes_stuck = !self.closes_progressing();
        for tier in 0..self.tiers.len() {
            if !idle(self, tier) {
                continue;
            }
            if self.tiers[tier].closing() > 0 && !closes_stuck {
                waiting = true;
                continue;
            }
            let ctx = Arc::clone(self.tiers[tier].context());
            if let Ok(efd) = self.tiers[tier].event_fd() {
                let _ = registry.deregister(&mut mio::unix::SourceFd(&efd));
            }
            match tier_worker(&ctx, registry, tier) {
                Ok(w) => {
                    // The old one goes now (UCX frees what it held for its endpoints).
                    let mut old = std::mem::replace(&mut self.tiers[tier], w);
                    old.abandon_closes();
                    drop(old);
                    self.served[tier] = 0;
                    tracing::debug!(
                        "ucx worker {} ({} tier) renewed after its clients left",
                        self.worker_index,
                        if tier == HOT { "hot" } else { "cold" }
                    );
                }
                Err(e) => {
                    // Keep serving on the old one.
                    tracing::warn!("cannot renew a UCX worker: {e}");
                    if let Ok(efd) = self.tiers[tier].event_fd() {
                        let _ = registry.register(
                            &mut mio::unix::SourceFd(&efd),
                            efd_token(tier),
                            Interest::READABLE,
                        );
                    }
                    self.served[tier] = 0;
                }
            }
        }
        waiting
    }
}

/// Whether `w`'s transports can carry an endpoint with UCX peer-failure handling: tried
/// once, towards a scratch worker of the same context (a peer no client will ever be, so
/// the attempt uses up no connection sequence number towards a client).
fn supports_peer_errors(ctx: &Arc<mf::Context>, w: &mut mf::Worker) -> bool {
    let Ok(mut scratch) = mf::Worker::new(ctx) else {
        return false;
    };
    let Ok(address) = scratch.address() else {
        return false;
    };
    w.set_peer_errors(true);
    let ok = match w.connect_address(&address) {
        Ok(ep) => {
            // Let a connecting transport (TCP) finish connecting while the scratch
            // worker still listens: closing or dropping it earlier has UCX log a refused
            // connection.
            for _ in 0..20 {
                let n = w.progress() + scratch.progress();
                if n == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            w.close(ep, true);
            w.finish_closes(Duration::from_secs(1));
            true
        }
        Err(_) => false,
    };
    w.set_peer_errors(false);
    for _ in 0..5 {
        scratch.progress();
        w.progress();
    }
    drop(scratch);
    // Whatever the probe left behind (its close, a reset from the scratch worker) is
    // settled and dropped here, so that the worker starts with no UCX work (which would
    // start its adaptive poll before any client came).
    let mut events = VecDeque::new();
    for _ in 0..20 {
        let n = w.progress();
        w.drain_into(&mut events);
        events.clear();
        if n == 0 && w.closing() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    ok
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
        assert_eq!(store_side::IFLAG_ACTIVE, client_side::IFLAG_ACTIVE);
        assert_eq!(
            store_side::ACCESS_UPDATE_INTERVAL,
            client_side::ACCESS_UPDATE_INTERVAL
        );
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
