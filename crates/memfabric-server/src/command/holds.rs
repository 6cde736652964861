//! The test store's held keys: a deterministic stand-in for a slower tier.
//!
//! With `--debug-hold-keys PREFIX` (hidden; for tests), a retrieval of a key that starts
//! with PREFIX answers "pending" instead of looking the key up, and stays pending until
//! some client sends `debug release` (ascii): then every held retrieval completes (the
//! key is looked up at that moment). Tests use it to prove that a command can complete
//! after later ones without reordering replies or blocking its worker, on every front
//! end — the path a flash read or a replicated write will take.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::shared::{ExecCtx, Inbox, Target};

/// Identifies one pending command within its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(pub u64);

/// Keys held until released.
pub struct Holds {
    prefix: Vec<u8>,
    parked: Mutex<Vec<(Arc<Inbox>, Target, u64)>>,
    next: AtomicU64,
}

impl Holds {
    pub fn new(prefix: Vec<u8>) -> Holds {
        Holds {
            prefix,
            parked: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
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

    /// Commands held now.
    pub fn held(&self) -> usize {
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Hold a retrieval of `key` if the test store holds it and the caller can wait.
pub fn hold(ctx: &ExecCtx<'_>, key: &[u8]) -> Option<Ticket> {
    let holds = ctx.shared.holds.as_ref()?;
    let waiter = ctx.waiter?;
    if !key.starts_with(&holds.prefix) {
        return None;
    }
    let ticket = holds.next.fetch_add(1, Ordering::Relaxed);
    holds
        .parked
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((Arc::clone(waiter.inbox), waiter.target, ticket));
    Some(Ticket(ticket))
}
