//! Chained items (values larger than a slab chunk, up to `-I`) on the flash tier: they go
//! to flash whole (head and pieces), come back exactly, survive a restart, die with the
//! oldest pages, and a damaged or missing piece reads as a miss, never as a value. Items
//! larger than the write buffers can ever hold stay out and are counted.
use tempfile::TempDir;

use memfabric_store::{
    DeleteStatus, FlashConfig, GetOptions, SetMode, Store, StoreConfig, StoreStatus,
};

fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("mf-flash-chained-")
        .tempdir()
        .unwrap()
}

/// 8 MiB of RAM, items up to 8 MiB, `flash_mb` of flash with `buffers` write buffers.
fn open(dir: &TempDir, flash_mb: u64, buffers: usize) -> Store {
    Store::new(StoreConfig {
        memory_limit: 8 << 20,
        item_size_max: 8 << 20,
        slab_automove: false,
        background_sweeper: false,
        flash: Some(FlashConfig {
            files: vec![(dir.path().join("flash"), flash_mb << 20)],
            write_buffers: buffers,
            ..FlashConfig::default()
        }),
        ..StoreConfig::default()
    })
    .unwrap()
}

/// A value that names its key and version, `len` bytes, every 4 KiB stamped with its
/// offset (so a piece in the wrong place cannot pass).
fn value(key: &str, version: u32, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut block = 0;
    while v.len() < len {
        v.extend_from_slice(format!("{key}@{version}#{block}:").as_bytes());
        while v.len() % 4096 != 0 {
            v.push(b'a' + (v.len() % 26) as u8);
        }
        block += 1;
    }
    v.truncate(len);
    v
}

fn set(s: &Store, key: &str, v: &[u8]) {
    let st = s.store(SetMode::Set, key.as_bytes(), v, 9, 0, 0);
    assert!(matches!(st, StoreStatus::Stored { .. }), "{key}: {st:?}");
}

/// On flash now: not in RAM, and flash slots with its tag.
fn on_flash(s: &Store, key: &str) -> bool {
    !in_ram(s, key) && !s.flash_candidates(key.as_bytes()).is_empty()
}

fn in_ram(s: &Store, key: &str) -> bool {
    let mut out = Vec::new();
    s.get(key.as_bytes(), &GetOptions::default(), &mut out)
        .is_some()
}

/// RAM first, then flash, as the server's lookup does.
fn get(s: &Store, key: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    if s.get(key.as_bytes(), &GetOptions::default(), &mut out)
        .is_some()
    {
        return Some(out);
    }
    let cands = s.flash_candidates(key.as_bytes());
    if cands.is_empty() {
        return None;
    }
    s.read_flash(key.as_bytes(), &cands).map(|h| {
        assert_eq!(h.info.flags, 9);
        assert_eq!(h.info.value_len as usize, h.value.len());
        h.value
    })
}

