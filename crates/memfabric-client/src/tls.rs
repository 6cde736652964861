//! TLS for the TCP transport (servers started with `-Z`: memcached's or memfabricd's), with
//! rustls. The handshake runs on the new, still blocking, socket (within the connect
//! deadline); then [`TlsStream`] reads and writes the non-blocking socket the transport
//! polls: a read fills what it is given until the socket has nothing more, a write
//! encrypts into rustls's buffer and pushes it out; what the socket did not take yet goes
//! first at the next write or [`TlsStream::push`].
use std::io::{self, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::error::Error;

/// Where the client's TLS trust and identity come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM CA certificates that sign the servers' certificates (default: Debian's system
    /// bundle, `/etc/ssl/certs/ca-certificates.crt`; give the file on other systems).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain and key, for servers with `ssl_verify_mode` 1–3.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the host of its address,
    /// a DNS name or an IP address).
    pub server_name: Option<String>,
}

const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

fn tls_err(what: impl std::fmt::Display) -> Error {
    Error::Io {
        server: "tls".into(),
        msg: what.to_string(),
    }
}

/// The rustls configuration for `c`; errors name the file that could not be used.
pub fn client_config(c: &TlsConfig) -> Result<Arc<ClientConfig>, Error> {
    let ca = c
        .ca_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(SYSTEM_CAS));
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&ca)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls_err(format!("CA file {}: {e}", ca.display())))?;
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(tls_err(format!("CA file {}: no certificate", ca.display())));
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_root_certificates(roots);
    let config = match (&c.cert_file, &c.key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| tls_err(format!("certificate {}: {e}", cert.display())))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| tls_err(format!("key {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(format!("client certificate: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(tls_err(
                "a client certificate needs its key, and a key its certificate",
            ))
        }
    };
    Ok(Arc::new(config))
}

/// Runs the handshake on the blocking `sock` before `deadline`.
pub fn handshake(
    sock: &StdTcpStream,
    config: &Arc<ClientConfig>,
    host: &str,
    server: &str,
    deadline: Instant,
) -> Result<ClientConnection, Error> {
    let io_err = |e: io::Error| Error::Io {
        server: server.to_string(),
        msg: format!("TLS handshake: {e}"),
    };
    let name = ServerName::try_from(host.to_string()).map_err(|e| Error::Io {
        server: server.to_string(),
        msg: format!("TLS server name {host:?}: {e}"),
    })?;
    let mut conn = ClientConnection::new(Arc::clone(config), name).map_err(|e| Error::Io {
        server: server.to_string(),
        msg: format!("TLS: {e}"),
    })?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    sock.set_read_timeout(Some(left)).map_err(io_err)?;
    sock.set_write_timeout(Some(left)).map_err(io_err)?;
    let mut s = sock;
    while conn.is_handshaking() {
        conn.complete_io(&mut s).map_err(io_err)?;
    }
    // The last flight (TLS 1.3's client Finished) goes now.
    while conn.wants_write() {
        conn.complete_io(&mut s).map_err(io_err)?;
    }
    Ok(conn)
}

/// A blocking TLS stream (the repair walk's metadump connection).
pub(crate) type Blocking = rustls::StreamOwned<ClientConnection, StdTcpStream>;

/// One TLS connection over the transport's non-blocking socket.
pub struct TlsStream {
    pub(crate) sock: mio::net::TcpStream,
    conn: ClientConnection,
    /// The stream ended: the socket's end, or the server's close_notify.
    eof: bool,
}

impl TlsStream {
    pub fn new(sock: mio::net::TcpStream, conn: ClientConnection) -> TlsStream {
        TlsStream {
            sock,
            conn,
            eof: false,
        }
    }

    /// The stream has ended though a read may still have returned data: the next read
    /// returns `Ok(0)` (a reader that stops at a short read must read once more).
    pub fn ended(&self) -> bool {
        self.eof
    }

    /// The socket, to register with a poller.
    pub fn socket_mut(&mut self) -> &mut mio::net::TcpStream {
        &mut self.sock
    }

    /// Encrypted bytes the socket has not taken yet.
    pub fn pending(&self) -> bool {
        self.conn.wants_write()
    }

    /// Push buffered ciphertext to the socket: `Ok(true)` when all of it went.
    pub fn push(&mut self) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl Read for TlsStream {
    /// Fills `buf` from what rustls decrypted and what the socket has, until it is full
    /// or the socket has nothing more now (then `WouldBlock` if nothing came at all).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        loop {
            while got < buf.len() {
                match self.conn.reader().read(&mut buf[got..]) {
                    Ok(0) => {
                        self.eof = true;
                        return Ok(got);
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        self.eof = true;
                        return Ok(got);
                    }
                    Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
                }
            }
            if got == buf.len() || self.eof {
                return Ok(got);
            }
            match self.conn.read_tls(&mut self.sock) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
            }
            if let Err(e) = self.conn.process_new_packets() {
                let _ = self.push();
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            self.push()?;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // No more plaintext while earlier ciphertext waits: the queue stays the caller's.
        if !self.push()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.conn.writer().write_vectored(bufs)?;
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.push()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push().map(|_| ())
    }
}

/// A non-blocking TCP socket, plain or with TLS over it (the transport's connections, and
/// the benchmark's).
pub enum Socket {
    Plain(mio::net::TcpStream),
    Tls(Box<TlsStream>),
}

impl Socket {
    /// The socket itself, to register with a poller or set options on.
    pub fn tcp(&mut self) -> &mut mio::net::TcpStream {
        match self {
            Socket::Plain(s) => s,
            Socket::Tls(t) => t.socket_mut(),
        }
    }

    /// TLS bytes encrypted but not yet taken by the socket.
    pub fn pending(&self) -> bool {
        matches!(self, Socket::Tls(t) if t.pending())
    }

    /// A TLS stream ended though the last read returned data (see `TlsStream::ended`).
    pub fn ended(&self) -> bool {
        matches!(self, Socket::Tls(t) if t.ended())
    }

    /// Push what `pending` says is waiting; `Ok(false)` while the socket takes no more.
    pub fn push(&mut self) -> io::Result<bool> {
        match self {
            Socket::Plain(_) => Ok(true),
            Socket::Tls(t) => t.push(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Plain(s) => s.read(buf),
            Socket::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Plain(s) => s.write(buf),
            Socket::Tls(t) => t.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Plain(s) => s.write_vectored(bufs),
            Socket::Tls(t) => t.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Socket::Plain(_) => Ok(()),
            Socket::Tls(t) => t.flush(),
        }
    }
}
