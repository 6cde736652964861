//! What one-sided (RMA) readers rely on: the control block at the end of the index
//! mapping, and access hints (`note_remote_access`) that keep remotely read items warm.
use std::time::{Duration, Instant};

use memfabric_store::remote::*;
use memfabric_store::{GetOptions, SetMode, Store, StoreConfig, StoreStatus};
use proptest::prelude::*;

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

fn small_store(memory: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit: memory,
        slab_automove: false,
        ..StoreConfig::default()
    })
    .unwrap()
}

fn set(s: &Store, k: &[u8], v: &[u8]) {
    let st = s.store(SetMode::Set, k, v, 0, 0, 0);
    assert!(matches!(st, StoreStatus::Stored { .. }), "{st:?}");
}

/// The value without recording an access (so tests do not warm items themselves).
fn peek_value(s: &Store, k: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let opts = GetOptions {
        bump: false,
        ..GetOptions::default()
    };
    s.get(k, &opts, &mut out).map(|_| out)
}

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

// ----- control block ---------------------------------------------------------------

#[test]
fn control_block_has_magic_layout_and_geometry_at_the_end_of_the_index() {
    let s = small_store(8 << 20);
    let b = s.control_block();
    assert_eq!(b.len(), CTL_BYTES);
    assert_eq!(u32_at(&b, OFF_MAGIC), CTL_MAGIC);
    assert_eq!(&b[..4], b"MMFX");
    assert_eq!(u32_at(&b, OFF_LAYOUT), CTL_LAYOUT);
    assert_eq!(u64_at(&b, OFF_HASH_SEED), s.hash_seed());
    let power = u32_at(&b, OFF_HASHPOWER);
    assert_eq!(power, s.stats().hash_power_level);
    let (_, ilen) = s.index_region();
    assert_eq!(ilen, (1usize << power) * BUCKET_BYTES + CTL_BYTES);
    assert_eq!(ilen, index_len(power));
    assert_eq!(u32_at(&b, OFF_PAGE_SIZE) as usize, s.config().page_size);
    assert_eq!(u32_at(&b, OFF_ITEM_HDR) as usize, ITEM_HDR);
    assert_eq!(ITEM_HDR, 40);
    let (_, alen) = s.arena_region();
    assert_eq!(u64_at(&b, OFF_ARENA_LEN) as usize, alen);
    assert_eq!(u64_at(&b, OFF_RESERVED), 0);
    assert_eq!(u64_at(&b, OFF_FLUSH_CAS), 0);
    assert_eq!(u32_at(&b, OFF_FLUSH_TIME), 0);
}

#[test]
fn control_block_class_table_matches_the_slab_classes() {
    let s = small_store(8 << 20);
    // One item per class size, so every class shows up in `stats slabs`.
    let b = s.control_block();
    let n = u32_at(&b, OFF_CLASSES) as usize;
    assert!(n >= 2);
    assert_eq!(u32_at(&b, OFF_CHUNK_SIZES), 0, "class id 0 is unused");
    let sizes: Vec<u32> = (0..n)
        .map(|c| u32_at(&b, OFF_CHUNK_SIZES + 4 * c))
        .collect();
    assert_eq!(sizes[1], 88, "smallest chunk: 40-byte header + 48");
    assert_eq!(sizes[n - 1] as usize, s.config().page_size / 2);
    assert!(sizes[1..].windows(2).all(|w| w[0] < w[1]));
    assert!(b[OFF_CHUNK_SIZES + 4 * n..].iter().all(|&x| x == 0));
    // Each stored item's class has the chunk size the table says.
    for (i, len) in [1usize, 100, 1000, 10_000, 100_000].into_iter().enumerate() {
        set(&s, format!("k{i}").as_bytes(), &vec![1u8; len]);
    }
    let slabs = s.slab_stats();
    assert!(slabs.len() >= 5);
    for c in &slabs {
        assert_eq!(sizes[c.id as usize], c.chunk_size, "class {}", c.id);
    }
    // A slot's class id is what `item_location`'s chunk carries.
    let info = s.peek(b"k2").unwrap();
    assert!(sizes[info.class_id as usize] as usize >= ITEM_HDR + 2 + 1000);
}

