//! Server configuration: one struct, memcached's defaults.

/// Everything memfabricd is configured with. Field defaults match memcached 1.6.
#[derive(Clone, Debug)]
pub struct Settings {
    /// TCP port (`-p`, default 11211; 0 = off).
    pub tcp_port: u16,
    /// UDP port (`-U`, default 0 = off, as in memcached 1.6).
    pub udp_port: u16,
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
    /// Busy-poll a worker for this many microseconds after activity before sleeping.
    pub poll_us: u64,
    /// `-C`: disable CAS.
    pub use_cas: bool,
    /// Max bytes of a single ascii request line before the connection is judged hostile.
    pub max_line: usize,
    /// Idle timeout in seconds (`-o idle_timeout`, 0 = off).
    pub idle_timeout: u32,
    /// Cap on how many bytes of replies one connection may queue before the server stops
    /// reading its requests (backpressure against clients that do not read).
    pub max_pending_output: usize,
    /// Store configuration (`-m -f -n -I -M`, slab options).
    pub store: memfabric_store::StoreConfig,
}

/// `-B` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolChoice {
    Auto,
    Ascii,
    Binary,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tcp_port: 11211,
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
            use_cas: true,
            max_line: 2048,
            idle_timeout: 0,
            max_pending_output: 4 << 20,
            store: memfabric_store::StoreConfig::default(),
        }
    }
}
