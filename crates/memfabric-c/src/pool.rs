//! A `memcached_st`'s state: its servers, behaviours and namespace, the per-server memfabric
//! clients (TCP, or UCX when the server offers it), placement as libmemcached places keys,
//! the results of the last `mget`, and the last error. Everything here is safe Rust; the
//! `extern "C"` layer (`exports.rs`) only converts pointers.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use memfabric_client::{
    ketama, Client, Config, Credentials, Error, GetMode, Handle, Op, Reply, Scheme, ServerAddr,
    Value,
};

use crate::abi::{self, Rc};
use crate::behavior::{self, Behaviors};

/// How servers are reached, from `MEMFABRIC_TRANSPORT` (default `auto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Memcached's protocol over TCP, whatever the server offers.
    Tcp,
    /// UCX only: a server that does not advertise a UCX port is a connection failure.
    Ucx,
    /// UCX where the server advertises it (`stats fabric` → `ucx_port`), else TCP.
    Auto,
}

impl TransportChoice {
    pub fn from_env() -> TransportChoice {
        match std::env::var("MEMFABRIC_TRANSPORT")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "tcp" => TransportChoice::Tcp,
            "ucx" => TransportChoice::Ucx,
            _ => TransportChoice::Auto,
        }
    }
}

/// What `memcached_server_instance_st` points at: stable for the life of the server entry.
pub struct Instance {
    pub hostname: CString,
    pub port: u16,
    pub weight: u32,
    pub version: (u8, u8, u8),
    /// The last error seen on this server (`memcached_server_error_return`).
    pub last_rc: Rc,
    pub last_message: Option<CString>,
}

struct Conn {
    client: Client,
    over_ucx: bool,
}

struct Server {
    instance: Box<Instance>,
    conn: Option<Conn>,
    /// Set after a connection failure: operations fail fast until then.
    down_until: Option<Instant>,
    /// The failure that marked the server down was a timeout (reported again as one).
    down_by_timeout: bool,
    /// Requests sent with noreply whose outcome nobody asks for; reaped as they finish.
    unanswered: VecDeque<Handle>,
    /// Non-blocking requests issued and not yet completed (`hold`).
    in_flight: usize,
}

/// One fetched item waiting for `memcached_fetch_result`.
pub struct Fetched {
    pub key: Vec<u8>,
    pub value: Value,
}

/// At most this many noreply requests per server in flight before a sender waits.
const MAX_UNANSWERED: usize = 4096;

/// The largest namespace libmemcached takes (`MEMCACHED_PREFIX_KEY_MAX_SIZE` - 1).
pub const MAX_NAMESPACE: usize = 127;

pub struct Pool {
    servers: Vec<Server>,
    pub behaviors: Behaviors,
    pub namespace: Option<CString>,
    pub transport: TransportChoice,
    /// How GETs reach UCX servers (`MEMFABRIC_GET_MODE`: auto, one-sided, two-sided).
    pub get_mode: GetMode,
    pub credentials: Option<Credentials>,
    pub results: VecDeque<Fetched>,
    /// Results of the last mget handed out so far, and whether its end was reported.
    delivered: usize,
    end_reported: bool,
    pub last_rc: Rc,
    pub last_message: CString,
    /// Callbacks the caller registered (function pointers kept as addresses).
    pub clone_fn: usize,
    pub cleanup_fn: usize,
    /// The caller's allocator for what is handed out (`memcached_set_memory_allocators`).
    pub allocators: Option<crate::abi::Allocators>,
    continuum: Option<Vec<(u32, usize)>>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.drain_unanswered();
    }
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            servers: Vec::new(),
            behaviors: Behaviors::default(),
            namespace: None,
            transport: TransportChoice::from_env(),
            get_mode: std::env::var("MEMFABRIC_GET_MODE")
                .ok()
                .and_then(|m| m.parse().ok())
                .unwrap_or_default(),
            credentials: None,
            results: VecDeque::new(),
            delivered: 0,
            end_reported: false,
            last_rc: abi::SUCCESS,
            last_message: CString::new("SUCCESS").unwrap(),
            clone_fn: 0,
            cleanup_fn: 0,
            allocators: None,
            continuum: None,
        }
    }
}

