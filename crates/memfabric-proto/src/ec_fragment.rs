//! The stored form of one fragment of an erasure-coded value (issue 12): a value cut into
//! `k` data shards plus `m` parity shards, each stored as an ordinary item on its own
//! server, under a header that says which write and which piece it is, so that fragments
//! of different writes are never mixed and a torn or corrupted fragment is detected.
//!
//! ```text
//! offset size
//!  0     4    magic "MFEC"
//!  4     1    format version (1)
//!  5     1    k, data shards (1..)
//!  6     1    m, parity shards (k + m <= 255)
//!  7     1    index of this shard (0..k+m; below k a data shard)
//!  8     8    stripe: the write's id, chosen by the writer; higher is newer (LE)
//! 16     8    the value's length in bytes (LE)
//! 24     4    crc32c of the payload (LE)
//! 28     4    crc32c of bytes 0..28 (LE)
//! 32          payload: shard_len(value length, k) bytes
//! ```
//! Every shard of a stripe has the same length: the value's length divided by `k`,
//! rounded up, at least 1 (the last data shard is zero-padded).

/// Bytes before the payload.
pub const HEADER_LEN: usize = 32;
/// The first bytes of every fragment.
pub const MAGIC: [u8; 4] = *b"MFEC";
const VERSION: u8 = 1;

/// What a fragment's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentHeader {
    pub k: u8,
    pub m: u8,
    pub index: u8,
    pub stripe: u64,
    pub value_len: u64,
}

/// Why bytes are not a fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    #[error("shorter than a fragment header")]
    Short,
    #[error("not a fragment (magic)")]
    Magic,
    #[error("fragment format version {0} is not known")]
    Version(u8),
    #[error("header checksum mismatch")]
    HeaderCrc,
    #[error("impossible geometry: k {k}, m {m}, index {index}")]
    Geometry { k: u8, m: u8, index: u8 },
    #[error("payload is {got} bytes, the header implies {want}")]
    Length { got: usize, want: u64 },
    #[error("payload checksum mismatch")]
    PayloadCrc,
}

/// Bytes of each shard of a `value_len`-byte value cut into `k` data shards.
pub fn shard_len(value_len: u64, k: u8) -> u64 {
    value_len.div_ceil(u64::from(k.max(1))).max(1)
}

impl FragmentHeader {
    /// Append the header for `payload` to `out`, then the payload.
    pub fn encode(&self, payload: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header(payload));
        out.extend_from_slice(payload);
    }

    /// The header for `payload` (for a writer that places the payload itself).
    pub fn header(&self, payload: &[u8]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&[VERSION, self.k, self.m, self.index]);
        h[8..16].copy_from_slice(&self.stripe.to_le_bytes());
        h[16..24].copy_from_slice(&self.value_len.to_le_bytes());
        h[24..28].copy_from_slice(&memfabric_checksum::crc32c(payload).to_le_bytes());
        let header_crc = memfabric_checksum::crc32c(&h[..28]);
        h[28..32].copy_from_slice(&header_crc.to_le_bytes());
        h
    }

    /// Check and split a stored fragment: its header and its payload.
    pub fn decode(bytes: &[u8]) -> Result<(FragmentHeader, &[u8]), FragmentError> {
        let h = bytes.get(..HEADER_LEN).ok_or(FragmentError::Short)?;
        if h[..4] != MAGIC {
            return Err(FragmentError::Magic);
        }
        if h[4] != VERSION {
            return Err(FragmentError::Version(h[4]));
        }
        let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let long = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if memfabric_checksum::crc32c(&h[..28]) != word(28) {
            return Err(FragmentError::HeaderCrc);
        }
        let header = FragmentHeader {
            k: h[5],
            m: h[6],
            index: h[7],
            stripe: long(8),
            value_len: long(16),
        };
        let shards = u16::from(header.k) + u16::from(header.m);
        if header.k == 0 || shards > 255 || u16::from(header.index) >= shards {
            return Err(FragmentError::Geometry {
                k: header.k,
                m: header.m,
                index: header.index,
            });
        }
        let payload = &bytes[HEADER_LEN..];
        let want = shard_len(header.value_len, header.k);
        if payload.len() as u64 != want {
            return Err(FragmentError::Length {
                got: payload.len(),
                want,
            });
        }
        if memfabric_checksum::crc32c(payload) != word(24) {
            return Err(FragmentError::PayloadCrc);
        }
        Ok((header, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(value_len: u64, payload: &[u8]) -> Vec<u8> {
        let h = FragmentHeader {
            k: 4,
            m: 2,
            index: 5,
            stripe: 0x0102_0304_0506_0708,
            value_len,
        };
        let mut out = Vec::new();
        h.encode(payload, &mut out);
        out
    }

    #[test]
    fn a_fragment_decodes_to_what_was_encoded() {
        let f = fragment(10, b"abc");
        assert_eq!(f.len(), HEADER_LEN + 3);
        let (h, p) = FragmentHeader::decode(&f).unwrap();
        assert_eq!((h.k, h.m, h.index, h.value_len), (4, 2, 5, 10));
        assert_eq!(h.stripe, 0x0102_0304_0506_0708);
        assert_eq!(p, b"abc");
    }

    #[test]
    fn damage_anywhere_is_detected() {
        let f = fragment(10, b"abc");
        for i in 0..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x20;
            assert!(FragmentHeader::decode(&bad).is_err(), "byte {i}");
        }
        assert_eq!(FragmentHeader::decode(&f[..31]), Err(FragmentError::Short));
        assert!(matches!(
            FragmentHeader::decode(&f[..f.len() - 1]),
            Err(FragmentError::Length { got: 2, want: 3 })
        ));
    }

    #[test]
    fn shard_lengths() {
        assert_eq!(shard_len(0, 4), 1);
        assert_eq!(shard_len(1, 4), 1);
        assert_eq!(shard_len(8, 4), 2);
        assert_eq!(shard_len(9, 4), 3);
        assert_eq!(shard_len(u64::MAX, 1), u64::MAX);
        assert_eq!(shard_len(5, 0), 5);
    }
}
