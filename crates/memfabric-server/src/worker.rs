//! Worker threads: each owns its connections (and a share of the UDP sockets) and runs
//! one `mio` event loop over them, as memcached's worker threads run libevent loops.
//!
//! The listener hands a new connection over a channel and wakes the worker with a
//! `mio::Waker`. Readiness is edge-triggered: a connection that stopped before draining
//! its socket (read batch, `-R` budget) is put on the `again` list and run on the next
//! round with a zero-timeout poll, so other connections get their turn in between.
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token, Waker};
use rustc_hash::FxHashMap;

use crate::conn::{Conn, ConnEntry, ConnState, Next, Stream};
use crate::counters::ThreadStats;
use crate::exec::Shared;
use crate::shared::{Inbox, Target};
use crate::ucx_frontend::FabricWorker;
use crate::udp::UdpPort;

const WAKER: Token = Token(0);
/// Ready connections from which `drive_ready` reads them all before running any. Below
/// it the first reply would wait for the other connections' reads for little gain: at one
/// client thread with two connections (4 KB GETs, server and client on their own CPUs),
/// answering each in turn took memfabricd from 14.2k to 14.9k ops/s (memcached: 15.9k,
/// medians of 8 alternating rounds).
const PREFILL_FROM_READY: usize = 4;
/// While busy-polling (`--poll-us`), how long to progress UCX alone between two epoll
/// checks of the sockets.
const UCX_SPIN_WINDOW: Duration = Duration::from_micros(10);
/// UDP sockets use tokens 1..FIRST_CONN.
const FIRST_CONN: usize = 1 << 16;

/// A connection handed from the listener to a worker.
pub struct NewConn {
    pub stream: Stream,
    pub listen_addr: String,
    /// A UCX bootstrap connection (crate::ucx_frontend), not a memcached one.
    pub ucx: bool,
}

/// The listener's side of a worker.
pub struct WorkerHandle {
    tx: Sender<NewConn>,
    waker: Arc<Waker>,
    join: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    /// Give the worker a connection. Fails only if the worker has exited.
    pub fn send(&self, c: NewConn) -> Result<(), NewConn> {
        self.tx.send(c).map_err(|e| e.0)?;
        // A failed wake would strand the connection until the worker's next event; the
        // waker only fails if the worker's epoll is gone, i.e. it has exited.
        let _ = self.waker.wake();
        Ok(())
    }

    /// Wake the worker so it sees `shutdown`, and wait for it to finish.
    pub fn stop(mut self) {
        let _ = self.waker.wake();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// Start worker `n`. `udp` are this worker's clones of the UDP sockets.
pub fn spawn(
    n: usize,
    shared: Arc<Shared>,
    udp: Vec<(std::net::UdpSocket, String)>,
) -> io::Result<WorkerHandle> {
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let inbox_waker = Arc::clone(&waker);
    let (tx, rx) = mpsc::channel();
    let mut ports = Vec::new();
    for (i, (sock, name)) in udp.into_iter().enumerate() {
        let mut p = UdpPort::new(&shared, mio::net::UdpSocket::from_std(sock), name);
        poll.registry()
            .register(p.socket_mut(), Token(1 + i), Interest::READABLE)?;
        ports.push(p);
    }
    let join = std::thread::Builder::new()
        .name(format!("mf-worker-{n}"))
        .spawn(move || {
            let stats = shared.register_thread();
            // The UCX worker is made here: it must stay on the thread that uses it.
            let fabric = match FabricWorker::new(&shared, n as u32, poll.registry()) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("worker {n}: no UCX data path: {e}");
                    None
                }
            };
            let inbox = Arc::new(Inbox::new(Arc::clone(&inbox_waker)));
            let mut fabric = fabric;
            if let Some(f) = fabric.as_mut() {
                f.set_inbox(Arc::clone(&inbox));
            }
            let mut w = Worker {
                inbox,
                fabric,
                shared,
                stats,
                poll,
                rx,
                conns: FxHashMap::default(),
                next_token: FIRST_CONN,
                udp: ports,
                again: Vec::new(),
                ready: Vec::new(),
            };
            if let Err(e) = w.run() {
                tracing::error!("worker {n} stopped: {e}");
            }
            w.close_all();
        })?;
    Ok(WorkerHandle {
        tx,
        waker,
        join: Some(join),
    })
}