#[test]
fn flush_all_without_delay_is_visible_in_the_control_block() {
    let s = small_store(4 << 20);
    set(&s, b"a", b"1");
    let cas_a = s.peek(b"a").unwrap().cas;
    s.flush_all(None);
    let b = s.control_block();
    let fc = u64_at(&b, OFF_FLUSH_CAS);
    assert!(fc > cas_a, "the flushed item's cas is below flush_cas");
    assert_eq!(u32_at(&b, OFF_FLUSH_TIME), 0);
    assert!(peek_value(&s, b"a").is_none());
    set(&s, b"b", b"2");
    assert!(s.peek(b"b").unwrap().cas >= fc, "new items are not dead");
}

#[test]
fn delayed_flush_all_is_visible_in_the_control_block() {
    let s = small_store(4 << 20);
    let now = s.clock().now();
    s.flush_all(Some(now + 100));
    let b = s.control_block();
    // memcached semantics: items stored before the flush time die when it comes.
    assert_eq!(u32_at(&b, OFF_FLUSH_TIME), now + 99);
    assert_eq!(u64_at(&b, OFF_FLUSH_CAS), 0);
    let live_now = u32_at(&b, OFF_NOW);
    assert!(live_now >= now, "flush_all refreshes the clock word");
    // A flush without delay afterwards clears the delayed one.
    s.flush_all(None);
    let b = s.control_block();
    assert_eq!(u32_at(&b, OFF_FLUSH_TIME), 0);
    assert_ne!(u64_at(&b, OFF_FLUSH_CAS), 0);
}

