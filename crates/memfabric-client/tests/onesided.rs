//! One-sided GETs (RMA reads of the server's index and items) against a real memfabricd:
//! values, misses, flushes, CAS, staleness, the transport choice, a torture test with
//! writers and an eviction storm, and access hints keeping remotely-hot items cached.
//! Run under each UCX_TLS the CI uses; over TCP (where UCX only emulates RMA) the
//! torture test does fewer reads.
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Kind, Server};
use memfabric_client::{Client, Config, GetMode};

fn config(mode: GetMode) -> Config {
    Config {
        get_mode: mode,
        timeout: Duration::from_secs(10),
        ..Config::default()
    }
}

fn client(s: &Server, mode: GetMode) -> Client {
    Client::new(s.url().as_str(), config(mode)).expect("client")
}

fn counter(c: &Client, name: &str) -> u64 {
    c.transport_counters()
        .into_iter()
        .find(|(k, _)| k == name)
        .map_or(0, |(_, v)| v)
}

/// Whether this run's UCX transports read natively, as `auto` decides: an RDMA transport,
/// or shared memory when TCP is not among them. (With TCP there, unset `UCX_TLS` included,
/// the server's endpoints use peer-failure mode, which UCX 1.13's shared memory cannot
/// carry: the endpoints are TCP, reads are emulated.)
fn native_rma() -> bool {
    let tls = std::env::var("UCX_TLS").unwrap_or_else(|_| "all".to_string());
    let names: Vec<&str> = tls.split(',').collect();
    let any = |set: &[&str]| names.iter().any(|x| set.contains(x));
    any(&[
        "rc", "rc_x", "rc_v", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "ib",
    ]) || (any(&["posix", "sysv", "cma", "sm", "shm"]) && !any(&["tcp", "all"]))
}

#[test]
fn onesided_get_returns_every_size_that_fits_a_chunk_and_falls_back_for_chained_ones() {
    let s = Server::start(Kind::MemfabricdUcx, &["-m", "64", "-I", "2m"]);
    let mut c = client(&s, GetMode::OneSided);
    let sizes = [
        0usize, 1, 100, 4096, 8192, 8193, 100_000, 500_000, 600_000, 1_500_000,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        let v: Vec<u8> = (0..n).map(|j| (j * 7 + i) as u8).collect();
        c.set(format!("sz{i}").as_bytes(), &v, i as u32, 0).unwrap();
    }
    for (i, &n) in sizes.iter().enumerate() {
        let got = c.get(format!("sz{i}").as_bytes()).unwrap().expect("hit");
        assert_eq!(got.data.len(), n, "size {n}");
        assert!(got
            .data
            .iter()
            .enumerate()
            .all(|(j, &b)| b == (j * 7 + i) as u8));
        assert_eq!(got.flags, i as u32);
    }
    assert_eq!(counter(&c, "conns_onesided"), 1);
    // Values above the largest chunk (512 KiB) are chained: served two-sided.
    assert_eq!(counter(&c, "get_onesided_fallback_chained"), 2);
    assert_eq!(counter(&c, "get_onesided_hits"), sizes.len() as u64 - 2);
}

#[test]
fn misses_deletes_and_flushes_are_confirmed_by_the_server() {
    let s = Server::start(Kind::MemfabricdUcx, &[]);
    let mut c = client(&s, GetMode::OneSided);
    assert!(c.get(b"never-set").unwrap().is_none());
    c.set(b"k", b"v1", 0, 0).unwrap();
    assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v1");
    assert!(c.delete(b"k").unwrap());
    assert!(c.get(b"k").unwrap().is_none(), "a completed delete is seen");
    c.set(b"k", b"v2", 0, 0).unwrap();
    c.flush_all(0).unwrap();
    assert!(
        c.get(b"k").unwrap().is_none(),
        "a completed flush_all is seen"
    );
    c.set(b"k", b"v3", 0, 0).unwrap();
    assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v3");
    // Never set and deleted: no slot (misses); flushed: found but dead, or no slot once
    // the store's sweeper has reclaimed it (flush_all wakes it). The server decided all
    // three.
    let misses = counter(&c, "get_onesided_fallback_miss");
    let dead = counter(&c, "get_onesided_fallback_dead");
    assert!(misses >= 2, "{misses} misses");
    assert_eq!(misses + dead, 3);
}

