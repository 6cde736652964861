//! Erasure coding of values (issue 12): RS(k, m) over GF(2^8) with
//! `reed-solomon-erasure` (chosen by measurement on this machine: `tools/rs-compare`;
//! decoding with two data shards lost takes ~1-3 µs at 16-64 KiB where
//! `reed-solomon-simd` has a fixed ~125 µs). A value becomes `k + m` fragments
//! (`memfabric_proto::ec_fragment`: a checked header naming the write, then one shard);
//! any `k` intact fragments of one write give the value back.
//!
//! This is the coding only; which servers hold the fragments (`Continuum::successors`),
//! and how they are written and read, is the pool's business.
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use memfabric_proto::ec_fragment::{data_crc, shard_len, FragmentHeader, WriteId};
use reed_solomon_erasure::galois_8::ReedSolomon;

/// Why a value could not be coded or rebuilt.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EcError {
    #[error("RS({k},{m}) is not possible: 1 <= k, 1 <= m, k + m <= 255")]
    Geometry { k: u8, m: u8 },
    #[error(
        "only {have} intact fragments of the newest write ({stripe}) were found, {need} are needed"
    )]
    NotEnough {
        stripe: u64,
        have: usize,
        need: usize,
    },
    #[error("no intact fragment of this code was found")]
    NoFragments,
    #[error("reed-solomon: {0}")]
    Coding(String),
}

/// RS(k, m) as a pool option: `"4+2"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcGeometry {
    pub k: u8,
    pub m: u8,
}

impl std::str::FromStr for EcGeometry {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not K+M (for example 4+2)");
        let (k, m) = s.split_once('+').ok_or_else(bad)?;
        let k: u8 = k.trim().parse().map_err(|_| bad())?;
        let m: u8 = m.trim().parse().map_err(|_| bad())?;
        Code::new(k, m).map_err(|e| e.to_string())?;
        Ok(EcGeometry { k, m })
    }
}

impl EcGeometry {
    /// The code `bytes` were made with, if they are an intact fragment of a coded value
    /// (what a pool without this code reads from one of its servers).
    /// A damaged fragment (its header intact) or one of the old format names its code
    /// too: its value is still read whole, through the other fragments.
    pub fn of_fragment(bytes: &[u8]) -> Option<EcGeometry> {
        memfabric_proto::ec_fragment::code_of(bytes).map(|(k, m)| EcGeometry { k, m })
    }
}

impl std::fmt::Display for EcGeometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// A code: `k` data shards and `m` parity shards.
#[derive(Debug)]
pub struct Code {
    k: u8,
    m: u8,
    rs: ReedSolomon,
    recycler: Arc<Recycler>,
}

/// Fragment buffers of at least this many bytes are recycled, up to this many bytes kept.
const RECYCLE_MIN: usize = 64 << 10;
const RECYCLE_MAX_KEPT: usize = 8 << 20;

/// Fragment buffers, recycled. malloc serves a buffer of a few hundred KiB from fresh
/// pages, and the first touch of each faults: for a 1 MB value's six fragments that was
/// ~200 µs, more than the coding itself. A fragment sent ([`Code::share`]) comes back
/// here when the transport drops it, and the next write reuses its pages. At most
/// [`RECYCLE_MAX_KEPT`] bytes wait here; buffers beyond go back to malloc.
#[derive(Debug, Default)]
struct Recycler {
    /// The buffers, and the sum of their capacities.
    free: Mutex<(Vec<Vec<u8>>, usize)>,
}

impl Recycler {
    /// An empty buffer with room for `len` bytes: a recycled one of at most twice that
    /// if there is one (so that small writes do not pin large buffers), else a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        if len >= RECYCLE_MIN {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let fits = |v: &Vec<u8>| v.capacity() >= len && v.capacity() <= 2 * len;
            if let Some(i) = free.0.iter().position(fits) {
                let mut v = free.0.swap_remove(i);
                free.1 -= v.capacity();
                v.clear();
                return v;
            }
        }
        Vec::with_capacity(len)
    }

    fn give(&self, v: Vec<u8>) {
        if v.capacity() < RECYCLE_MIN {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.1 + v.capacity() <= RECYCLE_MAX_KEPT {
            free.1 += v.capacity();
            free.0.push(v);
        }
    }

    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let free = self.free.lock().unwrap();
        (free.0.len(), free.1)
    }
}

/// A fragment on its way out; its buffer goes back to the code's [`Recycler`] when the
/// transport is done with it (or to malloc, if the code is gone).
struct Recycled {
    buf: Vec<u8>,
    home: Weak<Recycler>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            home.give(std::mem::take(&mut self.buf));
        }
    }
}

