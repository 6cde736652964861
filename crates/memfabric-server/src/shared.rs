//! What every worker shares (the store, settings, connection counts and registry, the
//! UCX context) and what a command is run with (`ExecCtx`). Everything above the counters
//! and settings layer reads these; nothing here knows a protocol or a socket.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memfabric_store::Store;

use crate::counters::ThreadStats;
use crate::pending::Holds;
pub use crate::pending::{Inbox, Target, Waiter};
use crate::settings::Settings;

/// State shared by every worker.
pub struct Shared {
    pub store: Store,
    pub settings: Settings,
    /// Runtime verbosity (`verbosity N` changes it).
    pub verbose: AtomicU32,
    /// The slab_automove level (`-o slab_automove=N`, then `slabs automove N`).
    pub slab_automove: AtomicU32,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    /// Connections refused or closed for exceeding `-c`.
    pub listen_disabled_num: AtomicU64,
    /// Every worker's counters, summed by `stats`.
    pub thread_stats: Mutex<Vec<Arc<ThreadStats>>>,
    /// Process id and the unix time the server started.
    pub pid: u32,
    pub started: u32,
    /// Random, drawn at start: with `started` it names this run of the server
    /// ([`Shared::instance_id`]), so that clients recognise a restarted (empty) server.
    pub instance: u32,
    /// Open connections and listeners, for `stats conns`.
    pub conns: ConnRegistry,
    /// Counter values at the last `stats reset` (reported counters are deltas from it).
    pub stats_base: crate::counters::ResetBase,
    /// Set once the server is stopping (signal or the `shutdown` command).
    pub shutdown: AtomicBool,
    /// Wakes the listener thread so that it notices `shutdown` (set by the runtime).
    pub shutdown_waker: OnceLock<mio::Waker>,
    /// The UCX context and registered memory, when `--ucx-port` is on and UCX started.
    pub fabric: Option<crate::ucx_context::FabricShared>,
    /// What connections hold now (`stats bounds`).
    pub gauges: Arc<crate::bounds::Gauges>,
    /// The test store's held keys (`--debug-hold-keys`), when on.
    pub holds: Option<Holds>,
    /// The flash tier's read threads, when there is a flash tier.
    pub flash_reads: Option<crate::flash_reads::FlashReads>,
    /// The `ext_*` settings as the `extstore` command leaves them.
    pub ext: crate::settings::ExtLive,
}

impl Shared {
    pub fn new(settings: Settings, store: Store) -> Shared {
        let ext = crate::settings::ExtLive::new(&settings.ext);
        let started = store.clock().started();
        Shared {
            verbose: AtomicU32::new(settings.verbose),
            slab_automove: AtomicU32::new(settings.slab_automove),
            store,
            settings,
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            listen_disabled_num: AtomicU64::new(0),
            thread_stats: Mutex::new(Vec::new()),
            pid: std::process::id(),
            started,
            instance: random_u32(),
            conns: Default::default(),
            stats_base: Default::default(),
            shutdown: AtomicBool::new(false),
            shutdown_waker: OnceLock::new(),
            fabric: None,
            gauges: Default::default(),
            holds: None,
            flash_reads: None,
            ext,
        }
    }

    /// This run's name, as `stats fabric` reports it and UCX WELCOME carries it.
    pub fn instance_id(&self) -> String {
        format!("{:08x}{:08x}", self.started, self.instance)
    }

    /// Stop the server (ascii `shutdown` with `-A`, or a signal): the listener stops
    /// accepting, workers close their connections after flushing, the process exits.
    pub fn request_shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        if let Some(w) = self.shutdown_waker.get() {
            // Nothing to do if the wake fails: the listener also polls with a timeout.
            let _ = w.wake();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Register a worker's counters; the worker keeps the returned handle.
    pub fn register_thread(&self) -> Arc<ThreadStats> {
        let t = Arc::new(ThreadStats::default());
        self.thread_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.clone());
        t
    }
}

/// What a transport a request came over can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Udp,
    Unix,
    /// The UCX active-message path (the server's UCX front end).
    Ucx,
}

