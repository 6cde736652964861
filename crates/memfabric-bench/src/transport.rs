//! How requests reach a server. The load generator drives a [`Transport`]: TCP (memcached's
//! text protocol, here) or UCX active messages to memfabricd ([`crate::ucx`]).
//!
//! TCP connections may speak TLS (a server with `-Z`; the client library's rustls stream).
//!
//! The shape (submit, then progress with a reply callback) is the one UCX imposes anyway:
//! requests are queued without blocking, and a progress call moves bytes and reports
//! completions in order per connection.

use crate::textproto::{self, Reply, ReplyError, Request};
use memfabric_client::tls::{Socket, TlsStream};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a transport gave up.
#[derive(Debug, Error)]
pub enum TransportError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("i/o on connection {conn}: {source}")]
    Io { conn: usize, source: io::Error },
    #[error("server closed connection {0}")]
    Closed(usize),
    #[error("bad reply on connection {conn}: {source}")]
    Protocol { conn: usize, source: ReplyError },
    #[error("no connection {0}")]
    NoSuchConnection(usize),
    /// A request failed in the client library (UCX transport): timeout, lost connection...
    #[error("request on connection {conn}: {msg}")]
    Request { conn: usize, msg: String },
}

/// A set of connections to one server, driven by one client thread. Not `Send`: a UCX
/// worker belongs to the thread that made it, so every transport is made (by a
/// [`Connector`]) inside the thread that drives it.
pub trait Transport {
    /// Short name for reports (`"tcp"`, later `"ucx-am"`, ...).
    fn name(&self) -> &'static str;
    /// How many connections this transport multiplexes.
    fn connections(&self) -> usize;
    /// Queue `req` on connection `conn`. Never blocks; bytes move in [`progress`](Self::progress).
    fn submit(&mut self, conn: usize, req: &Request<'_>) -> Result<(), TransportError>;
    /// Send what is queued, wait up to `timeout` for replies, and hand every complete reply
    /// to `on_reply(conn, reply)`, in order per connection. Returns how many were handed.
    fn progress(
        &mut self,
        timeout: Duration,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<usize, TransportError>;
}

/// Makes transports; shared by the client threads of a run, each of which calls
/// [`connect`](Self::connect) itself.
pub trait Connector: Sync {
    fn connect(&self, conns: usize) -> Result<Box<dyn Transport>, TransportError>;
}

/// TCP, memcached text protocol; over TLS when `tls` is set.
#[derive(Clone, Debug)]
pub struct TcpConnector {
    pub addr: SocketAddr,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl TcpConnector {
    pub fn plain(addr: SocketAddr) -> TcpConnector {
        TcpConnector { addr, tls: None }
    }
}

impl Connector for TcpConnector {
    fn connect(&self, conns: usize) -> Result<Box<dyn Transport>, TransportError> {
        Ok(Box::new(TcpTransport::connect(
            self.addr,
            conns,
            self.tls.as_ref(),
        )?))
    }
}

struct Conn {
    stream: Socket,
    wbuf: Vec<u8>,
    wpos: usize,
    /// Registered for writability because a write hit WouldBlock.
    want_write: bool,
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
}

/// Non-blocking sockets on one epoll (mio), so one thread keeps many connections busy.
pub struct TcpTransport {
    poll: Poll,
    events: Events,
    conns: Vec<Conn>,
}

const RBUF_INITIAL: usize = 64 * 1024;

impl TcpTransport {
    /// Open `n` connections to `addr` (Nagle off: requests are latency-bound), with TLS
    /// when `tls` is given (the certificate must name 127.0.0.1 or the address's IP).
    pub fn connect(
        addr: SocketAddr,
        n: usize,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Self, TransportError> {
        let cerr = |source| TransportError::Connect { addr, source };
        let poll = Poll::new().map_err(cerr)?;
        let mut conns = Vec::with_capacity(n);
        for i in 0..n {
            let std = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .map_err(cerr)?;
            std.set_nodelay(true).map_err(cerr)?;
            let tls = match tls {
                Some(config) => {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    let host = addr.ip().to_string();
                    let conn = memfabric_client::tls::handshake(
                        &std,
                        config,
                        &host,
                        &addr.to_string(),
                        deadline,
                    )
                    .map_err(|e| cerr(io::Error::other(e.to_string())))?;
                    Some(conn)
                }
                None => None,
            };
            std.set_nonblocking(true).map_err(cerr)?;
            let mut stream = match tls {
                Some(conn) => Socket::Tls(Box::new(TlsStream::new(TcpStream::from_std(std), conn))),
                None => Socket::Plain(TcpStream::from_std(std)),
            };
            poll.registry()
                .register(
                    stream.tcp(),
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(cerr)?;
            conns.push(Conn {
                stream,
                wbuf: Vec::with_capacity(16 * 1024),
                wpos: 0,
                want_write: false,
                rbuf: vec![0; RBUF_INITIAL],
                rstart: 0,
                rend: 0,
            });
        }
        Ok(TcpTransport {
            poll,
            events: Events::with_capacity(n.max(1) * 2),
            conns,
        })
    }
}

impl Conn {
    fn flush(&mut self, idx: usize, registry: &Registry) -> Result<(), TransportError> {
        let ioerr = |source| TransportError::Io { conn: idx, source };
        let mut blocked = !self.stream.push().map_err(ioerr)?;
        while !blocked && self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(TransportError::Closed(idx)),
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(ioerr(source)),
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
        // Asked for writability while bytes wait: ours, or TLS's encrypted ones.
        let want = blocked || self.stream.pending();
        if want != self.want_write {
            self.want_write = want;
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry
                .reregister(self.stream.tcp(), Token(idx), interest)
                .map_err(ioerr)?;
        }
        Ok(())
    }

    /// Read until the socket is drained (mio is edge-triggered), handing out replies as
    /// they complete.
    fn read(
        &mut self,
        idx: usize,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<usize, TransportError> {
        let mut delivered = 0;
        loop {
            if self.rend == self.rbuf.len() {
                if self.rstart > 0 {
                    self.rbuf.copy_within(self.rstart..self.rend, 0);
                    self.rend -= self.rstart;
                    self.rstart = 0;
                } else {
                    // One reply larger than the buffer (big values): grow.
                    let len = self.rbuf.len() * 2;
                    self.rbuf.resize(len, 0);
                }
            }
            let room = self.rbuf.len() - self.rend;
            let drained = match self.stream.read(&mut self.rbuf[self.rend..]) {
                Ok(0) => return Err(TransportError::Closed(idx)),
                Ok(n) => {
                    self.rend += n;
                    // On Linux a short read from a TCP socket means its receive queue is
                    // empty; data arriving later raises a new edge. Skipping the read that
                    // would only return EAGAIN saves a syscall per reply (memcached does
                    // the same).
                    // (A TLS stream that ended says so at the next read.)
                    n < room && !self.stream.ended()
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(delivered),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(TransportError::Io { conn: idx, source }),
            };
            loop {
                let window = &self.rbuf[self.rstart..self.rend];
                match textproto::parse_reply(window) {
                    Ok(Some((reply, used))) => {
                        on_reply(idx, reply);
                        delivered += 1;
                        self.rstart += used;
                    }
                    Ok(None) => break,
                    Err(source) => return Err(TransportError::Protocol { conn: idx, source }),
                }
            }
            if self.rstart == self.rend {
                self.rstart = 0;
                self.rend = 0;
            }
            if drained {
                return Ok(delivered);
            }
        }
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connections(&self) -> usize {
        self.conns.len()
    }

    fn submit(&mut self, conn: usize, req: &Request<'_>) -> Result<(), TransportError> {
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(TransportError::NoSuchConnection(conn))?;
        textproto::encode(req, &mut c.wbuf);
        Ok(())
    }

    fn progress(
        &mut self,
        timeout: Duration,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<usize, TransportError> {
        for (i, c) in self.conns.iter_mut().enumerate() {
            if (c.wpos < c.wbuf.len() || c.stream.pending()) && !c.want_write {
                c.flush(i, self.poll.registry())?;
            }
        }
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(0),
            Err(source) => return Err(TransportError::Io { conn: 0, source }),
        }
        let mut delivered = 0;
        for ev in self.events.iter() {
            let idx = ev.token().0;
            let Some(c) = self.conns.get_mut(idx) else {
                continue;
            };
            if ev.is_writable() && (c.wpos < c.wbuf.len() || c.stream.pending()) {
                c.flush(idx, self.poll.registry())?;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                delivered += c.read(idx, on_reply)?;
            }
        }
        Ok(delivered)
    }
}
