//! The client: a pool of servers, ketama routing, down-marking, and the async core (issue a
//! request, get a [`Handle`], then [`Client::test`] / [`Client::wait`] / [`Client::wait_all`]).
//! The blocking calls are issue + wait.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::addr::{check_one_scheme, Scheme, ServerAddr};
use crate::ec::{Code, EcGeometry};
use crate::error::Error;
use crate::ketama::{Continuum, Distribution, Node};
use crate::op::{Op, Reply, StoreMode, StoreStatus, Ttl, Value};
use crate::probe::{Hail, Probe};
use crate::repair::{RepairJob, RepairTally};
use crate::tasks::{Acks, Child, Modify, PoolCounters, SharedHints, Task, WritePolicy};
pub use crate::tls::TlsConfig;
pub use crate::transport::Credentials;
use crate::transport::{Completion, ConnId, GetMode, Transport};

/// The one place a scheme becomes a transport. Here, not in `transport.rs`, so that the
/// transports depend on the interface and the interface on none of them.
pub fn make_transport(
    scheme: Scheme,
    get_mode: GetMode,
    access_hints: bool,
    credentials: Option<Credentials>,
    tls: Option<&TlsConfig>,
) -> Result<Box<dyn Transport>, Error> {
    match scheme {
        Scheme::Tcp => Ok(Box::new(
            crate::tcp::TcpTransport::new()?
                .with_credentials(credentials)
                .with_tls(tls)?,
        )),
        Scheme::Ucx => Ok(Box::new(
            crate::ucx::UcxTransport::new(get_mode, access_hints)?.with_credentials(credentials),
        )),
    }
}

/// Client settings. `Config::default()` matches the documented defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// Deadline of every request, from when it is issued (default 1 s). A request that passes
    /// it fails with [`Error::Timeout`] and its server is marked down.
    pub timeout: Duration,
    /// How long a connect may take (default 1 s).
    pub connect_timeout: Duration,
    /// How long a server stays marked down after a timeout or connection failure (default 2 s);
    /// it is reconnected lazily by the first operation after that.
    pub retry_timeout: Duration,
    /// Send a key whose server is down to the next live server on the ring (default off: the
    /// operation fails with [`Error::ServerDown`]).
    pub failover: bool,
    /// Key placement (default libmemcached's weighted ketama).
    pub distribution: Distribution,
    /// At most this many requests in flight per server; issuing more first waits for some to
    /// complete (default 65536).
    pub max_in_flight: usize,
    /// How GETs reach `ucx://` servers: one-sided RMA reads where the transport reads
    /// natively (default `Auto`), always (`OneSided`) or never (`TwoSided`).
    pub get_mode: GetMode,
    /// Tell servers which items were read one-sidedly (batched), so that their eviction
    /// treats them as used (default on; off only to measure what the hints are worth).
    pub access_hints: bool,
    /// Keep `replicas` more copies of every key on the next distinct servers along the ring
    /// (default 0: one copy, libmemcached's behaviour). See [`crate::replicate`] and
    /// `docs/resilience.md`.
    pub replicas: u8,
    /// How many copies must acknowledge a write before it succeeds (default quorum).
    pub write_policy: WritePolicy,
    /// Spread a replicated pool's reads over the copies instead of primary first.
    pub randomize_reads: bool,
    /// Write a value found only on a later copy back to the copies that missed it (default
    /// on).
    pub read_repair: bool,
    /// Keys remembered per server whose write failed there, to be deleted on that server
    /// before it is read again (default 10000); beyond that the server is flushed instead.
    pub max_hints: usize,
    /// At most this many background requests (read repairs) in flight; more are skipped
    /// and counted (default 4096).
    pub max_background: usize,
    /// Erasure-code values of `ec_threshold` bytes or more with RS(k, m): `k + m`
    /// fragments on the next `k + m` distinct servers along the ring, any `k` of which
    /// give the value back (default off). Smaller values are replicated on `max(replicas,
    /// m) + 1` servers. See `docs/resilience.md`.
    pub ec: Option<EcGeometry>,
    /// The smallest value that is erasure coded (default 16 KiB).
    pub ec_threshold: usize,
    /// Keys this client remembers as erasure coded (default 65536), which its reads
    /// fetch from k+1 of their servers at once; other keys are read primary first, and
    /// from k more of their servers once the primary answers with a fragment. 0 = none.
    pub ec_known_keys: usize,
    /// Hand out what a server stores for a key even when it is one fragment of an
    /// erasure-coded value (default off; on for tools that copy or inspect fragments,
    /// such as the background repair). Off, a pool without `ec` and `replicas` that reads
    /// a fragment never returns it as the value: `get`, `gets`, `gat` and `get_multi` read
    /// the value whole from the servers its code puts it on (`gets` then gives cas 0, as a
    /// coded read does), and the non-blocking reads (`iget`, `bget`, then `wait`) fail
    /// with [`Error::CodedValue`].
    pub raw_fragments: bool,
    /// Refill a server that restarted empty from the others, in a background thread,
    /// when a replicated or coded pool sees the restart (default on). See
    /// [`Client::repair`].
    pub background_repair: bool,
    /// Bytes per second a repair may read and write together (default 32 MiB/s; 0 =
    /// unbounded).
    pub repair_bandwidth: u64,
    /// Who the pool is to servers started with `-Y` (default none).
    pub credentials: Option<Credentials>,
    /// Speak TLS to `tcp` servers (memcached's and memfabricd's `-Z`; default off). The
    /// UCX path is not TLS: see docs/security.md.
    pub tls: Option<TlsConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            retry_timeout: Duration::from_secs(2),
            failover: false,
            distribution: Distribution::default(),
            max_in_flight: 65536,
            get_mode: GetMode::Auto,
            access_hints: true,
            replicas: 0,
            write_policy: WritePolicy::Quorum,
            randomize_reads: false,
            read_repair: true,
            max_hints: 10_000,
            max_background: 4096,
            ec: None,
            ec_threshold: 16 * 1024,
            ec_known_keys: 65536,
            raw_fragments: false,
            background_repair: true,
            repair_bandwidth: 32 << 20,
            credentials: None,
            tls: None,
        }
    }
}

