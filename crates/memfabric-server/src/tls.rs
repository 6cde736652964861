//! TLS on the TCP listeners (`-Z`), with rustls, configured with memcached's options and
//! meanings: `ssl_chain_cert`, `ssl_key` (PEM: `ssl_keyformat=1`), `ssl_ca_cert`,
//! `ssl_verify_mode` (0 none, 1 request, 2 require, 3 once), `ssl_min_version`
//! (2: TLS 1.2, 3: TLS 1.3), `ssl_session_cache`, `ssl_wbuf_size` (KiB); `refresh_certs` loads
//! the certificate, key and CA files again (connections already open keep theirs). A
//! listener given as `notls:ADDR` stays plain, as in memcached.
//!
//! What memcached offers that rustls cannot, refused at start with a clear message:
//! `ssl_min_version` below TLS 1.2, `ssl_ciphers` (an OpenSSL cipher string),
//! `ssl_keyformat` other than PEM, `ssl_kernel_tls`. `ssl_verify_mode` 1–3 needs
//! `ssl_ca_cert` (rustls verifies client certificates only against given roots).
//!
//! [`TlsStream`] is one accepted connection: non-blocking reads decrypt what the socket
//! has; writes encrypt into rustls's buffer and push it to the socket; ciphertext the
//! socket did not take yet is [`TlsStream::pending`], which the connection counts as
//! output still to write.
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig, ServerConnection};

/// Sessions the server-side cache keeps with `ssl_session_cache`.
const SESSION_CACHE_ENTRIES: usize = 4096;

/// memcached's `ssl_verify_mode` values.
pub const VERIFY_NONE: u8 = 0;
pub const VERIFY_REQUEST: u8 = 1;
pub const VERIFY_REQUIRE: u8 = 2;
pub const VERIFY_ONCE: u8 = 3;

/// The TLS options, as given.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    pub chain_cert: Option<String>,
    pub key: Option<String>,
    pub ca_cert: Option<String>,
    pub verify_mode: u8,
    /// TLS 1.3 only (`ssl_min_version=3`); otherwise 1.2 and 1.3.
    pub tls13_only: bool,
    pub session_cache: bool,
    /// `ssl_wbuf_size`: the most plaintext encrypted per write (memcached's write
    /// buffer), in bytes.
    pub wbuf_size: usize,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            chain_cert: None,
            key: None,
            ca_cert: None,
            verify_mode: VERIFY_NONE,
            tls13_only: false,
            session_cache: false,
            wbuf_size: 16 * 1024,
        }
    }
}

impl TlsOptions {
    /// `ssl_min_version` as `stats settings` names it.
    pub fn min_version(&self) -> &'static str {
        if self.tls13_only {
            "tlsv1.3"
        } else {
            "tlsv1.2"
        }
    }
}

/// TLS for the process: the options, the server configuration in use (replaced by
/// `refresh_certs`), and the counters `stats` shows.
pub struct Tls {
    pub options: TlsOptions,
    config: RwLock<Arc<ServerConfig>>,
    /// When the files were last loaded (start, or the last successful `refresh_certs`).
    last_refresh: Mutex<Instant>,
    pub handshake_errors: AtomicU64,
    pub new_sessions: Arc<AtomicU64>,
    /// The server-side session cache (`ssl_session_cache`), one for the process: a
    /// `refresh_certs` keeps the sessions it holds, as memcached's `SSL_CTX` does.
    sessions: Arc<dyn StoresServerSessions>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("options", &self.options)
            .finish()
    }
}

impl Tls {
    /// Loads the certificate, key and CA files; the error is memcached's message for
    /// the same failure (the cause in rustls's words).
    pub fn new(options: TlsOptions) -> Result<Tls, String> {
        let new_sessions = Arc::new(AtomicU64::new(0));
        let sessions: Arc<dyn StoresServerSessions> = if options.session_cache {
            Arc::new(CountingCache {
                inner: ServerSessionMemoryCache::new(SESSION_CACHE_ENTRIES),
                new_sessions: Arc::clone(&new_sessions),
            })
        } else {
            Arc::new(rustls::server::NoServerSessionStorage {})
        };
        let config = build(&options, &sessions)?;
        Ok(Tls {
            options,
            config: RwLock::new(Arc::new(config)),
            last_refresh: Mutex::new(Instant::now()),
            handshake_errors: AtomicU64::new(0),
            new_sessions,
            sessions,
        })
    }