/// A key with its namespace, checked as libmemcached checks keys.
pub struct Key {
    pub full: Vec<u8>,
}

impl Pool {
    /// A new pool with `self`'s servers and settings and no connections (`memcached_clone`).
    pub fn clone_settings(&self) -> Pool {
        let mut p = Pool::default();
        p.behaviors = self.behaviors.clone();
        p.namespace = self.namespace.clone();
        p.transport = self.transport;
        p.get_mode = self.get_mode;
        p.credentials = self.credentials.clone();
        p.clone_fn = self.clone_fn;
        p.cleanup_fn = self.cleanup_fn;
        p.allocators = self.allocators;
        for s in &self.servers {
            let i = &s.instance;
            p.add_server(&i.hostname.to_string_lossy(), i.port, i.weight);
        }
        p
    }

    // ----- errors ----------------------------------------------------------------------

    pub fn fail(&mut self, rc: Rc, detail: &str) -> Rc {
        self.last_rc = rc;
        let text = abi::strerror(rc).trim_end_matches('\0');
        let msg = if detail.is_empty() {
            text.to_string()
        } else {
            format!("{text}, {detail}")
        };
        self.last_message = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        rc
    }

    /// Records the outcome of a call: errors are remembered, success is not (libmemcached
    /// keeps the last error until the next one).
    pub fn note(&mut self, rc: Rc) -> Rc {
        if is_error(rc) && rc != self.last_rc {
            self.fail(rc, "");
        }
        rc
    }

    // ----- servers ---------------------------------------------------------------------

    pub fn add_server(&mut self, host: &str, port: u16, weight: u32) {
        let port = if port == 0 { 11211 } else { port };
        self.servers.push(Server {
            instance: Box::new(Instance {
                hostname: CString::new(host.replace('\0', "")).unwrap_or_default(),
                port,
                weight: weight.max(1),
                version: (0, 0, 0),
                last_rc: abi::SUCCESS,
                last_message: None,
            }),
            conn: None,
            down_until: None,
            down_by_timeout: false,
            unanswered: VecDeque::new(),
            in_flight: 0,
        });
        self.continuum = None;
    }

    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    pub fn instance(&self, i: usize) -> Option<&Instance> {
        self.servers.get(i).map(|s| &*s.instance)
    }

    pub fn instance_mut(&mut self, i: usize) -> Option<&mut Instance> {
        self.servers.get_mut(i).map(|s| &mut *s.instance)
    }

    pub fn reset_servers(&mut self) {
        self.servers.clear();
        self.results.clear();
        self.continuum = None;
    }

    /// Closes every connection (`memcached_quit`); the next operation reconnects.
    pub fn quit(&mut self) {
        for s in &mut self.servers {
            s.conn = None;
            s.unanswered.clear();
            s.in_flight = 0;
        }
        self.results.clear();
    }

    /// Settings that change how connections are made (credentials, timeouts) drop the
    /// connections made before; requests in flight and fetched results stay.
    pub fn settings_changed(&mut self) {
        for s in &mut self.servers {
            if !s.unanswered.is_empty() || s.in_flight > 0 {
                continue; // still has requests to deliver: reconnects later
            }
            s.conn = None;
        }
        self.continuum = None;
    }

    /// After `memcached_behavior_set(flag)`: placement is recomputed when it depends on
    /// the flag, connections are remade when they do (others take effect per request).
    pub fn behavior_changed(&mut self, flag: u32) {
        match flag {
            // POLL_TIMEOUT, CONNECT_TIMEOUT, RETRY_TIMEOUT, SND/RCV_TIMEOUT
            8 | 14 | 15 | 19 | 20 => self.settings_changed(),
            // HASH, KETAMA, DISTRIBUTION, KETAMA_WEIGHTED, KETAMA_HASH
            2 | 3 | 9 | 16 | 17 => self.continuum = None,
            _ => {}
        }
    }

