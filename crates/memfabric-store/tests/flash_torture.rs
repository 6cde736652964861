//! The flash torture test: writers (sets and deletes), readers, page reclaim (a flash tier
//! of a few pages, cycled many times) and restarts racing. Values encode their key and
//! version, and every read is checked against what was acknowledged before it started:
//! never another key's value, never a version older than one already acknowledged, never
//! a value a delete acknowledged earlier removed — before and after each restart. No
//! timing is asserted.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use memfabric_store::{FlashConfig, GetOptions, SetMode, Store, StoreConfig, StoreStatus};

/// Twice what RAM holds per writer (each writer owns half the keys): however the two
/// writers are scheduled, most writes evict, and the tier is cycled in every round.
const KEYS: usize = 6_000;
const VLEN: usize = 1_200;

fn open(path: &std::path::Path) -> Store {
    Store::new(StoreConfig {
        memory_limit: 2 << 20,
        slab_automove: false,
        flash: Some(FlashConfig {
            files: vec![(path.to_path_buf(), 6 << 20)],
            write_buffers: 3,
            item_min: 0,
            ..FlashConfig::default()
        }),
        ..StoreConfig::default()
    })
    .unwrap()
}

fn key(k: usize) -> String {
    format!("t:{k:05}")
}

fn value(k: usize, version: u64) -> Vec<u8> {
    let mut v = format!("{k}/{version}/").into_bytes();
    v.resize(VLEN, b'x');
    v
}

/// (key, version) a value names.
fn parse(v: &[u8]) -> (usize, u64) {
    let s = String::from_utf8_lossy(v);
    let mut f = s.split('/');
    let k = f.next().unwrap().parse().unwrap();
    let ver = f.next().unwrap().parse().unwrap();
    (k, ver)
}

fn get(s: &Store, k: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    if s.get(k.as_bytes(), &GetOptions::default(), &mut out)
        .is_some()
    {
        return Some(out);
    }
    let c = s.flash_candidates(k.as_bytes());
    if c.is_empty() {
        return None;
    }
    s.read_flash(k.as_bytes(), &c).map(|h| h.value)
}

/// Per key: (last acknowledged version << 1) | (1 if that was a delete).
struct Acked(Vec<AtomicU64>);

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn writers_readers_reclaim_and_restarts_never_serve_a_wrong_or_stale_value() {
    let dir = std::env::temp_dir().join(format!("mf-flash-torture-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("flash");
    let acked = Arc::new(Acked((0..KEYS).map(|_| AtomicU64::new(0)).collect()));
    // Versions only grow, across restarts too.
    let next_version = Arc::new(AtomicU64::new(1));
    let mut checked = 0u64;
    let mut flash_reads = 0u64;
    for round in 0..3u64 {
        let store = Arc::new(open(&path));
        if round > 0 {
            assert!(store.flash_stats().unwrap().recovered > 0, "round {round}");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..2u64 {
            let (store, acked, nv) = (store.clone(), acked.clone(), next_version.clone());
            writers.push(std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9 ^ (round * 7 + w + 1));
                for _ in 0..30_000 {
                    // Each writer owns half the keys: one writer per key keeps
                    // "acknowledged" well defined.
                    let k = (rng.next() as usize % (KEYS / 2)) * 2 + w as usize;
                    let ver = nv.fetch_add(1, Ordering::SeqCst);
                    if rng.next().is_multiple_of(10) {
                        store.delete(key(k).as_bytes(), 0);
                        acked.0[k].store(ver << 1 | 1, Ordering::SeqCst);
                    } else {
                        let st =
                            store.store(SetMode::Set, key(k).as_bytes(), &value(k, ver), 0, 0, 0);
                        assert!(matches!(st, StoreStatus::Stored { .. }), "{st:?}");
                        acked.0[k].store(ver << 1, Ordering::SeqCst);
                    }
                }
            }));
        }
        let mut readers = Vec::new();
        for r in 0..2u64 {
            let (store, acked, stop) = (store.clone(), acked.clone(), stop.clone());
            readers.push(std::thread::spawn(move || {
                let mut rng = Rng(0x51_7cc1 ^ (round * 11 + r + 1));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.next() as usize % KEYS;
                    let before = acked.0[k].load(Ordering::SeqCst);
                    let Some(v) = get(&store, &key(k)) else {
                        continue;
                    };
                    let (vk, ver) = parse(&v);
                    assert_eq!(vk, k, "another key's value");
                    assert_eq!(v, value(k, ver), "damaged value");
                    let (last, deleted) = (before >> 1, before & 1 == 1);
                    if deleted {
                        assert!(ver > last, "{}: version {ver} after delete {last}", key(k));
                    } else {
                        assert!(ver >= last, "{}: version {ver} older than {last}", key(k));
                    }
                    n += 1;
                }
                n
            }));
        }
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            checked += r.join().unwrap();
        }
        // One slot per key, RAM or flash, never two.
        let twice = store.keys_named_twice();
        assert!(twice.is_empty(), "{} keys named twice", twice.len());
        // After the writers: every key reads as its acknowledged state or a miss.
        for k in 0..KEYS {
            let a = acked.0[k].load(Ordering::SeqCst);
            if let Some(v) = get(&store, &key(k)) {
                assert!(a & 1 == 0, "{}: deleted, yet served", key(k));
                assert_eq!(v, value(k, a >> 1), "{}", key(k));
            }
        }
        let st = store.flash_stats().unwrap();
        assert!(st.page_reclaims > 0, "no reclaim in round {round}: {st:?}");
        flash_reads += st.objects_read;
        // Dropping the last handle is a clean shutdown; the next round restarts.
        drop(store);
    }
    assert!(
        checked > 1_000 && flash_reads > 100,
        "{checked} reads, {flash_reads} flash"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