#[test]
fn gets_reports_the_same_cas_as_the_server_and_plain_get_reports_zero() {
    let s = Server::start(Kind::MemfabricdUcx, &[]);
    let mut one = client(&s, GetMode::OneSided);
    let mut two = client(&s, GetMode::TwoSided);
    one.set(b"c", b"value", 5, 0).unwrap();
    let a = one.gets(b"c").unwrap().unwrap();
    let b = two.gets(b"c").unwrap().unwrap();
    assert_ne!(a.cas, 0);
    assert_eq!(a.cas, b.cas);
    assert_eq!(one.get(b"c").unwrap().unwrap().cas, 0);
    assert_eq!(counter(&one, "get_onesided_hits"), 2);
    assert_eq!(counter(&two, "get_onesided_hits"), 0);
    assert_eq!(counter(&two, "get_twosided"), 1);
}

#[test]
fn a_completed_set_is_never_read_stale() {
    let s = Server::start(Kind::MemfabricdUcx, &[]);
    let mut writer = client(&s, GetMode::TwoSided);
    let mut reader = client(&s, GetMode::OneSided);
    for i in 0..2000u32 {
        let v = format!("version-{i}-{}", "x".repeat((i % 300) as usize));
        writer.set(b"hot", v.as_bytes(), 0, 0).unwrap();
        let got = reader.get(b"hot").unwrap().expect("hit");
        assert_eq!(got.data, v.as_bytes(), "read after set {i} completed");
    }
}

#[test]
fn auto_mode_reads_one_sided_only_where_the_transport_reads_natively() {
    let s = Server::start(Kind::MemfabricdUcx, &[]);
    let mut c = client(&s, GetMode::Auto);
    c.set(b"a", b"1", 0, 0).unwrap();
    assert_eq!(&c.get(b"a").unwrap().unwrap().data[..], b"1");
    if native_rma() {
        assert_eq!(counter(&c, "conns_onesided"), 1);
        assert_eq!(counter(&c, "get_onesided_hits"), 1);
    } else {
        assert_eq!(counter(&c, "conns_twosided"), 1);
        assert_eq!(counter(&c, "get_twosided"), 1);
    }
}

/// The size of the server's largest shared-memory segment (its arena) and how many bytes
/// of it the kernel has taken: for a POSIX segment the blocks of the file behind its
/// descriptor, for a SysV one the resident size `/proc/sysvipc/shm` reports.
fn largest_segment(pid: u32, backing: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut largest = (0, 0);
    if backing == "posix_shm" {
        for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
        {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            if !target.to_string_lossy().contains("ucx_shm_posix") {
                continue;
            }
            let m = std::fs::metadata(e.path()).unwrap();
            if m.len() > largest.0 {
                largest = (m.len(), m.blocks() * 512);
            }
        }
    } else {
        // key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss swap
        for line in std::fs::read_to_string("/proc/sysvipc/shm")
            .unwrap()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            if f.get(4) != Some(&pid.to_string().as_str()) {
                continue;
            }
            let (size, rss): (u64, u64) = (f[3].parse().unwrap(), f[14].parse().unwrap());
            if size > largest.0 {
                largest = (size, rss);
            }
        }
    }
    largest
}

/// UCX's POSIX allocator writes every page of what it allocates (to learn that /dev/shm
/// has room), so a store it allocates is taken whole at start; a SysV segment is taken as
/// it is used, as memcached's memory is. The server says which backs its store
/// (`ucx_memory_backing`) and warns about the first.
#[test]
fn the_server_names_what_backs_its_store_and_warns_when_all_of_it_is_taken_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (tls, backing) in [("posix,cma,self", "posix_shm"), ("sysv,cma,self", "sysv")] {
        let log = dir.path().join(format!("{backing}.stderr"));
        let s = Server::start_env_logged(Kind::MemfabricdUcx, &[], &[("UCX_TLS", tls)], &log);
        let mut c = Client::new(s.addr().as_str(), config(GetMode::TwoSided)).unwrap();
        let stats: HashMap<String, String> = c
            .stats(Some("fabric"))
            .into_iter()
            .flat_map(|(_, r)| r.expect("stats fabric"))
            .collect();
        assert_eq!(stats["ucx_memory"], "ucx", "UCX_TLS={tls}");
        assert_eq!(stats["ucx_memory_backing"], backing, "UCX_TLS={tls}");
        let (size, taken) = largest_segment(s.pid(), backing);
        let arena: u64 = stats["ucx_arena_registered"].parse().unwrap();
        assert!(
            size >= arena,
            "UCX_TLS={tls}: largest segment {size} < arena {arena}"
        );
        let said = std::fs::read_to_string(&log).unwrap();
        let warned = said.contains("as POSIX shared memory");
        if backing == "posix_shm" {
            assert!(taken >= size * 9 / 10, "{tls}: {taken} of {size} taken");
            assert!(warned, "{tls}: no warning in {said:?}");
        } else {
            assert!(taken <= size / 2, "{tls}: {taken} of {size} taken");
            assert!(!warned, "{tls}: {said:?}");
        }
    }
}

