//! The file layer against a real memfabricd: contents against a local model, namespace
//! errors as a local file system gives them, close-to-open between clients, lost chunks,
//! a full cache, the flush protocol (verified copies, resumption after a flusher stops,
//! nothing partial under a final name) and read-through from a backing directory.

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Kind as ServerKind, Server};
use memfabric_bb::flush::{self, Event, FlushOptions, Flusher};
use memfabric_bb::fs::{Fs, FsError, Options, SetAttr};
use memfabric_bb::layout::{sha256, Kind, ROOT};
use memfabric_client::{Client, Config};

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(20),
        ..Config::default()
    }
}

fn open(server: &Server, name: &str, chunk: u32, backing: Option<&std::path::Path>) -> Fs {
    let c = Client::new(server.url().as_str(), config()).unwrap();
    Fs::open(
        c,
        Options {
            name: name.into(),
            chunk_size: chunk,
            depth: 8,
            backing: backing.map(|p| p.to_path_buf()),
            lock_ttl: 5,
            ..Options::default()
        },
    )
    .unwrap()
}

/// A tiny deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn file(fs: &mut Fs, parent: u64, name: &str) -> u64 {
    fs.create(parent, name.as_bytes(), Kind::File, 0o644, 0, 0, b"")
        .unwrap()
        .id
}

#[test]
fn random_writes_truncations_and_reads_match_a_local_model() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "256"]);
    let mut fs = open(&server, "model", 4096, None);
    let mut other = open(&server, "model", 0, None);
    assert_eq!(
        other.chunk_size(),
        4096,
        "an existing file system keeps its chunk size"
    );
    let id = file(&mut fs, ROOT, "f");
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    fs.open_write(id).unwrap();
    for round in 0..300 {
        match rng.below(10) {
            0 => {
                let size = rng.below(40_000);
                fs.truncate(id, size).unwrap();
                model.resize(size as usize, 0);
            }
            1 => {
                // Another client opens after a publication: sees exactly the model.
                fs.publish(id).unwrap();
                other.drop_cached(id);
                let got = other.read(id, 0, 1 << 20).unwrap();
                assert_eq!(got.len(), model.len(), "round {round}");
                assert!(got == model, "round {round}: content differs");
            }
            _ => {
                let at = rng.below(model.len() as u64 + 9000);
                let n = rng.below(10_000) as usize + 1;
                let data = rng.bytes(n);
                fs.write(id, at, &data).unwrap();
                let end = at as usize + data.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&data);
            }
        }
        // This client reads its own writes before publishing them.
        let at = rng.below(model.len() as u64 + 1);
        let len = rng.below(20_000) as usize;
        let got = fs.read(id, at, len).unwrap();
        let end = (at as usize + len).min(model.len());
        assert!(
            got == model[at as usize..end],
            "round {round}: read at {at}+{len}"
        );
    }
    fs.close_write(id).unwrap();
    let i = other.getattr(id).unwrap();
    assert_eq!(i.size, model.len() as u64);
    assert_eq!(i.sha256, None, "never flushed: no digest claimed");
}