use memfabric_proto::ec_fragment::HEADER_LEN;

impl Code {
    pub fn new(k: u8, m: u8) -> Result<Code, EcError> {
        if k == 0 || m == 0 || usize::from(k) + usize::from(m) > 255 {
            return Err(EcError::Geometry { k, m });
        }
        let rs = ReedSolomon::new(usize::from(k), usize::from(m))
            .map_err(|e| EcError::Coding(format!("{e:?}")))?;
        Ok(Code {
            k,
            m,
            rs,
            recycler: Arc::default(),
        })
    }

    /// A fragment this code made, as the bytes a transport sends: its buffer is reused
    /// by a later write once the transport drops them.
    pub fn share(&self, fragment: Vec<u8>) -> Bytes {
        if fragment.capacity() < RECYCLE_MIN {
            return Bytes::from(fragment);
        }
        Bytes::from_owner(Recycled {
            buf: fragment,
            home: Arc::downgrade(&self.recycler),
        })
    }

    /// Whether this is RS(`k`, `m`).
    pub fn is(&self, k: u8, m: u8) -> bool {
        (self.k, self.m) == (k, m)
    }

    pub fn data_shards(&self) -> usize {
        usize::from(self.k)
    }

    pub fn total_shards(&self) -> usize {
        usize::from(self.k) + usize::from(self.m)
    }

    /// The `k + m` fragments of `value` for write `stripe` (index `i` at position `i`).
    pub fn encode(&self, stripe: u64, value: &[u8]) -> Result<Vec<Vec<u8>>, EcError> {
        let mut frags = self.encode_data(stripe, value);
        let parity = self.encode_parity(stripe, value.len(), &frags)?;
        frags.extend(parity);
        Ok(frags)
    }

    /// The `k` data fragments of `value` for write `stripe`: header room, then the shard
    /// (the value's bytes, the last one zero-padded), so the value is copied once. They
    /// can be sent before the parity is computed ([`Code::encode_parity`]). Each shard's
    /// checksum is computed once: its own header's, and combined, every header's data
    /// checksum.
    pub fn encode_data(&self, stripe: u64, value: &[u8]) -> Vec<Vec<u8>> {
        let len = shard_len(value.len() as u64, self.k) as usize;
        let mut frags: Vec<Vec<u8>> = (0..self.data_shards())
            .map(|i| {
                let mut f = self.recycler.take(HEADER_LEN + len);
                f.resize(HEADER_LEN, 0);
                let from = (i * len).min(value.len());
                let to = ((i + 1) * len).min(value.len());
                f.extend_from_slice(&value[from..to]);
                f.resize(HEADER_LEN + len, 0);
                f
            })
            .collect();
        let crcs: Vec<u32> = frags
            .iter()
            .map(|f| memfabric_checksum::crc32c(&f[HEADER_LEN..]))
            .collect();
        let data_crc = data_crc(crcs.iter().copied(), len);
        for (i, (f, crc)) in frags.iter_mut().zip(crcs).enumerate() {
            self.seal(stripe, value.len(), data_crc, i, crc, f);
        }
        frags
    }