// ---- torture ----------------------------------------------------------------------------

const SEG_LEN: usize = 16; // "t123@00001234/" padded: key up to 5 chars

fn segment(key: &str, ver: u32) -> String {
    let s = format!("{key}@{ver:08}/");
    assert!(s.len() <= SEG_LEN);
    format!("{s:->SEG_LEN$}")
}

/// Check a value read for `key`: whole segments, every one naming `key`, versions never
/// decreasing along the value (appends add newer ones). Returns the newest version.
fn check_value(key: &str, v: &[u8]) -> Result<u32, String> {
    if v.is_empty() || !v.len().is_multiple_of(SEG_LEN) {
        return Err(format!("{key}: torn length {}", v.len()));
    }
    let mut last = 0;
    for seg in v.chunks(SEG_LEN) {
        let s = std::str::from_utf8(seg).map_err(|_| format!("{key}: not utf-8"))?;
        let s = s.trim_start_matches('-');
        let (k, rest) = s.split_once('@').ok_or(format!("{key}: bad segment {s}"))?;
        if k != key {
            return Err(format!("{key}: foreign segment {s}"));
        }
        let ver: u32 = rest
            .trim_end_matches('/')
            .parse()
            .map_err(|_| format!("{key}: bad version in {s}"))?;
        if ver < last {
            return Err(format!("{key}: versions out of order in value"));
        }
        last = ver;
    }
    Ok(last)
}

#[test]
fn torture_onesided_readers_never_return_torn_or_wrong_values() {
    let native = native_rma();
    // 10^6 one-sided GETs where RMA is native; over emulated RMA (TCP) fewer, since every
    // read then waits for the server.
    let reads_per_reader: u64 = if native { 500_000 } else { 15_000 };
    let readers = 2;
    // Small memory: the cold flood keeps the eviction queue evicting and chunks being reused.
    let s = Arc::new(Server::start(
        Kind::MemfabricdUcx,
        &["-m", "8", "-t", "2", "-o", "slab_automove=1"],
    ));
    let keys: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..2usize {
        let (s, keys, stop) = (Arc::clone(&s), keys.clone(), Arc::clone(&stop));
        writers.push(std::thread::spawn(move || {
            let mut c = client(&s, GetMode::TwoSided);
            let mut ver = 1u32;
            let mut rng = 0x9e37_79b9u64 ^ w as u64;
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Writer w owns the keys with index % 2 == w: versions per key only grow.
                let i = (rng as usize % (keys.len() / 2)) * 2 + w;
                let key = &keys[i];
                ver += 1;
                let r = match rng % 10 {
                    0..=5 => {
                        let n = 1 + (rng >> 20) as usize % 200; // 16 B .. 3.2 KB
                        c.set(key.as_bytes(), segment(key, ver).repeat(n).as_bytes(), 0, 0)
                            .map(|_| ())
                    }
                    6..=8 => c
                        .append(key.as_bytes(), segment(key, ver).as_bytes())
                        .map(|_| ()),
                    _ => c.delete(key.as_bytes()).map(|_| ()),
                };
                // Out of memory under the storm is a legitimate answer; anything else is not.
                if let Err(e) = r {
                    assert!(matches!(e, memfabric_client::Error::Server(_)), "{e}");
                }
                ops += 1;
            }
            ops
        }));
    }
    let flood = {
        let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut c = client(&s, GetMode::TwoSided);
            let big = vec![b'c'; 6000];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = c.set(format!("cold{}", n % 20_000).as_bytes(), &big, 0, 0);
                n += 1;
            }
            n
        })
    };
    let mut handles = Vec::new();
    for r in 0..readers {
        let (s, keys) = (Arc::clone(&s), keys.clone());
        handles.push(std::thread::spawn(move || {
            let mut c = client(&s, GetMode::OneSided);
            let mut newest: HashMap<usize, u32> = HashMap::new();
            let mut rng = 0x1234_5678u64 + r as u64;
            let (mut hits, mut misses) = (0u64, 0u64);
            for _ in 0..reads_per_reader {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = rng as usize % keys.len();
                match c.get(keys[i].as_bytes()).expect("get") {
                    Some(v) => {
                        hits += 1;
                        let ver = check_value(&keys[i], &v.data).unwrap_or_else(|e| panic!("{e}"));
                        let seen = newest.entry(i).or_insert(0);
                        assert!(ver >= *seen, "{}: read version {ver} after {seen}", keys[i]);
                        *seen = ver;
                    }
                    None => misses += 1,
                }
            }
            (hits, misses, c.transport_counters())
        }));
    }
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let writes: u64 = writers.into_iter().map(|h| h.join().unwrap()).sum();
    let flooded = flood.join().unwrap();
    let mut total: HashMap<String, u64> = HashMap::new();
    let (mut hits, mut misses) = (0, 0);
    for (h, m, counters) in results {
        hits += h;
        misses += m;
        for (k, v) in counters {
            *total.entry(k).or_default() += v;
        }
    }
    let mut report: Vec<_> = total.iter().filter(|(_, &v)| v > 0).collect();
    report.sort();
    eprintln!(
        "torture: {} GETs ({hits} hits, {misses} misses), {writes} writes, {flooded} cold sets; {report:?}",
        hits + misses
    );
    assert_eq!(hits + misses, reads_per_reader * readers as u64);
    assert!(
        total["get_onesided_hits"] > 0,
        "no GET was served one-sided"
    );
}