/// A request in flight or finished but not yet collected. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(pub(crate) u64);

impl Handle {
    /// The request id the transport sees.
    pub fn id(self) -> u64 {
        self.0
    }
}

/// Anything that names a server list: `"h1:11211,h2:11211:2"`, or addresses already parsed.
pub trait IntoServers {
    fn into_servers(self) -> Result<Vec<ServerAddr>, Error>;
}

impl IntoServers for &str {
    fn into_servers(self) -> Result<Vec<ServerAddr>, Error> {
        ServerAddr::parse_list(self)
    }
}

impl IntoServers for &String {
    fn into_servers(self) -> Result<Vec<ServerAddr>, Error> {
        ServerAddr::parse_list(self)
    }
}

impl IntoServers for Vec<ServerAddr> {
    fn into_servers(self) -> Result<Vec<ServerAddr>, Error> {
        check_one_scheme(&self)?;
        Ok(self)
    }
}

impl IntoServers for &[ServerAddr] {
    fn into_servers(self) -> Result<Vec<ServerAddr>, Error> {
        self.to_vec().into_servers()
    }
}

pub(crate) struct Server {
    pub(crate) addr: ServerAddr,
    pub(crate) name: String,
    pub(crate) conn: Option<ConnId>,
    pub(crate) down_until: Option<Instant>,
    pub(crate) inflight: usize,
    /// Replicated pools: what must be deleted here before it is read again.
    pub(crate) hints: SharedHints,
    /// The server's `instance_id` (memfabricd's `stats fabric`), once probed.
    pub(crate) instance: Option<String>,
    /// Lost to a timeout (a connect or a request): a replicated or coded pool reconnects
    /// only after a background probe reached it (`crate::probe`).
    pub(crate) unreachable: bool,
    /// That probe, while it runs.
    pub(crate) probe: Option<Probe>,
    /// Over TCP: the server's `stats fabric` said `ms_keep_newer_write 1` on the current
    /// connection, so fragments go to it as `StoreMode::SetFragment` (over UCX they
    /// always do); to memcached, and to an older memfabricd, as plain sets.
    pub(crate) keeps_newer_write: bool,
    /// Over TCP, in a replicated or coded pool: the `stats fabric` asked first on the
    /// current connection has not answered yet. A fragment set is held (`held`) until it
    /// does, so that whether it goes with memfabricd's keep-newer flag is known when it
    /// is sent (sent without it, a racing writer's older fragment could replace a newer
    /// one; sent with it to memcached, it is refused), and so is everything submitted
    /// to this server after it, to keep the connection's order. One round trip, once per
    /// connection.
    pub(crate) awaiting_probe: bool,
    /// Requests held on the current connection until that answer, in submission order
    /// (each in `pending` with its deadline, unless its caller stopped waiting).
    pub(crate) held: std::collections::VecDeque<(Handle, Op)>,
}

pub(crate) struct Pending {
    pub(crate) server: usize,
    pub(crate) conn: ConnId,
    pub(crate) deadline: Instant,
}

/// A finished request: its result and, for replicated operations, how many copies
/// acknowledged it.
pub(crate) struct Done {
    pub(crate) result: Result<Reply, Error>,
    pub(crate) acks: Acks,
}

impl Done {
    fn failed(e: Error) -> Done {
        Done {
            result: Err(e),
            acks: Acks::default(),
        }
    }
}

/// A memcached client over a pool of servers. Single-threaded: use one per thread, like a
/// libmemcached `memcached_st`.
pub struct Client {
    pub(crate) config: Config,
    pub(crate) servers: Vec<Server>,
    pub(crate) ring: Continuum,
    transport: Box<dyn Transport>,
    next_id: u64,
    pub(crate) pending: HashMap<u64, Pending>,
    pub(crate) finished: HashMap<u64, Done>,
    conn_server: HashMap<ConnId, usize>,
    done: Vec<Completion>,
    failed: Vec<ConnId>,
    /// Replicated operations in progress, by the caller's handle id.
    pub(crate) tasks: HashMap<u64, Task>,
    /// Requests issued on behalf of a task or the pool's upkeep, by request id.
    pub(crate) child_of: HashMap<u64, Child>,
    /// Finished children not yet handed to their task.
    pub(crate) events: std::collections::VecDeque<(Child, Result<Reply, Error>)>,
    pub(crate) settling: bool,
    pub(crate) background_inflight: usize,
    /// Read repairs waiting for the expiry time of the value they copy, by key: how many,
    /// and whether this client changed the key (or flushed) since one started; such a
    /// repair writes nothing, or its `add` could bring back a value deleted meanwhile.
    pub(crate) repairs_waiting: HashMap<Vec<u8>, RepairWait>,
    pub(crate) counters: PoolCounters,
    /// The pool's erasure code, when `config.ec` is set.
    /// Shared, so that an erasure-coded SET can hold it while it issues the fragments
    /// (which may open connections, whose set-up asks whether the pool is resilient).
    pub(crate) ec_code: Option<std::sync::Arc<Code>>,
    /// Codes other than the pool's met in reads (`Client::code_for`), a few at most.
    pub(crate) other_codes: Vec<std::sync::Arc<Code>>,
    /// The last stripe id this client gave a write (ids only grow).
    pub(crate) last_stripe: u64,
    /// Keys known to hold a coded value (`ec_known_keys`).
    pub(crate) coded: std::collections::HashSet<Vec<u8>>,
    /// Appends and prepends made in steps (`crate::modify`), by the request or task of
    /// the step in flight; and that request's id by the caller's handle id.
    pub(crate) modifies: HashMap<u64, Modify>,
    pub(crate) modify_users: HashMap<u64, u64>,
    /// Repairs of restarted servers (running, or asked to stop and not yet ended).
    pub(crate) repairs: Vec<RepairJob>,
    pub(crate) repair_tally: std::sync::Arc<RepairTally>,
}

