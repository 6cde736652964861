//! The stored form of one fragment of an erasure-coded value (issue 12): a value cut into
//! `k` data shards plus `m` parity shards, each stored as an ordinary item on its own
//! server, under a header that says which write and which piece it is, so that fragments
//! of different writes are never mixed and a torn or corrupted fragment is detected.
//!
//! ```text
//! offset size
//!  0     4    magic "MFEC"
//!  4     1    format version (2)
//!  5     1    k, data shards (1..)
//!  6     1    m, parity shards (k + m <= 255)
//!  7     1    index of this shard (0..k+m; below k a data shard)
//!  8     8    stripe: the write's id, chosen by the writer; higher is newer (LE)
//! 16     8    the value's length in bytes (LE)
//! 24     4    crc32c of the payload (LE)
//! 28     4    crc32c of the write's data: its k data shards' payloads in order (LE)
//! 32     4    crc32c of bytes 0..32 (LE)
//! 36          payload: shard_len(value length, k) bytes
//! ```
//! Every shard of a stripe has the same length: the value's length divided by `k`,
//! rounded up, at least 1 (the last data shard is zero-padded).
//!
//! A write is its [`WriteId`]: stripe, length and data checksum. Two writers that pick
//! the same stripe (clocks agree to the microsecond; 15 in 400 rounds of two writers
//! racing on one key did) write different data checksums unless they wrote the same
//! bytes, so a reader never assembles a value from pieces of both. Version 1 had no data
//! checksum and grouped by stripe and length alone, which did: its fragments are known
//! ([`FragmentError::OldFormat`]) but not read.

/// Bytes before the payload.
pub const HEADER_LEN: usize = 36;
/// The first bytes of every fragment.
pub const MAGIC: [u8; 4] = *b"MFEC";
const VERSION: u8 = 2;
/// Version 1's header: 32 bytes, its checksum at 28 over bytes 0..28.
const V1_HEADER_LEN: usize = 32;

/// What a fragment's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentHeader {
    pub k: u8,
    pub m: u8,
    pub index: u8,
    pub stripe: u64,
    pub value_len: u64,
    /// crc32c of the write's `k` data shards' payloads, one after another
    /// ([`data_crc`]): the same in every fragment of one write.
    pub data_crc: u32,
}

/// Which write a fragment belongs to. Ordered newest first by stripe (then length and
/// data checksum, so that two writes that chose one stripe still have an order every
/// reader agrees on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WriteId {
    pub stripe: u64,
    pub value_len: u64,
    pub data_crc: u32,
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
    /// A fragment of format version 1 (checked header), which grouped a write's
    /// fragments by stripe and length only: a fragment, but not one this reader reads.
    #[error("fragment of format version 1 (k {k}, m {m}), no longer read")]
    OldFormat { k: u8, m: u8 },
    #[error("header checksum mismatch")]
    HeaderCrc,
    #[error("impossible geometry: k {k}, m {m}, index {index}")]
    Geometry { k: u8, m: u8, index: u8 },
    #[error("payload is {got} bytes, the header implies {want}")]
    Length { got: usize, want: u64 },
    #[error("payload checksum mismatch")]
    PayloadCrc,
}

impl FragmentError {
    /// Whether the bytes are a fragment nonetheless (a checked header of this format
    /// whose payload is damaged, or a checked header of the old format): a reader counts
    /// them as a fragment lost, not as a value that is not coded.
    pub fn is_fragment(&self) -> bool {
        matches!(
            self,
            FragmentError::OldFormat { .. }
                | FragmentError::Length { .. }
                | FragmentError::PayloadCrc
        )
    }
}

/// The code (`k`, `m`) of any fragment, intact or not ([`FragmentError::is_fragment`]):
/// what a reader that met one needs to find the others. Only the header is checked (a
/// payload checksum is not what tells a fragment from a plain value), so asking costs
/// nothing next to the full check the reader makes of the fragments it uses.
pub fn code_of(bytes: &[u8]) -> Option<(u8, u8)> {
    match FragmentHeader::peek(bytes) {
        Ok((h, _)) => Some((h.k, h.m)),
        Err(FragmentError::OldFormat { k, m }) => Some((k, m)),
        Err(_) => None,
    }
}

