//! The TCP transport: non-blocking sockets polled together through `mio`, requests pipelined,
//! replies matched to requests in order per connection, meta protocol on the wire. With
//! TLS configured, each new connection first runs the TLS handshake (`tls.rs`); with
//! credentials, it then goes through memcached's `-Y` handshake.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::addr::ServerAddr;
use crate::error::Error;
use crate::meta::{self, Expect, OutQueue, Parsed};
use crate::op::Op;
use crate::tls::{Socket, TlsConfig, TlsStream};
use crate::transport::{Completion, ConnId, Credentials, Transport};

const READ_CHUNK: usize = 256 * 1024;
const MAX_IOVECS: usize = 64;

struct Conn {
    stream: Socket,
    name: String,
    out: OutQueue,
    inbuf: BytesMut,
    /// Bytes the reply at the front needs before it can be parsed again.
    need: usize,
    inflight: VecDeque<(u64, Expect)>,
}

/// See the module documentation.
pub struct TcpTransport {
    poll: Poll,
    events: Events,
    conns: HashMap<ConnId, Conn>,
    next_conn: ConnId,
    /// Requests of closed connections, completed with `Error::Closed` at the next progress.
    orphans: Vec<u64>,
    scratch: Vec<u8>,
    credentials: Option<Credentials>,
    /// TLS for every connection (`Config::tls`), and the name servers' certificates
    /// must carry when one is configured.
    tls: Option<(Arc<rustls::ClientConfig>, Option<String>)>,
}

impl TcpTransport {
    pub fn new() -> Result<Self, Error> {
        let poll = Poll::new().map_err(|e| Error::Io {
            server: "poll".into(),
            msg: e.to_string(),
        })?;
        Ok(TcpTransport {
            poll,
            events: Events::with_capacity(256),
            conns: HashMap::new(),
            next_conn: 1,
            orphans: Vec::new(),
            scratch: vec![0; READ_CHUNK],
            credentials: None,
            tls: None,
        })
    }

    /// Speak TLS to every server (memcached's `-Z`); the files are read now.
    pub fn with_tls(mut self, tls: Option<&TlsConfig>) -> Result<Self, Error> {
        self.tls = match tls {
            Some(t) => Some((crate::tls::client_config(t)?, t.server_name.clone())),
            None => None,
        };
        Ok(self)
    }