struct Worker {
    /// Pending commands of this worker's connections that became ready.
    inbox: Arc<Inbox>,
    /// This thread's UCX worker and sessions, when the UCX path is on.
    fabric: Option<FabricWorker>,
    shared: Arc<Shared>,
    stats: Arc<ThreadStats>,
    poll: Poll,
    rx: Receiver<NewConn>,
    conns: FxHashMap<Token, Conn>,
    next_token: usize,
    udp: Vec<UdpPort>,
    /// Tokens to run again on the next round without waiting for readiness.
    again: Vec<Token>,
    /// The connections an `epoll_wait` returned, and whether each is readable.
    ready: Vec<(Token, bool)>,
}

impl Worker {
    /// The event loop.
    ///
    /// A blocked thread costs a wake-up (a futex/IPI and a context switch, tens of
    /// microseconds on a VM) on the next request, more than a whole shared-memory round
    /// trip; spinning avoids it at the price of a core. Two spins:
    ///
    /// * UCX work is followed by an adaptive poll of the UCX worker alone
    ///   (`--ucx-poll-us`, [`AdaptivePoll`]): a closed-loop UCX client's next request
    ///   usually comes within microseconds of our reply, so the worker keeps progressing
    ///   UCX for up to that window, and shrinks the window when the sessions pause. TCP
    ///   and UDP work never starts it (their own poll is the next one).
    /// * TCP and UDP work is followed by an adaptive poll of the sockets alone
    ///   (`--tcp-poll-us`, `epoll_wait` with a zero timeout). A sleeping worker that a
    ///   request wakes costs that request the wake-up: on virtual machines whose idle
    ///   vCPUs halt, about 40% of a one-client round trip over loopback. It polls on
    ///   saturated CPUs too: there the threads it competes with are mostly its own
    ///   clients, a polling worker spares each of them the wake-up of a sleeping one, and
    ///   the yields below let them run (two and four client threads against one worker on
    ///   two CPUs: 1.00-1.31x and 0.85-1.45x of memcached's throughput polling, against
    ///   0.83-1.20x and 0.83-1.20x when it stopped where the CPUs had none to spare;
    ///   docs/benchmarks.md). The window is the maximum while the polls catch
    ///   requests; each poll that runs out halves it, and requests that come within two
    ///   windows of the last bring it back only every 16th time (a probe), so clients
    ///   that pause longer than the window cost a few microseconds a request.
    /// * `--poll-us N` (default 0): after any round that did work, keep polling (UCX and
    ///   `epoll_wait` with a zero timeout) for N µs. An override for dedicated hosts.
    ///
    /// Each spin yields the core between rounds (`sched_yield`): on a shared machine the
    /// client we serve, or another worker, may be queued on this core, and spinning must
    /// not keep it from running.
    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let poll_for = Duration::from_micros(self.shared.settings.poll_us);
        let ucx_max = Duration::from_micros(self.shared.settings.ucx_poll_us);
        let mut ucx_poll = AdaptivePoll::new(ucx_max, ucx_max * UCX_BUSY_GAPS, 1);
        let tcp_max = Duration::from_micros(self.shared.settings.tcp_poll_us);
        let mut tcp_poll = AdaptivePoll::new(tcp_max, tcp_max * TCP_BUSY_GAPS, TCP_PROBE_EVERY);
        // Idle rounds of the TCP poll: their time, not yet told to the store, and their
        // count (for yielding).
        let mut tcp_polled = Duration::ZERO;
        let mut tcp_idle_rounds: u32 = 0;
        // Negative, as memcached takes it: never.
        let idle_timeout = u32::try_from(self.shared.settings.idle_timeout).unwrap_or(0);
        // With -Y, -S or -Z, connections that have not authenticated (or finished their
        // TLS handshake) are swept too.
        let auth_timeout = if self.shared.settings.handshakes() {
            self.shared.settings.auth_timeout
        } else {
            0
        };
        let sweep = idle_timeout > 0 || auth_timeout > 0;
        let mut spin_until: Option<Instant> = None;
        let mut last_sweep = Instant::now();
        // Rounds in a row in which UCX refused to be armed (it has work) and progressing
        // it then did nothing (see `UcxStall`).
        let mut stall = UcxStall::default();
        loop {
            // The clock only when a spin may be running (not per TCP request otherwise).
            let spinning = spin_until.is_some_and(|t| Instant::now() < t);
            let ucx_spinning = ucx_poll.spinning_now();
            if (spinning || ucx_spinning) && self.again.is_empty() {
                let now = Instant::now();
                if let Some(f) = self.fabric.as_mut() {
                    // While spinning, serve UCX for a short window between epoll checks:
                    // an epoll_wait costs about as much as a shared-memory round trip, and
                    // TCP clients of a spinning worker wait at most this window longer.
                    let window = now + UCX_SPIN_WINDOW;
                    let mut rounds: u32 = 0;
                    loop {
                        if f.progress(self.poll.registry(), &self.stats) {
                            let now = Instant::now();
                            // Caught while spinning (a `--poll-us` spin may start the
                            // adaptive one).
                            if ucx_poll.work(now, true) {
                                self.stats.ucx_poll_spins.incr();
                            }
                            if !poll_for.is_zero() {
                                spin_until = Some(now + poll_for);
                            }
                        }
                        rounds = rounds.wrapping_add(1);
                        if rounds.is_multiple_of(4) {
                            std::thread::yield_now();
                        }
                        if rounds.is_multiple_of(16) && Instant::now() >= window {
                            break;
                        }
                    }
                }
            }
            let tcp_spinning = tcp_poll.spinning_now();
            let busy = !self.again.is_empty()
                || spin_until.is_some_and(|t| Instant::now() < t)
                || ucx_poll.spinning_now()
                || tcp_spinning;
            // UCX, while it has anything to do: arm its event fd before sleeping; if it
            // has work already, do not sleep.
            let ucx_armed = self.fabric.as_mut().is_some_and(|f| f.in_use());
            let ucx_busy = !busy && ucx_armed && self.fabric.as_mut().is_some_and(|f| !f.arm());
            if ucx_busy {
                if let Some(pause) = stall.pause() {
                    self.stats.ucx_stalled_waits.incr();
                    std::thread::sleep(pause);
                }
            }
            let timeout = if busy || ucx_busy {
                Some(Duration::ZERO)
            } else if sweep {
                Some(Duration::from_secs(1))
            } else {
                None
            };
            let tcp_round = tcp_spinning.then(Instant::now);
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Some(started) = tcp_round.filter(|_| events.is_empty()) {
                tcp_polled += started.elapsed();
                tcp_idle_rounds = tcp_idle_rounds.wrapping_add(1);
                if tcp_idle_rounds.is_multiple_of(4) {
                    std::thread::yield_now();
                }
            }
            if tcp_polled >= TCP_POLL_REPORT || (!tcp_spinning && !tcp_polled.is_zero()) {
                let polled = std::mem::take(&mut tcp_polled);
                self.stats
                    .tcp_poll_idle_us
                    .add(u64::try_from(polled.as_micros()).unwrap_or(u64::MAX));
                self.shared.store.note_spin(polled);
            }
            // A blocking wait either ends by an event or by its timeout; with UCX armed,
            // a timeout after which UCX has work means its event fd missed a wake-up.
            let blocked = timeout != Some(Duration::ZERO) && ucx_armed;
            let woke_by_timer = blocked && events.is_empty();
            let ucx_event = events
                .iter()
                .any(|ev| FabricWorker::is_event_fd(ev.token()));
            if blocked && ucx_event {
                self.stats.ucx_wakeups_by_event.incr();
            }
            if self.shared.is_shutting_down() {
                return Ok(());
            }
            if !events.is_empty() {
                self.shared.store.note_activity();
            }
            let now = self.shared.store.clock().now();
            let mut active = false;
            self.ready.clear();
            for ev in events.iter() {
                let t = ev.token();
                if t == WAKER {
                    self.take_new_conns(now);
                    self.take_ready(now);
                } else if FabricWorker::is_event_fd(t) {
                    // Progressed below.
                } else if FabricWorker::owns(t) {
                    if let Some(f) = self.fabric.as_mut() {
                        f.drive_stream(self.poll.registry(), &self.stats, t);
                    }
                } else if t.0 < FIRST_CONN {
                    active = true;
                    self.run_udp(t);
                } else {
                    active = true;
                    let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                    if ev.is_read_closed() || ev.is_error() {
                        // The FIN may have come with the last data: no further edge
                        // will say so, so the connection must read until it sees it.
                        if let Some(conn) = self.conns.get_mut(&t) {
                            conn.note_peer_closed();
                        }
                    }
                    self.ready.push((t, readable));
                }
            }
            self.drive_ready(now);
            if !self.again.is_empty() {
                active = true;
                let again = std::mem::take(&mut self.again);
                for t in again {
                    if t.0 < FIRST_CONN {
                        self.run_udp(t);
                    } else {
                        self.drive(t, false, now);
                    }
                }
            }
            if active && !tcp_max.is_zero() {
                if tcp_spinning {
                    self.stats.tcp_poll_caught.incr();
                }
                if tcp_poll.work(Instant::now(), tcp_spinning) {
                    self.stats.tcp_poll_spins.incr();
                }
            }
            if let Some(f) = self.fabric.as_mut() {
                let ucx_work =
                    (ucx_event || f.in_use()) && f.progress(self.poll.registry(), &self.stats);
                if ucx_work {
                    if woke_by_timer {
                        self.stats.ucx_wakeups_by_timer.incr();
                    }
                    if ucx_poll.work(Instant::now(), false) {
                        self.stats.ucx_poll_spins.incr();
                    }
                }
                active |= ucx_work;
                stall.after_round(ucx_busy, ucx_work || !events.is_empty());
            }
            if active && !poll_for.is_zero() {
                spin_until = Some(Instant::now() + poll_for);
            }
            if sweep && last_sweep.elapsed() >= Duration::from_secs(1) {
                last_sweep = Instant::now();
                self.kick_idle(now, idle_timeout, auth_timeout);
            }
        }
    }

    fn take_new_conns(&mut self, now: u32) {
        while let Ok(nc) = self.rx.try_recv() {
            let mut stream = nc.stream;
            if nc.ucx {
                // Without UCX on this worker the client just sees the connection close.
                if let (Some(f), Stream::Tcp(s)) = (self.fabric.as_mut(), stream) {
                    f.add_client(self.poll.registry(), s);
                }
                continue;
            }
            let token = Token(self.next_token);
            self.next_token += 1;
            if self.next_token >= crate::ucx_frontend::TOKEN_BASE {
                self.next_token = FIRST_CONN;
            }
            // Writability is asked for only while a reply is blocked (`Worker::drive`).
            if let Err(e) = self
                .poll
                .registry()
                .register(&mut stream, token, Interest::READABLE)
            {
                tracing::warn!("cannot register connection: {e}");
                self.shared.curr_connections.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let id = stream.raw_fd() as u64;
            let entry = Arc::new(ConnEntry::new(
                stream.peer_name(),
                Some(nc.listen_addr),
                false,
                ConnState::NewCmd,
            ));
            entry.touch(now);
            self.shared.conns.insert(id, Arc::clone(&entry));
            tracing::debug!("<{id} new auto-negotiating client connection");
            self.conns.insert(
                token,
                Conn::new(
                    stream,
                    id,
                    token.0,
                    entry,
                    now,
                    Arc::clone(&self.shared.gauges),
                ),
            );
            // Data sent together with the connect is reported by the registration's
            // first event; nothing to do here.
        }
    }

    /// Complete the pending commands that became ready, and go on with their
    /// connections.
    fn take_ready(&mut self, now: u32) {
        for (target, ticket, done) in self.inbox.take() {
            match target {
                Target::Conn(t) => {
                    let t = Token(t);
                    if let Some(conn) = self.conns.get_mut(&t) {
                        conn.complete(&self.shared, &self.stats, ticket, done);
                        self.drive(t, false, now);
                    }
                }
                Target::Udp(i) => {
                    if let Some(port) = self.udp.get_mut(i) {
                        port.complete(&self.shared, &self.stats, &self.inbox, i, ticket, done);
                    }
                }
                Target::Ucx => {
                    if let Some(f) = self.fabric.as_mut() {
                        f.complete(&self.stats, ticket, done);
                    }
                }
            }
        }
    }

    /// Drive the connections an `epoll_wait` returned. With few of them ready, each is
    /// read, run and answered in turn, as memcached does: its reply leaves before the next
    /// connection's read, so a client waiting on it is not held up by other connections'
    /// system calls. With `PREFILL_FROM_READY` or more, first read every readable one
    /// (each read also starts loading the index buckets of its first request), then run
    /// them in turn, each while the item of the one after it is being loaded: their cache
    /// misses (the index is far larger than the cache) overlap each other's system calls
    /// instead of stalling one after another.
    fn drive_ready(&mut self, now: u32) {
        if self.ready.len() < PREFILL_FROM_READY {
            for i in 0..self.ready.len() {
                let (t, readable) = self.ready[i];
                self.drive(t, readable, now);
            }
            return;
        }
        for &(t, readable) in &self.ready {
            if let (true, Some(conn)) = (readable, self.conns.get_mut(&t)) {
                conn.prefill(&self.shared, &self.stats);
            }
        }
        // The first one's item too: the others' runs overlap it.
        self.prefetch_item(0);
        for i in 0..self.ready.len() {
            self.prefetch_item(i + 1);
            self.drive(self.ready[i].0, false, now);
        }
    }

    /// `Conn::prefetch_item` for the `i`th ready connection, if there is one.
    fn prefetch_item(&self, i: usize) {
        if let Some(conn) = self.ready.get(i).and_then(|(t, _)| self.conns.get(t)) {
            conn.prefetch_item(&self.shared);
        }
    }

    fn drive(&mut self, t: Token, readable: bool, now: u32) {
        let Some(conn) = self.conns.get_mut(&t) else {
            return;
        };
        let next = conn.drive(&self.shared, &self.stats, &self.inbox, readable, now);
        let blocked = next != Next::Close && conn.blocked_on_write();
        if blocked != conn.wants_writable {
            let interest = if blocked {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            // Edge-triggered: a socket that is writable already reports it at once.
            if let Err(e) = self
                .poll
                .registry()
                .reregister(&mut conn.stream, t, interest)
            {
                tracing::warn!("cannot change a connection's interest: {e}");
                self.close(t);
                return;
            }
            conn.wants_writable = blocked;
        }
        match next {
            Next::Wait => {}
            Next::Again => {
                if !self.again.contains(&t) {
                    self.again.push(t);
                }
            }
            Next::Close => self.close(t),
        }
    }

    fn run_udp(&mut self, t: Token) {
        let Some(port) = self.udp.get_mut(t.0 - 1) else {
            return;
        };
        if port.drain(&self.shared, &self.stats, &self.inbox, t.0 - 1) && !self.again.contains(&t) {
            self.again.push(t);
        }
    }

    fn close(&mut self, t: Token) {
        if let Some(mut c) = self.conns.remove(&t) {
            c.stream.goodbye();
            let _ = self.poll.registry().deregister(&mut c.stream);
            // Forget the entry before the fd is closed, so a new connection that reuses
            // the descriptor number cannot be removed by mistake.
            self.shared.conns.remove(c.id);
            self.shared.curr_connections.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!("<{} connection closed.", c.id);
        }
    }

    /// Close connections idle for longer than `-o idle_timeout`, and with `-Y`, `-S` or `-Z`
    /// those that have not authenticated (or finished their TLS handshake) within
    /// `--auth-timeout` (0 = no limit, for either).
    fn kick_idle(&mut self, now: u32, idle_timeout: u32, auth_timeout: u32) {
        let shared = &self.shared;
        let idle: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                (idle_timeout > 0
                    && now.saturating_sub(c.last_active) > idle_timeout
                    && c.waiting_for_command())
                    || (auth_timeout > 0
                        && c.unauthenticated(shared)
                        && now.saturating_sub(c.accepted) > auth_timeout)
            })
            .map(|(t, _)| *t)
            .collect();
        for t in idle {
            self.stats.idle_kicks.incr();
            self.close(t);
        }
    }

    /// Shutdown: send what is already queued (best effort, without waiting), then close.
    fn close_all(&mut self) {
        if let Some(f) = self.fabric.as_mut() {
            f.close_all(self.poll.registry());
        }
        for p in &self.udp {
            p.unregister(&self.shared);
        }
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        let now = self.shared.store.clock().now();
        for t in tokens {
            if let Some(c) = self.conns.get_mut(&t) {
                c.begin_close();
                let _ = c.drive(&self.shared, &self.stats, &self.inbox, false, now);
            }
            self.close(t);
        }
    }
}