/// The data checksum of a write ([`FragmentHeader::data_crc`]) from the crc32c of each
/// of its `k` data shards' payloads in order, every one `shard_len` bytes long: combined,
/// not computed over the data again.
pub fn data_crc(shard_crcs: impl IntoIterator<Item = u32>, shard_len: usize) -> u32 {
    let mut crcs = shard_crcs.into_iter();
    let first = crcs.next().unwrap_or(0);
    crcs.fold(first, |all, next| {
        memfabric_checksum::crc32c_combine(all, next, shard_len)
    })
}

/// Bytes of each shard of a `value_len`-byte value cut into `k` data shards.
pub fn shard_len(value_len: u64, k: u8) -> u64 {
    value_len.div_ceil(u64::from(k.max(1))).max(1)
}

impl FragmentHeader {
    /// The write this fragment belongs to.
    pub fn write(&self) -> WriteId {
        WriteId {
            stripe: self.stripe,
            value_len: self.value_len,
            data_crc: self.data_crc,
        }
    }

    /// Append the header for `payload` to `out`, then the payload.
    pub fn encode(&self, payload: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header(payload));
        out.extend_from_slice(payload);
    }

    /// The header for `payload` (for a writer that places the payload itself).
    pub fn header(&self, payload: &[u8]) -> [u8; HEADER_LEN] {
        self.header_with(memfabric_checksum::crc32c(payload))
    }

    /// The header of a payload whose crc32c the writer already has.
    pub fn header_with(&self, payload_crc: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&[VERSION, self.k, self.m, self.index]);
        h[8..16].copy_from_slice(&self.stripe.to_le_bytes());
        h[16..24].copy_from_slice(&self.value_len.to_le_bytes());
        h[24..28].copy_from_slice(&payload_crc.to_le_bytes());
        h[28..32].copy_from_slice(&self.data_crc.to_le_bytes());
        let header_crc = memfabric_checksum::crc32c(&h[..32]);
        h[32..36].copy_from_slice(&header_crc.to_le_bytes());
        h
    }

    /// The header of a stored fragment, its own checksum checked but not the payload's
    /// (for a writer reading back the header it just wrote), with the payload's crc32c
    /// as the header gives it.
    pub fn peek(bytes: &[u8]) -> Result<(FragmentHeader, u32), FragmentError> {
        if let Some(v1) = bytes
            .get(..V1_HEADER_LEN)
            .filter(|h| h[..4] == MAGIC && h[4] == 1)
        {
            let v1_crc = u32::from_le_bytes([v1[28], v1[29], v1[30], v1[31]]);
            if memfabric_checksum::crc32c(&v1[..28]) == v1_crc {
                return Err(FragmentError::OldFormat { k: v1[5], m: v1[6] });
            }
        }
        let h = bytes.get(..HEADER_LEN).ok_or(FragmentError::Short)?;
        let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let long = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if h[..4] != MAGIC {
            return Err(FragmentError::Magic);
        }
        if h[4] != VERSION {
            return Err(FragmentError::Version(h[4]));
        }
        if memfabric_checksum::crc32c(&h[..32]) != word(32) {
            return Err(FragmentError::HeaderCrc);
        }
        let header = FragmentHeader {
            k: h[5],
            m: h[6],
            index: h[7],
            stripe: long(8),
            value_len: long(16),
            data_crc: word(28),
        };
        let shards = u16::from(header.k) + u16::from(header.m);
        if header.k == 0 || shards > 255 || u16::from(header.index) >= shards {
            return Err(FragmentError::Geometry {
                k: header.k,
                m: header.m,
                index: header.index,
            });
        }
        Ok((header, word(24)))
    }

    /// Check and split a stored fragment: its header and its payload.
    pub fn decode(bytes: &[u8]) -> Result<(FragmentHeader, &[u8]), FragmentError> {
        let (header, payload_crc) = Self::peek(bytes)?;
        let payload = &bytes[HEADER_LEN..];
        let want = shard_len(header.value_len, header.k);
        if payload.len() as u64 != want {
            return Err(FragmentError::Length {
                got: payload.len(),
                want,
            });
        }
        if memfabric_checksum::crc32c(payload) != payload_crc {
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
            data_crc: 0xdead_beef,
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
        assert_eq!(h.data_crc, 0xdead_beef);
        assert_eq!(p, b"abc");
        assert_eq!(
            FragmentHeader::peek(&f),
            Ok((h, memfabric_checksum::crc32c(b"abc")))
        );
    }

    /// A version 1 fragment (32-byte header, no data checksum) is recognised as a
    /// fragment, never read as one of this format nor taken for a plain value.
    #[test]
    fn a_version_1_fragment_is_known_but_not_read() {
        let payload = b"0123456789";
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC);
        f.extend_from_slice(&[1, 4, 2, 5]);
        f.extend_from_slice(&7u64.to_le_bytes());
        f.extend_from_slice(&40u64.to_le_bytes());
        f.extend_from_slice(&memfabric_checksum::crc32c(payload).to_le_bytes());
        let crc = memfabric_checksum::crc32c(&f);
        f.extend_from_slice(&crc.to_le_bytes());
        f.extend_from_slice(payload);
        let e = FragmentHeader::decode(&f).unwrap_err();
        assert_eq!(e, FragmentError::OldFormat { k: 4, m: 2 });
        assert!(e.is_fragment());
        assert_eq!(code_of(&f), Some((4, 2)));
        // Damaged, it is not a fragment of any format.
        f[9] ^= 1;
        let e = FragmentHeader::decode(&f).unwrap_err();
        assert_eq!(e, FragmentError::Version(1));
        assert!(!e.is_fragment());
        assert_eq!(code_of(&f), None);
    }

    /// The data checksum combined from the shards' own is the checksum of the shards
    /// one after another; writes order by stripe first.
    #[test]
    fn the_data_checksum_covers_the_shards_in_order() {
        let shards: [&[u8]; 3] = [b"0123", b"4567", b"89ab"];
        let combined = data_crc(shards.iter().map(|s| memfabric_checksum::crc32c(s)), 4);
        assert_eq!(combined, memfabric_checksum::crc32c(b"0123456789ab"));
        let swapped = data_crc(
            [shards[1], shards[0], shards[2]]
                .iter()
                .map(|s| memfabric_checksum::crc32c(s)),
            4,
        );
        assert_ne!(combined, swapped);
        let w = |stripe, data_crc| WriteId {
            stripe,
            value_len: 9,
            data_crc,
        };
        assert!(w(2, 0) > w(1, u32::MAX));
        assert!(w(1, 5) > w(1, 4));
    }

    #[test]
    fn damage_anywhere_is_detected() {
        let f = fragment(10, b"abc");
        for i in 0..f.len() {
            let mut bad = f.clone();
            bad[i] ^= 0x20;
            assert!(FragmentHeader::decode(&bad).is_err(), "byte {i}");
        }
        assert_eq!(
            FragmentHeader::decode(&f[..HEADER_LEN - 1]),
            Err(FragmentError::Short)
        );
        // A damaged payload under an intact header is still a fragment of its code.
        let mut torn = f.clone();
        torn.push(b'!');
        assert!(FragmentHeader::decode(&torn).unwrap_err().is_fragment());
        assert_eq!(code_of(&torn), Some((4, 2)));
        let mut flipped = f.clone();
        flipped[HEADER_LEN] ^= 1;
        assert_eq!(
            FragmentHeader::decode(&flipped),
            Err(FragmentError::PayloadCrc)
        );
        assert_eq!(code_of(&flipped), Some((4, 2)));
        assert_eq!(code_of(b"MFEC plain value that only starts like one"), None);
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