/// Read repairs of one key that wait for the expiry time (`Client::repairs_waiting`).
#[derive(Default)]
pub(crate) struct RepairWait {
    pub(crate) waiting: u32,
    pub(crate) overtaken: bool,
}

/// `STAT` name/value pairs of one server.
pub type Stats = Vec<(String, String)>;

fn unexpected(r: Reply) -> Error {
    Error::Protocol(format!("unexpected reply {r:?}"))
}

impl Client {
    /// A client for `servers` (nothing is connected until the first operation needs it).
    pub fn new(servers: impl IntoServers, config: Config) -> Result<Client, Error> {
        let list = servers.into_servers()?;
        let first = list.first().ok_or(Error::NoServers)?;
        if let Some(g) = config.ec {
            Code::new(g.k, g.m).map_err(|e| Error::Config(e.to_string()))?;
        }
        if config.replicas > 0 || config.ec.is_some() {
            // Two copies (or fragments) on one server would be counted as two, and both
            // lost with it. A plain pool may list a server twice (libmemcached's pools
            // do: it weighs more).
            if let Some((i, j)) = crate::addr::same_server_twice(&list) {
                return Err(Error::Config(format!(
                    "servers {} and {} of the list ({} and {}) are the same server: a pool \
                     with replicas or erasure coding keeps its copies on distinct servers",
                    i + 1,
                    j + 1,
                    list[i],
                    list[j]
                )));
            }
        }
        if let Some(c) = &config.credentials {
            if c.username.is_empty() || c.username.contains(' ') || c.password.contains(' ') {
                return Err(Error::Config(
                    "a user name must not be empty, and neither it nor the password may \
                     contain a space (memcached's -Y handshake splits at spaces)"
                        .into(),
                ));
            }
        }
        let transport = make_transport(
            first.scheme,
            config.get_mode,
            config.access_hints,
            config.credentials.clone(),
            config.tls.as_ref(),
        )?;
        Ok(Self::with_transport(list, config, transport))
    }

    /// A client over a transport built by the caller (for tests and other transports).
    pub fn with_transport(
        list: Vec<ServerAddr>,
        config: Config,
        transport: Box<dyn Transport>,
    ) -> Client {
        let nodes: Vec<Node> = list
            .iter()
            .map(|a| Node {
                host: a.host.clone(),
                port: a.port,
                weight: a.weight,
            })
            .collect();
        let ring = Continuum::new(&nodes, config.distribution);
        // `Client::new` refuses a geometry the code cannot have; here one is just off.
        let ec_code = config
            .ec
            .and_then(|g| Code::new(g.k, g.m).ok())
            .map(std::sync::Arc::new);
        let servers = list
            .into_iter()
            .map(|addr| Server {
                name: addr.host_port(),
                addr,
                conn: None,
                down_until: None,
                inflight: 0,
                hints: SharedHints::default(),
                instance: None,
                unreachable: false,
                probe: None,
                keeps_newer_write: false,
                awaiting_probe: false,
                held: std::collections::VecDeque::new(),
            })
            .collect();
        Client {
            config,
            servers,
            ring,
            transport,
            next_id: 1,
            pending: HashMap::new(),
            finished: HashMap::new(),
            conn_server: HashMap::new(),
            done: Vec::new(),
            failed: Vec::new(),
            tasks: HashMap::new(),
            child_of: HashMap::new(),
            events: std::collections::VecDeque::new(),
            settling: false,
            background_inflight: 0,
            repairs_waiting: HashMap::new(),
            counters: PoolCounters::default(),
            ec_code,
            other_codes: Vec::new(),
            last_stripe: 0,
            coded: std::collections::HashSet::new(),
            modifies: HashMap::new(),
            modify_users: HashMap::new(),
            repairs: Vec::new(),
            repair_tally: std::sync::Arc::default(),
        }
    }

    /// The transport's counters: how GETs were served (one-sided hits, two-sided GETs,
    /// one-sided reads that fell back and why, retries, access hints sent).
    pub(crate) fn transport_instance(&self, conn: ConnId) -> Option<String> {
        self.transport.instance(conn)
    }

