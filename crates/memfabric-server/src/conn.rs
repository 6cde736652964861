//! One client connection: its socket, buffers and the read → process → write cycle.
//!
//! The worker calls [`Conn::drive`] whenever the socket is ready or the connection asked
//! to be run again. A drive does a bounded amount of work (one read batch, at most `-R`
//! requests) so that one busy client cannot starve the others on the same worker; what
//! is left is picked up on the next round of the worker's loop.
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use memfabric_store::PrefetchHint;
use mio::event::Source;
use mio::{Interest, Registry, Token};

use crate::bounds::{Gauges, Holdings, Share};
use crate::command;
use crate::counters::ThreadStats;
use crate::exec::{self, ExecCtx, Session, Shared, Transport};
use crate::outqueue::OutQueue;
pub use crate::shared::{ConnEntry, ConnRegistry, ConnState};
use crate::shared::{Inbox, Target, Waiter};
use crate::tls::TlsStream;

/// Initial read buffer. It grows only as bytes arrive for a request that needs them (a
/// value announced as large grows it as the value arrives, never ahead of it), and
/// shrinks back once the connection's input is drained.
const READ_BUF_INITIAL: usize = 16 * 1024;
/// Bytes read from one socket per drive before others get a turn.
const READ_BATCH: usize = 256 * 1024;
/// The same for a value received in place: one of memcached's default `-I` (1 MiB, ~40 us
/// of copying here) in one turn, as memcached reads a value to its end; the smaller batch
/// cost every such SET an extra trip through epoll_wait.
const VALUE_READ_BATCH: usize = 1024 * 1024;

/// A connected stream socket (TCP, TLS over TCP, or unix).
pub enum Stream {
    Tcp(mio::net::TcpStream),
    Tls(Box<TlsStream>),
    Unix(mio::net::UnixStream),
}

impl Stream {
    pub fn transport(&self) -> Transport {
        match self {
            Stream::Tcp(_) | Stream::Tls(_) => Transport::Tcp,
            Stream::Unix(_) => Transport::Unix,
        }
    }

    /// Encrypted bytes the socket has not taken yet (TLS): output still to write.
    pub fn pending(&self) -> bool {
        matches!(self, Stream::Tls(t) if t.pending())
    }

    /// Push what `pending` says is waiting; `Ok(false)` while the socket takes no more.
    pub fn push(&mut self) -> io::Result<bool> {
        match self {
            Stream::Tls(t) => t.push(),
            _ => Ok(true),
        }
    }

    /// The TLS stream has ended though the last read returned data (see
    /// [`TlsStream::ended`]): read on to the end.
    pub fn ended(&self) -> bool {
        matches!(self, Stream::Tls(t) if t.ended())
    }

    /// Before the socket is closed: a TLS close_notify, best effort.
    pub fn goodbye(&mut self) {
        if let Stream::Tls(t) = self {
            t.close();
        }
    }

    /// The peer as `stats conns` prints it.
    pub fn peer_name(&self) -> String {
        match self {
            Stream::Tcp(s) => match s.peer_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:unknown".into(),
            },
            Stream::Tls(t) => match t.socket().peer_addr() {
                Ok(a) => format!("tcp:{a}"),
                Err(_) => "tcp:unknown".into(),
            },
            Stream::Unix(s) => match s.local_addr() {
                Ok(a) => match a.as_pathname() {
                    Some(p) => format!("unix:{}", p.display()),
                    None => "unix:".into(),
                },
                Err(_) => "unix:".into(),
            },
        }
    }

    pub fn raw_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Tls(t) => t.socket().as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
    // One `readv` for the end of a value (into item memory) and what follows it (into
    // the read buffer); the default would read only the first piece.
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        // One piece: `recv` (what `read` is on a socket), which the kernel serves without
        // `readv`'s iovec import and file-position lock (~2% of a 4 KB GET's server CPU
        // in perf between them).
        if let [one] = bufs {
            return self.read(one);
        }
        match self {
            Stream::Tcp(s) => s.read_vectored(bufs),
            // Decrypted into the pieces in order, as `readv` fills them.
            Stream::Tls(t) => t.read_vectored(bufs),
            Stream::Unix(s) => s.read_vectored(bufs),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    // One `writev` for a reply and the pinned values inside it (the default would write
    // only the first piece per call).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // One piece: `send`, for the same reason as `recv` above.
        if let [one] = bufs {
            return self.write(one);
        }
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Tls(t) => t.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Source for Stream {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.register(r, t, i),
            Stream::Tls(s) => s.socket_mut().register(r, t, i),
            Stream::Unix(s) => s.register(r, t, i),
        }
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.reregister(r, t, i),
            Stream::Tls(s) => s.socket_mut().reregister(r, t, i),
            Stream::Unix(s) => s.reregister(r, t, i),
        }
    }
    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.deregister(r),
            Stream::Tls(s) => s.socket_mut().deregister(r),
            Stream::Unix(s) => s.deregister(r),
        }
    }
}