#[test]
fn control_block_clock_is_refreshed_by_the_store() {
    // Neither sweeper nor automove: the maintenance thread still keeps `now` fresh.
    let s = Store::new(StoreConfig {
        memory_limit: 4 << 20,
        slab_automove: false,
        background_sweeper: false,
        ..StoreConfig::default()
    })
    .unwrap();
    let start = s.clock().now();
    assert!(u32_at(&s.control_block(), OFF_NOW) >= start.saturating_sub(1));
    // Liveness only (no timing asserted): wait for the clock to pass `start`, then for
    // the block to follow. The limit is generous for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if u32_at(&s.control_block(), OFF_NOW) > start {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "control block clock never advanced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ----- access hints ------------------------------------------------------------------

#[test]
fn remote_hint_is_accepted_for_a_linked_item_with_its_seq() {
    let s = small_store(4 << 20);
    set(&s, b"k", b"value");
    let before = s.peek(b"k").unwrap();
    assert!(!before.fetched);
    let (off, seq) = s.item_location(b"k").unwrap();
    assert!(s.note_remote_access(off, seq));
    let after = s.peek(b"k").unwrap();
    assert!(after.fetched, "marked fetched like a local GET");
    assert!(after.last_access >= before.last_access);
    assert_eq!(peek_value(&s, b"k").unwrap(), b"value");
    let st = s.stats();
    assert_eq!((st.remote_hints, st.remote_hints_rejected), (1, 0));
}

#[test]
fn remote_hint_is_rejected_for_a_wrong_seq_or_a_deleted_item() {
    let s = small_store(4 << 20);
    set(&s, b"k", b"value");
    let (off, seq) = s.item_location(b"k").unwrap();
    assert!(!s.note_remote_access(off, seq + 2), "newer seq");
    assert!(!s.note_remote_access(off, seq.wrapping_sub(2)), "older seq");
    assert!(
        !s.note_remote_access(off, seq | 1),
        "odd seq (being written)"
    );
    // Replaced: the old chunk is freed (or reused with a new seq).
    set(&s, b"k", b"other");
    let (off2, seq2) = s.item_location(b"k").unwrap();
    if off2 == off {
        assert_ne!(seq2, seq);
    }
    assert!(!s.note_remote_access(off, seq), "replaced item");
    s.delete(b"k", 0);
    assert!(!s.note_remote_access(off2, seq2), "deleted item");
    let st = s.stats();
    assert_eq!(st.remote_hints, 0);
    assert_eq!(st.remote_hints_rejected, 5);
}

#[test]
fn remote_hint_is_rejected_off_chunk_boundaries_and_outside_carved_pages() {
    let s = small_store(4 << 20);
    set(&s, b"k", b"value");
    let (off, seq) = s.item_location(b"k").unwrap();
    let (_, alen) = s.arena_region();
    let page = s.config().page_size as u64;
    for bad in [
        off + 1,                 // misaligned
        off + 4,                 // inside the header
        off + 8,                 // 8-aligned, inside the chunk
        off + ITEM_HDR as u64,   // the key
        alen as u64,             // past the arena
        alen as u64 + off,       // far past
        u64::MAX,                // absurd
        u64::MAX - 7,            // absurd, aligned
        (off / page + 1) * page, // the next page: never carved in this store
        alen as u64 - page,      // last (reserve) page: uncarved
    ] {
        assert!(!s.note_remote_access(bad, seq), "offset {bad}");
    }
    assert!(!s.peek(b"k").unwrap().fetched, "nothing was marked");
    assert!(s.note_remote_access(off, seq));
}

#[test]
fn remote_hint_never_marks_bytes_inside_another_items_value() {
    // A value that looks like an item header (even seq 2, state LINKED, the right class,
    // a short key) at every 8-aligned arena offset must never be written to.
    let s = small_store(4 << 20);
    set(&s, b"fake", &[0u8; 4000]);
    let class = s.peek(b"fake").unwrap().class_id;
    let mut word = [0u8; 8];
    word[ITEM_OFF_SEQ..ITEM_OFF_SEQ + 4].copy_from_slice(&2u32.to_le_bytes());
    word[ITEM_OFF_STATE] = STATE_LINKED;
    word[ITEM_OFF_CLASS] = class;
    word[ITEM_OFF_KEY_LEN] = 4;
    // The value starts at chunk + 40 + 4 (the key "fake"): 4 bytes into an 8-byte word.
    let fake: Vec<u8> = (0..4000).map(|i| word[(4 + i) % 8]).collect();
    set(&s, b"fake", &fake);
    let (off, _) = s.item_location(b"fake").unwrap();
    for delta in (8..4000u64).step_by(8) {
        assert!(!s.note_remote_access(off + delta, 2));
    }
    assert_eq!(peek_value(&s, b"fake").unwrap(), fake);
    assert!(!s.peek(b"fake").unwrap().fetched);
}

#[test]
fn remote_hints_keep_remotely_read_items_from_eviction() {
    // The same workload twice: a hot set written once, then a flood of never-read
    // writes seven times the memory. In one run the hot set is "read remotely" (hinted)
    // between batches of the flood; in the other it is not read at all.
    fn run(hint: bool) -> usize {
        let s = small_store(2 << 20);
        let value = vec![3u8; 100];
        const HOT: usize = 500;
        for i in 0..HOT {
            set(&s, format!("hot{i}").as_bytes(), &value);
        }
        let locs: Vec<(u64, u32)> = (0..HOT)
            .map(|i| s.item_location(format!("hot{i}").as_bytes()).unwrap())
            .collect();
        for j in 0..100_000u32 {
            if hint && j % 2000 == 0 {
                for &(off, seq) in &locs {
                    s.note_remote_access(off, seq);
                }
            }
            set(&s, format!("cold{j}").as_bytes(), &value);
        }
        assert!(s.stats().evictions > 50_000);
        (0..HOT)
            .filter(|i| peek_value(&s, format!("hot{i}").as_bytes()).is_some())
            .count()
    }
    let with = run(true);
    let without = run(false);
    eprintln!("hot items kept: {with}/500 with hints, {without}/500 without");
    assert!(with >= 400, "hinted hot items kept: {with}/500");
    assert!(without <= 100, "unhinted hot items kept: {without}/500");
}

// ----- untrusted input -------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn arbitrary_hints_never_panic_and_never_change_a_value(
        hints in proptest::collection::vec((any::<u64>(), any::<u32>(), 0u8..4), 1..400),
    ) {
        let s = small_store(16 << 20);
        let keys: Vec<Vec<u8>> = (0..600).map(|i| format!("key-{i}").into_bytes()).collect();
        let values: Vec<Vec<u8>> = (0..600)
            .map(|i| pattern(i as u32, [5usize, 60, 300, 3000, 40_000][i % 5]))
            .collect();
        for (k, v) in keys.iter().zip(&values) {
            set(&s, k, v);
        }
        let locs: Vec<(u64, u32)> = keys.iter().map(|k| s.item_location(k).unwrap()).collect();
        let (_, alen) = s.arena_region();
        for (raw_off, raw_seq, how) in hints {
            // Mix fully random input with near misses of real items.
            let (off, seq) = match how {
                0 => (raw_off, raw_seq),
                1 => (raw_off % (alen as u64 + 4096), raw_seq),
                2 => {
                    let (o, q) = locs[raw_off as usize % locs.len()];
                    (o.wrapping_add(raw_seq as u64 % 512), q)
                }
                _ => {
                    let (o, q) = locs[raw_off as usize % locs.len()];
                    (o, q.wrapping_add(raw_seq % 4))
                }
            };
            let _ = s.note_remote_access(off, seq);
        }
        for (k, v) in keys.iter().zip(&values) {
            let got = peek_value(&s, k);
            prop_assert_eq!(got.as_ref(), Some(v));
        }
    }
}