    /// The `m` parity fragments of the write whose data fragments
    /// ([`Code::encode_data`] of a `value_len`-byte value) are `data`: the parity is
    /// computed straight into them.
    pub fn encode_parity<B: AsRef<[u8]>>(
        &self,
        stripe: u64,
        value_len: usize,
        data: &[B],
    ) -> Result<Vec<Vec<u8>>, EcError> {
        let len = shard_len(value_len as u64, self.k) as usize;
        // The write's data checksum, as its data fragments' headers carry it.
        let data_crc = data
            .first()
            .and_then(|f| FragmentHeader::peek(f.as_ref()).ok())
            .map(|(h, _)| h.data_crc)
            .ok_or_else(|| EcError::Coding("no data fragment to code".into()))?;
        let mut parity: Vec<Vec<u8>> = (0..usize::from(self.m))
            .map(|_| {
                let mut f = self.recycler.take(HEADER_LEN + len);
                f.resize(HEADER_LEN + len, 0);
                f
            })
            .collect();
        {
            let shards: Vec<&[u8]> = data.iter().map(|f| &f.as_ref()[HEADER_LEN..]).collect();
            let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|f| &mut f[HEADER_LEN..]).collect();
            self.rs
                .encode_sep(&shards, &mut out)
                .map_err(|e| EcError::Coding(format!("{e:?}")))?;
        }
        for (j, f) in parity.iter_mut().enumerate() {
            let crc = memfabric_checksum::crc32c(&f[HEADER_LEN..]);
            self.seal(stripe, value_len, data_crc, self.data_shards() + j, crc, f);
        }
        Ok(parity)
    }

    /// Writes fragment `index`'s header (with `payload_crc`, its shard's checksum) in
    /// front of it.
    fn seal(
        &self,
        stripe: u64,
        value_len: usize,
        data_crc: u32,
        index: usize,
        payload_crc: u32,
        f: &mut [u8],
    ) {
        let header = FragmentHeader {
            k: self.k,
            m: self.m,
            index: index as u8,
            stripe,
            value_len: value_len as u64,
            data_crc,
        }
        .header_with(payload_crc);
        f[..HEADER_LEN].copy_from_slice(&header);
    }

    /// The value of the newest write (highest stripe) of which at least `k` intact
    /// fragments of this code are among `fragments` (in any order; damaged ones, ones
    /// of another code and duplicates are ignored). Decodes only when a data shard is
    /// missing.
    pub fn decode(&self, fragments: &[&[u8]]) -> Result<Vec<u8>, EcError> {
        let checked: Vec<(FragmentHeader, &[u8])> = fragments
            .iter()
            .filter_map(|f| FragmentHeader::decode(f).ok())
            .collect();
        self.decode_checked(&checked)
    }

    /// [`Code::decode`] of fragments already checked and split by
    /// [`FragmentHeader::decode`] (header, payload): a read that checked each fragment as
    /// it arrived does not pay for the payload checksums a second time.
    pub fn decode_checked(
        &self,
        fragments: &[(FragmentHeader, &[u8])],
    ) -> Result<Vec<u8>, EcError> {
        let mut intact: Vec<(FragmentHeader, &[u8])> = fragments
            .iter()
            .filter(|(h, _)| h.k == self.k && h.m == self.m)
            .copied()
            .collect();
        // Newest write first; within it by index (duplicates next to each other).
        intact.sort_by(|a, b| {
            b.0.write()
                .cmp(&a.0.write())
                .then(a.0.index.cmp(&b.0.index))
        });
        intact.dedup_by(|a, b| a.0.write() == b.0.write() && a.0.index == b.0.index);
        let first = intact.first().ok_or(EcError::NoFragments)?.0;
        // A write is its stripe, its length and its data checksum: two writes that chose
        // the same stripe are never mixed (unless they wrote the same bytes). Neither of
        // two such writes is newer: the one with k fragments here is the value.
        let of = |w: WriteId| -> Vec<&(FragmentHeader, &[u8])> {
            intact.iter().filter(|(h, _)| h.write() == w).collect()
        };
        let newest = intact
            .iter()
            .map(|(h, _)| h)
            .take_while(|h| h.stripe == first.stripe)
            .find(|h| of(h.write()).len() >= self.data_shards())
            .copied()
            .unwrap_or(first);
        let stripe = of(newest.write());
        if stripe.len() < self.data_shards() {
            return Err(EcError::NotEnough {
                stripe: newest.stripe,
                have: stripe.len(),
                need: self.data_shards(),
            });
        }
        let len = newest.value_len as usize;
        let mut data: Vec<Option<&[u8]>> = vec![None; self.data_shards()];
        for (h, payload) in &stripe {
            if let Some(d) = data.get_mut(usize::from(h.index)) {
                *d = Some(payload);
            }
        }
        if data.iter().all(Option::is_some) {
            // Every data shard is here (each its write's shard length: the header check
            // says so): the value is their concatenation, copied once.
            let mut value = Vec::with_capacity(len);
            for d in data.iter().flatten() {
                value.extend_from_slice(&d[..d.len().min(len - value.len())]);
            }
            return Ok(value);
        }
        // Rebuilt in place: the data shards at hand are copied once, into the value's own
        // buffer where they belong, and the missing ones are computed straight into it
        // from as many parity shards (the only other copies). Before, every shard was
        // copied into a vector of its own and the value assembled from them afterwards:
        // three copies of the value, 5-8 ms at 3 MB here, against ~3 for a read that
        // needs no decoding.
        let k = self.data_shards();
        let shard = shard_len(newest.value_len, self.k) as usize;
        let mut value = vec![0u8; k * shard];
        let mut have_data = vec![false; k];
        for (h, payload) in &stripe {
            let i = usize::from(h.index);
            if i < k {
                let slot = value
                    .get_mut(i * shard..(i + 1) * shard)
                    .filter(|s| s.len() == payload.len())
                    .ok_or_else(|| EcError::Coding(format!("shard {i} is not {shard} bytes")))?;
                slot.copy_from_slice(payload);
                have_data[i] = true;
            }
        }
        let mut wanted = have_data.iter().filter(|&&d| !d).count();
        let mut parity: Vec<Option<Vec<u8>>> = vec![None; usize::from(self.m)];
        for (h, payload) in &stripe {
            let j = usize::from(h.index);
            if j >= k && wanted > 0 {
                parity[j - k] = Some(payload.to_vec());
                wanted -= 1;
            }
        }
        let mut shards: Vec<(&mut [u8], bool)> = value
            .chunks_mut(shard)
            .zip(have_data.iter().copied())
            .collect();
        for p in parity.iter_mut() {
            shards.push(match p {
                Some(v) => (v.as_mut_slice(), true),
                None => (&mut [][..], false),
            });
        }
        self.rs
            .reconstruct_data(&mut shards)
            .map_err(|e| EcError::Coding(format!("{e:?}")))?;
        drop(shards);
        value.truncate(len);
        Ok(value)
    }
}