/// A UCX worker that will not arm (`UCS_ERR_BUSY`: it has work) although progressing it
/// does nothing. Its transports hold sends they cannot make yet: a shared-memory reply
/// waits for room in the client's receive FIFO, which only the client, running, makes
/// (and a client that died with its FIFO full leaves such sends behind for good: UCX 1.13
/// does not drop them when the endpoint is force-closed). No event will say when to
/// retry, so the worker must poll; spinning hot would take the core from the very client
/// it waits for (seen on 2 cores: 6 servers' workers spinning, pipelined clients at a
/// fifth of their blocking rate, idle servers at 100% CPU). After a few such rounds the
/// worker pauses between them, growing to `UCX_STALL_PAUSE_MAX`, and any work resets it.
#[derive(Default)]
struct UcxStall {
    rounds: u32,
}

/// Rounds of a stall polled hot before the first pause: a FIFO that is full for a moment
/// (a burst) is usually drained by then.
const UCX_STALL_HOT_ROUNDS: u32 = 16;
/// The longest pause: TCP and UDP clients of a stalled worker wait at most this much
/// longer, and so does a UCX client's request that comes while the worker cannot arm.
const UCX_STALL_PAUSE_MAX: Duration = Duration::from_micros(200);

impl UcxStall {
    /// The pause before the next round, if the stall has gone on long enough.
    fn pause(&self) -> Option<Duration> {
        let over = self.rounds.checked_sub(UCX_STALL_HOT_ROUNDS)?;
        let us = 4u64 << over.min(6);
        Some(Duration::from_micros(us).min(UCX_STALL_PAUSE_MAX))
    }