    pub fn transport_counters(&self) -> Vec<(String, u64)> {
        self.transport.counters()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The servers of the pool, in the order given.
    pub fn servers(&self) -> Vec<&ServerAddr> {
        self.servers.iter().map(|s| &s.addr).collect()
    }

    /// The server `key` belongs to on the ring (ignoring down-marking).
    pub fn locate(&self, key: &[u8]) -> Option<&ServerAddr> {
        self.ring.locate(key).map(|i| &self.servers[i].addr)
    }

    /// The `n` distinct servers along the ring from `key` (ignoring down-marking; fewer
    /// if the pool has fewer): the key's server first, then where its replicas or the
    /// other fragments of an erasure-coded value belong ([`Continuum::successors`]).
    pub fn locate_successors(&self, key: &[u8], n: usize) -> Vec<&ServerAddr> {
        self.ring
            .successors(key, n)
            .into_iter()
            .map(|i| &self.servers[i].addr)
            .collect()
    }

    /// Whether the server at `index` is currently marked down (or, lost to a timeout, is
    /// being probed before the pool reconnects).
    pub fn is_down(&self, index: usize) -> bool {
        !self.is_up(index)
    }

    /// Requests issued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Lets what is still in flight finish, at most `timeout`: the copies a quorum or
    /// `one` write did not wait for, read repairs, hinted deletes. A short-lived client
    /// (a command-line tool) calls it before it exits, or those copies are never sent.
    /// True when nothing is left.
    pub fn drain(&mut self, timeout: Duration) -> bool {
        let limit = Instant::now() + timeout;
        while !self.pending.is_empty() {
            let now = Instant::now();
            if now >= limit {
                return false;
            }
            let until = self.nearest_deadline().map_or(limit, |d| d.min(limit));
            if self.round(until).is_err() {
                return false;
            }
        }
        true
    }

    /// Whether server `s` is not marked down (the clock is read only for one that was)
    /// and not being probed.
    pub(crate) fn is_up(&self, s: usize) -> bool {
        let server = &self.servers[s];
        !matches!(server.down_until, Some(t) if Instant::now() < t)
            && !server.probe.as_ref().is_some_and(Probe::running)
    }

    fn route(&self, key: &[u8]) -> Result<usize, Error> {
        let home = self.ring.locate(key).ok_or(Error::NoServers)?;
        if self.is_up(home) {
            return Ok(home);
        }
        let down = || Error::ServerDown {
            server: self.servers[home].name.clone(),
        };
        if self.config.failover {
            self.ring
                .locate_live(key, |s| self.is_up(s))
                .ok_or_else(down)
        } else {
            Err(down())
        }
    }

    pub(crate) fn ensure_conn(&mut self, s: usize) -> Result<ConnId, Error> {
        if !self.is_up(s) {
            return Err(Error::ServerDown {
                server: self.servers[s].name.clone(),
            });
        }
        if let Some(c) = self.servers[s].conn {
            return Ok(c);
        }
        if self.servers[s].unreachable && self.resilient() && !self.probe_reached(s) {
            return Err(Error::ServerDown {
                server: self.servers[s].name.clone(),
            });
        }
        let started = Instant::now();
        let connected = self
            .transport
            .connect(&self.servers[s].addr, self.config.connect_timeout);
        // A connect blocks this client: the requests already issued did not get their
        // time (some were not even sent yet), so their deadlines move on by what the
        // connect took. Otherwise one unreachable server would time out the requests of
        // healthy ones whenever it is retried.
        let blocked = started.elapsed();
        if blocked > Duration::from_millis(1) {
            for p in self.pending.values_mut() {
                p.deadline += blocked;
            }
        }
        match connected {
            Ok(c) => {
                self.servers[s].conn = Some(c);
                self.servers[s].down_until = None;
                self.servers[s].unreachable = false;
                self.conn_server.insert(c, s);
                if self.resilient() {
                    self.on_connect(s, c);
                }
                Ok(c)
            }
            Err(e) => {
                // A connect that ran into its deadline (a cut link, a host gone: nothing
                // answered) makes the next one wait for a probe; a refusal came at once.
                self.servers[s].unreachable = matches!(e, Error::Timeout { .. })
                    || blocked >= self.config.connect_timeout / 2;
                self.counters.connect_failures += 1;
                self.servers[s].down_until = Some(Instant::now() + self.config.retry_timeout);
                Err(e)
            }
        }
    }

    /// Whether the probe of unreachable server `s` has reached it (start one if none
    /// runs). One that did not is marked down for `retry_timeout`, as a failed connect is.
    fn probe_reached(&mut self, s: usize) -> bool {
        let timeout = self.config.connect_timeout;
        let server = &mut self.servers[s];
        match server.probe.take() {
            None => {
                let hail = Hail::for_server(&server.addr, self.config.tls.as_ref());
                match Probe::start(&server.addr, timeout, hail) {
                    Some(probe) => {
                        server.probe = Some(probe);
                        self.counters.reconnect_probes += 1;
                        false
                    }
                    None => true,
                }
            }
            Some(probe) if probe.running() => {
                server.probe = Some(probe);
                false
            }
            Some(probe) => {
                let reached = probe.reached();
                if !reached {
                    server.down_until = Some(Instant::now() + self.config.retry_timeout);
                    self.counters.reconnect_probes_failed += 1;
                }
                reached
            }
        }
    }

    pub(crate) fn new_handle(&mut self) -> Handle {
        let h = Handle(self.next_id);
        self.next_id += 1;
        h
    }

    pub(crate) fn fail_now(&mut self, e: Error) -> Handle {
        let h = self.new_handle();
        self.complete(h.0, Err(e));
        h
    }

    /// Hands a finished request to its task (a child) or to the caller.
    pub(crate) fn complete(&mut self, id: u64, result: Result<Reply, Error>) {
        match self.child_of.remove(&id) {
            Some(child) => self.events.push_back((child, result)),
            None => {
                let result = self.not_a_fragment(result);
                let acks = Acks::single(result.is_ok());
                self.finish(id, Done { result, acks });
            }
        }
    }

    /// Issues `op` to server `s`. Errors before sending complete the handle at once.
    fn issue_to(&mut self, s: usize, op: Op) -> Handle {
        self.issue(s, op, None)
    }

    /// Issues `op` to server `s`, on behalf of `child`'s task when given.
    pub(crate) fn issue(&mut self, s: usize, op: Op, child: Option<Child>) -> Handle {
        let h = self.new_handle();
        if let Some(c) = child {
            self.child_of.insert(h.0, c);
        }
        let conn = match self.ensure_conn(s) {
            Ok(c) => c,
            Err(e) => {
                self.complete(h.0, Err(e));
                return h;
            }
        };
        // Back-pressure: let some requests of this server finish first.
        // Held requests do not count: only the answer they wait for sends them, and
        // it may be waiting to be handled behind this very call.
        while self.in_flight_sent(s) >= self.config.max_in_flight.max(1)
            && self.servers[s].conn == Some(conn)
        {
            let until = self.nearest_deadline().unwrap_or_else(Instant::now);
            if let Err(e) = self.round(until) {
                self.complete(h.0, Err(e));
                return h;
            }
        }
        let conn = match self.ensure_conn(s) {
            Ok(c) => c,
            Err(e) => {
                self.complete(h.0, Err(e));
                return h;
            }
        };
        self.submit_on(s, conn, h, op);
        h
    }

    /// Submits `op` as request `h` on `conn` of server `s`, with the pool's deadline.
    pub(crate) fn submit_on(&mut self, s: usize, conn: ConnId, h: Handle, op: Op) {
        let server = &self.servers[s];
        let fragment = matches!(
            op,
            Op::Store {
                mode: StoreMode::SetFragment,
                ..
            }
        );
        if server.awaiting_probe
            && server.conn == Some(conn)
            && (fragment || !server.held.is_empty())
        {
            // Until the server says whether it keeps newer writes (`release_held`).
            self.pending.insert(
                h.0,
                Pending {
                    server: s,
                    conn,
                    deadline: Instant::now() + self.config.timeout,
                },
            );
            self.servers[s].inflight += 1;
            self.servers[s].held.push_back((h, op));
            return;
        }
        self.send_on(s, conn, h, op, true);
    }

    /// Sends `op` as request `h` on `conn` of server `s` (a fragment set to a TCP server
    /// that does not keep newer writes as a plain set), tracked in `pending` with the
    /// pool's deadline, or, untracked, for a caller that stopped waiting (its reply is
    /// dropped when it comes).
    fn send_on(&mut self, s: usize, conn: ConnId, h: Handle, op: Op, tracked: bool) {
        let server = &self.servers[s];
        let op = match op {
            Op::Store {
                mode: StoreMode::SetFragment,
                key,
                value,
                flags,
                exptime,
                cas,
            } if server.addr.scheme == Scheme::Tcp && !server.keeps_newer_write => Op::Store {
                mode: StoreMode::Set,
                key,
                value,
                flags,
                exptime,
                cas,
            },
            op => op,
        };
        match self.transport.submit(conn, h.0, op) {
            Ok(()) if tracked => {
                let deadline = Instant::now() + self.config.timeout;
                self.pending.insert(
                    h.0,
                    Pending {
                        server: s,
                        conn,
                        deadline,
                    },
                );
                self.servers[s].inflight += 1;
            }
            Ok(()) => {}
            Err(e) if tracked => self.complete(h.0, Err(e)),
            Err(_) => {}
        }
    }

    /// The server of `conn` answered what the pool asked first on it: send the requests
    /// held until then, in order, fragments with or without the keep-newer flag as it
    /// said. What a send's failure issues meanwhile to this server is held behind them
    /// (still `awaiting_probe`) and sent in its turn.
    pub(crate) fn release_held(&mut self, s: usize, conn: ConnId) {
        if self.servers[s].conn != Some(conn) || !self.servers[s].awaiting_probe {
            return;
        }
        while self.servers[s].conn == Some(conn) {
            let Some((h, op)) = self.servers[s].held.pop_front() else {
                break;
            };
            // Not in `pending` if its caller stopped waiting: sent all the same, as it
            // would have been without the hold; its reply is dropped.
            let tracked = self.pending.remove(&h.0).is_some();
            if tracked {
                self.servers[s].inflight -= 1;
            }
            self.send_on(s, conn, h, op, tracked);
        }
        self.servers[s].awaiting_probe = false;
    }

    /// The current connection of server `s` failed or timed out: what was held on it
    /// will not be sent there.
    fn drop_held(&mut self, s: usize, err: impl Fn() -> Error) {
        self.servers[s].awaiting_probe = false;
        for (h, _) in std::mem::take(&mut self.servers[s].held) {
            if self.pending.remove(&h.0).is_some() {
                self.servers[s].inflight -= 1;
                self.complete(h.0, Err(err()));
            }
        }
    }

    /// Requests of server `s` sent and not yet answered (held ones are not sent).
    fn in_flight_sent(&self, s: usize) -> usize {
        self.servers[s]
            .inflight
            .saturating_sub(self.servers[s].held.len())
    }

    /// Issues any keyed operation to the key's server, or a server-wide one to the first server.
    /// The result is collected with [`Client::test`], [`Client::wait`] or [`Client::wait_all`].
    pub fn submit(&mut self, op: Op) -> Handle {
        if let (true, Op::Ttl { key }) = (self.resilient(), &op) {
            // Every copy has the same expiry time: the first live one answers.
            let copies = self.ring.successors(key, self.plain_copies());
            return match copies.into_iter().find(|&s| self.is_up(s)) {
                Some(s) => self.issue_to(s, op),
                None => self.fail_now(Error::NoServers),
            };
        }
        if self.resilient() && op.key().is_some() {
            return self.submit_resilient(op);
        }
        let s = match op.key() {
            Some(key) => self.route(key),
            None => Ok(0),
        };
        match s {
            Ok(s) => self.issue_to(s, op),
            Err(e) => self.fail_now(e),
        }
    }

    pub(crate) fn nearest_deadline(&self) -> Option<Instant> {
        self.pending.values().map(|p| p.deadline).min()
    }

    /// One round of progress: wait for the transport at most until `until`, take completions,
    /// handle failed connections, expire requests past their deadline.
    fn round(&mut self, until: Instant) -> Result<(), Error> {
        let start = Instant::now();
        let wait = until.saturating_duration_since(start);
        let res = self
            .transport
            .progress(wait, &mut self.done, &mut self.failed);
        for c in std::mem::take(&mut self.done) {
            if let Some(p) = self.pending.remove(&c.id) {
                self.servers[p.server].inflight -= 1;
                self.complete(c.id, c.result);
            }
        }
        // A round that was not to wait took microseconds at most: its start time serves
        // for the deadlines (a clock read is a noticeable part of a one-sided GET).
        let now = if wait.is_zero() {
            start
        } else {
            Instant::now()
        };
        for conn in std::mem::take(&mut self.failed) {
            if let Some(s) = self.conn_server.remove(&conn) {
                if self.servers[s].conn == Some(conn) {
                    let name = self.servers[s].name.clone();
                    self.drop_held(s, || Error::Io {
                        server: name.clone(),
                        msg: "connection failed".into(),
                    });
                    self.servers[s].conn = None;
                    self.servers[s].down_until = Some(now + self.config.retry_timeout);
                }
            }
        }
        let expired: Vec<(usize, ConnId)> = self
            .pending
            .values()
            .filter(|p| p.deadline <= now)
            .map(|p| (p.server, p.conn))
            .collect();
        for (s, conn) in expired {
            self.mark_down_timeout(s, conn, now);
        }
        self.settle();
        res
    }

    /// A request on `conn` of server `s` timed out: every request on that connection fails with
    /// `Timeout`, the connection is closed and the server marked down.
    fn mark_down_timeout(&mut self, s: usize, conn: ConnId, now: Instant) {
        if self.servers[s].conn == Some(conn) {
            // Held requests are in `pending` on `conn`: they fail below with the others,
            // and the probe's failure must not send them.
            self.servers[s].awaiting_probe = false;
            self.servers[s].held.clear();
        }
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.pending.remove(&id);
            self.servers[s].inflight -= 1;
            let e = Error::Timeout {
                server: self.servers[s].name.clone(),
            };
            self.complete(id, Err(e));
        }
        if self.servers[s].conn == Some(conn) {
            self.servers[s].conn = None;
            self.servers[s].down_until = Some(now + self.config.retry_timeout);
            self.servers[s].unreachable = true;
        }
        self.conn_server.remove(&conn);
        self.transport.close(conn);
    }

