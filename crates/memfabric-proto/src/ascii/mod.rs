//! memcached's classic ascii protocol: line framing, tokenizing, typed requests, replies.
//!
//! Everything here mirrors memcached 1.6.18 (`proto_text.c`, `util.c`) as observed on the
//! real server, quirks included, because clients depend on the exact bytes:
//!
//! - A request line ends at the first `\n`; one `\r` before it is dropped (only when the
//!   line has more than one byte), and the line ends early at a NUL byte (memcached
//!   tokenizes a C string).
//! - Tokens are separated by spaces only (a tab is part of a token). At most 23 tokens are
//!   split off; whatever follows stays unsplit (`Tokens::rest`), which only multigets read.
//! - With no `\n` in the first `max_line` (2048) bytes the connection is closed, unless the
//!   buffer starts (after at most 100 spaces) with `get ` or `gets `: long multigets keep
//!   reading. memcached lets those grow without bound. `parse` closes once the partial
//!   line passes `Limits::max_multiget_line` (8 MiB by default); memfabricd's executor
//!   never lets it get there: it serves a long multiget key by key as it arrives
//!   (`multiget_prefix` finds where its keys start).
//! - Numbers are parsed by `crate::number`, memcached's `safe_strto*` (shared with meta):
//!   leading whitespace and a sign are accepted, the number may be followed by whitespace
//!   and anything after it, 32-bit values are truncated from 64 bits (flags `4294967297`
//!   is 1, exptime `2147483648` is negative), a `-` is refused only when the 64-bit
//!   result looks negative.
//! - A storage command's data block is exactly `len + 2` bytes whose last two must be
//!   `\r\n`; otherwise `CLIENT_ERROR bad data chunk` and whatever follows is read as the
//!   next command.
//!
//! `parse` turns bytes into a `Request` (or says it needs more, or that the connection
//! must be closed); `Request::encode` writes the canonical form of a request (clients and
//! tests use it); the `reply` module and the `write_*` helpers build replies.
//!
//! Files, one concern each: `framing` (where a line ends, long lines), `tokens`
//! (tokenizing), `command` (a line to a typed request), `storage` (storage headers and
//! their data blocks), `multiget` (streaming a multiget's keys), `request` (the typed
//! requests), `encode` (requests to bytes), `reply` (reply encoding), `tests`.

mod command;
mod encode;
mod framing;
mod line;
mod multiget;
mod request;
mod storage;
mod tokens;

pub mod reply;

// The names ascii callers have always used for memcached's number helpers, which live in
// `crate::number` (shared with meta).
pub use crate::number::{
    push_i64, push_u64, safe_strtod as parse_f64, safe_strtol as parse_i32,
    safe_strtoul as parse_u32, safe_strtoull as parse_u64,
};
pub use crate::KEY_MAX_LEN;
pub use framing::parse;
pub use line::command_text;
pub use multiget::{multiget_prefix, KeyIter, Keys};
pub use reply::{write_number_line, write_stat, write_value_header, write_version};
pub use request::*;
pub use storage::{pending_store, PendingStore};
pub use tokens::{tokenize, Tokens};

/// memcached's `MAX_TOKENS`: 23 tokens plus the terminal one.
pub const MAX_TOKENS: usize = 24;
/// Bytes without a newline after which a non-multiget connection is closed.
pub const DEFAULT_MAX_LINE: usize = 2048;
/// Our bound on a multiget line still being received (memcached has none). 8 MiB holds
/// more than 30,000 keys of 250 bytes, far beyond what clients batch.
pub const DEFAULT_MAX_MULTIGET_LINE: usize = 8 << 20;
/// memcached's `MAX_VERBOSITY_LEVEL`.
pub const MAX_VERBOSITY_LEVEL: u32 = 2;

#[cfg(test)]
mod tests;