    /// A round ended: `busy` UCX would not arm; `work` anything was done.
    fn after_round(&mut self, busy: bool, work: bool) {
        if busy && !work {
            self.rounds = self.rounds.saturating_add(1);
        } else {
            self.rounds = 0;
        }
    }
}

/// The window of an adaptive poll: of UCX after UCX work (`--ucx-poll-us`), of the sockets
/// after TCP/UDP work (`--tcp-poll-us`). After such work the worker keeps polling until
/// `now + window`. The window is the maximum while the peers are busy: a spin caught the
/// next request, or a request came within `busy_gap` of the previous work even though the
/// worker had gone to sleep (a burst that the shrunken window missed). Each spin that
/// ends without work halves it, so peers that pause between requests cost almost no
/// spinning. The TCP poll restores its window for requests that come soon only every
/// `probe_every`th time (a probe): a sleeping worker's gaps include its wake-up, so
/// "soon" there cannot tell a client a full window would catch from one it would not.
struct AdaptivePoll {
    max: Duration,
    /// Work within this of the previous work means the peers are busy: full window.
    busy_gap: Duration,
    /// ... at the `probe_every`th such work since the last full window (1: each time).
    probe_every: u32,
    soon_since_probe: u32,
    window: Duration,
    /// The current spin's end, if one is running.
    until: Option<Instant>,
    last_work: Option<Instant>,
}

