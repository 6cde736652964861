//! memfabric-proto: memcached's wire formats as pure parsers and encoders.
//!
//! Nothing here does I/O or touches storage: a parser takes bytes and says what request
//! they hold and how many bytes it used (or that more are needed); an encoder appends a
//! reply to a buffer. `ucx_wire` holds the UCX active-message headers and the bootstrap
//! frames of memfabric's own protocol (docs/fabric-protocol.md); `onesided` decodes and
//! checks what a client reads from the server's memory with RMA (docs/one-sided.md).
//! `meta_client` is the client's side of the meta protocol (its requests and the decoding
//! of their replies); `metadump` the lines of `lru_crawler metadump` as a client reads them;
//! `sasl` the binary protocol's SASL PLAIN message.
//! `number` is the one decimal parser (memcached's `safe_strto*`) both
//! text protocols use. Limits every protocol shares are defined here, once.

pub mod ascii;
pub mod binary;
pub mod ec_fragment;
pub mod key_hint;
pub mod meta;
pub mod meta_client;
pub mod metadump;
pub mod number;
pub mod onesided;
pub mod sasl;
pub mod ucx_wire;
pub mod udp;

/// Longest key memcached accepts, in every protocol (ascii, meta, binary) and on the UCX
/// path.
pub const KEY_MAX_LEN: usize = 250;

/// A key memcached's text protocols can carry: 1..=`KEY_MAX_LEN` bytes, no whitespace or
/// control characters (they would split or end the command line).
pub fn is_text_key(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= KEY_MAX_LEN && key.iter().all(|&b| b > 0x20 && b != 0x7f)
}

/// Whether two secrets (passwords, MACs) are equal, comparing every byte when the lengths
/// agree: the time taken does not say how many leading bytes of a guess were right.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