#[test]
fn sparse_parts_and_truncated_tails_read_as_zeros() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "128"]);
    let mut fs = open(&server, "seq", 8192, None);
    let id = file(&mut fs, ROOT, "seq");
    let data = Rng(7).bytes(100_000);
    fs.open_write(id).unwrap();
    for piece in data.chunks(3000) {
        let at = fs.getattr(id).unwrap().size;
        fs.write(id, at, piece).unwrap();
    }
    let i = fs.close_write(id).unwrap().unwrap();
    assert_eq!(i.size, data.len() as u64);
    assert_eq!(fs.read(id, 0, 1 << 20).unwrap(), data);
    // A hole: bytes far past the end.
    let sparse = file(&mut fs, ROOT, "sparse");
    fs.write(sparse, 1 << 20, b"end").unwrap();
    fs.close_write(sparse).unwrap();
    let got = fs.read(sparse, 0, 2 << 20).unwrap();
    assert_eq!(got.len(), (1 << 20) + 3);
    assert!(got[..1 << 20].iter().all(|&b| b == 0));
    assert_eq!(&got[1 << 20..], b"end");
    assert_eq!(
        fs.getattr(sparse).unwrap().written_chunks().count(),
        1,
        "a hole stores nothing"
    );
    // Shrink then extend: the cut bytes come back as zeros, as truncate(2) says.
    fs.setattr(
        id,
        &SetAttr {
            size: Some(10),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.truncate(id, 20_000).unwrap();
    let got = fs.read(id, 0, 30_000).unwrap();
    assert_eq!(&got[..10], &data[..10]);
    assert!(got[10..].iter().all(|&b| b == 0));
    assert_eq!(got.len(), 20_000);
}

#[test]
fn namespace_errors_are_the_ones_a_local_file_system_gives() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "64"]);
    let mut fs = open(&server, "names", 0, None);
    let d = fs
        .create(ROOT, b"d", Kind::Dir, 0o755, 0, 0, b"")
        .unwrap()
        .id;
    let f = file(&mut fs, d, "f");
    let errno = |r: Result<(), FsError>| r.err().map(|e| e.errno());
    let create =
        |fs: &mut Fs, p: u64, n: &[u8]| fs.create(p, n, Kind::File, 0o644, 0, 0, b"").map(|_| ());
    assert_eq!(errno(create(&mut fs, d, b"f")), Some(libc::EEXIST));
    assert_eq!(
        errno(create(&mut fs, d, &[b'n'; 256])),
        Some(libc::ENAMETOOLONG)
    );
    assert_eq!(errno(create(&mut fs, d, &[b'n'; 255])), None);
    assert_eq!(errno(create(&mut fs, f, b"x")), Some(libc::ENOTDIR));
    assert_eq!(
        errno(fs.remove(ROOT, b"d", true).map(|_| ())),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        errno(fs.remove(ROOT, b"d", false).map(|_| ())),
        Some(libc::EISDIR)
    );
    assert_eq!(
        errno(fs.remove(d, b"f", true).map(|_| ())),
        Some(libc::ENOTDIR)
    );
    assert_eq!(
        errno(fs.remove(d, b"nope", false).map(|_| ())),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno(fs.rename(ROOT, b"d", d, b"below", false)),
        Some(libc::EINVAL),
        "a directory into itself"
    );
    let e = fs
        .create(ROOT, b"e", Kind::Dir, 0o755, 0, 0, b"")
        .unwrap()
        .id;
    assert_eq!(
        errno(fs.rename(d, b"f", ROOT, b"e", false)),
        Some(libc::EISDIR)
    );
    assert_eq!(
        errno(fs.rename(ROOT, b"e", d, b"f", false)),
        Some(libc::ENOTDIR)
    );
    assert_eq!(
        errno(fs.rename(ROOT, b"e", ROOT, b"d", false)),
        Some(libc::ENOTEMPTY)
    );
    // A rename over a file replaces it; a directory moves with what it holds.
    let g = file(&mut fs, ROOT, "g");
    fs.write(g, 0, b"gee").unwrap();
    fs.close_write(g).unwrap();
    fs.rename(ROOT, b"g", d, b"f", false).unwrap();
    assert_eq!(fs.resolve(b"/d/f").unwrap().id, g);
    assert_eq!(
        errno(fs.get_inode(f).map(|_| ())),
        Some(libc::ENOENT),
        "replaced: gone"
    );
    fs.rename(ROOT, b"d", e, b"moved", false).unwrap();
    let moved = fs.resolve(b"/e/moved/f").unwrap().id;
    assert_eq!(fs.read(moved, 0, 10).unwrap(), b"gee");
    assert_eq!(fs.path_of(g).unwrap(), b"e/moved/f");
    assert_eq!(fs.get_inode(e).unwrap().nlink, 3, "e holds one directory");
    assert_eq!(
        fs.get_inode(ROOT).unwrap().nlink,
        3,
        "the root holds e (and . ..)"
    );
    let names: Vec<Vec<u8>> = fs
        .readdir(ROOT)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"e".to_vec()]);
}

