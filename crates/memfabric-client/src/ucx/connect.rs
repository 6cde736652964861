//! Bootstrap and connection life of the UCX transport: the process's UCX context, HELLO /
//! WELCOME over the server's `--ucx-port`, the UCX endpoint to the server's worker, and the
//! lifeline (the bootstrap TCP connection kept open: when it closes, the server is gone
//! and everything in flight to it fails at once).
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memfabric_proto::ucx_wire as fp;
use memfabric_ucx as mf;
use mio::{Interest, Token};

use super::{Conn, UcxTransport};
use crate::addr::ServerAddr;
use crate::error::Error;
use crate::transport::{Completion, ConnId};

/// A lifeline seen open this recently is not asked again before a one-sided GET.
const LIFELINE_FRESH: Duration = Duration::from_micros(20);

/// The process's UCX context, created on first use.
pub(super) fn context() -> Result<Arc<mf::Context>, Error> {
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

impl UcxTransport {
    /// Answer bootstrap challenges (servers with `-Y`) as `credentials`.
    pub fn with_credentials(mut self, credentials: Option<crate::transport::Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    pub(super) fn connect_server(
        &mut self,
        addr: &ServerAddr,
        timeout: Duration,
    ) -> Result<ConnId, Error> {
        let deadline = Instant::now() + timeout;
        let (lifeline, welcome) = self.bootstrap(addr, timeout)?;
        // The server's endpoint to us is connecting already: ours is made once it is up,
        // so that UCX pairs the two over that one connection (both ends connecting at once
        // sometimes lost a reply, docs/fabric-protocol.md 1.3). Should READY not come in
        // time, ours is made anyway, as with servers that send none.
        if welcome.ready {
            self.await_ready(&fp::Ready::for_welcome(&welcome), deadline);
        }
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
                instance: format!(
                    "{:08x}{:08x}",
                    welcome.started_unix as u32, welcome.instance
                ),
                eager_max: welcome.eager_max as usize,
                rma,
                am_inflight: 0,
                moving: None,
            },
        );
        Ok(id)
    }

    /// Progress the worker until the READY `want` comes (or has come), at most until
    /// `deadline`. Everything else that arrives meanwhile is kept for the next wait.
    pub(super) fn await_ready(&mut self, want: &fp::Ready, deadline: Instant) -> bool {
        if self.take_ready(want) {
            return true;
        }
        let mut events = std::collections::VecDeque::new();
        loop {
            let n = self.w.progress();
            self.w.drain_into(&mut events);
            let mut found = false;
            while let Some(e) = events.pop_front() {
                match e {
                    mf::Event::Am(msg)
                        if !found
                            && msg.id == fp::AM_READY
                            && fp::decode_ready(&msg.header).as_ref() == Ok(want) =>
                    {
                        found = true;
                    }
                    other => self.local_events.push_back(other),
                }
            }
            if found {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if n == 0 {
                // A connection on its way: a wake-up costs less than the core it would
                // take from the server on this host.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Whether READY `r` came before anyone waited for it (forgotten once taken).
    pub(super) fn take_ready(&mut self, r: &fp::Ready) -> bool {
        match self.readies_seen.iter().position(|x| x == r) {
            Some(i) => {
                self.readies_seen.remove(i);
                true
            }
            None => false,
        }
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
        let (major, minor, _) = mf::version_numbers();
        let hello = fp::Hello {
            version: fp::VERSION,
            ucx_version: fp::ucx_version_code(major, minor),
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
            if fp::server_frame_status(&buf) == Some(fp::WELCOME_CHALLENGE) {
                match fp::decode_challenge(&buf) {
                    Ok(Some((challenge, used))) => {
                        buf.drain(..used);
                        let proof = self.prove(&server, &challenge)?;
                        s.write_all(&proof.encode()).map_err(io)?;
                    }
                    Ok(None) => {}
                    Err(e) => return Err(Error::Protocol(format!("{server}: bad challenge: {e}"))),
                }
                continue;
            }
            match fp::decode_welcome(&buf) {
                Ok(Some((w, _))) => break w,
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(format!("{server}: bad WELCOME: {e}"))),
            }
        };
        match welcome.status {
            fp::WELCOME_OK => Ok((s, welcome)),
            fp::WELCOME_AUTH_FAILED => Err(Error::Auth {
                server,
                msg: format!(
                    "the server refused the credentials of {:?}",
                    self.credentials
                        .as_ref()
                        .map_or("", |c| c.username.as_str())
                ),
            }),
            fp::WELCOME_FULL => Err(Error::Io {
                server,
                msg: "the server is full (it serves --max-clients UCX sessions already)".into(),
            }),
            fp::WELCOME_UCX_MISMATCH => Err(Error::Protocol(format!(
                "{server}: the server runs UCX {}, this client UCX {} ({}): UCX peers of \
                 different releases cannot talk to each other; use the same UCX on both \
                 sides, or the memcached protocol over TCP",
                fp::ucx_version_text(welcome.session as u16),
                fp::ucx_version_text(hello.ucx_version),
                mf::version()
            ))),
            fp::WELCOME_BAD_VERSION => Err(Error::Protocol(format!(
                "{server}: fabric protocol version {} not supported (server speaks {})",
                fp::VERSION,
                welcome.version
            ))),
            _ => Err(Error::ServerDown { server }),
        }
    }

    /// The proof for a challenge: the MAC of its nonce and our worker address, keyed
    /// with the password.
    fn prove(&self, server: &str, challenge: &fp::Challenge) -> Result<fp::Proof, Error> {
        let Some(c) = self.credentials.as_ref() else {
            return Err(Error::Auth {
                server: server.to_string(),
                msg: "the server asks for credentials (its -Y file); the pool has none \
                      (Config::credentials)"
                    .into(),
            });
        };
        if c.username.len() > fp::USER_MAX {
            return Err(Error::Config(format!(
                "a user name is at most {} bytes",
                fp::USER_MAX
            )));
        }
        Ok(fp::Proof {
            user: c.username.as_bytes().to_vec(),
            mac: fp::proof_mac(c.password.as_bytes(), &challenge.nonce, &self.address),
        })
    }

    pub(super) fn fail_conn(&mut self, conn: ConnId, msg: &str, done: &mut Vec<Completion>) {
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
        let queued = match c.moving.take() {
            Some(m) => {
                self.w.close(m.ep, true);
                m.queued
            }
            None => Default::default(),
        };
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
        // Requests waiting for a move never went out.
        for (id, _) in queued {
            done.push(Completion {
                id,
                result: Err(err()),
            });
        }
    }

    /// Lifelines that closed or failed: their servers are gone.
    pub(super) fn check_lifelines(&mut self, done: &mut Vec<Completion>, failed: &mut Vec<ConnId>) {
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

    /// Whether `conn`'s lifeline is still open: one non-blocking peek, at most once per
    /// `LIFELINE_FRESH` (a dead process's sockets close at once, so this bounds how long
    /// after a server's death its memory can still be read).
    pub(super) fn lifeline_alive(&mut self, conn: ConnId) -> bool {
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
}

/// Whether a session's lifeline (non-blocking) is still open: nothing to read yet. EOF, an
/// error, or bytes (which the protocol never sends after WELCOME) mean the server is gone.
pub(super) fn lifeline_open(lifeline: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match lifeline.peek(&mut buf) {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}