/// Everything a command needs besides its bytes.
pub struct ExecCtx<'a> {
    pub shared: &'a Shared,
    pub stats: &'a ThreadStats,
    pub transport: Transport,
    /// Identifies the connection in logs (memcached prints the fd).
    pub conn_id: u64,
    /// Where to report that a command which answered "pending" can go on; `None` where
    /// the caller cannot wait (the command then completes at once).
    pub waiter: Option<Waiter<'a>>,
    /// What a resumed command waited for (a flash read's result), when it has it.
    pub completion: Option<&'a crate::pending::Completion>,
}

/// What `stats conns` says a connection is doing (memcached's state names, as memcached
/// 1.6 shows them: a connection that has sent nothing yet is `conn_new_cmd`; one waiting
/// for the next command or for the rest of a command line is `conn_read`, memcached's
/// `conn_waiting` turning into `conn_read` before its worker sleeps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    Listening = 0,
    NewCmd = 1,
    Read = 2,
    ParseCmd = 3,
    Nread = 4,
    Mwrite = 5,
    Closing = 6,
}

impl ConnState {
    pub fn name(self) -> &'static str {
        match self {
            ConnState::Listening => "conn_listening",
            ConnState::NewCmd => "conn_new_cmd",
            ConnState::Read => "conn_read",
            ConnState::ParseCmd => "conn_parse_cmd",
            ConnState::Nread => "conn_nread",
            ConnState::Mwrite => "conn_mwrite",
            ConnState::Closing => "conn_closing",
        }
    }

    fn from_u8(v: u8) -> ConnState {
        match v {
            0 => ConnState::Listening,
            1 => ConnState::NewCmd,
            2 => ConnState::Read,
            3 => ConnState::ParseCmd,
            4 => ConnState::Nread,
            5 => ConnState::Mwrite,
            _ => ConnState::Closing,
        }
    }
}

/// A connection (or listener) as `stats conns` lists it. The owning thread updates the
/// atomics; the registry lock is taken only when entries come and go.
#[derive(Debug)]
pub struct ConnEntry {
    /// `tcp:1.2.3.4:5678`, `udp:...`, `unix:/path`.
    pub addr: String,
    /// The listener it came in on, for accepted connections.
    pub listen_addr: Option<String>,
    /// UDP sockets print an extra `UDP` line.
    pub udp: bool,
    state: AtomicU8,
    last_cmd: AtomicU32,
}

impl ConnEntry {
    pub fn new(addr: String, listen_addr: Option<String>, udp: bool, state: ConnState) -> Self {
        ConnEntry {
            addr,
            listen_addr,
            udp,
            state: AtomicU8::new(state as u8),
            last_cmd: AtomicU32::new(0),
        }
    }
    pub fn set_state(&self, s: ConnState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
    pub fn state(&self) -> ConnState {
        ConnState::from_u8(self.state.load(Ordering::Relaxed))
    }
    pub fn touch(&self, now: u32) {
        self.last_cmd.store(now, Ordering::Relaxed);
    }
    pub fn last_cmd(&self) -> u32 {
        self.last_cmd.load(Ordering::Relaxed)
    }
}

/// Every open connection and listener, keyed by file descriptor as memcached prints them.
#[derive(Debug, Default)]
pub struct ConnRegistry {
    entries: Mutex<BTreeMap<u64, Arc<ConnEntry>>>,
}

impl ConnRegistry {
    pub fn insert(&self, id: u64, e: Arc<ConnEntry>) {
        self.lock().insert(id, e);
    }
    pub fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
    /// A copy of the current entries, in descriptor order.
    pub fn snapshot(&self) -> Vec<(u64, Arc<ConnEntry>)> {
        self.lock()
            .iter()
            .map(|(k, v)| (*k, Arc::clone(v)))
            .collect()
    }
    pub fn len(&self) -> usize {
        self.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<ConnEntry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A random u32 from the kernel, or from the clock and pid where /dev/urandom cannot be
/// read (it only has to differ between two runs).
fn random_u32() -> u32 {
    use std::io::Read;
    let mut b = [0u8; 4];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u32::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    t ^ std::process::id().rotate_left(16)
}