/// The window never shrinks below this (unless the poll is off): short enough to cost
/// nothing between idle requests, and it lets a burst be recognised by its gaps.
const UCX_POLL_MIN: Duration = Duration::from_micros(2);
/// UCX work within this many windows of the previous work means the sessions are busy.
const UCX_BUSY_GAPS: u32 = 4;
/// TCP work within this many windows of the previous work may be a closed-loop client
/// that a full window would catch: the gap includes the sleeping worker's own wake-up.
const TCP_BUSY_GAPS: u32 = 2;
/// ... and every this many such requests the full window is tried again (a probe): a
/// client too slow for it costs one wasted window per this many requests, and a window
/// shrunk by a pause (another client's turn) comes back within as many requests.
const TCP_PROBE_EVERY: u32 = 16;
/// The TCP poll's idle time is added to the store's total (`Store::note_spin`) when its
/// poll ends, or once this much has gathered.
const TCP_POLL_REPORT: Duration = Duration::from_micros(500);

impl AdaptivePoll {
    fn new(max: Duration, busy_gap: Duration, probe_every: u32) -> AdaptivePoll {
        AdaptivePoll {
            max,
            busy_gap,
            probe_every: probe_every.max(1),
            soon_since_probe: 0,
            window: max,
            until: None,
            last_work: None,
        }
    }