#[test]
fn a_batch_of_hints_counts_accepted_and_rejected() {
    let s = small_store(4 << 20);
    set(&s, b"a", b"1");
    set(&s, b"b", b"2");
    let a = s.item_location(b"a").unwrap();
    let b = s.item_location(b"b").unwrap();
    let hints = [a, (a.0 + 8, a.1), b, (b.0, b.1 + 2), (u64::MAX, 0)];
    assert_eq!(s.note_remote_accesses(&hints), 2);
    assert_eq!(s.note_remote_accesses(&[]), 0);
    assert!(s.peek(b"a").unwrap().fetched && s.peek(b"b").unwrap().fetched);
    let st = s.stats();
    assert_eq!((st.remote_hints, st.remote_hints_rejected), (2, 3));
}

#[test]
fn hints_for_a_page_moved_to_another_class_are_rejected() {
    let s = small_store(8 << 20);
    let small = vec![5u8; 100];
    let keys: Vec<Vec<u8>> = (0..20_000)
        .map(|i| format!("s{i:05}").into_bytes())
        .collect();
    for k in &keys {
        set(&s, k, &small);
    }
    let from = s.peek(&keys[0]).unwrap().class_id;
    let old: Vec<(u64, u32)> = keys.iter().map(|k| s.item_location(k).unwrap()).collect();
    // The page moves to the class of 3000-byte values and is re-carved there.
    set(&s, b"big0", &pattern(1, 3000));
    let to = s.peek(b"big0").unwrap().class_id;
    assert_eq!(
        s.slabs_reassign(from as i32, to as i32),
        memfabric_store::ReassignStatus::Ok
    );
    let bigs: Vec<(Vec<u8>, Vec<u8>)> = (1..400)
        .map(|i| (format!("big{i}").into_bytes(), pattern(i, 3000)))
        .collect();
    for (k, v) in &bigs {
        set(&s, k, v);
    }
    let mut moved = 0;
    for (k, &(off, seq)) in keys.iter().zip(&old) {
        let present = s.item_location(k) == Some((off, seq));
        moved += usize::from(!present);
        // A hint counts only for an item still where it was.
        assert_eq!(s.note_remote_access(off, seq), present, "{off}");
        // Near misses into the re-carved page never count.
        assert!(!s.note_remote_access(off + 8, seq));
    }
    assert!(moved > 1000, "a whole page of small items left: {moved}");
    for (k, v) in &bigs {
        assert_eq!(peek_value(&s, k).as_ref(), Some(v));
    }
}

