//! Operations and their replies, independent of the transport that carries them.

use bytes::Bytes;

/// How a store operation treats an existing (or missing) item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Store unconditionally.
    Set,
    /// Store only if the key is missing.
    Add,
    /// Store only if the key exists.
    Replace,
    /// Append the data to an existing item.
    Append,
    /// Prepend the data to an existing item.
    Prepend,
    /// Store only if the item's CAS value still equals the one given.
    Cas,
    /// Store an erasure-coded fragment (`memfabric_proto::ec_fragment`) as `Set` does,
    /// except that a memfabricd that holds a fragment of a newer write under the key
    /// keeps it and answers [`StoreStatus::Superseded`] (over UCX the fabric protocol's
    /// `FLAG_KEEP_NEWER_WRITE`, over TCP meta's `ms ... K`, sent only to servers whose
    /// `stats fabric` says they understand it). To memcached, a plain set.
    SetFragment,
}

/// One request to one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `get` (or `gets` when `cas` is true).
    Get {
        key: Vec<u8>,
        cas: bool,
    },
    /// Get and touch: fetch the item and set its expiry time; the reply carries the CAS value.
    Gat {
        key: Vec<u8>,
        exptime: u32,
    },
    /// set/add/replace/append/prepend/cas. `cas` is used only by [`StoreMode::Cas`].
    Store {
        mode: StoreMode,
        key: Vec<u8>,
        value: Bytes,
        flags: u32,
        exptime: u32,
        cas: u64,
    },
    Delete {
        key: Vec<u8>,
    },
    /// incr (`incr` = true) or decr.
    Arith {
        key: Vec<u8>,
        delta: u64,
        incr: bool,
    },
    Touch {
        key: Vec<u8>,
        exptime: u32,
    },
    FlushAll {
        delay: u32,
    },
    Stats {
        group: Option<String>,
    },
    Version,
    Noop,
    /// How long the item still lives (its value is not sent): `mg <key> t` over TCP,
    /// the TTL request over UCX. memcached answers it over TCP too.
    Ttl {
        key: Vec<u8>,
    },
}

impl Op {
    /// The key this operation is routed by; `None` for server-wide operations.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Op::Get { key, .. }
            | Op::Gat { key, .. }
            | Op::Store { key, .. }
            | Op::Delete { key }
            | Op::Arith { key, .. }
            | Op::Touch { key, .. }
            | Op::Ttl { key } => Some(key),
            Op::FlushAll { .. } | Op::Stats { .. } | Op::Version | Op::Noop => None,
        }
    }

    /// The same store with `value` as its data (any other operation unchanged).
    pub(crate) fn with_value(self, value: Bytes) -> Op {
        match self {
            Op::Store {
                mode,
                key,
                flags,
                exptime,
                cas,
                ..
            } => Op::Store {
                mode,
                key,
                value,
                flags,
                exptime,
                cas,
            },
            other => other,
        }
    }
}

/// A fetched item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub data: Bytes,
    pub flags: u32,
    /// The item's CAS value (0 when the server was not asked for it).
    pub cas: u64,
}

/// The outcome of a store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreStatus {
    /// Stored; `cas` is the new item's CAS value (0 if the server did not say).
    Stored { cas: u64 },
    /// The mode's condition failed (add of an existing key, replace/append/prepend of a missing one).
    NotStored,
    /// cas: the item was modified since its CAS value was read.
    Exists,
    /// cas: the item does not exist.
    NotFound,
    /// A [`StoreMode::SetFragment`] the server did not store: it holds a fragment of a
    /// newer write of the key, whose stripe this is.
    Superseded { stripe: u64 },
}

/// The reply to an [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Get/Gat: `None` is a miss.
    Value(Option<Value>),
    Stored(StoreStatus),
    /// Delete: `false` = not found.
    Deleted(bool),
    /// incr/decr: the new value, `None` = not found.
    Counter(Option<u64>),
    /// Touch: `false` = not found.
    Touched(bool),
    /// Ttl: `None` = not found.
    Ttl(Option<Ttl>),
    /// flush_all, noop.
    Ok,
    Stats(Vec<(String, String)>),
    Version(String),
}

pub use memfabric_proto::meta_client::Ttl;

/// The longest key memcached accepts.
pub use memfabric_proto::KEY_MAX_LEN as MAX_KEY_LEN;

/// A key memcached's text protocols can carry: 1..=250 bytes, no whitespace or control characters.
pub fn valid_key(key: &[u8]) -> bool {
    memfabric_proto::is_text_key(key)
}
