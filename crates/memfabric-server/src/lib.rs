//! memfabricd: listeners, worker loops and command execution against the store.
//!
//! Path of a request: `net` (listener hands a connection to a worker) → `worker` (event
//! loop reads bytes) → `exec::process` (detects ascii or binary, frames requests, runs
//! them against `memfabric_store::Store`, appends replies) → `worker` writes the replies.

pub mod exec;
pub mod settings;
pub mod stats;