#[test]
fn hints_racing_writes_deletes_and_page_moves_never_corrupt_a_value() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // Values name their key and version, so any stray write shows up on read.
    fn value_for(key: usize, version: u32) -> Vec<u8> {
        let len = [30usize, 120, 700, 2500][(key + version as usize) % 4];
        let mut v = format!("{key}|{version}|").into_bytes();
        v.extend(pattern(key as u32 ^ version.rotate_left(7), len));
        v
    }
    fn parse(v: &[u8]) -> Option<(usize, u32)> {
        let mut p = v.splitn(3, |&b| b == b'|');
        let mut num = || std::str::from_utf8(p.next()?).ok()?.parse::<u64>().ok();
        Some((num()? as usize, num()? as u32))
    }
    const KEYS: usize = 3000;
    let s = Arc::new(small_store(4 << 20));
    let stop = Arc::new(AtomicBool::new(false));
    let hinter = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_u64;
            let mut accepted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..256 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = format!("k{}", x as usize % KEYS);
                    if let Some((off, seq)) = s.item_location(k.as_bytes()) {
                        // The real location, a stale seq, or a near miss.
                        let h = match x >> 60 {
                            0..=7 => (off, seq),
                            8..=11 => (off, seq.wrapping_sub(2)),
                            _ => (off + 8 * (x >> 56 & 7), seq),
                        };
                        accepted += u64::from(s.note_remote_access(h.0, h.1));
                    }
                }
            }
            accepted
        })
    };
    use memfabric_store::ReassignStatus::Ok;
    let mut version = 0u32;
    let mut moves = 0;
    for round in 0..30 {
        for k in 0..KEYS {
            version += 1;
            let key = format!("k{k}");
            if (k + round) % 7 == 0 {
                s.delete(key.as_bytes(), 0);
            } else {
                set(&s, key.as_bytes(), &value_for(k, version));
            }
        }
        // Move a page between classes now and then (re-carving under the hinter).
        let classes: Vec<u8> = s.slab_stats().iter().map(|c| c.id).collect();
        if classes.len() >= 2 {
            let (a, b) = (
                classes[round % classes.len()],
                classes[(round + 1) % classes.len()],
            );
            moves += usize::from(s.slabs_reassign(a as i32, b as i32) == Ok);
        }
        for k in 0..KEYS {
            if let Some(v) = peek_value(&s, format!("k{k}").as_bytes()) {
                let (key, ver) = parse(&v).expect("value header intact");
                assert_eq!(key, k);
                assert_eq!(v, value_for(k, ver), "value of k{k} changed");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let accepted = hinter.join().unwrap();
    eprintln!(
        "{moves} page moves, {accepted} hints accepted, {:?}",
        s.stats()
    );
    assert!(accepted > 0);
    assert_eq!(s.stats().remote_hints, accepted);
}

#[test]
fn repeated_remote_hints_are_accepted_and_change_nothing_more() {
    let s = small_store(4 << 20);
    set(&s, b"k", b"value");
    let (off, seq) = s.item_location(b"k").unwrap();
    assert!(s.note_remote_access(off, seq));
    let first = s.peek(b"k").unwrap();
    // Already marked this second: accepted without another write.
    assert!(s.note_remote_access(off, seq));
    assert_eq!(s.note_remote_accesses(&[(off, seq), (off, seq)]), 2);
    let again = s.peek(b"k").unwrap();
    assert!(again.fetched);
    assert!(again.last_access >= first.last_access);
    // Still only for the item it names.
    assert!(!s.note_remote_access(off, seq + 2));
    s.delete(b"k", 0);
    assert!(!s.note_remote_access(off, seq), "deleted item");
    let st = s.stats();
    assert_eq!((st.remote_hints, st.remote_hints_rejected), (4, 2));
}