// ---- eviction ---------------------------------------------------------------------------

/// Hit ratio of a hot set that is read in `mode` between rounds of a cold-write flood
/// several times larger than memory. Read back two-sided at the end.
fn hot_set_survival(mode: GetMode, access_hints: bool) -> f64 {
    let s = Server::start(Kind::MemfabricdUcx, &["-m", "16", "-o", "slab_automove=0"]);
    let mut reader = Client::new(
        s.url().as_str(),
        Config {
            access_hints,
            ..config(mode)
        },
    )
    .expect("client");
    let mut writer = client(&s, GetMode::TwoSided);
    let hot: Vec<String> = (0..1000).map(|i| format!("hot{i}")).collect();
    let value = vec![b'h'; 1000];
    for k in &hot {
        writer.set(k.as_bytes(), &value, 0, 0).unwrap();
    }
    let cold = vec![b'c'; 1000];
    let mut n = 0u64;
    for _round in 0..40 {
        for k in &hot {
            let _ = reader.get(k.as_bytes()).unwrap();
        }
        // ~1.2 MB of cold items per round: 48 MB in all, three times the memory.
        for _ in 0..1200 {
            writer
                .set(format!("cold{n}").as_bytes(), &cold, 0, 0)
                .unwrap();
            n += 1;
        }
    }
    let mut check = client(&s, GetMode::TwoSided);
    let kept = hot
        .iter()
        .filter(|k| check.get(k.as_bytes()).unwrap().is_some())
        .count();
    kept as f64 / hot.len() as f64
}

#[test]
fn hot_items_read_only_one_sidedly_survive_a_cold_flood_like_two_sided_ones() {
    if !native_rma() {
        return; // auto/one-sided over emulated RMA is not the deployment this is about
    }
    let two = hot_set_survival(GetMode::TwoSided, true);
    let one = hot_set_survival(GetMode::OneSided, true);
    let blind = hot_set_survival(GetMode::OneSided, false);
    eprintln!(
        "hot-set hit ratio after a 3x cold flood: two-sided {two:.3}, one-sided {one:.3}, \
         one-sided without access hints {blind:.3}"
    );
    assert!(two > 0.8, "two-sided reads keep the hot set ({two})");
    assert!(one >= two - 0.1, "one-sided {one} vs two-sided {two}");
    // Without hints the server never sees the reads: the hot set is evicted like cold data.
    assert!(
        blind < one - 0.3,
        "hints make the difference ({blind} vs {one})"
    );
}
