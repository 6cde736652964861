//! The test store's held keys: a deterministic stand-in for a slower tier.
//!
//! With `--debug-hold-keys PREFIX` (hidden; for tests), a retrieval of a key that starts
//! with PREFIX answers "pending" instead of looking the key up, and stays pending until
//! some client sends `debug release` (ascii): then every held retrieval completes (the
//! key is looked up at that moment). Tests use it to prove that a command can complete
//! after later ones without reordering replies or blocking its worker, on every front
//! end — the path a flash read or a replicated write will take.
use std::sync::Arc;

pub use crate::pending::Ticket;
use crate::shared::ExecCtx;

/// Hold a retrieval of `key` if the test store holds it and the caller can wait.
pub fn hold(ctx: &ExecCtx<'_>, key: &[u8]) -> Option<Ticket> {
    let holds = ctx.shared.holds.as_ref()?;
    let waiter = ctx.waiter?;
    if !holds.holds(key) {
        return None;
    }
    let ticket = crate::pending::next_ticket();
    holds.park(Arc::clone(waiter.inbox), waiter.target, ticket);
    Some(Ticket(ticket, 0))
}
