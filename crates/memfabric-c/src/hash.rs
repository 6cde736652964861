//! libhashkit's key hash functions (`MEMCACHED_HASH_*`), bit for bit, so that placement and
//! `memcached_generate_hash` agree with libmemcached's for every hash a pool can choose.
//! The differential test compares 40 keys x every hash x modula/ketama/weighted with the
//! real library.

use md5::{Digest, Md5};

/// `memcached_hash_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    Default = 0,
    Md5 = 1,
    Crc = 2,
    Fnv1_64 = 3,
    Fnv1a64 = 4,
    Fnv1_32 = 5,
    Fnv1a32 = 6,
    Murmur = 8,
    Jenkins = 9,
    Murmur3 = 10,
}

impl Hash {
    /// The hash numbered `n`, or `None` for the ones Debian's libhashkit refuses (Hsieh is
    /// not built in, CUSTOM has no function) or does not know.
    pub fn from_number(n: u64) -> Option<Hash> {
        Some(match n {
            0 => Hash::Default,
            1 => Hash::Md5,
            2 => Hash::Crc,
            3 => Hash::Fnv1_64,
            4 => Hash::Fnv1a64,
            5 => Hash::Fnv1_32,
            6 => Hash::Fnv1a32,
            8 => Hash::Murmur,
            9 => Hash::Jenkins,
            10 => Hash::Murmur3,
            _ => return None,
        })
    }

    /// The name `--HASH=` takes in a configuration string.
    pub fn from_name(name: &str) -> Option<Hash> {
        Some(match name.to_ascii_uppercase().as_str() {
            "DEFAULT" => Hash::Default,
            "MD5" => Hash::Md5,
            "CRC" => Hash::Crc,
            "FNV1_64" => Hash::Fnv1_64,
            "FNV1A_64" => Hash::Fnv1a64,
            "FNV1_32" => Hash::Fnv1_32,
            "FNV1A_32" => Hash::Fnv1a32,
            "MURMUR" => Hash::Murmur,
            "JENKINS" => Hash::Jenkins,
            "MURMUR3" => Hash::Murmur3,
            _ => return None,
        })
    }

    pub fn hash(self, key: &[u8]) -> u32 {
        match self {
            Hash::Default => memfabric_client::ketama::one_at_a_time(key),
            Hash::Md5 => {
                let d: [u8; 16] = Md5::digest(key).into();
                u32::from_le_bytes([d[0], d[1], d[2], d[3]])
            }
            Hash::Crc => (crc32fast::hash(key) >> 16) & 0x7fff,
            Hash::Fnv1_64 => key.iter().fold(FNV64_OFFSET, |h, &b| {
                h.wrapping_mul(FNV64_PRIME) ^ u64::from(b)
            }) as u32,
            Hash::Fnv1a64 => key.iter().fold(FNV64_OFFSET, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(FNV64_PRIME)
            }) as u32,
            Hash::Fnv1_32 => key.iter().fold(FNV32_OFFSET, |h, &b| {
                h.wrapping_mul(FNV32_PRIME) ^ u32::from(b)
            }),
            Hash::Fnv1a32 => key.iter().fold(FNV32_OFFSET, |h, &b| {
                (h ^ u32::from(b)).wrapping_mul(FNV32_PRIME)
            }),
            Hash::Murmur => murmur2(key),
            Hash::Jenkins => jenkins(key),
            Hash::Murmur3 => murmur3_x86_32(key, 0xdead_beef_u32.wrapping_mul(key.len() as u32)),
        }
    }
}

const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV32_OFFSET: u32 = 2_166_136_261;
const FNV32_PRIME: u32 = 16_777_619;

/// MurmurHash2 as libhashkit seeds it: `0xdeadbeef * length`.
fn murmur2(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    let len = key.len() as u32;
    let mut h = 0xdead_beef_u32.wrapping_mul(len) ^ len;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

/// Bob Jenkins' lookup3 `hashlittle` with libhashkit's initial value 13.
fn jenkins(key: &[u8]) -> u32 {
    let init = 0xdead_beef_u32
        .wrapping_add(key.len() as u32)
        .wrapping_add(13);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut k = key;
    while k.len() > 12 {
        a = a.wrapping_add(le_word(&k[0..4]));
        b = b.wrapping_add(le_word(&k[4..8]));
        c = c.wrapping_add(le_word(&k[8..12]));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    let mut tail = [0u8; 12];
    tail[..k.len()].copy_from_slice(k);
    a = a.wrapping_add(le_word(&tail[0..4]));
    b = b.wrapping_add(le_word(&tail[4..8]));
    c = c.wrapping_add(le_word(&tail[8..12]));
    final_mix(&mut a, &mut b, &mut c);
    c
}

fn le_word(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// MurmurHash3 x86_32 (libhashkit seeds it as MurmurHash2: `0xdeadbeef * length`).
fn murmur3_x86_32(key: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = le_word(c);
        k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = chunks.remainder();
    let mut k = 0u32;
    for (i, &b) in tail.iter().enumerate() {
        k ^= u32::from(b) << (8 * i);
    }
    if !tail.is_empty() {
        h ^= k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    }
    h ^= key.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_and_murmur3_reference_values() {
        // Published test vectors.
        assert_eq!(Hash::Fnv1a32.hash(b"a"), 0xe40c_292c);
        assert_eq!(Hash::Fnv1_32.hash(b"a"), 0x050c_5d7e);
        assert_eq!(murmur3_x86_32(b"hello", 0), 0x248b_fa47);
        assert_eq!(murmur3_x86_32(b"", 0), 0);
    }
}
