//! Server configuration: one struct, memcached's defaults.

/// `--ucx-poll-us`'s default: longer than a client's turnaround between a reply and its
/// next request on one host (a few µs), far shorter than a wake-up's cost adds up to.
pub const DEFAULT_UCX_POLL_US: u64 = 50;
/// `--tcp-poll-us`: the longest a worker polls for the next TCP/UDP request (`worker.rs`,
/// `Worker::run`).
pub const DEFAULT_TCP_POLL_US: u64 = 50;
/// `--ucx-port` when not given.
pub const DEFAULT_UCX_PORT: u16 = 11311;

/// The cold tier's transports unless `--ucx-cold-tls` says otherwise: those whose cost
/// does not grow per peer the way RC queue pairs and shared-memory mappings do — DC and
/// UD on InfiniBand/RoCE, TCP elsewhere (UCX uses those of them the machine has).
pub const DEFAULT_COLD_TLS: &str = "dc,ud,tcp";

/// Everything memfabricd is configured with. Field defaults match memcached 1.6.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `-Y FILE`: the ascii authentication table (memcached's `-Y`), loaded.
    pub auth: Option<std::sync::Arc<crate::auth::AuthFile>>,
    /// `-Z`: TLS on the TCP listeners (not those given as `notls:ADDR`), loaded.
    pub tls: Option<std::sync::Arc<crate::tls::Tls>>,
    /// `-S`: binary SASL PLAIN against the file `MEMCACHED_SASL_PWDB` names.
    pub sasl: Option<std::sync::Arc<crate::auth::SaslPwdb>>,
    /// TCP port (`-p`, default 11211; 0 = off; -1 = an ephemeral port, as memcached:
    /// each listener binds port 0 and `MEMCACHED_PORT_FILENAME` reports what it got).
    pub tcp_port: i32,
    /// UDP port (`-U`, default 0 = off, as in memcached 1.6; -1 = ephemeral).
    pub udp_port: i32,
    /// Interfaces to listen on (`-l`, comma separated; default all).
    pub listen: Vec<String>,
    /// Unix socket path (`-s`); disables TCP/UDP as in memcached.
    pub unix_socket: Option<String>,
    /// Unix socket permissions (`-a`, octal, default 0700).
    pub unix_mask: u32,
    /// Max simultaneous connections (`-c`, default 1024).
    pub max_connections: usize,
    /// Worker threads (`-t`, default 4).
    pub threads: usize,
    /// Max requests per event per connection before yielding (`-R`, default 20).
    pub reqs_per_event: usize,
    /// Protocol (`-B`: auto, ascii, binary).
    pub protocol: ProtocolChoice,
    /// Verbosity (`-v` = 1, `-vv` = 2, `-vvv` = 3).
    pub verbose: u32,
    /// Busy-poll a worker for this many microseconds after any activity before sleeping
    /// (`--poll-us`, an override; 0 = only the adaptive UCX poll).
    pub poll_us: u64,
    /// The longest adaptive poll of UCX after UCX work (`--ucx-poll-us`; 0 = off).
    pub ucx_poll_us: u64,
    /// `--tcp-poll-us`
    pub tcp_poll_us: u64,
    /// UCX bootstrap port (`--ucx-port`, default 11311; 0 = no UCX data path).
    pub ucx_port: u16,
    /// `--ucx-port` was given: a UCX listener that cannot be bound stops the server (as a
    /// TCP one does) instead of leaving a server that answers TCP only on a port its
    /// operator asked to be the UCX one.
    pub ucx_port_given: bool,
    /// Values above this many bytes travel by rendezvous over UCX (`--ucx-eager-max`).
    pub ucx_eager_max: usize,
    /// Seconds to complete a UCX HELLO (`--ucx-hello-timeout`, 0 = none).
    pub ucx_hello_timeout: u32,
    /// Seconds a UCX rendezvous transfer may take (`--ucx-transfer-timeout`, 0 = none).
    pub ucx_transfer_timeout: u32,
    /// Rendezvous bytes in flight per UCX session (`--ucx-session-inflight-max`).
    pub ucx_session_inflight_max: u64,
    /// UCX sessions served at once (`--max-clients`); also UCX's endpoint-count hint.
    pub ucx_max_clients: u32,
    /// The hot tier's transports (`--ucx-hot-tls`; None: `UCX_TLS` / UCX's choice).
    pub ucx_hot_tls: Option<String>,
    /// The cold tier's transports (`--ucx-cold-tls`; None: one tier), and whether they are
    /// the default list (whose transports this machine may lack without a warning).
    pub ucx_cold_tls: Option<String>,
    pub ucx_cold_tls_default: bool,
    /// Sessions the hot tier holds at most (`--hot-clients`).
    pub ucx_hot_clients: u32,
    /// Requests per second that get a cold session promoted (`--promote-rate`).
    pub ucx_promote_rate: u32,
    /// Seconds below that rate after which a hot session is demoted (`--hot-idle`).
    pub ucx_hot_idle: u32,
    /// `-C`: disable CAS.
    pub use_cas: bool,
    /// Max bytes of a single ascii request line before the connection is judged hostile.
    pub max_line: usize,
    /// Idle timeout in seconds (`-o idle_timeout`; 0 = off). memcached takes a negative
    /// one too, shows it in `stats settings` and never closes a connection for it: so
    /// does memfabricd.
    pub idle_timeout: i32,
    /// With `-Y`: seconds a connection has to authenticate (`--auth-timeout`, 0 = off).
    pub auth_timeout: u32,
    /// Cap on how many bytes of replies one connection may queue before the server stops
    /// reading its requests (backpressure against clients that do not read).
    pub max_pending_output: usize,
    /// Store configuration (`-m -f -n -I -M`, slab options).
    pub store: memfabric_store::StoreConfig,
    /// `-A`: the ascii `shutdown` command is allowed.
    pub enable_shutdown: bool,
    /// `-F`: refuse `flush_all`.
    pub flush_enabled: bool,
    /// `-X`: refuse `stats cachedump` and `lru_crawler metadump`.
    pub dump_enabled: bool,
    /// `-b`: listen backlog (default 1024).
    pub backlog: u32,
    /// `-d`: detach from the terminal.
    pub daemonize: bool,
    /// `-P`: write the pid here (memcached only does with `-d`; we always do when given).
    pub pidfile: Option<String>,
    /// `-u`: user to become when started as root.
    pub user: Option<String>,
    /// `-r`: raise the core file size limit.
    pub enable_coredumps: bool,
    /// `-k`: lock all memory (`mlockall`).
    pub lock_memory: bool,
    /// `-L`: ask for large pages (accepted; the arena decides).
    pub large_pages: bool,
    /// `-D`: delimiter of key prefixes for per-prefix stats; setting it enables detail.
    pub prefix_delimiter: char,
    /// `stats detail on`, or `-D` given.
    pub detail_enabled: bool,
    /// `-o maxconns_fast` (default on): reject over-limit connections with an error at
    /// once instead of leaving them in the accept queue.
    pub maxconns_fast: bool,
    /// `-o slab_chunk_max` in bytes (reported only; the store chains large items itself).
    pub slab_chunk_max: usize,
    /// `-o hashpower` as given (0 = not given), reported by `stats settings`.
    pub hashpower_init: u32,
    /// `-o slab_automove=N` as given (0, 1 or 2): the level at start.
    pub slab_automove: u32,
    /// Pages may move between slab classes at all (memcached's slab_reassign; off with
    /// `-o no_slab_reassign`): `slabs reassign` and `slabs automove` are refused then.
    pub slab_reassign: bool,
    /// `-o track_sizes`.
    pub track_sizes: bool,
    /// `-o lru_crawler` / `no_lru_crawler`.
    pub lru_crawler: bool,
    /// `-o tail_repair_time` (reported only).
    pub tail_repair_time: u32,
    /// `-o sock_cookie_id=N`: the `SO_MARK` set on every listening socket (for firewall
    /// rules), as memcached does.
    pub sock_cookie_id: Option<u32>,
    /// `--debug-hold-keys`: the test store holds retrievals of keys with this prefix
    /// until `debug release` (command::holds).
    pub debug_hold_keys: Option<Vec<u8>>,
    /// memcached's extstore settings as given (the flash tier itself is `store.flash`).
    pub ext: ExtSettings,
}

