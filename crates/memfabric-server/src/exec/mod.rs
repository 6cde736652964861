//! Command execution: bytes in, replies out.
//!
//! `process` is what a worker calls with a connection's buffered input. It picks the
//! protocol from the first byte (0x80 = binary, anything else = ascii, as memcached's
//! auto-negotiation does), frames and runs as many requests as are complete, and appends
//! the replies to `out`. It never blocks and never panics on input.
//!
//! Files: `ascii.rs` (classic text commands and line framing), `meta.rs` (mg ms md ma mn
//! me), `binary.rs` (binary protocol). Each exposes a `process_one` with the same shape.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memfabric_store::Store;

use crate::settings::{ProtocolChoice, Settings};
use crate::stats::ThreadStats;

pub mod ascii;
pub mod binary;
pub mod meta;

/// State shared by every worker.
pub struct Shared {
    pub store: Store,
    pub settings: Settings,
    /// Runtime verbosity (`verbosity N` changes it).
    pub verbose: AtomicU32,
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
    /// Open connections and listeners, for `stats conns`.
    pub conns: crate::conn::ConnRegistry,
    /// Counter values at the last `stats reset` (reported counters are deltas from it).
    pub stats_base: crate::stats::ResetBase,
    /// Set once the server is stopping (signal or the `shutdown` command).
    pub shutdown: AtomicBool,
    /// Wakes the listener thread so that it notices `shutdown` (set by the runtime).
    pub shutdown_waker: OnceLock<mio::Waker>,
    /// The UCX context and registered memory, when `--ucx-port` is on and UCX started.
    pub fabric: Option<crate::fabric::FabricShared>,
}

impl Shared {
    pub fn new(settings: Settings, store: Store) -> Shared {
        let started = store.clock().started();
        Shared {
            verbose: AtomicU32::new(settings.verbose),
            store,
            settings,
            curr_connections: AtomicU64::new(0),
            total_connections: AtomicU64::new(0),
            rejected_connections: AtomicU64::new(0),
            listen_disabled_num: AtomicU64::new(0),
            thread_stats: Mutex::new(Vec::new()),
            pid: std::process::id(),
            started,
            conns: Default::default(),
            stats_base: Default::default(),
            shutdown: AtomicBool::new(false),
            shutdown_waker: OnceLock::new(),
            fabric: None,
        }
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
    /// The UCX active-message path (crate::fabric).
    Ucx,
}

/// Everything a command needs besides its bytes.
pub struct ExecCtx<'a> {
    pub shared: &'a Shared,
    pub stats: &'a ThreadStats,
    pub transport: Transport,
    /// Identifies the connection in logs (memcached prints the fd).
    pub conn_id: u64,
}

/// Which protocol a connection speaks, decided by its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Ascii,
    Binary,
}

/// Per-connection protocol state.
#[derive(Default)]
pub struct Session {
    pub proto: Option<Proto>,
    /// Bytes of input still to be discarded (data of a rejected storage command).
    pub swallow: usize,
    pub ascii: ascii::AsciiState,
    pub binary: binary::BinaryState,
}

/// Outcome of one `process_one` call.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// One request was handled using this many bytes of input (its reply, if any, is in
    /// `out`).
    Done(usize),
    /// The next request is incomplete: at least this many bytes of input are needed in
    /// total (0 if not yet known). Nothing was consumed.
    NeedMore(usize),
    /// Send what is in `out`, then close the connection. Input is ignored.
    Close,
}

/// Result of `process`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of input used; the caller drops them and keeps the rest.
    pub consumed: usize,
    /// Flush `out` and close.
    pub close: bool,
    /// Total input bytes the pending request needs, when known (lets the caller size its
    /// read buffer for a large value).
    pub need: usize,
    /// Stopped with complete input left because of the `-R` budget or the output
    /// high-water mark: the caller should call again later (memcached's conn_yields).
    pub yielded: bool,
}

/// Stop running requests once this much reply data is queued, so that a client that
/// pipelines without reading cannot make the server buffer without bound.
pub fn output_high_water(shared: &Shared) -> usize {
    shared.settings.max_pending_output
}

/// Run every complete request in `input`, appending replies to `out`.
/// Stops early after `max_requests` requests (fairness, `-R`) or when `out` passes the
/// high-water mark; the caller calls again later.
pub fn process(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
    max_requests: usize,
) -> Progress {
    let mut progress = Progress::default();
    let high_water = output_high_water(ctx.shared);
    let mut handled = 0;
    while progress.consumed < input.len() {
        let rest = &input[progress.consumed..];
        if sess.swallow > 0 {
            let n = sess.swallow.min(rest.len());
            sess.swallow -= n;
            progress.consumed += n;
            continue;
        }
        if handled >= max_requests || out.len() >= high_water {
            progress.yielded = true;
            break;
        }
        let proto = match sess.proto {
            Some(p) => p,
            None => {
                let p = match ctx.shared.settings.protocol {
                    ProtocolChoice::Ascii => Proto::Ascii,
                    ProtocolChoice::Binary => Proto::Binary,
                    ProtocolChoice::Auto if rest[0] == binary::REQUEST_MAGIC => Proto::Binary,
                    ProtocolChoice::Auto => Proto::Ascii,
                };
                sess.proto = Some(p);
                p
            }
        };
        let step = match proto {
            Proto::Ascii => ascii::process_one(ctx, sess, rest, out),
            Proto::Binary => binary::process_one(ctx, sess, rest, out),
        };
        match step {
            Step::Done(n) => {
                progress.consumed += n;
                handled += 1;
            }
            Step::NeedMore(n) => {
                progress.need = n;
                break;
            }
            Step::Close => {
                progress.close = true;
                break;
            }
        }
    }
    progress
}