    /// Forgets a request the caller stopped waiting for; its reply is dropped when it comes.
    fn abandon(&mut self, id: u64) -> Error {
        if let Some(step) = self.abandon_modify(id) {
            return self.abandon(step);
        }
        if let Some(e) = self.abandon_task(id) {
            return e;
        }
        match self.pending.remove(&id) {
            Some(p) => {
                self.servers[p.server].inflight -= 1;
                Error::Timeout {
                    server: self.servers[p.server].name.clone(),
                }
            }
            None => Error::UnknownHandle,
        }
    }

    /// Whether request `id` is still to finish (a request in flight or a replicated
    /// operation not yet decided).
    fn waiting(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
            || self.tasks.get(&id).is_some_and(|t| !t.delivered)
            || self
                .modify_users
                .get(&id)
                .is_some_and(|&step| self.waiting(step))
    }

    /// When request `id` will have finished at the latest: its own deadline, or for a
    /// replicated operation the nearest deadline of anything in flight (each step of it
    /// has one).
    fn deadline_of(&self, id: u64) -> Option<Instant> {
        match self.pending.get(&id) {
            Some(p) => Some(p.deadline),
            None if self.waiting(id) => Some(
                self.nearest_deadline()
                    .unwrap_or_else(|| Instant::now() + self.config.timeout),
            ),
            None => None,
        }
    }

