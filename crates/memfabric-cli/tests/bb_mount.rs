//! The burst buffer's FUSE mount (`memfabric bb mount`) against a local directory: `cp -r`,
//! `tar x`, `dd`, `rsync` and a checkpoint program give the same tree on both; wrong use
//! gets the errno a local file system gives; at unmount the backing directory receives
//! the same tree, with no temporary file left. Needs root and /dev/fuse (CI has both);
//! rsync and tar from the set-up.

#[path = "../../memfabric-client/tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Kind, Server};
use sha2::Digest;

/// A mount run by the CLI; unmounted (lazily if it must) and stopped when dropped, also
/// when a test fails.
struct Mounted {
    child: Option<Child>,
    dir: PathBuf,
}

impl Mounted {
    fn start(url: &str, fs: &str, backing: Option<&Path>, dir: &Path, extra: &[&str]) -> Mounted {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_memfabric"));
        // The options after the verb, as the issue and docs/burst-buffer.md write it
        // (`memfabric --servers LIST bb mount DIR --backing PATH`); the other tests here
        // give them before it: both work.
        cmd.args(["--servers", url, "bb", "mount"]).arg(dir);
        cmd.args(["--fs", fs, "--timeout", "20000"]);
        if let Some(b) = backing {
            cmd.arg("--backing").arg(b);
        }
        cmd.args(extra);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut m = Mounted {
            child: Some(child),
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !m.is_mounted() {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                let out = m.child.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "mount exited ({st}): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(Instant::now() < deadline, "not mounted after 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn is_mounted(&self) -> bool {
        let want = self.dir.canonicalize().unwrap_or(self.dir.clone());
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(want.to_str().unwrap()))
    }

    /// `umount DIR`, then what the mount process said and how it ended.
    fn unmount(mut self) -> Output {
        let st = Command::new("umount").arg(&self.dir).status().unwrap();
        assert!(st.success(), "umount failed");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the mount did not end after umount"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sh(cwd: &Path, script: &str) {
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} in {}: {}",
        cwd.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn random(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A source tree with what checkpoints and source trees hold.
fn make_source(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::create_dir_all(root.join("empty dir")).unwrap();
    for (name, size) in [
        ("zero", 0usize),
        ("one", 1),
        ("a/page", 4095),
        ("a/b/mib", (1 << 20) + 3),
        ("a/b/c/big", 3 << 20),
        ("näme with spaces", 777),
    ] {
        std::fs::write(root.join(name), random(size as u64 + 5, size)).unwrap();
    }
    std::fs::set_permissions(root.join("one"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(root.join("a/page"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("b/mib", root.join("a/link")).unwrap();
}

/// The checkpoint program: a rank writes its pieces out of order with pwrite, fsyncs,
/// closes, reopens, reads back; appends; rewrites the middle.
fn checkpoint(dir: &Path) {
    let path = dir.join("ckpt.rank0");
    let pieces: Vec<Vec<u8>> = (0..5).map(|i| random(100 + i, 300_000)).collect();
    let f = std::fs::File::create(&path).unwrap();
    for i in [3usize, 0, 4, 1, 2] {
        f.write_all_at(&pieces[i], i as u64 * 300_000).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let mut back = Vec::new();
    std::fs::File::open(&path)
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == pieces.concat(), "checkpoint read back differs");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"trailer").unwrap();
    drop(f);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.seek(SeekFrom::Start(299_990)).unwrap();
    f.write_all(b"across the chunk edge").unwrap();
    f.sync_all().unwrap();
    // A second file truncated and rewritten.
    let t = dir.join("ckpt.meta");
    std::fs::write(&t, b"version 1 with a longer body").unwrap();
    std::fs::write(&t, b"v2").unwrap();
}

/// The operations, run the same way in a local directory and in the mount.
fn exercise(src: &Path, tar: &Path, at: &Path) {
    let s = src.display();
    let t = tar.display();
    sh(at, &format!("cp -r '{s}' cp && cp -a '{s}' cpa"));
    sh(at, &format!("mkdir tar && tar xf '{t}' -C tar"));
    sh(
        at,
        &format!(
            "dd if='{s}/a/b/c/big' of=dd bs=64k status=none && \
             dd if=/dev/zero of=dd bs=1k seek=100 count=7 conv=notrunc status=none && \
             dd if='{s}/a/page' of=dd bs=1 seek=5000000 conv=notrunc status=none && \
             dd if='{s}/a/b/mib' of=dd.trunc bs=100k count=3 status=none"
        ),
    );
    sh(
        at,
        &format!("rsync -a '{s}/' rsync/ && rsync -a --delete '{s}/a/' rsync/a/"),
    );
    sh(
        at,
        "mv cp moved && mv moved/one moved/one.renamed && rm -r cpa/a/b",
    );
    checkpoint(at);
}

#[derive(Debug, PartialEq)]
enum Node {
    Dir(u32),
    File(u32, u64, String),
    Link(PathBuf),
}

fn tree(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let node = if m.file_type().is_symlink() {
                Node::Link(std::fs::read_link(&p).unwrap())
            } else if m.is_dir() {
                stack.push(p.clone());
                Node::Dir(mode)
            } else {
                let data = std::fs::read(&p).unwrap();
                Node::File(mode, m.len(), format!("{:x}", sha2::Sha256::digest(&data)))
            };
            out.insert(rel, node);
        }
    }
    out
}

fn assert_same_tree(want: &Path, got: &Path) {
    let (a, b) = (tree(want), tree(got));
    for (p, n) in &a {
        assert_eq!(b.get(p), Some(n), "{} differs", p.display());
    }
    for p in b.keys() {
        assert!(
            a.contains_key(p),
            "{} is extra in {}",
            p.display(),
            got.display()
        );
    }
}

#[test]
fn posix_tools_on_the_mount_give_what_they_give_on_a_local_directory_and_it_all_reaches_the_backing_directory(
) {
    let server = Server::start(Kind::Memfabricd, &["-m", "512"]);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    make_source(&src);
    let tar = work.path().join("src.tar");
    sh(work.path(), "tar cf src.tar -C src .");
    let local = work.path().join("local");
    let mnt = work.path().join("mnt");
    let backing = work.path().join("backing");
    for d in [&local, &mnt, &backing] {
        std::fs::create_dir_all(d).unwrap();
    }
    exercise(&src, &tar, &local);
    let m = Mounted::start(&server.url(), "posix", Some(&backing), &mnt, &[]);
    exercise(&src, &tar, &mnt);
    assert_same_tree(&local, &mnt);
    // Another client sees the same (close-to-open): the CLI reads a file back.
    let out = Command::new(env!("CARGO_BIN_EXE_memfabric"))
        .args(["--servers", &server.url(), "bb", "--fs", "posix", "cp"])
        .arg("bb:/ckpt.rank0")
        .arg(work.path().join("ckpt.copy"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(work.path().join("ckpt.copy")).unwrap(),
        std::fs::read(local.join("ckpt.rank0")).unwrap()
    );
    let out = m.unmount();
    assert!(
        out.status.success(),
        "the mount ended badly: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Flushed as files closed and at unmount: the backing directory holds the same tree,
    // and no temporary file.
    assert_same_tree(&local, &backing);
}

#[test]
fn wrong_use_gets_the_errno_a_local_file_system_gives() {
    // -M: a full cache refuses (as a full disk) instead of evicting files.
    let server = Server::start(Kind::Memfabricd, &["-m", "16", "-M"]);
    let work = tempfile::tempdir().unwrap();
    let mnt = work.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = Mounted::start(&server.url(), "errs", None, &mnt, &[]);
    let errno = |r: std::io::Result<()>| r.err().and_then(|e| e.raw_os_error());
    // A component over 255 bytes.
    let long = mnt.join("n".repeat(256));
    assert_eq!(errno(std::fs::write(&long, b"x")), Some(libc::ENAMETOOLONG));
    assert_eq!(errno(std::fs::create_dir(&long)), Some(libc::ENAMETOOLONG));
    std::fs::write(mnt.join("n".repeat(255)), b"x").unwrap();
    // The usual ones.
    assert_eq!(
        errno(std::fs::remove_dir(mnt.join("nope"))),
        Some(libc::ENOENT)
    );
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/f"), b"x").unwrap();
    assert_eq!(
        errno(std::fs::remove_dir(mnt.join("d"))),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        errno(std::fs::create_dir(mnt.join("d"))),
        Some(libc::EEXIST)
    );
    assert_eq!(
        errno(std::fs::write(mnt.join("d/f/g"), b"x")),
        Some(libc::ENOTDIR)
    );
    // A file larger than the pool holds: ENOSPC at a write or at fsync, as a full disk.
    let big = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(mnt.join("too-big"))?;
        let block = vec![1u8; 1 << 20];
        for _ in 0..64 {
            f.write_all(&block)?;
        }
        f.sync_all()
    })();
    assert_eq!(errno(big), Some(libc::ENOSPC));
    // What was there is still readable.
    assert_eq!(std::fs::read(mnt.join("d/f")).unwrap(), b"x");
    // An unlinked file stays readable and writable through the descriptors open on it.
    let mut open = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mnt.join("tmpfile"))
        .unwrap();
    open.write_all(b"still here").unwrap();
    std::fs::remove_file(mnt.join("tmpfile")).unwrap();
    assert!(!mnt.join("tmpfile").exists());
    open.write_all(b", and more").unwrap();
    open.sync_all().unwrap();
    let mut back = String::new();
    open.seek(SeekFrom::Start(0)).unwrap();
    open.read_to_string(&mut back).unwrap();
    assert_eq!(back, "still here, and more");
    drop(open);
    drop(m.unmount());
    // Read-only.
    let m = Mounted::start(&server.url(), "errs", None, &mnt, &["--read-only"]);
    assert_eq!(std::fs::read(mnt.join("d/f")).unwrap(), b"x");
    assert_eq!(
        errno(std::fs::write(mnt.join("d/f"), b"y")),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno(std::fs::write(mnt.join("new"), b"y")),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno(std::fs::remove_file(mnt.join("d/f"))),
        Some(libc::EROFS)
    );
    drop(m.unmount());
}

/// `memfabric bb` without a mount: a tree with a non-UTF-8 name and a link copied in and
/// out the same, listed, staged in from the backing directory, flushed, removed.
#[test]
fn cli_verbs_copy_trees_with_any_names_in_and_out() {
    use std::os::unix::ffi::OsStrExt;
    let server = Server::start(Kind::Memfabricd, &["-m", "128"]);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    make_source(&src);
    let odd = std::ffi::OsStr::from_bytes(b"caf\xe9-latin1");
    std::fs::write(src.join(odd), b"not utf-8").unwrap();
    let backing = work.path().join("pfs");
    std::fs::create_dir_all(backing.join("staged")).unwrap();
    std::fs::write(backing.join("staged/in"), random(9, 300_000)).unwrap();
    let bb = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memfabric"))
            .args(["--servers", &server.url(), "bb", "--fs", "cli", "--backing"])
            .arg(&backing)
            .args(args)
            .current_dir(work.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bb {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    bb(&["cp", "-r", "src", "bb:/tree"]);
    bb(&["cp", "-r", "bb:/tree", "back"]);
    assert_same_tree(&src, &work.path().join("back"));
    assert!(bb(&["ls", "bb:/tree"]).contains("unflushed"));
    bb(&["stage-in", "bb:/staged"]);
    assert!(bb(&["stat", "bb:/staged/in"]).contains("size      300000"));
    bb(&["flush"]);
    assert_same_tree(&src, &backing.join("tree"));
    bb(&["rm", "-r", "bb:/tree"]);
    assert!(!bb(&["ls", "bb:/"]).contains("tree"));
    // The flushed copies of what was removed leave the backing directory too.
    bb(&["flush"]);
    assert!(!backing.join("tree").exists());
    assert!(
        backing.join("staged/in").exists(),
        "what was only read through stays"
    );
}
