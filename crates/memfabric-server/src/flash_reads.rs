//! The flash tier's reads: a retrieval that finds its key only on flash answers
//! "pending", the read engine reads and verifies the record, and the worker that waits is
//! told (`Inbox::post_with`) with the item read. Two engines (`--flash-io-engine`):
//! io_uring (one thread, up to `URING_DEPTH` reads in flight; the default when the
//! start-up probe says it works) and a pool of `ext_threads` threads doing `pread`. A worker never
//! blocks on flash unless the queue is full or the values read and not yet answered
//! reach their budget (`HELD_MAX`): then the read is done in place, bounded work rather
//! than unbounded memory — a client that pipelines GETs of large flash items and does not
//! read its replies holds at most its output cap, not its reads' values.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use memfabric_store::flash::uring::UringReads;
use memfabric_store::{FlashCandidates, FlashReader};

use crate::pending::{Completion, HeldBytes, Inbox, Target};

/// One read to do and whom to tell.
pub struct ReadJob {
    pub key: Vec<u8>,
    pub cands: FlashCandidates,
    pub inbox: Arc<Inbox>,
    pub target: Target,
    pub ticket: u64,
    /// Its reservation of `FlashReads::held` (the most the read can return).
    pub hold: HeldBytes,
}

/// Whom a finished read is told to (a job without its key and candidates).
struct Reply {
    inbox: Arc<Inbox>,
    target: Target,
    ticket: u64,
    hold: HeldBytes,
}

/// How flash reads are done (`--flash-io-engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// io_uring when the start-up probe says it works, else the thread pool.
    Auto,
    /// io_uring, or refuse to start.
    IoUring,
    /// `ext_threads` threads doing `pread`.
    Psync,
}

enum Engine {
    Threads {
        tx: Mutex<Option<SyncSender<ReadJob>>>,
        threads: Mutex<Vec<JoinHandle<()>>>,
        queued: Arc<AtomicU64>,
    },
    Uring(UringReads<Reply>),
}

pub struct FlashReads {
    engine: Engine,
    /// Bytes reserved by reads queued, in progress, or done and not yet answered.
    pub held: Arc<AtomicU64>,
}

/// Reads queued at most (beyond this a worker reads in place).
const QUEUE: usize = 4096;
/// Reads in flight at once with io_uring.
pub const URING_DEPTH: usize = 64;
/// Bytes of values read from flash and not yet answered, at most (beyond this a worker
/// reads in place).
pub const HELD_MAX: u64 = 32 << 20;

impl FlashReads {
    /// Start the reads: with `engine`, `threads` for the thread pool. Errors when the
    /// engine asked for cannot run (io_uring whose probe fails).
    pub fn start(
        reader: FlashReader,
        threads: usize,
        engine: IoEngine,
    ) -> std::io::Result<FlashReads> {
        let uring = match engine {
            IoEngine::Psync => None,
            IoEngine::IoUring => {
                memfabric_store::flash::uring::probe(&reader).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("--flash-io-engine io_uring: {e}"))
                })?;
                Some(reader.clone())
            }
            IoEngine::Auto => match memfabric_store::flash::uring::probe(&reader) {
                Ok(()) => Some(reader.clone()),
                Err(e) => {
                    tracing::info!("flash reads: io_uring unavailable ({e}), using read threads");
                    None
                }
            },
        };
        let engine = match uring {
            Some(reader) => Engine::Uring(UringReads::start(
                reader,
                URING_DEPTH,
                QUEUE,
                |r: Reply, hit| {
                    let done = Completion::Flash(hit, r.hold);
                    r.inbox.post_with(r.target, r.ticket, Some(done));
                },
            )?),
            None => Self::threads(reader, threads)?,
        };
        Ok(FlashReads {
            engine,
            held: Arc::new(AtomicU64::new(0)),
        })
    }

    fn threads(reader: FlashReader, threads: usize) -> std::io::Result<Engine> {
        let (tx, rx) = sync_channel::<ReadJob>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            let reader = reader.clone();
            let queued = Arc::clone(&queued);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("mf-flash-io-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                            Ok(j) => j,
                            Err(_) => return,
                        };
                        let hit = reader.read(&job.key, &job.cands);
                        queued.fetch_sub(1, Ordering::Relaxed);
                        let done = Completion::Flash(hit, job.hold);
                        job.inbox.post_with(job.target, job.ticket, Some(done));
                    })?,
            );
        }
        Ok(Engine::Threads {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(handles),
            queued,
        })
    }

    /// Which engine runs (`stats extstore`).
    pub fn engine_name(&self) -> &'static str {
        match &self.engine {
            Engine::Threads { .. } => "psync",
            // The ring failed at run time: its thread reads with pread since.
            Engine::Uring(u) if u.failed() => "io_uring_failed_pread",
            Engine::Uring(_) => "io_uring",
        }
    }

    /// Reads queued or in progress (`extstore_io_queue`).
    pub fn queued(&self) -> u64 {
        match &self.engine {
            Engine::Threads { queued, .. } => queued.load(Ordering::Relaxed),
            Engine::Uring(u) => u.queued.load(Ordering::Relaxed),
        }
    }

    /// Reserve `bytes` for a read's result; `None` when the budget is spent.
    pub fn reserve(&self, bytes: u64) -> Option<HeldBytes> {
        HeldBytes::reserve(&self.held, bytes, HELD_MAX)
    }

    /// Queue a read. False when the queue is full (or the reads stopped): the caller
    /// reads in place.
    pub fn submit(&self, job: ReadJob) -> bool {
        match &self.engine {
            Engine::Threads { tx, queued, .. } => {
                let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
                let Some(tx) = tx.as_ref() else {
                    return false;
                };
                queued.fetch_add(1, Ordering::Relaxed);
                match tx.try_send(job) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                        queued.fetch_sub(1, Ordering::Relaxed);
                        false
                    }
                }
            }
            Engine::Uring(u) => {
                let ReadJob {
                    key,
                    cands,
                    inbox,
                    target,
                    ticket,
                    hold,
                } = job;
                let reply = Reply {
                    inbox,
                    target,
                    ticket,
                    hold,
                };
                u.submit(key, cands, reply).is_ok()
            }
        }
    }
}

impl Drop for FlashReads {
    fn drop(&mut self) {
        if let Engine::Threads { tx, threads, .. } = &self.engine {
            drop(tx.lock().unwrap_or_else(|e| e.into_inner()).take());
            for h in threads.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                let _ = h.join();
            }
        }
    }
}
