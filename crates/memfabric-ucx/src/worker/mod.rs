//! A UCP worker and everything that hangs off it: endpoints, listeners, active messages
//! and RMA reads (registered memory is `region.rs`). Its parts: `base` (the worker,
//! progress, the event queue and wake-up fd), `events` (what it hands out), `am` (active
//! messages), `rndv` (rendezvous receives), `endpoint`, `listener`, `sockaddr`, `rma`.
//!
//! Callbacks from UCX run inside `ucp_worker_progress` on the owning thread. Each one only
//! appends an [`Event`] to the worker's queue (reached through a boxed, address-stable
//! `Queue` passed as the callback's argument); the owner then [`Worker::drain`]s the queue.
mod am;
mod base;
mod endpoint;
mod events;
mod listener;
mod rma;
mod rndv;
mod sockaddr;

pub use base::Worker;
pub use endpoint::Endpoint;
pub use events::{
    AmData, AmMessage, ConnRequest, EpId, Event, HeldData, Posted, Proto, RndvData, SendHow, Token,
};
pub use listener::Listener;
pub use rma::RemoteKey;
