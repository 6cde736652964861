//! The burst buffer's flush survives its flusher and a server dying mid-flush
//! (`memfabric-cluster`: servers in their own network namespaces): a restarted flusher
//! completes, every file at the destination is sha256-identical to what was written, and
//! no partial or temporary file is ever visible under a final name (a watcher checks every
//! final name the moment it appears).
//!
//! Needs root and `ip`, as CI has; `MEMFABRIC_SKIP_NETNS=1` skips it (printed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memfabric_bb::flush::{self, Event, FlushOptions, Flusher};
use memfabric_bb::fs::{Fs, Options};
use memfabric_bb::layout::{hex, sha256, FlushState, Kind, ROOT};
use memfabric_client::{Client, Config};
use memfabric_cluster::{Cluster, ClusterConfig};

const FILES: usize = 6;
const SIZE: usize = 4 << 20;

fn config() -> Config {
    Config {
        timeout: Duration::from_millis(500),
        connect_timeout: Duration::from_millis(500),
        retry_timeout: Duration::from_millis(500),
        // Every key on three servers, a write done at two: one server may die.
        replicas: 2,
        ..Config::default()
    }
}

fn opts(backing: &Path) -> Options {
    Options {
        name: "crash".into(),
        chunk_size: 256 << 10,
        backing: Some(backing.to_path_buf()),
        lock_ttl: 3,
        ..Options::default()
    }
}

fn data(i: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1) * 0x9e37_79b9_7f4a_7c15;
    (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A flusher process: `memfabric bb flush` with a short lease.
fn flusher(servers: &str, backing: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_memfabric"))
        .args([
            "--servers",
            servers,
            "--replicas",
            "2",
            "--timeout",
            "500",
            "bb",
            "--fs",
            "crash",
            "--chunk",
            "262144",
            "--backing",
        ])
        .arg(backing)
        .args(["flush", "--lease", "2"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

struct KillOnDrop(Option<Child>);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Watches `dir` until stopped: every name that is not a temporary one must hold exactly
/// the expected content the moment it is seen.
fn watch(
    dir: PathBuf,
    want: HashMap<String, [u8; 32]>,
    stop: Arc<AtomicBool>,
) -> Arc<Mutex<Vec<String>>> {
    let bad = Arc::new(Mutex::new(Vec::new()));
    let out = bad.clone();
    std::thread::spawn(move || {
        let mut verified = std::collections::HashSet::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.contains(".mfbb-") || verified.contains(&name) {
                        continue;
                    }
                    match (std::fs::read(e.path()), want.get(&name)) {
                        (Ok(b), Some(sha)) if sha256(&b) == *sha => {
                            verified.insert(name);
                        }
                        (Ok(b), _) => out.lock().unwrap().push(format!(
                            "{name}: {} bytes, sha256 {} under its final name",
                            b.len(),
                            hex(&sha256(&b))
                        )),
                        (Err(_), _) => {}
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    bad
}

#[test]
fn a_flush_finishes_after_its_flusher_and_a_server_are_killed_with_nothing_partial_ever_visible() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    let mut cluster = Cluster::start(ClusterConfig {
        servers: 4,
        args: vec!["-m".into(), "256".into()],
        ..ClusterConfig::default()
    })
    .expect("cluster");
    let servers: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    let servers = servers.join(",");
    let work = tempfile::tempdir().unwrap();
    let backing = work.path().join("pfs");
    std::fs::create_dir_all(&backing).unwrap();

    let mut fs = Fs::open(
        Client::new(servers.as_str(), config()).unwrap(),
        opts(&backing),
    )
    .unwrap();
    let d = fs
        .create(ROOT, b"ckpt", Kind::Dir, 0o755, 0, 0, b"")
        .unwrap()
        .id;
    let mut want = HashMap::new();
    for i in 0..FILES {
        let name = format!("rank{i}");
        let id = fs
            .create(d, name.as_bytes(), Kind::File, 0o644, 0, 0, b"")
            .unwrap()
            .id;
        let bytes = data(i);
        fs.open_write(id).unwrap();
        fs.write(id, 0, &bytes).unwrap();
        fs.close_write(id).unwrap();
        want.insert(name, sha256(&bytes));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bad = watch(backing.join("ckpt"), want.clone(), stop.clone());

    // The first flusher, slowed down (2 MB/s) so that it is killed in the middle.
    let mut first = KillOnDrop(Some(flusher(
        &servers,
        &backing,
        &["--bandwidth", "2000000"],
    )));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let q = flush::queued(&mut fs).unwrap();
        let copying = q
            .iter()
            .any(|r| r.state == FlushState::Copying && r.done > 0 && !r.path.is_empty());
        let finished = want
            .keys()
            .filter(|n| backing.join("ckpt").join(n).exists())
            .count();
        if copying && finished >= 1 {
            break;
        }
        assert!(
            first.0.as_mut().unwrap().try_wait().unwrap().is_none(),
            "the slowed flusher finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "no progress: {q:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Kill the flusher and one server in the middle.
    let mut child = first.0.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    cluster.kill(1).unwrap();

    // A new flusher completes (after the dead one's lease and lock run out).
    let second = flusher(&servers, &backing, &[]);
    let mut second = KillOnDrop(Some(second));
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(st) = second.0.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the second flusher did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = second.0.take().unwrap().wait_with_output().unwrap();
    assert!(
        status.success(),
        "second flusher: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Usually it resumes the dead flusher's file where its last progress record says;
    // with the server gone, the copy of that record it reads may be an older one (a
    // quorum write's third copy was the dead flusher's to finish), so it may start that
    // file earlier, or over: either way from bytes it checked.
    let log = String::from_utf8_lossy(&out.stderr);
    eprintln!("second flusher: {log}");
    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    for (name, sha) in &want {
        let got = std::fs::read(backing.join("ckpt").join(name)).unwrap();
        assert_eq!(&sha256(&got), sha, "{name}");
    }
    let left: Vec<_> = std::fs::read_dir(backing.join("ckpt"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !want.contains_key(n))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "seen under a final name: {bad:?}");
    // The journal is empty and every file is marked flushed.
    let mut fs = Fs::open(
        Client::new(servers.as_str(), config()).unwrap(),
        opts(&backing),
    )
    .unwrap();
    assert!(flush::queued(&mut fs).unwrap().is_empty());
    for name in want.keys() {
        let i = fs.resolve(format!("/ckpt/{name}").as_bytes()).unwrap();
        assert!(!flush::is_dirty(&i), "{name} not marked flushed");
    }
    // Nothing more to flush.
    let sum = Flusher::new(FlushOptions::default())
        .run(&mut fs, &AtomicBool::new(false), &mut |e: &Event| {
            panic!("{e:?}")
        })
        .unwrap();
    assert_eq!(sum.files, 0);
}