    /// Work was done at `now`; `caught`: while spinning for it. Returns whether this starts
    /// a spin (none was running).
    fn work(&mut self, now: Instant, caught: bool) -> bool {
        if self.max.is_zero() {
            return false;
        }
        let soon = self
            .last_work
            .is_some_and(|t| now.duration_since(t) < self.busy_gap);
        if caught {
            self.window = self.max;
            self.soon_since_probe = 0;
        } else if soon {
            // Without probing, every request that comes soon gets the full window back.
            self.soon_since_probe += 1;
            if self.soon_since_probe >= self.probe_every {
                self.window = self.max;
                self.soon_since_probe = 0;
            }
        }
        self.last_work = Some(now);
        let starts = self.until.is_none();
        self.until = Some(now + self.window);
        starts
    }

    /// [`AdaptivePoll::spinning`] at the current time, reading the clock only while a
    /// spin is running.
    fn spinning_now(&mut self) -> bool {
        self.until.is_some() && self.spinning(Instant::now())
    }

    /// Whether to keep spinning at `now`; a spin that ran out without work shrinks the
    /// window for the next one.
    fn spinning(&mut self, now: Instant) -> bool {
        match self.until {
            Some(t) if now < t => true,
            Some(_) => {
                self.until = None;
                self.window = (self.window / 2).max(UCX_POLL_MIN.min(self.max));
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_shrinks_over_idle_gaps_and_comes_back_when_busy() {
        let max = Duration::from_micros(64);
        let mut p = AdaptivePoll::new(max, max * UCX_BUSY_GAPS, 1);
        let mut t = Instant::now();
        // Requests 10 ms apart: every spin runs out, the window halves down to the floor.
        for _ in 0..10 {
            p.work(t, false);
            assert!(p.spinning(t));
            t += Duration::from_millis(10);
            assert!(!p.spinning(t));
        }
        assert_eq!(p.window, UCX_POLL_MIN);
        // A request soon after the last one (a burst) brings the full window back.
        p.work(t, false);
        t += Duration::from_micros(20);
        p.work(t, false);
        assert_eq!(p.window, max);
    }

    #[test]
    fn a_stall_is_polled_hot_then_with_growing_pauses_until_work_comes() {
        let mut s = UcxStall::default();
        for _ in 0..UCX_STALL_HOT_ROUNDS {
            assert_eq!(s.pause(), None);
            s.after_round(true, false);
        }
        let mut pauses = Vec::new();
        for _ in 0..10 {
            pauses.push(s.pause().unwrap().as_micros());
            s.after_round(true, false);
        }
        assert_eq!(pauses, [4, 8, 16, 32, 64, 128, 200, 200, 200, 200]);
        // Any work, or UCX arming again, ends the stall.
        s.after_round(true, true);
        assert_eq!(s.pause(), None);
        for _ in 0..UCX_STALL_HOT_ROUNDS + 3 {
            s.after_round(true, false);
        }
        assert!(s.pause().is_some());
        s.after_round(false, false);
        assert_eq!(s.pause(), None);
    }

    #[test]
    fn the_tcp_poll_probes_for_clients_slower_than_its_window() {
        let max = Duration::from_micros(50);
        let mut p = AdaptivePoll::new(max, max * TCP_BUSY_GAPS, TCP_PROBE_EVERY);
        let mut t = Instant::now();
        // A request every 70 us (within two windows): no window catches it, so each spin
        // runs out and the window halves to the floor, where it stays but for one full
        // window (a probe) every TCP_PROBE_EVERY requests.
        let mut full = 0;
        for _ in 0..10 * TCP_PROBE_EVERY {
            p.work(t, false);
            if p.window == max {
                full += 1;
            }
            t += Duration::from_micros(70);
            assert!(!p.spinning(t));
        }
        assert!(
            full <= 10 + 6,
            "{full} full windows in {}",
            10 * TCP_PROBE_EVERY
        );
        // A closed-loop client on the same host (the next request 20 us after the last
        // reply): the next probe catches one, and the full window stays.
        let mut caught = 0;
        for _ in 0..2 * TCP_PROBE_EVERY {
            let spinning = p.spinning(t);
            if spinning {
                caught += 1;
            }
            p.work(t, spinning);
            t += Duration::from_micros(20);
        }
        assert_eq!(p.window, max);
        assert!(caught >= TCP_PROBE_EVERY, "caught {caught}");
        // Requests seconds apart never bring the window back.
        for _ in 0..4 * TCP_PROBE_EVERY {
            t += Duration::from_secs(1);
            assert!(!p.spinning(t));
            p.work(t, false);
        }
        t += Duration::from_secs(1);
        assert!(!p.spinning(t));
        assert_eq!(p.window, UCX_POLL_MIN);
    }

    #[test]
    fn off_never_spins() {
        let mut p = AdaptivePoll::new(Duration::ZERO, Duration::ZERO, 1);
        let t = Instant::now();
        assert!(!p.work(t, true));
        assert!(!p.spinning(t));
    }
}