    /// Whether server `i` is reached over UCX (None: not connected yet).
    pub fn over_ucx(&self, i: usize) -> Option<bool> {
        self.servers.get(i)?.conn.as_ref().map(|c| c.over_ucx)
    }

    // ----- keys and placement ----------------------------------------------------------

    /// Checks a key as libmemcached does and puts the namespace in front of it.
    pub fn key(&self, key: &[u8]) -> Result<Key, Rc> {
        let ns = self.namespace.as_ref().map_or(&[][..], |n| n.as_bytes());
        if key.is_empty() || key.len() + ns.len() > abi::MAX_KEY - 1 {
            return Err(abi::BAD_KEY_PROVIDED);
        }
        // memfabric's transports carry text keys only (meta protocol, UCX): a key with
        // whitespace or control characters cannot be sent, in either protocol mode.
        if !key.iter().all(|&b| b > b' ' && b != 0x7f) {
            return Err(abi::BAD_KEY_PROVIDED);
        }
        let mut full = Vec::with_capacity(ns.len() + key.len());
        full.extend_from_slice(ns);
        full.extend_from_slice(key);
        Ok(Key { full })
    }

    fn build_continuum(&self) -> Vec<(u32, usize)> {
        let mut points = Vec::new();
        let n = self.servers.len();
        if self.behaviors.distribution == behavior::DIST_CONSISTENT_WEIGHTED {
            let total: u64 = self
                .servers
                .iter()
                .map(|s| u64::from(s.instance.weight))
                .sum();
            for (index, s) in self.servers.iter().enumerate() {
                let host = s.instance.hostname.to_string_lossy();
                let count = ketama::weighted_points(s.instance.weight, total, n);
                for p in 0..count / 4 {
                    let d = ketama::md5(ketama::point_name(&host, s.instance.port, p).as_bytes());
                    for w in 0..4 {
                        let v = u32::from_le_bytes([
                            d[w * 4],
                            d[w * 4 + 1],
                            d[w * 4 + 2],
                            d[w * 4 + 3],
                        ]);
                        points.push((v, index));
                    }
                }
            }
        } else {
            for (index, s) in self.servers.iter().enumerate() {
                let host = s.instance.hostname.to_string_lossy();
                for p in 0..ketama::POINTS_PER_SERVER {
                    let name = ketama::point_name(&host, s.instance.port, p);
                    points.push((
                        self.behaviors.distribution_hash.hash(name.as_bytes()),
                        index,
                    ));
                }
            }
        }
        points.sort_unstable();
        points
    }

    /// The server libmemcached sends `key` (the placement key: a group key or the key with
    /// its namespace when `hash_with_namespace`) to.
    pub fn place(&mut self, key: &[u8]) -> usize {
        let n = self.servers.len();
        if n <= 1 {
            return 0;
        }
        let hash = self.behaviors.key_hash.hash(key);
        match self.behaviors.distribution {
            1 | 2 | 4 | 5 => {
                if self.continuum.is_none() {
                    self.continuum = Some(self.build_continuum());
                }
                let points = self.continuum.as_ref().unwrap();
                let i = points.partition_point(|&(v, _)| v < hash);
                points.get(i).or(points.first()).map_or(0, |p| p.1)
            }
            behavior::DIST_RANDOM => {
                // SAFETY-free randomness: libmemcached uses random(); any spread will do.
                (Instant::now().elapsed().subsec_nanos() as usize ^ key.len()) % n
            }
            _ => hash as usize % n,
        }
    }

    /// The placement key of `key` (namespace included only with hash_with_namespace).
    pub fn placement_key<'k>(&self, group: Option<&'k [u8]>, key: &'k Key) -> &'k [u8] {
        if let Some(g) = group {
            return g;
        }
        let ns = self.namespace.as_ref().map_or(0, |n| n.as_bytes().len());
        if self.behaviors.hash_with_namespace {
            &key.full
        } else {
            &key.full[ns..]
        }
    }

    // ----- connections -----------------------------------------------------------------

