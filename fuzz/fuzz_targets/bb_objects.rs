#![no_main]
//! The burst buffer's objects as they come back from a cache (anything another client, a
//! bug or a damaged copy could have stored under their keys): inode, directory,
//! superblock, flush journal and record, chunk. Never a panic or an allocation the bytes
//! do not justify; what decodes encodes back to the same bytes.
use libfuzzer_sys::fuzz_target;
use memfabric_bb::layout::{chunk_decode, chunk_encode, Dir, FlushRecord, Inode, Journal, Superblock};

fuzz_target!(|data: &[u8]| {
    if let Ok(i) = Inode::decode(data) {
        assert_eq!(i.encode(), data);
        let _ = i.written_chunks().take(1000).count();
    }
    if let Ok(d) = Dir::decode(data) {
        assert_eq!(d.encode(), data);
    }
    if let Ok(s) = Superblock::decode(data) {
        assert_eq!(s.encode(), data);
    }
    if let Ok(j) = Journal::decode(data) {
        assert_eq!(j.encode(), data);
    }
    if let Ok(r) = FlushRecord::decode(data) {
        assert_eq!(r.encode(), data);
    }
    if data.len() >= 24 {
        let id = u64::from_le_bytes(data[..8].try_into().unwrap());
        let gen = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let n = u64::from_le_bytes(data[16..24].try_into().unwrap());
        if let Ok(d) = chunk_decode(&data[24..], id, gen, n) {
            assert_eq!(chunk_encode(id, gen, n, d), &data[24..]);
        }
    }
});