/// What the worker should do with a connection after a drive.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing to do until the socket reports readiness.
    Wait,
    /// More work is ready now (input left over after the `-R` budget, or the socket may
    /// still hold data): drive again on the next round.
    Again,
    /// Close and forget the connection.
    Close,
}

/// A client connection owned by one worker.
pub struct Conn {
    pub stream: Stream,
    pub id: u64,
    /// The worker's poll token for it (where pending commands report ready).
    token: usize,
    pub entry: Arc<ConnEntry>,
    session: Session,
    /// Read buffer: bytes `rstart..rend` are unprocessed input; the Vec's length is its
    /// capacity (kept initialised so reads need no unsafe).
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Replies not yet written.
    out: OutQueue,
    /// The input holds requests that were not run yet (the `-R` budget or the output cap
    /// stopped `process`): run them before reading more, so unexecuted input stays
    /// bounded by one read batch (docs/connections.md).
    backlog: bool,
    /// The socket may have unread data (mio readiness is edge-triggered: once we stop
    /// reading before `WouldBlock`, no new event will tell us again).
    may_read: bool,
    /// The peer closed its side (a read returned 0).
    eof: bool,
    /// The poller reported the peer's FIN (or an error): read until EOF even after a
    /// short read, since no further readiness edge will come.
    peer_closed: bool,
    /// Flush `out`, then close.
    closing: bool,
    /// A read in `prefill` failed: `drive` closes the connection.
    read_failed: bool,
    /// `prefill` read this round's input: `drive` runs it before reading again (a second
    /// read first would take a large value's bytes through the read buffer instead of
    /// receiving them in place once its request has run).
    prefilled: bool,
    /// Where `prefill` found this round's first request's key, for `prefetch_item`.
    hint: Option<PrefetchHint>,
    /// Input bytes the pending request needs in total (from `Progress::need`).
    need: usize,
    /// Unix time of the last request, for `-o idle_timeout`.
    pub last_active: u32,
    /// When the connection was accepted (server clock), for `--auth-timeout`.
    pub accepted: u32,
    /// The poller reports this socket's writability too: only while a write stopped at
    /// `WouldBlock` left bytes queued (as memcached asks for `EV_WRITE` only then). An
    /// edge-triggered writable interest kept all the time costs an event-queue callback
    /// on every ACK of every reply (measured: ~2% of a 4 KB GET's server CPU).
    pub wants_writable: bool,
    /// This connection's part of `stats bounds`.
    share: Share,
}

impl Conn {
    /// Still has to pass the `-Y` handshake, SASL (`-S`) or the TLS handshake (`-Z`).
    pub fn unauthenticated(&self, shared: &Shared) -> bool {
        (shared.settings.auth.is_some() && !self.session.auth.done)
            || (shared.settings.sasl.is_some() && !self.session.sasl.authenticated)
            || matches!(&self.stream, Stream::Tls(t) if t.handshaking())
    }

    /// Waiting for its next command (or the rest of its line): what `-o idle_timeout`
    /// may close, as memcached closes only connections in conn_new_cmd or conn_read. A
    /// value still arriving, replies still to be written (a slow reader) or commands
    /// waiting for their result are work in progress, however slowly it moves.
    pub fn waiting_for_command(&self) -> bool {
        !self.session.in_request()
            && self.need == 0
            && self.session.parked() == 0
            && self.out.is_empty()
    }

    pub fn new(
        stream: Stream,
        id: u64,
        token: usize,
        entry: Arc<ConnEntry>,
        now: u32,
        gauges: Arc<Gauges>,
    ) -> Conn {
        Conn {
            stream,
            id,
            token,
            entry,
            session: Session::default(),
            rbuf: vec![0; READ_BUF_INITIAL],
            rstart: 0,
            rend: 0,
            out: OutQueue::new(),
            backlog: false,
            may_read: true,
            eof: false,
            peer_closed: false,
            closing: false,
            read_failed: false,
            prefilled: false,
            hint: None,
            need: 0,
            last_active: now,
            accepted: now,
            wants_writable: false,
            share: Share::new(gauges),
        }
    }