    /// The earliest [`Client::deadline_of`] of `hs`, with the requests in flight scanned
    /// once however many of `hs` are replicated operations (a window of 32 EC SETs has
    /// ~200 requests in flight: scanning them per handle and round cost 9% of the run).
    fn earliest_deadline(&self, hs: &[Handle]) -> Option<Instant> {
        let mut earliest: Option<Instant> = None;
        let mut tasks = false;
        for h in hs {
            match self.pending.get(&h.0) {
                Some(p) => earliest = Some(earliest.map_or(p.deadline, |e| e.min(p.deadline))),
                None => tasks |= self.waiting(h.0),
            }
        }
        if tasks {
            let task = self
                .nearest_deadline()
                .unwrap_or_else(|| Instant::now() + self.config.timeout);
            earliest = Some(earliest.map_or(task, |e| e.min(task)));
        }
        earliest
    }

    /// Progress once without blocking; the result if the request has finished. A result is
    /// returned once: after that the handle is unknown.
    pub fn test(&mut self, h: Handle) -> Option<Result<Reply, Error>> {
        self.test_acked(h).map(|d| d.0)
    }

    /// [`Client::test`], with how many copies acknowledged (replicated pools).
    pub fn test_acked(&mut self, h: Handle) -> Option<(Result<Reply, Error>, Acks)> {
        if let Some(d) = self.finished.remove(&h.0) {
            return Some((d.result, d.acks));
        }
        if !self.waiting(h.0) {
            return Some((Err(Error::UnknownHandle), Acks::default()));
        }
        if let Err(e) = self.round(Instant::now()) {
            return Some((Err(e), Acks::default()));
        }
        self.finished.remove(&h.0).map(|d| (d.result, d.acks))
    }

    fn wait_until(&mut self, h: Handle, limit: Option<Instant>) -> Done {
        loop {
            if let Some(d) = self.finished.remove(&h.0) {
                return d;
            }
            let Some(deadline) = self.deadline_of(h.0) else {
                return Done::failed(Error::UnknownHandle);
            };
            let now = Instant::now();
            if limit.is_some_and(|l| now >= l) {
                return Done::failed(self.abandon(h.0));
            }
            let until = limit.map_or(deadline, |l| l.min(deadline));
            if let Err(e) = self.round(until) {
                return Done::failed(e);
            }
        }
    }

    /// Waits for one request, at most `timeout` (and never past the request's own deadline).
    /// If `timeout` passes first the request is abandoned and `Error::Timeout` returned (its
    /// server is not marked down for that).
    pub fn wait(&mut self, h: Handle, timeout: Duration) -> Result<Reply, Error> {
        self.wait_until(h, Some(Instant::now() + timeout)).result
    }

    /// [`Client::wait`], with how many copies acknowledged (replicated pools).
    pub fn wait_acked(&mut self, h: Handle, timeout: Duration) -> (Result<Reply, Error>, Acks) {
        let d = self.wait_until(h, Some(Instant::now() + timeout));
        (d.result, d.acks)
    }

