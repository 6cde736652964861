//! Grace periods: how a page move waits for the lock-free readers that might still touch
//! the page.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::index;

/// Grace periods for page moves.
///
/// A lock-free reader may hold an item offset obtained from the index while that item is
/// removed. Reusing the chunk for another item of the same class is harmless (the seqlock
/// catches it), but re-carving its page for another class would shift chunk boundaries
/// under the reader's atomic access-bit writes. So a reader brackets its lookup with
/// `enter`/exit, and a page is re-carved only after `synchronize` has seen every reader
/// that started before the page was emptied leave. Two sets of counters (by epoch parity)
/// let `synchronize` wait for old readers only, so a steady stream of new readers cannot
/// starve it.
pub(crate) struct Grace {
    epoch: AtomicU64,
    active: [[Padded; GRACE_STRIPES]; 2],
    sync: Mutex<()>,
}

const GRACE_STRIPES: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicU64);

impl Default for Grace {
    fn default() -> Self {
        Grace {
            epoch: AtomicU64::new(0),
            active: Default::default(),
            sync: Mutex::new(()),
        }
    }
}

pub(crate) struct GraceGuard<'g> {
    grace: &'g Grace,
    parity: usize,
    stripe: usize,
}

impl Drop for GraceGuard<'_> {
    fn drop(&mut self) {
        self.grace.active[self.parity][self.stripe]
            .0
            .fetch_sub(1, Ordering::Release);
    }
}

fn stripe() -> usize {
    use std::cell::Cell;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) });
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) as usize % GRACE_STRIPES);
        }
        s.get()
    })
}

impl Grace {
    pub(crate) fn enter(&self) -> GraceGuard<'_> {
        let stripe = stripe();
        loop {
            let e = self.epoch.load(Ordering::SeqCst);
            let parity = (e & 1) as usize;
            self.active[parity][stripe].0.fetch_add(1, Ordering::SeqCst);
            if self.epoch.load(Ordering::SeqCst) == e {
                return GraceGuard {
                    grace: self,
                    parity,
                    stripe,
                };
            }
            self.active[parity][stripe].0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Wait until every reader that entered before this call has left.
    pub(crate) fn synchronize(&self) {
        let _one_at_a_time = self.sync.lock().unwrap_or_else(|e| e.into_inner());
        let e = self.epoch.fetch_add(1, Ordering::SeqCst);
        let old = (e & 1) as usize;
        let mut spins = 0;
        while self.active[old]
            .iter()
            .map(|p| p.0.load(Ordering::SeqCst))
            .sum::<u64>()
            != 0
        {
            index::backoff(&mut spins);
        }
    }
}