    /// Whether the last drive left bytes it could not write (the socket's buffer full).
    pub fn blocked_on_write(&self) -> bool {
        self.out.has_writable() || self.stream.pending()
    }

    /// Reply bytes still to write, plus one for each reply still owed (a pending
    /// command's), plus one while TLS holds encrypted bytes the socket did not take.
    fn pending_out(&self) -> usize {
        self.out.len() + self.out.holes() + usize::from(self.stream.pending())
    }

    /// Pending command `ticket` of this connection is ready: put its reply in its place.
    /// The worker drives the connection next, which writes it and goes on.
    pub fn complete(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        ticket: u64,
        done: Option<crate::pending::Completion>,
    ) {
        let ctx = ExecCtx {
            shared,
            stats,
            transport: self.stream.transport(),
            conn_id: self.id,
            waiter: None,
            completion: done.as_ref(),
        };
        exec::resume(&ctx, &mut self.session, ticket, &mut self.out);
    }

    fn pending_in(&self) -> usize {
        self.rend - self.rstart
    }

    /// Write as much of `out` as the socket takes: one syscall per batch of replies.
    fn flush(&mut self, stats: &ThreadStats) -> io::Result<()> {
        // TLS bytes encrypted earlier go first (`write_to` would not call the stream
        // with nothing of its own to write).
        if !self.stream.push()? {
            return Ok(());
        }
        let n = self.out.write_to(&mut self.stream)?;
        stats.bytes_written.add(n as u64);
        Ok(())
    }