    fn gather(&mut self, hs: &[Handle], limit: Option<Instant>) -> Vec<Done> {
        loop {
            let waiting = hs
                .iter()
                .any(|h| !self.finished.contains_key(&h.0) && self.waiting(h.0));
            let now = Instant::now();
            if !waiting || limit.is_some_and(|l| now >= l) {
                break;
            }
            let nearest = self.earliest_deadline(hs);
            let until = match (nearest, limit) {
                (Some(d), Some(l)) => d.min(l),
                (Some(d), None) => d,
                (None, Some(l)) => l,
                (None, None) => now,
            };
            if let Err(e) = self.round(until) {
                return hs.iter().map(|_| Done::failed(e.clone())).collect();
            }
        }
        hs.iter()
            .map(|h| match self.finished.remove(&h.0) {
                Some(d) => d,
                None => Done::failed(self.abandon(h.0)),
            })
            .collect()
    }

    /// Waits for all `hs`, at most `timeout` in all; results in the order of `hs`.
    pub fn wait_all(&mut self, hs: &[Handle], timeout: Duration) -> Vec<Result<Reply, Error>> {
        self.gather(hs, Some(Instant::now() + timeout))
            .into_iter()
            .map(|d| d.result)
            .collect()
    }

    /// [`Client::wait_all`], with how many copies acknowledged each (replicated pools).
    pub fn wait_all_acked(
        &mut self,
        hs: &[Handle],
        timeout: Duration,
    ) -> Vec<(Result<Reply, Error>, Acks)> {
        self.gather(hs, Some(Instant::now() + timeout))
            .into_iter()
            .map(|d| (d.result, d.acks))
            .collect()
    }

    fn call(&mut self, op: Op) -> Result<Reply, Error> {
        self.call_acked(op).result
    }

    fn call_acked(&mut self, op: Op) -> Done {
        let h = self.submit(op);
        self.wait_until(h, None)
    }

    // ---- non-blocking, in the style of RDMA-Libmemcached ----

    /// Issues a set now; completes later. `value` is sent without a copy (it is shared).
    pub fn iset(&mut self, key: &[u8], value: Bytes, flags: u32, exptime: u32) -> Handle {
        self.submit(Op::Store {
            mode: StoreMode::Set,
            key: key.to_vec(),
            value,
            flags,
            exptime,
            cas: 0,
        })
    }

    /// Issues a get now; completes later with `Reply::Value`.
    pub fn iget(&mut self, key: &[u8]) -> Handle {
        self.submit(Op::Get {
            key: key.to_vec(),
            cas: false,
        })
    }

    /// Issues a set and returns once `value` may be reused (it was copied and sending started).
    pub fn bset(&mut self, key: &[u8], value: &[u8], flags: u32, exptime: u32) -> Handle {
        let h = self.iset(key, Bytes::copy_from_slice(value), flags, exptime);
        let _ = self.round(Instant::now());
        h
    }

    /// Issues a get and returns once `key` may be reused (the request was queued and sending
    /// started); completes later with `Reply::Value`.
    pub fn bget(&mut self, key: &[u8]) -> Handle {
        let h = self.iget(key);
        let _ = self.round(Instant::now());
        h
    }

    // ---- blocking ----

    fn value(&mut self, op: Op) -> Result<Option<Value>, Error> {
        match self.call(op)? {
            Reply::Value(v) => Ok(v),
            r => Err(unexpected(r)),
        }
    }

    /// A read of a pool without `ec` or `replicas`, which found a fragment of a coded
    /// value: read it again whole, with the code the fragment names.
    fn value_or_whole(&mut self, op: Op) -> Result<Option<Value>, Error> {
        match self.value(op.clone()) {
            Err(Error::CodedValue { k, m, .. }) => self.read_whole(op, k, m),
            r => r,
        }
    }