/// The fragment index to write at position `pos` of a value's servers: `pos`'s own
/// unless it is in `taken` (held elsewhere), then the lowest of the `n` not taken; `None`
/// when every one is. The index chosen joins `taken`.
pub(crate) fn free_index(pos: usize, taken: &mut Vec<usize>, n: usize) -> Option<usize> {
    let index = if taken.contains(&pos) {
        (0..n).find(|i| !taken.contains(i))?
    } else {
        pos
    };
    taken.push(index);
    Some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 + 7) as u8).collect()
    }

    /// Fragments sent come back to the code when the transport drops them and serve the
    /// next write (same pages), which still codes correctly; small ones and ones beyond
    /// the cap go to malloc; a code dropped first leaves nothing behind.
    #[test]
    fn fragment_buffers_are_recycled_within_their_bound() {
        let code = Code::new(4, 2).unwrap();
        let big = value(1 << 20);
        let frags = code.encode(7, &big).unwrap();
        let first: Vec<*const u8> = frags.iter().map(|f| f.as_ptr()).collect();
        let sent: Vec<Bytes> = frags.into_iter().map(|f| code.share(f)).collect();
        assert_eq!(code.recycler.kept(), (0, 0), "none back while in flight");
        drop(sent);
        let (n, bytes) = code.recycler.kept();
        assert_eq!(n, 6);
        assert!((6 * (1 << 18)..=RECYCLE_MAX_KEPT).contains(&bytes));
        // The next write of the same size reuses every buffer.
        let again = code.encode(8, &value(1 << 20)).unwrap();
        let mut reused: Vec<*const u8> = again.iter().map(|f| f.as_ptr()).collect();
        reused.sort();
        let mut first = first;
        first.sort();
        assert_eq!(reused, first);
        assert_eq!(code.recycler.kept(), (0, 0));
        let refs: Vec<&[u8]> = again.iter().map(|f| &f[..]).collect();
        assert_eq!(code.decode(&refs[2..]).unwrap(), value(1 << 20));
        // Small fragments are not kept.
        drop(code.share(code.encode(9, &value(1000)).unwrap().remove(0)));
        // Many large ones: at most the cap is kept.
        let many: Vec<Bytes> = (0..8)
            .flat_map(|i| code.encode(10 + i, &big).unwrap())
            .map(|f| code.share(f))
            .collect();
        drop(many);
        let (_, bytes) = code.recycler.kept();
        assert!(bytes <= RECYCLE_MAX_KEPT, "{bytes}");
        // Fragments that outlive their code are freed, not returned.
        let late = code.share(code.encode(99, &big).unwrap().remove(0));
        drop(code);
        assert_eq!(late.len(), HEADER_LEN + (1 << 18));
        drop(late);
    }

    #[test]
    fn any_k_fragments_give_the_value_back_for_other_codes_too() {
        for (k, m) in [(3u8, 2u8), (2, 1), (6, 3), (1, 2)] {
            let code = Code::new(k, m).unwrap();
            let n = usize::from(k + m);
            for len in [0usize, 1, 7, 1000, 65_537] {
                let v = value(len);
                let frags = code.encode(9, &v).unwrap();
                // Every way of losing exactly m fragments.
                for lost in (0u32..1 << n).filter(|b| b.count_ones() == u32::from(m)) {
                    let kept: Vec<&[u8]> = (0..n)
                        .filter(|i| lost & (1 << i) == 0)
                        .map(|i| &frags[i][..])
                        .collect();
                    assert_eq!(
                        code.decode(&kept).unwrap(),
                        v,
                        "{k}+{m}, {len} B, lost {lost:b}"
                    );
                }
            }
        }
    }

    #[test]
    fn any_k_of_k_plus_m_fragments_give_the_value_back() {
        let code = Code::new(4, 2).unwrap();
        for n in [0usize, 1, 3, 4, 5, 1000, 65536, 65537] {
            let v = value(n);
            let frags = code.encode(7, &v).unwrap();
            assert_eq!(frags.len(), 6);
            // Every pair of lost fragments.
            for a in 0..6 {
                for b in a + 1..6 {
                    let kept: Vec<&[u8]> = (0..6)
                        .filter(|&i| i != a && i != b)
                        .map(|i| &frags[i][..])
                        .collect();
                    assert_eq!(code.decode(&kept).unwrap(), v, "n {n}, lost {a} and {b}");
                }
            }
            let three: Vec<&[u8]> = frags[..3].iter().map(|f| &f[..]).collect();
            assert_eq!(
                code.decode(&three),
                Err(EcError::NotEnough {
                    stripe: 7,
                    have: 3,
                    need: 4
                })
            );
        }
    }

    #[test]
    fn writes_are_never_mixed_and_damage_is_ignored() {
        let code = Code::new(3, 2).unwrap();
        let (old, new) = (value(5000), vec![9u8; 4000]);
        let a = code.encode(1, &old).unwrap();
        let b = code.encode(2, &new).unwrap();
        // Three of the new write and two of the old: the new one.
        let mix: Vec<&[u8]> = vec![&a[0], &b[1], &a[3], &b[2], &b[4]];
        assert_eq!(code.decode(&mix).unwrap(), new);
        // Two of the new write (torn) and all of the old: not the old value (it may be
        // stale); the newest write is reported short, for the caller to judge.
        let torn: Vec<&[u8]> = vec![&b[0], &b[1], &a[0], &a[1], &a[2]];
        assert!(matches!(
            code.decode(&torn),
            Err(EcError::NotEnough {
                stripe: 2,
                have: 2,
                ..
            })
        ));
        // A damaged fragment does not count; duplicates count once.
        let mut bad = b[0].clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let damaged: Vec<&[u8]> = vec![&bad, &b[1], &b[1], &b[2]];
        assert!(matches!(
            code.decode(&damaged),
            Err(EcError::NotEnough { have: 2, .. })
        ));
        let healed: Vec<&[u8]> = vec![&bad, &b[1], &b[2], &b[3]];
        assert_eq!(code.decode(&healed).unwrap(), new);
        // Fragments of another code are not this code's.
        let other = Code::new(4, 2).unwrap().encode(3, &new).unwrap();
        let foreign: Vec<&[u8]> = other.iter().map(|f| &f[..]).collect();
        assert_eq!(code.decode(&foreign), Err(EcError::NoFragments));
    }

    /// Two writers that chose one stripe, values of one length: whatever mix of their
    /// fragments a reader meets, it returns one of the two values or reports too few,
    /// never pieces of both (before the data checksum it returned such a mix).
    #[test]
    fn writes_that_chose_the_same_stripe_are_never_mixed() {
        let code = Code::new(4, 2).unwrap();
        let (x, y) = (value(40_000), vec![7u8; 40_000]);
        let a = code.encode(5, &x).unwrap();
        let b = code.encode(5, &y).unwrap();
        for pattern in 0u32..64 {
            let pick = |i: usize| {
                if pattern & (1 << i) == 0 {
                    &a[i]
                } else {
                    &b[i]
                }
            };
            let all: Vec<&[u8]> = (0..6).map(|i| &pick(i)[..]).collect();
            let from_a = (0..6).filter(|&i| pattern & (1 << i) == 0).count();
            match code.decode(&all) {
                Ok(v) => assert!(v == x || v == y, "pattern {pattern:06b}: a mix"),
                Err(e) => assert!(
                    matches!(e, EcError::NotEnough { .. }) && from_a < 4 && 6 - from_a < 4,
                    "pattern {pattern:06b}: {e}"
                ),
            }
            // Only the data shards (no decoding needed if they were one write).
            let data: Vec<&[u8]> = (0..4).map(|i| &pick(i)[..]).collect();
            if let Ok(v) = code.decode(&data) {
                assert!(v == x || v == y, "pattern {pattern:06b}: data shards mixed");
            }
        }
    }

    #[test]
    fn impossible_codes_are_refused() {
        assert!(Code::new(0, 2).is_err());
        assert!(Code::new(4, 0).is_err());
        assert!(Code::new(200, 56).is_err());
        assert!(Code::new(200, 55).is_ok());
    }
}