    pub fn client_config(&self) -> Config {
        let b = &self.behaviors;
        let ms = |v: i32, default: u64| {
            Duration::from_millis(if v < 0 {
                3_600_000
            } else if v == 0 {
                default
            } else {
                v as u64
            })
        };
        Config {
            timeout: ms(b.poll_timeout, 5000),
            connect_timeout: ms(b.connect_timeout, 4000),
            retry_timeout: Duration::from_secs(b.retry_timeout.max(0) as u64),
            background_repair: false,
            get_mode: self.get_mode,
            credentials: self.credentials.clone(),
            ..Config::default()
        }
    }

    fn connect(&mut self, i: usize) -> Result<(), (Rc, String)> {
        let now = Instant::now();
        let s = &mut self.servers[i];
        if s.conn.is_some() {
            return Ok(());
        }
        if let Some(until) = s.down_until {
            if now < until {
                let rc = if s.down_by_timeout {
                    abi::TIMEOUT
                } else {
                    abi::SERVER_TEMPORARILY_DISABLED
                };
                return Err((rc, format!("host: {}", host_port(&s.instance))));
            }
            s.down_until = None;
        }
        let host = s.instance.hostname.to_string_lossy().into_owned();
        let port = s.instance.port;
        let config = self.client_config();
        let choice = self.transport;
        let ucx_port = match choice {
            TransportChoice::Tcp => None,
            _ => match probe_ucx_port(&host, port, config.connect_timeout, config.timeout) {
                Ok(p) => p,
                Err((rc, msg)) => return Err(self.mark_down(i, rc, msg)),
            },
        };
        let mut made = None;
        if let Some(up) = ucx_port {
            let addr = ServerAddr {
                scheme: Scheme::Ucx,
                host: host.clone(),
                port: up,
                weight: 1,
            };
            match Client::new(vec![addr], config.clone()) {
                Ok(c) => {
                    made = Some(Conn {
                        client: c,
                        over_ucx: true,
                    })
                }
                Err(e) if choice == TransportChoice::Ucx => {
                    return Err(self.mark_down(i, abi::CONNECTION_FAILURE, format!("UCX: {e}")))
                }
                Err(_) => {}
            }
        } else if choice == TransportChoice::Ucx {
            return Err(self.mark_down(
                i,
                abi::CONNECTION_FAILURE,
                format!("{host}:{port} offers no UCX (MEMFABRIC_TRANSPORT=ucx)"),
            ));
        }
        let conn = match made {
            Some(c) => c,
            None => {
                let addr = ServerAddr {
                    scheme: Scheme::Tcp,
                    host: host.clone(),
                    port,
                    weight: 1,
                };
                match Client::new(vec![addr], config) {
                    Ok(c) => Conn {
                        client: c,
                        over_ucx: false,
                    },
                    Err(e) => {
                        return Err(self.mark_down(i, abi::CONNECTION_FAILURE, e.to_string()))
                    }
                }
            }
        };
        self.servers[i].conn = Some(conn);
        Ok(())
    }

    fn mark_down(&mut self, i: usize, rc: Rc, msg: String) -> (Rc, String) {
        let retry = Duration::from_secs(self.behaviors.retry_timeout.max(0) as u64);
        let s = &mut self.servers[i];
        s.down_until = Some(Instant::now() + retry);
        s.down_by_timeout = rc == abi::TIMEOUT;
        (rc, format!("{msg}, host: {}", host_port(&s.instance)))
    }

    /// Reaps finished noreply requests of server `i` and bounds the ones in flight.
    fn reap(&mut self, i: usize) {
        let timeout = self.client_config().timeout;
        let s = &mut self.servers[i];
        let Some(conn) = s.conn.as_mut() else {
            s.unanswered.clear();
            return;
        };
        while let Some(&h) = s.unanswered.front() {
            if s.unanswered.len() >= MAX_UNANSWERED {
                let _ = conn.client.wait(h, timeout);
            } else if conn.client.test(h).is_none() {
                break;
            }
            s.unanswered.pop_front();
        }
    }

