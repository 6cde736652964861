//! Commands that complete later: who waits for them (a worker's inbox and what in that
//! worker) and the test store's held keys. The lowest layer: the command layer parks
//! commands here and workers are told here when they can go on.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Who is waiting for a pending command: a worker's inbox and what in that worker.
#[derive(Clone, Copy)]
pub struct Waiter<'a> {
    pub inbox: &'a Arc<Inbox>,
    pub target: Target,
}

/// What in a worker a ready command belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A stream connection, by its poll token.
    Conn(usize),
    /// A UDP socket of the worker, by index.
    Udp(usize),
    /// The worker's UCX front end.
    Ucx,
}

/// What a pending command waited for, handed to it when it resumes.
#[derive(Debug)]
pub enum Completion {
    /// A flash read: the item read, or `None` for a miss.
    Flash(Option<memfabric_store::FlashHit>, HeldBytes),
}

/// Bytes reserved against a process-wide budget while a result waits to be used: given
/// back when it is dropped, wherever that happens (resumed, or its connection gone).
#[derive(Debug)]
pub struct HeldBytes {
    bytes: u64,
    counter: Arc<AtomicU64>,
}

impl HeldBytes {
    /// Reserve `bytes` of `counter` if that stays within `cap`.
    pub fn reserve(counter: &Arc<AtomicU64>, bytes: u64, cap: u64) -> Option<HeldBytes> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= cap).then_some(held + bytes)
            })
            .ok()?;
        Some(HeldBytes {
            bytes,
            counter: Arc::clone(counter),
        })
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A pending command that became ready: whose, which, and what it waited for (`None`
/// when the command looks its result up again, as the test store's held keys do).
pub type Ready = (Target, u64, Option<Completion>);

/// A worker's inbox of pending commands that became ready, filled by other threads and
/// drained by the worker when its waker fires.
pub struct Inbox {
    ready: Mutex<Vec<Ready>>,
    waker: Arc<mio::Waker>,
}

/// A ticket no other pending command of the process has.
pub fn next_ticket() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Inbox {
    pub fn new(waker: Arc<mio::Waker>) -> Inbox {
        Inbox {
            ready: Mutex::new(Vec::new()),
            waker,
        }
    }

    /// Report pending command `ticket` of `target` ready, and wake the worker.
    pub fn post(&self, target: Target, ticket: u64) {
        self.post_with(target, ticket, None)
    }

    /// `post`, with what the command waited for.
    pub fn post_with(&self, target: Target, ticket: u64, done: Option<Completion>) {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((target, ticket, done));
        // Fails only when the worker's poll is gone, i.e. it has exited.
        let _ = self.waker.wake();
    }

    /// Everything reported since the last call.
    pub fn take(&self) -> Vec<Ready> {
        std::mem::take(&mut *self.ready.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Identifies one pending command within its worker, with the bytes its reply may take
/// (so that a connection's output bound counts replies still owed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(pub u64, pub usize);

/// Keys held until released.
pub struct Holds {
    prefix: Vec<u8>,
    parked: Mutex<Vec<(Arc<Inbox>, Target, u64)>>,
}

impl Holds {
    pub fn new(prefix: Vec<u8>) -> Holds {
        Holds {
            prefix,
            parked: Mutex::new(Vec::new()),
        }
    }

    /// Complete every held command (each is told to its worker). Returns how many.
    pub fn release_all(&self) -> usize {
        let parked = std::mem::take(&mut *self.parked.lock().unwrap_or_else(|e| e.into_inner()));
        for (inbox, target, ticket) in &parked {
            inbox.post(*target, *ticket);
        }
        parked.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<Inbox>, Target, u64)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold a command until `release_all`.
    pub fn park(&self, inbox: Arc<Inbox>, target: Target, ticket: u64) {
        self.lock().push((inbox, target, ticket));
    }

    /// The test store holds retrievals of `key`.
    pub fn holds(&self, key: &[u8]) -> bool {
        key.starts_with(&self.prefix)
    }

    /// Commands held now.
    pub fn held(&self) -> usize {
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