    /// `refresh_certs`: load the files again; on failure the configuration in use stays.
    pub fn refresh(&self) -> Result<(), String> {
        let config = build(&self.options, &self.sessions)?;
        if let Ok(mut c) = self.config.write() {
            *c = Arc::new(config);
        }
        if let Ok(mut t) = self.last_refresh.lock() {
            *t = Instant::now();
        }
        Ok(())
    }

    /// Seconds since the files were last loaded (memcached's
    /// `time_since_server_cert_refresh`).
    pub fn since_refresh(&self) -> u64 {
        self.last_refresh
            .lock()
            .map_or(0, |t| t.elapsed().as_secs())
    }

    /// Starts the server side of a connection.
    pub fn accept(self: &Arc<Self>, sock: mio::net::TcpStream) -> io::Result<TlsStream> {
        let config = self
            .config
            .read()
            .map(|c| Arc::clone(&c))
            .map_err(|_| io::Error::other("TLS configuration lock poisoned"))?;
        let conn = ServerConnection::new(config).map_err(io::Error::other)?;
        Ok(TlsStream {
            sock,
            conn,
            tls: Arc::clone(self),
            eof: false,
            failed: false,
            closed: false,
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn name(path: &Option<String>) -> &str {
    path.as_deref().unwrap_or("(null)")
}

fn build(o: &TlsOptions, sessions: &Arc<dyn StoresServerSessions>) -> Result<ServerConfig, String> {
    let chain: Vec<CertificateDer<'static>> = o
        .chain_cert
        .as_deref()
        .ok_or_else(|| "no file given".to_string())
        .and_then(|p| {
            CertificateDer::pem_file_iter(p)
                .map_err(|e| e.to_string())?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())
        })
        .and_then(|c| {
            if c.is_empty() {
                Err("no certificate in the file".to_string())
            } else {
                Ok(c)
            }
        })
        .map_err(|e| {
            format!(
                "Error loading the certificate chain: {} : {e}",
                name(&o.chain_cert)
            )
        })?;
    let key = o
        .key
        .as_deref()
        .ok_or_else(|| "no file given".to_string())
        .and_then(|p| PrivateKeyDer::from_pem_file(p).map_err(|e| e.to_string()))
        .map_err(|e| format!("Error loading the key: {} : {e}", name(&o.key)))?;
    let versions: &[&rustls::SupportedProtocolVersion] = if o.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| format!("Error setting up TLS: {e}"))?;
    let builder = if o.verify_mode == VERIFY_NONE {
        builder.with_no_client_auth()
    } else {
        let path = o
            .ca_cert
            .as_deref()
            .ok_or_else(|| "ssl_verify_mode needs ssl_ca_cert".to_string())?;
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| e.to_string())
            .and_then(|i| i.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string()))
            .map_err(|e| format!("Error loading the CA certificate: {path} : {e}"))?;
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("Error loading the CA certificate: {path} : {e}"))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
        let verifier = if o.verify_mode == VERIFY_REQUEST {
            verifier.allow_unauthenticated()
        } else {
            verifier
        };
        let verifier = verifier
            .build()
            .map_err(|e| format!("Error loading the CA certificate: {path} : {e}"))?;
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("Error validating the certificate: {e}"))?;
    config.session_storage = Arc::clone(sessions);
    if !o.session_cache {
        // memcached's default: no session cache (no resumption), so no tickets either.
        config.send_tls13_tickets = 0;
    }
    Ok(config)
}

/// The session cache, counting new sessions (memcached's `ssl_new_sessions`).
#[derive(Debug)]
struct CountingCache {
    inner: Arc<ServerSessionMemoryCache>,
    new_sessions: Arc<AtomicU64>,
}

