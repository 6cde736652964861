//! Lock-free readers against concurrent writers, eviction and page moves: a reader must
//! never see a torn value or a value of another key.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use memfabric_store::{GetOptions, SetMode, Store, StoreConfig};

/// A value that names its key and version and can be checked on its own:
/// "key|version|" followed by filler derived from both, length varying with version.
fn value_for(key: &str, version: u64) -> Vec<u8> {
    let mut v = format!("{key}|{version}|").into_bytes();
    let len = 20 + (version as usize * 37) % 3000;
    let seed = key.len() as u64 * 31 + version;
    v.extend((0..len).map(|i| b'a' + ((seed + i as u64) % 26) as u8));
    v
}

fn check(key: &str, v: &[u8]) -> Result<(), String> {
    let s = std::str::from_utf8(v).map_err(|_| format!("{key}: not utf8"))?;
    let mut parts = s.splitn(3, '|');
    let k = parts.next().unwrap_or("");
    let ver: u64 = parts
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or(format!("{key}: bad version in {s:.40}"))?;
    if k != key {
        return Err(format!("read {key} got value of {k}"));
    }
    if value_for(key, ver) != v {
        return Err(format!("{key}: torn value at version {ver}"));
    }
    Ok(())
}

#[test]
fn readers_never_see_torn_or_foreign_values_under_write_and_eviction_storms() {
    let store = Arc::new(
        Store::new(StoreConfig {
            memory_limit: 4 << 20,
            ..StoreConfig::default()
        })
        .unwrap(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let keys: Vec<String> = (0..400).map(|i| format!("key:{i}")).collect();
    let mut handles = Vec::new();
    for w in 0..2u64 {
        let (store, stop, keys) = (store.clone(), stop.clone(), keys.clone());
        handles.push(thread::spawn(move || {
            let mut version = w * 1_000_000;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                n += 1;
                let k = &keys[(version as usize * 7919) % keys.len()];
                match n % 10 {
                    0 => {
                        store.delete(k.as_bytes(), 0);
                    }
                    1 => {
                        // Cold filler that forces eviction.
                        let filler = format!("filler:{w}:{n}");
                        store.store(SetMode::Set, filler.as_bytes(), &vec![b'f'; 2000], 0, 0, 0);
                    }
                    _ => {
                        store.store(SetMode::Set, k.as_bytes(), &value_for(k, version), 0, 0, 0);
                    }
                }
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2usize {
        let (store, stop, keys, reads) = (store.clone(), stop.clone(), keys.clone(), reads.clone());
        readers.push(thread::spawn(move || {
            let mut out = Vec::new();
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                i = i.wrapping_add(13);
                let k = &keys[i % keys.len()];
                out.clear();
                if store
                    .get(k.as_bytes(), &GetOptions::default(), &mut out)
                    .is_some()
                {
                    if let Err(e) = check(k, &out) {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while (reads.load(Ordering::Relaxed) < 400_000 || store.stats().evictions == 0)
        && std::time::Instant::now() < deadline
    {
        thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    for r in readers {
        r.join().unwrap().unwrap();
    }
    assert!(
        store.stats().evictions > 0,
        "the test must exercise eviction"
    );
}