/// What to bind for a `-p`/`-U` value: `None` for off (0), port 0 (the kernel picks) for
/// -1, else the port itself. The CLI has checked the range.
pub fn bind_port(port: i32) -> Option<u16> {
    match port {
        0 => None,
        -1 => Some(0),
        p => u16::try_from(p).ok(),
    }
}

impl ProtocolChoice {
    /// The name `stats settings` prints (`binding_protocol`).
    pub fn name(self) -> &'static str {
        match self {
            ProtocolChoice::Auto => "auto-negotiate",
            ProtocolChoice::Ascii => "ascii",
            ProtocolChoice::Binary => "binary",
        }
    }
}

/// `-B` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolChoice {
    Auto,
    Ascii,
    Binary,
}

impl Settings {
    /// The credentials clients must prove (`-Y` or `-S`), if any: what the UCX bootstrap
    /// checks a HELLO's proof against.
    pub fn users(&self) -> Option<crate::auth::Users> {
        use crate::auth::Users;
        match (&self.auth, &self.sasl) {
            (Some(t), _) => Some(Users::AuthFile(std::sync::Arc::clone(t))),
            (None, Some(t)) => Some(Users::SaslPwdb(std::sync::Arc::clone(t))),
            (None, None) => None,
        }
    }

    /// Whether connections must authenticate before anything runs (`-Y` or `-S`).
    pub fn authenticates(&self) -> bool {
        self.auth.is_some() || self.sasl.is_some()
    }

