//! crc32c (Castagnoli, as iSCSI and ext4 use it) for every checksum memfabric keeps: the
//! store's items (which one-sided readers check), erasure-coded fragments, the burst
//! buffer's chunks and objects.
//!
//! Two implementations give the same value at different speeds, and which is faster
//! depends on the CPU: the `crc32c` crate's crc32 instruction in three parallel streams,
//! and `crc-fast`'s carry-less multiply folding. Measured for 512 KiB: on one host of this
//! project's VM 15.7 µs against 7.7 µs (folding twice as fast); on another (AMD EPYC with
//! VPCLMULQDQ but no AVX-512) 26 µs against 42 µs (folding 1.6x slower). So large
//! buffers take whichever measured faster here, once per process, the first time a
//! checksum is asked for (about a millisecond); short ones (keys, headers) always take the
//! instruction, which starts faster. `MEMFABRIC_CRC=instruction|folding` fixes the choice.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Below this many bytes the instruction is used whatever was measured.
const LARGE: usize = 1024;

/// The two ways of computing the same crc32c.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// The `crc32c` crate (the SSE 4.2 crc32 instruction, three streams).
    Instruction,
    /// `crc-fast` (carry-less multiply folding).
    Folding,
}

impl Engine {
    /// How `stats fabric` and the environment variable name it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Instruction => "instruction",
            Engine::Folding => "folding",
        }
    }
}

/// crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// crc32c of `data`, continuing from `crc` (the result of an earlier call over the bytes
/// before it).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.len() < LARGE {
        return crc32c::crc32c_append(crc, data);
    }
    crc32c_append_with(large_engine(), crc, data)
}

/// The crc32c of two buffers one after the other, from `crc1` (the first's) and `crc2`
/// (the second's, `len2` bytes long), without reading either again.
pub fn crc32c_combine(crc1: u32, crc2: u32, len2: usize) -> u32 {
    crc32c::crc32c_combine(crc1, crc2, len2)
}

/// crc32c by a given engine (both give the same value).
pub fn crc32c_append_with(engine: Engine, crc: u32, data: &[u8]) -> u32 {
    match engine {
        Engine::Instruction => crc32c::crc32c_append(crc, data),
        Engine::Folding => {
            // The digest's state is the running value before the final inversion.
            let mut d = crc_fast::Digest::new_with_init_state(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                u64::from(!crc),
            );
            d.update(data);
            d.finalize() as u32
        }
    }
}

/// The engine large buffers use in this process.
pub fn large_engine() -> Engine {
    static CHOSEN: OnceLock<Engine> = OnceLock::new();
    *CHOSEN.get_or_init(|| match std::env::var("MEMFABRIC_CRC").as_deref() {
        Ok("instruction") => Engine::Instruction,
        Ok("folding") => Engine::Folding,
        _ => measure(),
    })
}

/// The faster engine over a 64 KiB buffer: the best of several passes each (the least
/// disturbed by other work on the machine), alternating so that both see the same
/// moments.
fn measure() -> Engine {
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i >> 3) as u8).collect();
    let mut best = [Duration::MAX; 2];
    for _ in 0..12 {
        for (slot, engine) in [Engine::Instruction, Engine::Folding]
            .into_iter()
            .enumerate()
        {
            let start = Instant::now();
            std::hint::black_box(crc32c_append_with(engine, 0, std::hint::black_box(&data)));
            best[slot] = best[slot].min(start.elapsed());
        }
    }
    if best[1] < best[0] {
        Engine::Folding
    } else {
        Engine::Instruction
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn every_way_gives_crc32c() {
        let d = data(70_000);
        for len in [0, 1, 31, 1023, 1024, 1025, 4096, 65_537, 70_000] {
            let want = crc32c::crc32c(&d[..len]);
            assert_eq!(crc32c(&d[..len]), want, "len {len}");
            for e in [Engine::Instruction, Engine::Folding] {
                assert_eq!(crc32c_append_with(e, 0, &d[..len]), want, "{e:?} len {len}");
            }
        }
        for cut in [0, 5, 1024, 3000, 69_999] {
            let (a, b) = d.split_at(cut);
            let want = crc32c::crc32c(&d);
            assert_eq!(crc32c_append(crc32c(a), b), want, "cut {cut}");
            for e in [Engine::Instruction, Engine::Folding] {
                let first = crc32c_append_with(e, 0, a);
                assert_eq!(crc32c_append_with(e, first, b), want, "{e:?} cut {cut}");
            }
        }
        for cut in [0, 1, 4096, 70_000] {
            let (a, b) = d.split_at(cut);
            assert_eq!(
                crc32c_combine(crc32c(a), crc32c(b), b.len()),
                crc32c(&d),
                "combine at {cut}"
            );
        }
        // The standard's check value.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn the_choice_is_made_once() {
        assert_eq!(large_engine(), large_engine());
    }
}