    /// Authenticate every new connection as `credentials` (memcached's `-Y`).
    pub fn with_credentials(mut self, credentials: Option<Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    fn resolve(addr: &ServerAddr) -> Result<Vec<SocketAddr>, Error> {
        (addr.host.as_str(), addr.port)
            .to_socket_addrs()
            .map(|it| it.collect())
            .map_err(|e| Error::Io {
                server: addr.host_port(),
                msg: format!("resolve: {e}"),
            })
    }

    /// Removes a failed connection, completing its requests with `err`.
    fn fail(
        &mut self,
        id: ConnId,
        msg: String,
        done: &mut Vec<Completion>,
        failed: &mut Vec<ConnId>,
    ) {
        if let Some(mut c) = self.conns.remove(&id) {
            let _ = self.poll.registry().deregister(c.stream.tcp());
            for (rid, _) in c.inflight.drain(..) {
                done.push(Completion {
                    id: rid,
                    result: Err(Error::Io {
                        server: c.name.clone(),
                        msg: msg.clone(),
                    }),
                });
            }
            failed.push(id);
        }
    }
}

/// Writes as much queued output as the socket takes. `Err` = the connection is broken.
fn flush(c: &mut Conn) -> io::Result<()> {
    if !c.stream.push()? {
        return Ok(());
    }
    while !c.out.is_empty() {
        let slices = c.out.slices(MAX_IOVECS);
        match c.stream.write_vectored(&slices) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
            Ok(n) => c.out.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// memcached's ascii authentication on a new, still blocking, connection (`sock`; `s` is
/// what to speak through: the socket, or TLS over it). First a meta no-op: a server
/// without `-Y` answers `MN` (nothing to do: a `set` would store the credentials there),
/// one with `-Y` refuses it as unauthenticated; then the handshake, a `set` with `<user>
/// <password>` as its value, which `STORED` accepts.
pub(crate) fn authenticate(
    s: &mut impl ReadWrite,
    sock: &StdTcpStream,
    c: &Credentials,
    server: &str,
    deadline: Instant,
) -> Result<(), Error> {
    let io_err = |e: io::Error| Error::Io {
        server: server.to_string(),
        msg: format!("authentication: {e}"),
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    sock.set_read_timeout(Some(left)).map_err(io_err)?;
    sock.set_write_timeout(Some(left)).map_err(io_err)?;
    s.write_all(b"mn\r\n").map_err(io_err)?;
    match &reply_line(s).map_err(io_err)?[..] {
        b"MN\r\n" => return Ok(()),
        b"CLIENT_ERROR unauthenticated\r\n" => {}
        other => {
            return Err(Error::Protocol(format!(
                "{server}: unexpected answer to mn: {}",
                String::from_utf8_lossy(other).trim_end()
            )))
        }
    }
    let payload = format!("{} {}", c.username, c.password);
    s.write_all(format!("set auth 0 0 {}\r\n{payload}\r\n", payload.len()).as_bytes())
        .map_err(io_err)?;
    match &reply_line(s).map_err(io_err)?[..] {
        b"STORED\r\n" => Ok(()),
        other => Err(Error::Auth {
            server: server.to_string(),
            msg: format!(
                "authentication as {:?} refused: {}",
                c.username,
                String::from_utf8_lossy(other).trim_end()
            ),
        }),
    }
}

/// A blocking byte stream: a socket, or TLS over one.
pub(crate) trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// One `\r\n`-ended line (at most 1 KiB; less if the server closed).
fn reply_line(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") && line.len() < 1024 {
        match r.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => line.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(line)
}

/// Reads everything available and completes the requests whose replies are whole.
/// `Err` = the connection is broken or out of step.
fn read_and_parse(
    c: &mut Conn,
    scratch: &mut [u8],
    done: &mut Vec<Completion>,
) -> Result<(), String> {
    loop {
        match c.stream.read(scratch) {
            Ok(0) => {
                parse_ready(c, done)?;
                return Err("connection closed by server".into());
            }
            Ok(n) => {
                c.inbuf.extend_from_slice(&scratch[..n]);
                if c.inbuf.len() >= c.need {
                    parse_ready(c, done)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn parse_ready(c: &mut Conn, done: &mut Vec<Completion>) -> Result<(), String> {
    while let Some(&(id, expect)) = c.inflight.front() {
        if c.inbuf.is_empty() {
            break;
        }
        match meta::parse(&mut c.inbuf, expect)? {
            Parsed::Incomplete { need } => {
                c.need = need;
                if need > c.inbuf.capacity() {
                    c.inbuf.reserve(need - c.inbuf.len());
                }
                return Ok(());
            }
            Parsed::Done(result) => {
                c.inflight.pop_front();
                c.need = 0;
                done.push(Completion { id, result });
            }
        }
    }
    if c.inflight.is_empty() && !c.inbuf.is_empty() {
        return Err(format!("{} unexpected bytes from server", c.inbuf.len()));
    }
    c.need = 0;
    Ok(())
}

impl Transport for TcpTransport {
    fn connect(&mut self, addr: &ServerAddr, timeout: Duration) -> Result<ConnId, Error> {
        let name = addr.host_port();
        let mut last = Error::ServerDown {
            server: name.clone(),
        };
        let deadline = Instant::now() + timeout;
        for sa in Self::resolve(addr)? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout { server: name });
            }
            match StdTcpStream::connect_timeout(&sa, left) {
                Ok(s) => {
                    let io_err = |e: io::Error| Error::Io {
                        server: name.clone(),
                        msg: e.to_string(),
                    };
                    let tls = match &self.tls {
                        Some((config, server_name)) => {
                            let host = server_name.as_deref().unwrap_or(&addr.host);
                            Some(crate::tls::handshake(&s, config, host, &name, deadline)?)
                        }
                        None => None,
                    };
                    let mut tls = tls;
                    if let Some(c) = &self.credentials {
                        match tls.as_mut() {
                            Some(conn) => {
                                let mut sock = &s;
                                let mut over = rustls::Stream::new(conn, &mut sock);
                                authenticate(&mut over, &s, c, &name, deadline)?;
                            }
                            None => authenticate(&mut &s, &s, c, &name, deadline)?,
                        }
                    }
                    s.set_nonblocking(true).map_err(io_err)?;
                    s.set_nodelay(true).map_err(io_err)?;
                    let mut stream = match tls {
                        Some(conn) => {
                            Socket::Tls(Box::new(TlsStream::new(TcpStream::from_std(s), conn)))
                        }
                        None => Socket::Plain(TcpStream::from_std(s)),
                    };
                    let id = self.next_conn;
                    self.next_conn += 1;
                    self.poll
                        .registry()
                        .register(
                            stream.tcp(),
                            Token(id),
                            Interest::READABLE | Interest::WRITABLE,
                        )
                        .map_err(io_err)?;
                    self.conns.insert(
                        id,
                        Conn {
                            stream,
                            name,
                            out: OutQueue::default(),
                            inbuf: BytesMut::with_capacity(16 * 1024),
                            need: 0,
                            inflight: VecDeque::new(),
                        },
                    );
                    return Ok(id);
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    last = Error::Timeout {
                        server: name.clone(),
                    }
                }
                Err(e) => {
                    last = Error::Io {
                        server: name.clone(),
                        msg: format!("connect: {e}"),
                    }
                }
            }
        }
        Err(last)
    }

    fn submit(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error> {
        let c = self.conns.get_mut(&conn).ok_or(Error::Closed)?;
        let expect = meta::encode(op, &mut c.out)?;
        c.inflight.push_back((id, expect));
        Ok(())
    }

    fn progress(
        &mut self,
        timeout: Duration,
        done: &mut Vec<Completion>,
        failed: &mut Vec<ConnId>,
    ) -> Result<(), Error> {
        let start_len = done.len();
        done.extend(self.orphans.drain(..).map(|id| Completion {
            id,
            result: Err(Error::Closed),
        }));
        let mut broken = Vec::new();
        for (&id, c) in self.conns.iter_mut() {
            if let Err(e) = flush(c) {
                broken.push((id, format!("write: {e}")));
            }
        }
        for (id, msg) in broken.drain(..) {
            self.fail(id, msg, done, failed);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let wait = if done.len() > start_len || !failed.is_empty() {
                Duration::ZERO
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match self.poll.poll(&mut self.events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Error::Io {
                        server: "poll".into(),
                        msg: e.to_string(),
                    })
                }
            }
            for ev in self.events.iter() {
                let id = ev.token().0;
                let Some(c) = self.conns.get_mut(&id) else {
                    continue;
                };
                if ev.is_writable() {
                    if let Err(e) = flush(c) {
                        broken.push((id, format!("write: {e}")));
                        continue;
                    }
                }
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    if let Err(msg) = read_and_parse(c, &mut self.scratch, done) {
                        broken.push((id, msg));
                    }
                } else if ev.is_write_closed() && !c.out.is_empty() {
                    broken.push((id, "connection closed by server".into()));
                }
            }
            for (id, msg) in broken.drain(..) {
                self.fail(id, msg, done, failed);
            }
            if done.len() > start_len || !failed.is_empty() || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    fn close(&mut self, conn: ConnId) {
        if let Some(mut c) = self.conns.remove(&conn) {
            let _ = self.poll.registry().deregister(c.stream.tcp());
            // A connection is closed when its server timed out. Reset it rather than close
            // it: the kernel then drops what was not yet sent (no retransmission reaches a
            // cut-off server once its link is back), and the server's kernel drops what
            // its process had not read yet (a paused server does not run, once resumed,
            // requests its client gave up on — after the requests of a newer connection).
            let _ = socket2::SockRef::from(&*c.stream.tcp()).set_linger(Some(Duration::ZERO));
            self.orphans.extend(c.inflight.drain(..).map(|(id, _)| id));
        }
    }
}