    /// Whether connections have a handshake to finish in `--auth-timeout` (`-Y`, `-S`,
    /// or TLS's own with `-Z`).
    pub fn handshakes(&self) -> bool {
        self.authenticates() || self.tls.is_some()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tcp_port: 11211,
            auth: None,
            sasl: None,
            tls: None,
            udp_port: 0,
            listen: Vec::new(),
            unix_socket: None,
            unix_mask: 0o700,
            max_connections: 1024,
            threads: 4,
            reqs_per_event: 20,
            protocol: ProtocolChoice::Auto,
            verbose: 0,
            poll_us: 0,
            ucx_poll_us: DEFAULT_UCX_POLL_US,
            tcp_poll_us: DEFAULT_TCP_POLL_US,
            ucx_port: DEFAULT_UCX_PORT,
            ucx_port_given: false,
            ucx_eager_max: memfabric_proto::ucx_wire::DEFAULT_EAGER_MAX,
            ucx_hello_timeout: 10,
            ucx_transfer_timeout: 30,
            ucx_session_inflight_max: 64 << 20,
            ucx_max_clients: 4096,
            ucx_hot_tls: None,
            ucx_cold_tls: Some(DEFAULT_COLD_TLS.to_string()),
            ucx_cold_tls_default: true,
            ucx_hot_clients: 256,
            ucx_promote_rate: 100,
            ucx_hot_idle: 10,
            use_cas: true,
            max_line: 2048,
            idle_timeout: 0,
            auth_timeout: 10,
            max_pending_output: 4 << 20,
            store: memfabric_store::StoreConfig {
                sealed: Some(coded_fragment),
                ..memfabric_store::StoreConfig::default()
            },
            ext: ExtSettings::default(),
            enable_shutdown: false,
            flush_enabled: true,
            dump_enabled: true,
            backlog: 1024,
            daemonize: false,
            pidfile: None,
            user: None,
            enable_coredumps: false,
            lock_memory: false,
            large_pages: false,
            prefix_delimiter: ':',
            detail_enabled: false,
            maxconns_fast: true,
            slab_chunk_max: 512 * 1024,
            hashpower_init: 0,
            slab_automove: 1,
            slab_reassign: true,
            track_sizes: false,
            lru_crawler: true,
            tail_repair_time: 0,
            sock_cookie_id: None,
            debug_hold_keys: None,
        }
    }
}

/// The `ext_*` settings as they are now: `extstore <setting> <value>` changes them at run
/// time, as in memcached (`item_size` and `low_ttl` also change what goes to flash).
#[derive(Debug)]
pub struct ExtLive {
    pub item_size: std::sync::atomic::AtomicU64,
    pub item_age: std::sync::atomic::AtomicU32,
    pub low_ttl: std::sync::atomic::AtomicU32,
    pub recache_rate: std::sync::atomic::AtomicU32,
    pub compact_under: std::sync::atomic::AtomicU32,
    pub drop_under: std::sync::atomic::AtomicU32,
    pub max_sleep: std::sync::atomic::AtomicU32,
    /// f64 bits.
    pub max_frag: std::sync::atomic::AtomicU64,
    pub drop_unread: std::sync::atomic::AtomicBool,
}

impl ExtLive {
    pub fn new(e: &ExtSettings) -> ExtLive {
        use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
        ExtLive {
            item_size: AtomicU64::new(e.item_size as u64),
            item_age: AtomicU32::new(e.item_age),
            low_ttl: AtomicU32::new(e.low_ttl),
            recache_rate: AtomicU32::new(e.recache_rate),
            compact_under: AtomicU32::new(e.compact_under),
            drop_under: AtomicU32::new(e.drop_under),
            max_sleep: AtomicU32::new(e.max_sleep),
            max_frag: AtomicU64::new(e.max_frag.to_bits()),
            drop_unread: AtomicBool::new(e.drop_unread),
        }
    }
}

/// memcached's `ext_*` settings, with its defaults (`stats settings` reports them).
#[derive(Clone, Debug)]
pub struct ExtSettings {
    pub item_size: usize,
    pub item_age: u32,
    pub low_ttl: u32,
    pub threads: usize,
    pub wbuf_mb: usize,
    pub page_mb: usize,
    pub recache_rate: u32,
    pub compact_under: u32,
    pub drop_under: u32,
    pub max_frag: f64,
    pub max_sleep: u32,
    pub drop_unread: bool,
    /// How flash reads are done (`--flash-io-engine`).
    pub engine: crate::flash_reads::IoEngine,
}

impl Default for ExtSettings {
    fn default() -> Self {
        ExtSettings {
            item_size: 512,
            item_age: u32::MAX,
            low_ttl: 0,
            threads: 4,
            wbuf_mb: 4,
            page_mb: 64,
            recache_rate: 2000,
            compact_under: 0,
            drop_under: 0,
            max_frag: 0.8,
            max_sleep: 1_000_000,
            drop_unread: false,
            engine: crate::flash_reads::IoEngine::Auto,
        }
    }
}

/// Whether a value is a fragment of a value memfabric's client erasure-coded (its header
/// checked): `append` and `prepend` leave it alone (`NOT_STORED`). A pool without the
/// code appending to it would damage it, and a prepend would push its header from the
/// front, where every reader looks for it, so that the damaged bytes were read as the
/// value.
fn coded_fragment(value: &[u8]) -> bool {
    memfabric_proto::ec_fragment::code_of(value).is_some()
}