impl StoresServerSessions for CountingCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.new_sessions.fetch_add(1, Ordering::Relaxed);
        self.inner.put(key, value)
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(key)
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// One TLS connection over a non-blocking socket.
pub struct TlsStream {
    sock: mio::net::TcpStream,
    conn: ServerConnection,
    tls: Arc<Tls>,
    /// The socket reported its end.
    eof: bool,
    /// The handshake or a record failed: nothing more is read.
    failed: bool,
    /// The peer's close_notify came.
    closed: bool,
}

impl TlsStream {
    pub fn socket(&self) -> &mio::net::TcpStream {
        &self.sock
    }

    pub fn socket_mut(&mut self) -> &mut mio::net::TcpStream {
        &mut self.sock
    }

    /// The handshake has not completed: with `ssl_verify_mode`, the client has not proven
    /// who it is (the connection counts as unauthenticated for `--auth-timeout`).
    pub fn handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Encrypted bytes that the socket has not taken yet.
    pub fn pending(&self) -> bool {
        self.conn.wants_write()
    }

    /// The stream has ended (close_notify, the socket's end, or a bad record) though a
    /// read may still have returned data: the next read says so (`Ok(0)`), which the
    /// connection must make even after a short read, since no readiness edge will come.
    pub fn ended(&self) -> bool {
        self.eof || self.failed || self.closed
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

    /// Say goodbye (close_notify), best effort, before the socket is closed.
    pub fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.push();
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_vectored(&mut [io::IoSliceMut::new(buf)])
    }

    /// Fills `bufs` in order from what rustls has decrypted and what the socket has,
    /// until they are full or the socket has nothing more now: a short read means the
    /// socket and rustls were drained, as for a plain socket (the connection relies on
    /// that with edge-triggered readiness).
    fn read_vectored(&mut self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let mut got = 0;
        loop {
            // Plaintext rustls already has, into the first buffer with room.
            while got < want {
                let mut skip = got;
                let Some(dst) = bufs.iter_mut().find_map(|b| {
                    if skip < b.len() {
                        Some(&mut b[skip..])
                    } else {
                        skip -= b.len();
                        None
                    }
                }) else {
                    break;
                };
                match self.conn.reader().read(dst) {
                    // close_notify: the end.
                    Ok(0) => {
                        self.closed = true;
                        return Ok(got);
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // The peer closed without close_notify: an end like any other here.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        self.closed = true;
                        return Ok(got);
                    }
                    Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
                }
            }
            if got == want || self.ended() {
                return Ok(got);
            }
            match self.conn.read_tls(&mut self.sock) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return if got > 0 { Ok(got) } else { Err(e) },
            }
            if let Err(e) = self.conn.process_new_packets() {
                // The alert rustls queued goes out; the connection is then closed.
                self.failed = true;
                if self.conn.is_handshaking() {
                    self.tls.handshake_errors.fetch_add(1, Ordering::Relaxed);
                }
                let _ = self.push();
                return if got > 0 {
                    Ok(got)
                } else {
                    Err(io::Error::new(io::ErrorKind::InvalidData, e))
                };
            }
            // Handshake replies; what the socket does not take now is `pending`.
            self.push()?;
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // Take no more plaintext while earlier ciphertext waits: what a connection
        // holds stays bounded by its output cap plus one write buffer.
        if !self.push()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // At most one write buffer (`ssl_wbuf_size`) per call, as memcached encrypts its
        // `ssl_wbuf`; handed over in one call so that a reply's pieces (its header line,
        // the pinned value, END) become one TLS record, not one each.
        let mut room = self.tls.options.wbuf_size;
        let mut parts: [io::IoSlice<'_>; 64] = [io::IoSlice::new(&[]); 64];
        let mut count = 0;
        for b in bufs.iter().take(parts.len()) {
            if room == 0 {
                break;
            }
            let part = &b[..b.len().min(room)];
            room -= part.len();
            parts[count] = io::IoSlice::new(part);
            count += 1;
        }
        let taken = self.conn.writer().write_vectored(&parts[..count])?;
        if taken == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.push()?;
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push().map(|_| ())
    }
}