    /// Sends `op` to server `i`; with `noreply`, returns without waiting for the answer.
    pub fn issue(
        &mut self,
        i: usize,
        op: Op,
        noreply: bool,
    ) -> Result<Option<Handle>, (Rc, String)> {
        if self.servers.is_empty() {
            return Err((abi::NO_SERVERS, String::new()));
        }
        self.connect(i)?;
        self.reap(i);
        let s = &mut self.servers[i];
        let conn = s.conn.as_mut().expect("connected above");
        let h = conn.client.submit(op);
        if noreply {
            // One round of progress puts the request on the wire now: nothing else may
            // ask this server anything for a while (a replica's copy, a last write).
            if conn.client.test(h).is_none() {
                s.unanswered.push_back(h);
            }
            return Ok(None);
        }
        Ok(Some(h))
    }

    /// Waits (each at most the request timeout) until every noreply request sent so far
    /// has been answered: `memcached_flush_buffers`, and before the pool is freed, so that
    /// writes libmemcached would have flushed are not lost.
    pub fn drain_unanswered(&mut self) {
        let timeout = self.client_config().timeout;
        for s in &mut self.servers {
            let Some(conn) = s.conn.as_mut() else {
                s.unanswered.clear();
                continue;
            };
            while let Some(h) = s.unanswered.pop_front() {
                if conn.client.wait(h, timeout).is_err() {
                    // A server that does not answer gets no more waiting.
                    s.unanswered.clear();
                }
            }
        }
    }

    /// Waits for a request issued to server `i`, at most the pool's request timeout.
    pub fn complete(&mut self, i: usize, h: Handle) -> Result<Reply, (Rc, String)> {
        let timeout = self.client_config().timeout + Duration::from_millis(50);
        self.finish(i, h, Some(timeout))
            .expect("a wait always finishes the request")
    }

    /// The outcome of request `h` on server `i`: after waiting at most `wait` (then
    /// abandoned as a timeout), or, with `None`, only if it has already finished.
    pub fn finish(
        &mut self,
        i: usize,
        h: Handle,
        wait: Option<Duration>,
    ) -> Option<Result<Reply, (Rc, String)>> {
        let binary = self.behaviors.binary;
        // The server list may have been reset since the request was issued.
        let Some(s) = self.servers.get_mut(i) else {
            return Some(Err((abi::CONNECTION_FAILURE, "server removed".into())));
        };
        let Some(conn) = s.conn.as_mut() else {
            return Some(Err((abi::CONNECTION_FAILURE, "connection closed".into())));
        };
        let r = match wait {
            Some(t) => conn.client.wait(h, t),
            None => conn.client.test(h)?,
        };
        Some(match r {
            Ok(reply) => Ok(reply),
            Err(e) => {
                let rc = error_rc(&e, binary);
                let failed_server = matches!(
                    e,
                    Error::Timeout { .. }
                        | Error::Io { .. }
                        | Error::ServerDown { .. }
                        | Error::Closed
                );
                let msg = e.to_string();
                if failed_server && s.in_flight == 0 {
                    s.conn = None;
                    s.unanswered.clear();
                }
                if failed_server {
                    let out = self.mark_down(i, rc, msg);
                    self.servers[i].instance.last_rc = out.0;
                    return Some(Err(out));
                }
                self.servers[i].instance.last_rc = rc;
                Err((rc, msg))
            }
        })
    }

    /// Non-blocking requests (memfabric.h) in flight on server `i`: its connection is kept
    /// while there are any, whatever else happens.
    pub fn hold(&mut self, i: usize, delta: isize) {
        if let Some(s) = self.servers.get_mut(i) {
            s.in_flight = s.in_flight.saturating_add_signed(delta);
        }
    }

    /// Issue and wait.
    pub fn call(&mut self, i: usize, op: Op) -> Result<Reply, (Rc, String)> {
        match self.issue(i, op, false)? {
            Some(h) => self.complete(i, h),
            None => unreachable!("issued with a reply"),
        }
    }

    // ----- commands --------------------------------------------------------------------

    /// The next result of the last mget.
    pub fn next_result(&mut self) -> Option<Fetched> {
        let f = self.results.pop_front()?;
        self.delivered += 1;
        Some(f)
    }

