//! The flash tier's read threads (`ext_threads`): a retrieval that finds its key only on
//! flash answers "pending", one of these threads reads and verifies the record, and the
//! worker that waits is told (`Inbox::post_with`) with the item read. A worker never
//! blocks on flash unless the queue is full or the values read and not yet answered
//! reach their budget (`HELD_MAX`): then the read is done in place, bounded work rather
//! than unbounded memory — a client that pipelines GETs of large flash items and does not
//! read its replies holds at most its output cap, not its reads' values.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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

pub struct FlashReads {
    tx: Mutex<Option<SyncSender<ReadJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Reads queued or in progress (`extstore_io_queue`).
    pub queued: Arc<AtomicU64>,
    /// Bytes reserved by reads queued, in progress, or done and not yet answered.
    pub held: Arc<AtomicU64>,
}

/// Reads queued at most (beyond this a worker reads in place).
const QUEUE: usize = 4096;
/// Bytes of values read from flash and not yet answered, at most (beyond this a worker
/// reads in place).
pub const HELD_MAX: u64 = 32 << 20;

impl FlashReads {
    pub fn start(reader: FlashReader, threads: usize) -> std::io::Result<FlashReads> {
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
        Ok(FlashReads {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(handles),
            queued,
            held: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Reserve `bytes` for a read's result; `None` when the budget is spent.
    pub fn reserve(&self, bytes: u64) -> Option<HeldBytes> {
        HeldBytes::reserve(&self.held, bytes, HELD_MAX)
    }

    /// Queue a read. False when the queue is full (or the pool stopped): the caller
    /// reads in place.
    pub fn submit(&self, job: ReadJob) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else {
            return false;
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                false
            }
        }
    }
}

impl Drop for FlashReads {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        for h in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = h.join();
        }
    }
}