#[test]
fn writers_of_disjoint_parts_of_one_file_are_merged_and_a_lost_chunk_is_an_error() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "64"]);
    let mut a = open(&server, "n1", 4096, None);
    let mut b = open(&server, "n1", 0, None);
    let id = file(&mut a, ROOT, "shared");
    a.open_write(id).unwrap();
    b.open_write(id).unwrap();
    a.write(id, 0, &[1; 8192]).unwrap();
    b.write(id, 8192, &[2; 8192]).unwrap();
    a.close_write(id).unwrap();
    b.close_write(id).unwrap();
    let got = a.read(id, 0, 1 << 20).unwrap();
    assert_eq!(got.len(), 16384);
    assert!(got[..8192].iter().all(|&x| x == 1) && got[8192..].iter().all(|&x| x == 2));
    // Strided N-1 inside chunks: 512-byte blocks alternating between the two writers,
    // each writer seeing only its own until the other publishes.
    let s = file(&mut a, ROOT, "strided");
    a.open_write(s).unwrap();
    b.open_write(s).unwrap();
    for blk in 0..64u64 {
        let (w, v) = if blk % 2 == 0 {
            (&mut a, 3u8)
        } else {
            (&mut b, 4u8)
        };
        w.write(s, blk * 512, &[v; 512]).unwrap();
    }
    a.close_write(s).unwrap();
    b.close_write(s).unwrap();
    let got = b.read(s, 0, 1 << 20).unwrap();
    assert_eq!(got.len(), 64 * 512);
    for blk in 0..64usize {
        let want = if blk % 2 == 0 { 3u8 } else { 4u8 };
        assert!(
            got[blk * 512..(blk + 1) * 512].iter().all(|&x| x == want),
            "block {blk} lost its writer's bytes"
        );
    }
    // A chunk the cache lost (evicted, every copy gone) is EIO, never zeros.
    let i = a.get_inode(id).unwrap();
    let key = format!("bb:n1:c:{id}:{}:1", i.gen);
    assert!(a.client().delete(key.as_bytes()).unwrap());
    a.drop_cached(id);
    let err = a.read(id, 0, 1 << 20).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
}