    /// The code at the end of an mget's results, as libmemcached gives it: END the first
    /// time, if the mget found anything and the end is read into a caller's result (or by
    /// `memcached_fetch`); NOT FOUND otherwise.
    pub fn end_of_results(&mut self, into_callers_result: bool) -> Rc {
        let first = !std::mem::replace(&mut self.end_reported, true);
        if first && self.delivered > 0 && into_callers_result {
            abi::END
        } else {
            abi::NOTFOUND
        }
    }

    /// `memcached_mget_by_key`: fetches the keys and keeps the hits for `fetch`.
    pub fn mget(&mut self, group: Option<&[u8]>, keys: &[&[u8]]) -> Rc {
        self.results.clear();
        self.delivered = 0;
        self.end_reported = false;
        if self.servers.is_empty() {
            return self.fail(abi::NO_SERVERS, "");
        }
        if keys.is_empty() {
            return self.fail(abi::INVALID_ARGUMENTS, "no keys");
        }
        if self.behaviors.use_udp {
            return self.fail(abi::NOT_SUPPORTED, "reads over UDP");
        }
        let mut checked = Vec::with_capacity(keys.len());
        for key in keys {
            match self.key(key) {
                Ok(k) => checked.push(k),
                Err(rc) => return self.fail(rc, ""),
            }
        }
        let ns = self.namespace.as_ref().map_or(0, |n| n.as_bytes().len());
        let mut issued = Vec::with_capacity(checked.len());
        let mut missed = Vec::new();
        let mut first_error = None;
        let mut ok = 0usize;
        for k in checked {
            let i = self.place(self.placement_key(group, &k).to_vec().as_slice());
            let user_key = k.full[ns..].to_vec();
            match self.issue(
                i,
                Op::Get {
                    key: k.full,
                    cas: true,
                },
                false,
            ) {
                Ok(Some(h)) => issued.push((i, h, user_key)),
                Ok(None) => {}
                Err(e) => {
                    missed.push((i, user_key));
                    first_error.get_or_insert(e);
                }
            }
        }
        for (i, h, key) in issued {
            match self.complete(i, h) {
                Ok(Reply::Value(Some(value))) => {
                    ok += 1;
                    self.results.push_back(Fetched { key, value });
                }
                Ok(_) => ok += 1,
                Err(e) => {
                    // Its server failed: the replicas may have it (a miss is a miss).
                    missed.push((i, key));
                    first_error.get_or_insert(e);
                }
            }
        }
        self.mget_from_replicas(missed, ns);
        match first_error {
            None => abi::SUCCESS,
            Some(_) if ok > 0 => self.fail(abi::SOME_ERRORS, ""),
            Some((rc, m)) => self.fail(rc, &m),
        }
    }

    /// With libmemcached's replicas (binary protocol, NUMBER_OF_REPLICAS), the keys whose
    /// server failed during an mget are asked of its replicas, one after the other.
    fn mget_from_replicas(&mut self, mut missed: Vec<(usize, Vec<u8>)>, ns: usize) {
        let n = self.servers.len();
        if !self.behaviors.binary || self.behaviors.replicas == 0 || n < 2 {
            return;
        }
        let prefix = self
            .namespace
            .as_ref()
            .map_or(Vec::new(), |p| p.as_bytes().to_vec());
        debug_assert_eq!(prefix.len(), ns);
        for r in 1..=(self.behaviors.replicas as usize).min(n - 1) {
            if missed.is_empty() {
                break;
            }
            let mut issued = Vec::new();
            for (i, key) in std::mem::take(&mut missed) {
                let mut full = prefix.clone();
                full.extend_from_slice(&key);
                match self.issue(
                    (i + r) % n,
                    Op::Get {
                        key: full,
                        cas: true,
                    },
                    false,
                ) {
                    Ok(Some(h)) => issued.push((i, h, key)),
                    _ => missed.push((i, key)),
                }
            }
            for (i, h, key) in issued {
                match self.complete((i + r) % n, h) {
                    Ok(Reply::Value(Some(value))) => self.results.push_back(Fetched { key, value }),
                    Ok(_) => {}
                    Err(_) => missed.push((i, key)),
                }
            }
        }
    }