    /// The value of `key` (`cas` is 0), or `None`.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Value>, Error> {
        self.value_or_whole(Op::Get {
            key: key.to_vec(),
            cas: false,
        })
    }

    /// The value of `key` with its CAS value, or `None`.
    pub fn gets(&mut self, key: &[u8]) -> Result<Option<Value>, Error> {
        self.value_or_whole(Op::Get {
            key: key.to_vec(),
            cas: true,
        })
    }

    /// Get and touch: the value (with CAS) and a new expiry time.
    pub fn gat(&mut self, key: &[u8], exptime: u32) -> Result<Option<Value>, Error> {
        self.value_or_whole(Op::Gat {
            key: key.to_vec(),
            exptime,
        })
    }

    /// Fetches many keys: requests go to all their servers at once, then are gathered. Hits
    /// only; keys whose server failed are left out (an error is returned only when every
    /// request failed). Coded values met by a pool without `ec` or `replicas` are read
    /// whole, one after another, as `get` reads them.
    pub fn get_multi(&mut self, keys: &[&[u8]]) -> Result<HashMap<Vec<u8>, Value>, Error> {
        let hs: Vec<Handle> = keys
            .iter()
            .map(|k| {
                self.submit(Op::Get {
                    key: k.to_vec(),
                    cas: true,
                })
            })
            .collect();
        let results: Vec<_> = self
            .gather(&hs, None)
            .into_iter()
            .map(|d| d.result)
            .collect();
        let mut out = HashMap::new();
        let mut first_err = None;
        let mut ok = 0;
        for (key, r) in keys.iter().zip(results) {
            // One fragment of a coded value, in a pool without ec or replicas: read whole.
            let r = match r {
                Err(Error::CodedValue { k, m, .. }) => {
                    let op = Op::Get {
                        key: key.to_vec(),
                        cas: true,
                    };
                    self.read_whole(op, k, m).map(Reply::Value)
                }
                r => r,
            };
            match r {
                Ok(Reply::Value(Some(v))) => {
                    ok += 1;
                    out.insert(key.to_vec(), v);
                }
                Ok(Reply::Value(None)) => ok += 1,
                Ok(r) => first_err = first_err.or(Some(unexpected(r))),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        match first_err {
            Some(e) if ok == 0 => Err(e),
            _ => Ok(out),
        }
    }

    fn store(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> Result<StoreStatus, Error> {
        let value = Bytes::copy_from_slice(value);
        match self.call(Op::Store {
            mode,
            key: key.to_vec(),
            value,
            flags,
            exptime,
            cas,
        })? {
            Reply::Stored(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    fn stored(s: StoreStatus) -> bool {
        matches!(s, StoreStatus::Stored { .. })
    }

    pub fn set(&mut self, key: &[u8], value: &[u8], flags: u32, exptime: u32) -> Result<(), Error> {
        match self.store(StoreMode::Set, key, value, flags, exptime, 0)? {
            StoreStatus::Stored { .. } => Ok(()),
            s => Err(Error::Protocol(format!("set answered {s:?}"))),
        }
    }

    /// Stores `value` and says how many copies acknowledged it (replicated pools: at least
    /// as many as the write policy asks, or an error).
    pub fn set_acked(
        &mut self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
    ) -> Result<Acks, Error> {
        let d = self.call_acked(Op::Store {
            mode: StoreMode::Set,
            key: key.to_vec(),
            value: Bytes::copy_from_slice(value),
            flags,
            exptime,
            cas: 0,
        });
        match d.result? {
            Reply::Stored(StoreStatus::Stored { .. }) => Ok(d.acks),
            r => Err(unexpected(r)),
        }
    }

    /// Stores only if `key` is missing; `false` if it exists.
    pub fn add(
        &mut self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
    ) -> Result<bool, Error> {
        self.store(StoreMode::Add, key, value, flags, exptime, 0)
            .map(Self::stored)
    }

    /// Stores only if `key` exists; `false` if it is missing.
    pub fn replace(
        &mut self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
    ) -> Result<bool, Error> {
        self.store(StoreMode::Replace, key, value, flags, exptime, 0)
            .map(Self::stored)
    }

    /// Appends to an existing item; `false` if it is missing.
    pub fn append(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        self.store(StoreMode::Append, key, value, 0, 0, 0)
            .map(Self::stored)
    }

    /// Prepends to an existing item; `false` if it is missing.
    pub fn prepend(&mut self, key: &[u8], value: &[u8]) -> Result<bool, Error> {
        self.store(StoreMode::Prepend, key, value, 0, 0, 0)
            .map(Self::stored)
    }

    /// Stores only if the item's CAS value is still `cas`: `Stored`, `Exists` (modified since)
    /// or `NotFound`.
    pub fn cas(
        &mut self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> Result<StoreStatus, Error> {
        self.store(StoreMode::Cas, key, value, flags, exptime, cas)
    }

    /// `false` if the key was not found.
    pub fn delete(&mut self, key: &[u8]) -> Result<bool, Error> {
        match self.call(Op::Delete { key: key.to_vec() })? {
            Reply::Deleted(d) => Ok(d),
            r => Err(unexpected(r)),
        }
    }

    fn arith(&mut self, key: &[u8], delta: u64, incr: bool) -> Result<Option<u64>, Error> {
        match self.call(Op::Arith {
            key: key.to_vec(),
            delta,
            incr,
        })? {
            Reply::Counter(c) => Ok(c),
            r => Err(unexpected(r)),
        }
    }

    /// The new value, or `None` if the key was not found.
    pub fn incr(&mut self, key: &[u8], delta: u64) -> Result<Option<u64>, Error> {
        self.arith(key, delta, true)
    }

    /// The new value (never below 0), or `None` if the key was not found.
    pub fn decr(&mut self, key: &[u8], delta: u64) -> Result<Option<u64>, Error> {
        self.arith(key, delta, false)
    }

    /// `false` if the key was not found.
    /// How long `key` still lives (`None`: not found), its value left on the server:
    /// `mg <key> t` over TCP (memcached answers it too), the TTL request over UCX.
    pub fn ttl(&mut self, key: &[u8]) -> Result<Option<Ttl>, Error> {
        match self.call(Op::Ttl { key: key.to_vec() })? {
            Reply::Ttl(t) => Ok(t),
            r => Err(unexpected(r)),
        }
    }

    pub fn touch(&mut self, key: &[u8], exptime: u32) -> Result<bool, Error> {
        match self.call(Op::Touch {
            key: key.to_vec(),
            exptime,
        })? {
            Reply::Touched(t) => Ok(t),
            r => Err(unexpected(r)),
        }
    }

    /// Sends `op` to every server at once and gathers the replies, in server order.
    fn broadcast(&mut self, op: Op) -> Vec<(String, Result<Reply, Error>)> {
        let hs: Vec<Handle> = (0..self.servers.len())
            .map(|s| self.issue_to(s, op.clone()))
            .collect();
        let results = self.gather(&hs, None).into_iter().map(|d| d.result);
        self.servers
            .iter()
            .map(|s| s.name.clone())
            .zip(results)
            .collect()
    }

    /// Flushes every server; the first error if any failed.
    pub fn flush_all(&mut self, delay: u32) -> Result<(), Error> {
        for (_, r) in self.broadcast(Op::FlushAll { delay }) {
            match r? {
                Reply::Ok => {}
                r => return Err(unexpected(r)),
            }
        }
        Ok(())
    }

    /// `stats [group]` of every server: `(server, result)` in server order.
    pub fn stats(&mut self, group: Option<&str>) -> Vec<(String, Result<Stats, Error>)> {
        self.broadcast(Op::Stats {
            group: group.map(str::to_string),
        })
        .into_iter()
        .map(|(s, r)| {
            let r = r.and_then(|r| match r {
                Reply::Stats(v) => Ok(v),
                r => Err(unexpected(r)),
            });
            (s, r)
        })
        .collect()
    }

    /// The version of every server: `(server, result)` in server order.
    pub fn version(&mut self) -> Vec<(String, Result<String, Error>)> {
        self.broadcast(Op::Version)
            .into_iter()
            .map(|(s, r)| {
                let r = r.and_then(|r| match r {
                    Reply::Version(v) => Ok(v),
                    r => Err(unexpected(r)),
                });
                (s, r)
            })
            .collect()
    }
}