    /// Make the buffer hold at least `want` bytes of pending input (and always leave room
    /// to read into), moving pending bytes to the front when that frees space.
    /// Growing is for the first read of a round only: later reads of the same round fill
    /// what room is left, so input is run as it comes instead of piling up.
    fn make_room(&mut self, want: usize, grow: bool) {
        if self.rstart > 0 && (self.rstart == self.rend || self.rbuf.len() - self.rend < 4096) {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        if !grow {
            return;
        }
        let target = self.rstart + want.max(self.pending_in() + 4096);
        if self.rbuf.len() < target {
            let new_len = target.max(self.rbuf.len() * 2);
            self.rbuf.resize(new_len, 0);
        }
    }

    /// One `read` into `dst`; keeps `may_read`/`eof` and the counters up to date.
    /// Returns the bytes read (0 at EOF or when the socket has nothing now).
    /// `value_left`: bytes of a value being received in place that are still to come; a
    /// short read that leaves some of them does not end the reading (see below).
    fn read_step(
        stream: &mut Stream,
        dst: &mut [io::IoSliceMut<'_>],
        value_left: usize,
        peer_closed: bool,
        may_read: &mut bool,
        eof: &mut bool,
        stats: &ThreadStats,
    ) -> io::Result<usize> {
        let want: usize = dst.iter().map(|d| d.len()).sum();
        loop {
            return match stream.read_vectored(dst) {
                Ok(0) => {
                    *eof = true;
                    *may_read = false;
                    Ok(0)
                }
                Ok(n) => {
                    stats.bytes_read.add(n as u64);
                    // A short read drained the socket: asking again would only return
                    // WouldBlock (one wasted syscall per request); data that arrives
                    // later raises a new edge-triggered event. Unless the peer's FIN
                    // already came: no edge will follow it, so read on to the EOF. Nor
                    // in the middle of a large value: its sender is still writing, more
                    // has usually come by the next read, and reading on (as memcached
                    // does) saves the trip through epoll_wait.
                    if n < want && !peer_closed && !stream.ended() && n >= value_left {
                        *may_read = false;
                    }
                    Ok(n)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *may_read = false;
                    Ok(0)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// While a large value is arriving and nothing else is buffered, read the socket
    /// straight into the item's memory (as memcached reads into its item), up to one
    /// batch. The bytes after the value come through `fill` as usual.
    fn fill_value(&mut self, stats: &ThreadStats) -> io::Result<()> {
        let mut total = 0;
        while total < VALUE_READ_BATCH && self.pending_in() == 0 && self.may_read && !self.eof {
            let Some(r) = self.session.receiving.as_mut() else {
                break;
            };
            let last_piece = r.remaining();
            let Some(dst) = r.unfilled_mut() else {
                break;
            };
            let value_part = dst.len();
            // The value's last piece is read together with what follows it (its
            // trailer, the next requests) into the empty read buffer: one system call
            // where two would do, as memcached reads the `\r\n` with the data.
            let after = if value_part == last_piece {
                self.rstart = 0;
                self.rend = 0;
                &mut self.rbuf[..]
            } else {
                &mut []
            };
            let mut bufs = [io::IoSliceMut::new(dst), io::IoSliceMut::new(after)];
            let n = Self::read_step(
                &mut self.stream,
                &mut bufs,
                last_piece,
                self.peer_closed,
                &mut self.may_read,
                &mut self.eof,
                stats,
            )?;
            r.advance(n.min(value_part));
            self.rend += n.saturating_sub(value_part);
            total += n;
        }
        Ok(())
    }

    /// Read until `WouldBlock`, EOF or one batch.
    fn fill(&mut self, stats: &ThreadStats) -> io::Result<()> {
        if self.pending_in() == 0
            && self
                .session
                .receiving
                .as_ref()
                .is_some_and(|r| r.remaining() > 0)
        {
            // A value is still arriving in place (`fill_value` stopped at its batch):
            // its bytes go to the item on the next round, not through the read buffer.
            return Ok(());
        }
        let mut total = 0;
        while total < READ_BATCH && self.may_read && !self.eof {
            let want = self.need.max(self.pending_in() + 1);
            self.make_room(want.min(self.pending_in() + READ_BATCH), total == 0);
            if self.rend == self.rbuf.len() {
                break;
            }
            let n = Self::read_step(
                &mut self.stream,
                &mut [io::IoSliceMut::new(&mut self.rbuf[self.rend..])],
                0,
                self.peer_closed,
                &mut self.may_read,
                &mut self.eof,
                stats,
            )?;
            self.rend += n;
            total += n;
        }
        Ok(())
    }

    /// The first half of `drive` for a connection the poller says is readable: read what
    /// the socket has (when `drive` would) and start loading the store memory its first
    /// request will touch (`exec::prefetch`). When enough connections are ready
    /// (`PREFILL_FROM_READY`), the worker does this for each before it drives any, so
    /// that one connection's cache misses overlap the reads of the others; `drive` (with
    /// `readable` false: this was the read) then runs what was read.
    pub fn prefill(&mut self, shared: &Shared, stats: &ThreadStats) {
        self.may_read = true;
        if self.closing
            || self.eof
            || self.backlog
            || self.read_failed
            || exec::output_full(shared, &self.out)
            || exec::parked_full(&self.session)
        {
            return;
        }
        self.entry.set_state(ConnState::Read);
        if self.fill_value(stats).is_err() || self.fill(stats).is_err() {
            self.read_failed = true;
            return;
        }
        self.prefilled = true;
        self.hint = exec::prefetch(shared, &self.session, &self.rbuf[self.rstart..self.rend]);
    }

    /// The second prefetch step (see `prefill`), for the connection driven next, while
    /// the worker runs the one before it: its bucket has had time to arrive; start
    /// loading its item.
    pub fn prefetch_item(&self, shared: &Shared) {
        if let Some(hint) = &self.hint {
            command::prefetch_item(shared, hint);
        }
    }

    /// A readiness event arrived (or the worker re-runs us). Do one bounded round of
    /// work.
    pub fn drive(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        inbox: &Arc<Inbox>,
        readable: bool,
        now: u32,
    ) -> Next {
        let next = self.drive_round(shared, stats, inbox, readable, now);
        let holdings = Holdings {
            read_buf_bytes: self.rbuf.len() as i64,
            copied_out_bytes: (self.out.len() - self.out.pinned_bytes()) as i64,
            pinned_values: self.out.pinned_values() as i64,
            pinned_bytes: self.out.pinned_bytes() as i64,
            receiving_values: self.session.receiving_values() as i64,
            receiving_bytes: self.session.receiving_bytes() as i64,
            paused_on_output: i64::from(self.entry.state() == ConnState::Mwrite),
            pending_commands: self.session.parked() as i64,
        };
        self.share.update(holdings);
        next
    }

    fn drive_round(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        inbox: &Arc<Inbox>,
        readable: bool,
        now: u32,
    ) -> Next {
        if readable {
            self.may_read = true;
        }
        let prefilled = std::mem::take(&mut self.prefilled);
        self.hint = None;
        if self.read_failed || self.flush(stats).is_err() {
            return Next::Close;
        }
        if self.closing {
            return if self.pending_out() == 0 {
                Next::Close
            } else {
                self.entry.set_state(ConnState::Closing);
                Next::Wait
            };
        }
        // Backpressure: a client that does not read its replies gets nothing more
        // processed or read until they drain (the writable event re-drives us).
        if exec::output_full(shared, &self.out) {
            self.entry.set_state(ConnState::Mwrite);
            return Next::Wait;
        }
        // As many commands pending as one connection may have: nothing more runs until
        // one completes (its completion re-drives us).
        if exec::parked_full(&self.session) {
            return Next::Wait;
        }
        // Read only when the input holds no runnable request: a client that pipelines
        // faster than `-R` lets us execute is slowed down (TCP flow control), never cut off.
        if self.may_read && !self.eof && !self.backlog && !prefilled {
            self.entry.set_state(ConnState::Read);
            if self.fill_value(stats).is_err() || self.fill(stats).is_err() {
                return Next::Close;
            }
        }
        self.backlog = false;
        if (self.pending_in() > 0 && self.pending_in() >= self.need) || self.session.received() {
            self.entry.set_state(ConnState::ParseCmd);
            let mut ctx = ExecCtx {
                shared,
                stats,
                transport: self.stream.transport(),
                conn_id: self.id,
                waiter: Some(Waiter {
                    inbox,
                    target: Target::Conn(self.token),
                }),
                completion: None,
            };
            let verbose = shared.verbose.load(Ordering::Relaxed) >= 2;
            let before = self.out.len();
            let p = exec::process(
                &mut ctx,
                &mut self.session,
                &self.rbuf[self.rstart..self.rend],
                &mut self.out,
                shared.settings.reqs_per_event,
            );
            if verbose && p.consumed > 0 {
                let reply = self.out.to_vec();
                log_traffic(
                    self.id,
                    &self.rbuf[self.rstart..self.rstart + p.consumed],
                    reply.get(before..).unwrap_or_default(),
                );
            }
            self.rstart += p.consumed.min(self.pending_in());
            if self.rstart == self.rend {
                self.rstart = 0;
                self.rend = 0;
                if self.rbuf.len() > READ_BUF_INITIAL * 4 && !self.session.in_request() {
                    // A large request is done: give its buffer back.
                    self.rbuf = vec![0; READ_BUF_INITIAL];
                }
            }
            if p.consumed > 0 {
                self.last_active = now;
                self.entry.touch(now);
            }
            self.need = p.need;
            // The executors refuse values above -I before buffering them, and receive
            // large values in place: a request needing more than this is not one.
            let cap = shared.settings.store.item_size_max + (2 << 20);
            if p.need > cap {
                self.closing = true;
            }
            if p.close {
                self.closing = true;
            } else if p.yielded {
                // memcached's conn_yields counts the -R budget and output stops, not a
                // connection waiting for its pending commands (completions re-drive it).
                if !exec::parked_full(&self.session) {
                    stats.conn_yields.incr();
                }
                self.backlog = true;
            }
        }
        if self.flush(stats).is_err() {
            return Next::Close;
        }
        if self.closing {
            return if self.pending_out() == 0 {
                Next::Close
            } else {
                self.entry.set_state(ConnState::Closing);
                Next::Wait
            };
        }
        if self.eof && !self.backlog {
            // Peer half-closed: finish what can be answered, then close (as memcached
            // does on a read of 0).
            return if self.pending_out() == 0 {
                Next::Close
            } else {
                self.closing = true;
                Next::Wait
            };
        }
        if exec::output_full(shared, &self.out) {
            self.entry.set_state(ConnState::Mwrite);
            return Next::Wait;
        }
        self.entry.set_state(if self.need > self.pending_in() {
            ConnState::Nread
        } else {
            ConnState::Read
        });
        if self.backlog || (self.may_read && !self.eof) {
            Next::Again
        } else {
            Next::Wait
        }
    }

    /// The poller saw the peer close its side (see `peer_closed`).
    pub fn note_peer_closed(&mut self) {
        self.peer_closed = true;
    }

    /// Ask to be closed: flush what is queued first.
    pub fn begin_close(&mut self) {
        self.closing = true;
    }
}

/// `-vv`: memcached prints each command and the start of each reply. We print the first
/// line of what was consumed and of what was answered, truncated, so that large values
/// do not flood the log.
fn log_traffic(id: u64, req: &[u8], reply: &[u8]) {
    fn first_line(b: &[u8]) -> std::borrow::Cow<'_, str> {
        const MAX: usize = 200;
        let end = b
            .iter()
            .position(|&c| c == b'\r' || c == b'\n')
            .unwrap_or(b.len())
            .min(MAX);
        String::from_utf8_lossy(&b[..end])
    }
    tracing::debug!("<{id} {}", first_line(req));
    if !reply.is_empty() {
        tracing::debug!(">{id} {}", first_line(reply));
    }
}