    /// A server-wide command on every server; `f` gets each reply. The code is SUCCESS
    /// or, if any server failed, SOME_ERRORS (`stat`) / that server's error (others).
    pub fn each_server(
        &mut self,
        op: &Op,
        some_errors: bool,
        mut f: impl FnMut(&mut Pool, usize, Reply),
    ) -> Rc {
        if self.servers.is_empty() {
            return self.fail(abi::NO_SERVERS, "");
        }
        let mut rc = abi::SUCCESS;
        for i in 0..self.servers.len() {
            match self.call(i, op.clone()) {
                Ok(reply) => f(self, i, reply),
                Err((e, m)) => {
                    // The server's own error is the one remembered (what
                    // memcached_last_error_message shows); the call says SOME ERRORS.
                    self.fail(e, &m);
                    rc = if some_errors { abi::SOME_ERRORS } else { e };
                }
            }
        }
        rc
    }
}

fn host_port(i: &Instance) -> String {
    format!("{}:{}", i.hostname.to_string_lossy(), i.port)
}

pub fn is_error(rc: Rc) -> bool {
    !matches!(rc, abi::SUCCESS | abi::END | 15 | 22 | 23 | 24 | 25 | 32)
}

/// libmemcached's code for a memfabric client error.
pub fn error_rc(e: &Error, binary: bool) -> Rc {
    let _ = binary;
    match e {
        Error::Timeout { .. } => abi::TIMEOUT,
        Error::ServerDown { .. } => abi::SERVER_TEMPORARILY_DISABLED,
        Error::Io { .. } | Error::Closed => abi::CONNECTION_FAILURE,
        Error::Auth { .. } => abi::AUTH_FAILURE,
        Error::Protocol(_) => abi::PROTOCOL_ERROR,
        Error::TooLarge => abi::E2BIG,
        Error::Server(m) if m.contains("too large") => abi::E2BIG,
        Error::Server(m) if m.contains("out of memory") => abi::SERVER_MEMORY_ALLOCATION_FAILURE,
        Error::Server(_) => abi::SERVER_ERROR,
        Error::Client(m) if m == "ERROR" => abi::ERROR,
        Error::Client(_) => abi::CLIENT_ERROR,
        Error::NoServers => abi::NO_SERVERS,
        Error::InvalidKey => abi::BAD_KEY_PROVIDED,
        Error::Config(_) => abi::INVALID_ARGUMENTS,
        _ => abi::FAILURE,
    }
}

/// Asks a server over TCP whether it offers UCX: memfabricd answers `stats fabric` with a
/// `ucx_port` line when its UCX listener runs (docs/fabric-protocol.md); memcached answers
/// without one. `Ok(None)`: the server speaks TCP only.
pub fn probe_ucx_port(
    host: &str,
    port: u16,
    connect: Duration,
    reply: Duration,
) -> Result<Option<u16>, (Rc, String)> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| (2, format!("{host}: {e}")))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, connect) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut s) = stream else {
        let e = last.map_or("no address".to_string(), |e| e.to_string());
        let rc = if e.contains("timed out") {
            abi::TIMEOUT
        } else {
            abi::CONNECTION_FAILURE
        };
        return Err((rc, e));
    };
    let _ = s.set_read_timeout(Some(reply));
    let _ = s.set_write_timeout(Some(reply));
    s.write_all(b"stats fabric\r\n")
        .map_err(|e| (abi::WRITE_FAILURE, e.to_string()))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Err((abi::TIMEOUT, "no answer to stats fabric".into()))
            }
            Err(e) => return Err((abi::CONNECTION_FAILURE, e.to_string())),
        };
        buf.extend_from_slice(&chunk[..n]);
        if buf.ends_with(b"END\r\n") || buf.ends_with(b"ERROR\r\n") || buf.len() > 1 << 16 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("STAT ucx_port "))
        .find_map(|p| p.trim().parse::<u16>().ok())
        .filter(|&p| p != 0))
}