fn settle(s: &Store) {
    for _ in 0..500 {
        if s.flash_stats().unwrap().pages_buffered <= 1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Write buffers (1 MiB pages) for the whole load a test writes: a writer slowed by the
/// disk then never has to drop an eviction (`flash_dropped_writer_behind`), so which
/// items reach flash does not depend on the disk's speed.
const WHOLE_LOAD: usize = 64;

/// Sizes around the chunk limit (half a page) up to several pages.
const SIZES: [usize; 6] = [
    600_000,
    1 << 20,
    (1 << 20) + 1,
    1_500_000,
    2_900_000,
    3 * (1 << 20) + 12_345,
];

fn key(i: usize) -> String {
    format!("big:{i:04}")
}

/// Store `n` chained items (sizes cycling through `SIZES`), enough to push most of them
/// out of 8 MiB of RAM.
fn fill(s: &Store, n: usize, version: u32) {
    for i in 0..n {
        set(s, &key(i), &value(&key(i), version, SIZES[i % SIZES.len()]));
    }
    settle(s);
}

#[test]
fn chained_items_evicted_from_ram_are_served_from_flash_exactly() {
    let dir = temp_dir();
    let s = open(&dir, 128, WHOLE_LOAD);
    let n = 24;
    fill(&s, n, 1);
    let mut from_flash = 0;
    for i in 0..n {
        let k = key(i);
        let ram = in_ram(&s, &k);
        let v = get(&s, &k).unwrap_or_else(|| panic!("{k} lost"));
        assert_eq!(v, value(&k, 1, SIZES[i % SIZES.len()]), "{k}: wrong value");
        from_flash += usize::from(!ram);
    }
    let st = s.flash_stats().unwrap();
    assert!(from_flash >= n / 2, "{from_flash} from flash, {st:?}");
    assert!(st.chained_written >= from_flash as u64, "{st:?}");
    assert_eq!(st.chained_used, from_flash as u64, "{st:?}");
    assert_eq!((st.badcrc, st.dropped_too_large), (0, 0), "{st:?}");
    // Each counts its head and pieces in bytes_used: at least its value.
    let at_least: usize = (0..n)
        .filter(|&i| on_flash(&s, &key(i)))
        .map(|i| SIZES[i % SIZES.len()])
        .sum();
    assert!(st.bytes_used >= at_least as u64, "{st:?} < {at_least}");
}

#[test]
fn commands_on_a_chained_flash_item_bring_it_back_and_replace_it() {
    let dir = temp_dir();
    let s = open(&dir, 128, WHOLE_LOAD);
    fill(&s, 24, 1);
    let on_flash: Vec<usize> = (0..24).filter(|&i| on_flash(&s, &key(i))).collect();
    assert!(on_flash.len() >= 4, "{on_flash:?}");
    let (app, over, del) = (on_flash[0], on_flash[1], on_flash[2]);
    assert!(matches!(
        s.store(SetMode::Append, key(app).as_bytes(), b"+tail", 0, 0, 0),
        StoreStatus::Stored { .. }
    ));
    let mut want = value(&key(app), 1, SIZES[app % SIZES.len()]);
    want.extend_from_slice(b"+tail");
    assert_eq!(get(&s, &key(app)), Some(want));
    set(&s, &key(over), &value(&key(over), 2, 700_000));
    assert_eq!(get(&s, &key(over)), Some(value(&key(over), 2, 700_000)));
    assert_eq!(s.delete(key(del).as_bytes(), 0), DeleteStatus::Deleted);
    assert_eq!(get(&s, &key(del)), None);
    // The replaced and deleted flash copies stay dead when RAM evicts everything again.
    fill(&s, 24, 3);
    for i in 0..24 {
        assert_eq!(
            get(&s, &key(i)),
            Some(value(&key(i), 3, SIZES[i % SIZES.len()])),
            "{}",
            key(i)
        );
    }
}

#[test]
fn chained_items_survive_a_restart_and_replaced_ones_stay_replaced() {
    let dir = temp_dir();
    let on_flash: Vec<usize>;
    {
        let s = open(&dir, 128, WHOLE_LOAD);
        fill(&s, 24, 1);
        on_flash = (0..24).filter(|&i| self::on_flash(&s, &key(i))).collect();
        assert!(on_flash.len() >= 4, "{on_flash:?}");
        // Overwritten after it went to flash: the restart must not bring version 1 back.
        set(&s, &key(on_flash[0]), b"small now");
    }
    let s = open(&dir, 128, WHOLE_LOAD);
    let st = s.flash_stats().unwrap();
    assert!(st.recovered as usize >= on_flash.len() - 1, "{st:?}");
    assert_eq!(st.chained_used as usize, on_flash.len() - 1, "{st:?}");
    assert_eq!(get(&s, &key(on_flash[0])), None, "replaced value came back");
    for &i in &on_flash[1..] {
        assert_eq!(
            get(&s, &key(i)),
            Some(value(&key(i), 1, SIZES[i % SIZES.len()])),
            "{}",
            key(i)
        );
    }
}

#[test]
fn chained_items_die_with_the_oldest_pages_and_never_read_reused_ones() {
    let dir = temp_dir();
    // 24 pages of flash, written through several times by ~100 MiB of values.
    let s = open(&dir, 24, 8);
    for round in 0..4u32 {
        fill(&s, 40, round);
        for i in 0..40 {
            if let Some(v) = get(&s, &key(i)) {
                assert_eq!(
                    v,
                    value(&key(i), round, SIZES[i % SIZES.len()]),
                    "{}",
                    key(i)
                );
            }
        }
    }
    let st = s.flash_stats().unwrap();
    // The tier was cycled, and live items died with their pages (how often depends on
    // how many evictions a writer slowed by the disk had to drop; before the reserve grew
    // for items of several pages, 3 MiB values were dropped every time and a loaded run
    // evicted nothing).
    assert!(st.page_reclaims > 0, "{st:?}");
    assert!(st.objects_evicted > 0, "{st:?}");
    assert_eq!(st.badcrc, 0, "{st:?}");
    // What is still counted is what slots still name.
    assert!(st.chained_used <= 24, "{st:?}");
}

#[test]
fn items_of_several_pages_still_reach_a_tier_that_has_cycled() {
    let dir = temp_dir();
    // 24 pages; each value needs three fresh pages at once (its first piece may share
    // its head's page), more than the two the writer kept ready: once the tier had
    // cycled, every one of them was dropped, and with nothing written nothing was
    // reclaimed again.
    let s = open(&dir, 24, WHOLE_LOAD);
    let len = 3 * (1 << 20) + 12_345;
    let sets = 40;
    let mut at_half = None;
    for i in 0..sets {
        set(&s, &key(i), &value(&key(i), 1, len));
        // Let the writer catch up (everything written, its reserve refilled) so that a
        // drop can only be for want of a reserve, never for a slow disk.
        let caught_up = (0..12_000).any(|_| {
            let st = s.flash_stats().unwrap();
            let done = st.pages_buffered <= 1 && st.pages_free >= st.pages_reserved;
            if !done {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done
        });
        assert!(caught_up, "writer never caught up: {:?}", s.flash_stats());
        if i + 1 == sets / 2 {
            at_half = Some(s.flash_stats().unwrap());
        }
    }
    let st = s.flash_stats().unwrap();
    let half = at_half.unwrap();
    // The first half cycled the tier and grew the reserve (a drop or two); in the second
    // half every set pushes a value out of RAM (8 MiB hold two) and every one is written.
    assert!(half.page_reclaims > 0, "{half:?}");
    assert!(half.pages_reserved >= 3, "{half:?}");
    assert_eq!(st.dropped_no_buffer, half.dropped_no_buffer, "{st:?}");
    assert!(
        st.chained_written - half.chained_written >= sets as u64 / 2 - 2,
        "{half:?} then {st:?}"
    );
    assert_eq!(st.badcrc, 0, "{st:?}");
    // What it serves is exact: the newest values, some from flash.
    let mut from_flash = 0;
    for i in 0..sets {
        let ram = in_ram(&s, &key(i));
        if let Some(v) = get(&s, &key(i)) {
            assert_eq!(v, value(&key(i), 1, len), "{}", key(i));
            from_flash += usize::from(!ram);
        }
    }
    assert!(from_flash >= 3, "{from_flash} from flash, {st:?}");
}

#[test]
fn a_damaged_piece_is_a_miss_and_its_slot_goes() {
    let dir = temp_dir();
    let s = open(&dir, 128, WHOLE_LOAD);
    fill(&s, 24, 1);
    let on_flash: Vec<usize> = (0..24).filter(|&i| on_flash(&s, &key(i))).collect();
    assert!(!on_flash.is_empty());
    // Damage every 64 KiB of the file past the first page's header: pieces are large,
    // so every chained item has bytes in a damaged place.
    let path = dir.path().join("flash");
    let mut bytes = std::fs::read(&path).unwrap();
    let mut at = 70_000;
    while at < bytes.len() {
        bytes[at] ^= 0x41;
        at += 64 << 10;
    }
    std::fs::write(&path, &bytes).unwrap();
    for &i in &on_flash {
        assert_eq!(get(&s, &key(i)), None, "{}: damaged value served", key(i));
        assert!(s.flash_candidates(key(i).as_bytes()).is_empty());
    }
    let st = s.flash_stats().unwrap();
    assert!(st.badcrc > 0, "{st:?}");
    assert_eq!(st.chained_used, 0, "{st:?}");
}

#[test]
fn items_larger_than_the_write_buffers_stay_out_and_are_counted() {
    let dir = temp_dir();
    // Two 1 MiB buffers: a 3 MiB value can never be laid out in them.
    let s = open(&dir, 64, 2);
    for i in 0..8 {
        set(&s, &key(i), &value(&key(i), 1, 3 << 20));
    }
    settle(&s);
    let st = s.flash_stats().unwrap();
    assert!(st.dropped_too_large > 0, "{st:?}");
    assert_eq!(st.chained_written, 0, "{st:?}");
    for i in 0..8 {
        if let Some(v) = get(&s, &key(i)) {
            assert_eq!(v, value(&key(i), 1, 3 << 20));
            assert!(in_ram(&s, &key(i)));
        }
    }
}