#[test]
fn a_full_cache_is_enospc_and_a_chunk_over_the_item_limit_is_refused() {
    // -M: memcached's "return errors instead of evicting".
    let server = Server::start(ServerKind::Memfabricd, &["-m", "8", "-M"]);
    let mut fs = open(&server, "full", 0, None);
    let id = file(&mut fs, ROOT, "big");
    let block = vec![7u8; 1 << 20];
    let mut failed = None;
    for i in 0..64u64 {
        if let Err(e) = fs.write(id, i << 20, &block) {
            failed = Some(e);
            break;
        }
    }
    let err = match failed {
        Some(e) => e,
        None => fs.publish(id).unwrap_err(),
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    // The failure sticks: a second close does not publish what was not stored.
    let before = fs.get_inode(id).unwrap();
    assert_eq!(fs.close_write(id).unwrap_err().errno(), libc::ENOSPC);
    let after = fs.get_inode(id).unwrap();
    assert_eq!((after.version, after.size), (before.version, before.size));
    assert_eq!(
        after.writing_until_ms, 0,
        "the failed writer no longer holds the file"
    );
    let c = Client::new(server.url().as_str(), config()).unwrap();
    let e = Fs::open(
        c,
        Options {
            name: "huge-chunks".into(),
            chunk_size: 2 << 20,
            ..Options::default()
        },
    )
    .err()
    .expect("a 2 MiB chunk over a 1 MiB -I");
    assert!(e.to_string().contains("-I"), "{e}");
}

fn flush_opts() -> FlushOptions {
    FlushOptions {
        lease: Duration::from_secs(2),
        checkpoint_bytes: 64 << 10,
        write_bytes: 64 << 10,
        readback: true,
        ..FlushOptions::default()
    }
}

#[test]
fn a_flush_copies_verified_files_and_resumes_where_a_stopped_flusher_left_off() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "256"]);
    let backing = tempfile::tempdir().unwrap();
    let mut fs = open(&server, "flush", 16384, Some(backing.path()));
    let d = fs
        .create(ROOT, b"ckpt", Kind::Dir, 0o750, 0, 0, b"")
        .unwrap()
        .id;
    let mut want = Vec::new();
    for (i, size) in [0usize, 1, 16384, 1_000_000, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let name = format!("rank{i}");
        let id = file(&mut fs, d, &name);
        let data = Rng(i as u64 + 11).bytes(size);
        fs.open_write(id).unwrap();
        fs.write(id, 0, &data).unwrap();
        fs.close_write(id).unwrap();
        want.push((format!("ckpt/{name}"), sha256(&data), size));
    }
    assert_eq!(
        flush::enqueue_dirty(&mut fs, ROOT).unwrap(),
        6,
        "the directory and 5 files"
    );
    // The first flusher stops after its first progress record on the big file.
    let stop = AtomicBool::new(false);
    let mut first = Flusher::new(flush_opts());
    first
        .run(&mut fs, &stop, &mut |ev| {
            if let Event::Progress { path, .. } = ev {
                if path.ends_with(b"rank4") {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        })
        .unwrap();
    let final_big = backing.path().join("ckpt/rank4");
    assert!(
        !final_big.exists(),
        "nothing under the final name before it is verified"
    );
    let temps = |dir: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".mfbb-"))
            .collect()
    };
    let ckpt_dir = backing.path().join("ckpt");
    assert_eq!(
        temps(&ckpt_dir).len(),
        1,
        "the stopped flusher's temporary file"
    );
    assert!(temps(&ckpt_dir)[0].starts_with(".rank4.mfbb-"));
    // Another flusher (another client) takes over once the lease ends, from the bytes
    // recorded.
    let mut fs2 = open(&server, "flush", 0, Some(backing.path()));
    let mut resumed_at = None;
    let sum = Flusher::new(flush_opts())
        .run(&mut fs2, &AtomicBool::new(false), &mut |ev| {
            if let Event::Started {
                resumed_at: r,
                path,
                ..
            } = ev
            {
                if path.ends_with(b"rank4") {
                    resumed_at = Some(*r);
                }
            }
        })
        .unwrap();
    assert!(sum.failed.is_empty(), "{:?}", sum.failed);
    assert!(
        resumed_at.unwrap() > 0,
        "resumed, not restarted: {resumed_at:?}"
    );
    for (path, sha, size) in &want {
        let got = std::fs::read(backing.path().join(path)).unwrap();
        assert_eq!(got.len(), *size, "{path}");
        assert_eq!(&sha256(&got), sha, "{path}");
    }
    assert!(temps(&ckpt_dir).is_empty(), "{:?}", temps(&ckpt_dir));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(backing.path().join("ckpt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
    assert!(flush::queued(&mut fs2).unwrap().is_empty());
    let big = fs2.resolve(b"/ckpt/rank4").unwrap();
    assert!(!flush::is_dirty(&big));
    assert_eq!(big.sha256, Some(want[4].1), "the flushed copy's digest");
    // Written again: dirty again, flushed again.
    let id = fs2.resolve(b"/ckpt/rank1").unwrap().id;
    fs2.open_write(id).unwrap();
    fs2.write(id, 1, b"more").unwrap();
    let changed = fs2.close_write(id).unwrap().unwrap();
    assert_eq!(changed.sha256, None, "changed since its flush");
    assert_eq!(flush::enqueue_dirty(&mut fs2, ROOT).unwrap(), 1);
    Flusher::new(flush_opts())
        .run(&mut fs2, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    let got = std::fs::read(backing.path().join("ckpt/rank1")).unwrap();
    assert_eq!(got.len(), 5);
    assert_eq!(&got[1..], b"more");
}

/// Every temporary file of a flush under `dir`, recursively.
fn flush_temps(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(flush_temps(&p));
        } else if e.file_name().to_string_lossy().contains(".mfbb-") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_file_renamed_or_removed_while_it_is_flushed_ends_where_it_is_now_and_leaves_no_temporary_file()
{
    let server = Server::start(ServerKind::Memfabricd, &["-m", "256"]);
    let backing = tempfile::tempdir().unwrap();
    let mut fs = open(&server, "moving", 16384, Some(backing.path()));
    // Another client (an application on another node) renames and removes.
    let mut app = open(&server, "moving", 0, Some(backing.path()));
    let big = Rng(5).bytes(1 << 20);
    for (name, data) in [("a", &big[..]), ("gone", &big[..5000])] {
        let id = file(&mut fs, ROOT, name);
        fs.open_write(id).unwrap();
        fs.write(id, 0, data).unwrap();
        fs.close_write(id).unwrap();
    }
    flush::enqueue_dirty(&mut fs, ROOT).unwrap();
    // `a` is renamed to `b` in the middle of its copy; `gone` is removed as its copy
    // starts (it is small: no progress record comes before the copy's last check).
    let (mut renamed, mut removed) = (false, false);
    let sum = Flusher::new(flush_opts())
        .run(&mut fs, &AtomicBool::new(false), &mut |ev| match ev {
            Event::Progress { path, .. } if path.ends_with(b"a") && !renamed => {
                app.rename(ROOT, b"a", ROOT, b"b", false).unwrap();
                renamed = true;
            }
            Event::Started { path, .. } if path.ends_with(b"gone") && !removed => {
                app.remove(ROOT, b"gone", false).unwrap();
                removed = true;
            }
            _ => {}
        })
        .unwrap();
    assert!(renamed && removed, "both happened during the flush");
    assert!(sum.failed.is_empty(), "{:?}", sum.failed);
    // Anything the rename queued again runs too.
    Flusher::new(flush_opts())
        .run(&mut fs, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(flush::queued(&mut fs).unwrap().is_empty());
    let b = std::fs::read(backing.path().join("b")).expect("flushed under its new name");
    assert_eq!(sha256(&b), sha256(&big));
    assert!(
        !backing.path().join("a").exists(),
        "no copy under the old name"
    );
    assert!(!backing.path().join("gone").exists());
    assert_eq!(
        flush_temps(backing.path()),
        Vec::<std::path::PathBuf>::new()
    );
    // Nor does the old name come back through read-through, on either client.
    for c in [&mut fs, &mut app] {
        assert!(matches!(c.lookup(ROOT, b"a"), Err(FsError::NotFound)));
        assert!(matches!(c.lookup(ROOT, b"gone"), Err(FsError::NotFound)));
    }
}

#[test]
fn paths_not_in_the_cache_are_read_through_from_the_backing_directory() {
    let server = Server::start(ServerKind::Memfabricd, &["-m", "128"]);
    let backing = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(backing.path().join("in/sub")).unwrap();
    let big = Rng(3).bytes(300_000);
    std::fs::write(backing.path().join("in/sub/data"), &big).unwrap();
    std::fs::write(backing.path().join("in/small"), b"small").unwrap();
    std::os::unix::fs::symlink("sub/data", backing.path().join("in/link")).unwrap();
    let mut fs = open(&server, "stage", 65536, Some(backing.path()));
    let i = fs.resolve(b"/in/sub/data").unwrap();
    assert_eq!(i.size, big.len() as u64);
    assert_eq!(fs.read(i.id, 0, 1 << 20).unwrap(), big);
    assert!(
        !flush::is_dirty(&fs.get_inode(i.id).unwrap()),
        "staged content is clean"
    );
    // Now in the cache: changing the backing file does not change what is read.
    std::fs::write(backing.path().join("in/sub/data"), b"changed").unwrap();
    let mut other = open(&server, "stage", 0, Some(backing.path()));
    assert_eq!(other.read(i.id, 0, 10).unwrap(), &big[..10]);
    let in_dir = fs.resolve(b"/in").unwrap().id;
    let mut names: Vec<Vec<u8>> = fs
        .readdir(in_dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![b"link".to_vec(), b"small".to_vec(), b"sub".to_vec()]
    );
    assert_eq!(fs.resolve(b"/in/link").unwrap().target, b"sub/data");
    // Removing a read-through name hides the backing file (which stays).
    let d = fs.resolve(b"/in").unwrap().id;
    fs.remove(d, b"small", false).unwrap();
    assert_eq!(fs.resolve(b"/in/small").unwrap_err().errno(), libc::ENOENT);
    assert!(backing.path().join("in/small").exists());
    assert_eq!(
        fs.create(d, b"small", Kind::File, 0o644, 0, 0, b"")
            .map(|_| ())
            .err()
            .map(|e| e.errno()),
        None,
        "a removed name can be created again"
    );
    // A read-through file that changed in the backing directory before it was opened:
    // ESTALE, not the other file's bytes.
    std::fs::write(backing.path().join("in/late"), b"first").unwrap();
    let late = fs.resolve(b"/in/late").unwrap().id;
    std::fs::write(backing.path().join("in/late"), b"second, longer").unwrap();
    assert_eq!(fs.read(late, 0, 100).unwrap_err().errno(), libc::ESTALE);
    // A read-through directory renamed before it was listed keeps its backing entries.
    std::fs::create_dir_all(backing.path().join("in2")).unwrap();
    std::fs::write(backing.path().join("in2/a"), b"aa").unwrap();
    std::fs::write(backing.path().join("in2/b"), b"bb").unwrap();
    let in2 = fs.resolve(b"/in2").unwrap();
    fs.rename(ROOT, b"in2", ROOT, b"moved2", false).unwrap();
    let mut names: Vec<Vec<u8>> = fs
        .readdir(in2.id)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec()]);
    let b_id = fs.resolve(b"/moved2/b").unwrap().id;
    assert_eq!(fs.read(b_id, 0, 10).unwrap(), b"bb");
    // A directory made over a removed one does not show the old one's flushed files.
    let out = fs
        .create(ROOT, b"out", Kind::Dir, 0o755, 0, 0, b"")
        .unwrap()
        .id;
    let f = file(&mut fs, out, "old");
    fs.write(f, 0, b"old").unwrap();
    fs.close_write(f).unwrap();
    flush::enqueue_dirty(&mut fs, ROOT).unwrap();
    Flusher::new(FlushOptions::default())
        .run(&mut fs, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(backing.path().join("out/old").exists());
    fs.remove(out, b"old", false).unwrap();
    fs.remove(ROOT, b"out", true).unwrap();
    let out2 = fs
        .create(ROOT, b"out", Kind::Dir, 0o755, 0, 0, b"")
        .unwrap()
        .id;
    assert!(fs.readdir(out2).unwrap().is_empty());
    assert_eq!(fs.lookup(out2, b"old").unwrap_err().errno(), libc::ENOENT);
}
