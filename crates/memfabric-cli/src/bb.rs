//! `memfabric bb ...`: the burst buffer's verbs (docs/burst-buffer.md).
//!
//! Paths inside the burst buffer are written `bb:/path`; anything else is a local path.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use memfabric_bb::flush::{self, Event, FlushOptions, Flusher};
use memfabric_bb::fs::{Fs, FsError, Options};
use memfabric_bb::layout::{hex, Inode, Kind, ROOT};
use memfabric_bb::mount::{BbMount, MountOptions};
use memfabric_client::{Client, Config};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Args)]
pub struct BbArgs {
    /// The file system's name in the pool (its keys are `bb:NAME:...`).
    #[arg(global = true, long = "fs", default_value = "default")]
    name: String,
    /// Chunk size of a new file system, in bytes (default: 512 KiB, or less if the
    /// servers' -I needs it). An existing file system keeps its own.
    #[arg(global = true, long, default_value_t = 0)]
    chunk: u32,
    /// Chunk reads and writes in flight per file.
    #[arg(global = true, long, default_value_t = 16)]
    depth: usize,
    /// The backing directory (the parallel file system): paths not in the cache are read
    /// through from it, and flushes go to it.
    #[arg(global = true, long, env = "MEMFABRIC_BB_BACKING")]
    backing: Option<PathBuf>,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Copy files in or out: `cp [-r] SRC... DST`, where one side is `bb:/path`.
    Cp {
        #[arg(short = 'r', long)]
        recursive: bool,
        #[arg(required = true, num_args = 2..)]
        paths: Vec<String>,
    },
    /// List a directory (or show a file): mode, size, flushed or not, name.
    Ls {
        #[arg(default_value = "bb:/")]
        path: String,
    },
    /// Everything the file system knows about a path.
    Stat { path: String },
    /// Make a directory (`-p`: with its parents, no error if it exists).
    Mkdir {
        #[arg(short = 'p', long)]
        parents: bool,
        path: String,
    },
    /// Remove files (`-r`: directories and what they hold). The backing directory is
    /// never touched.
    Rm {
        #[arg(short = 'r', long)]
        recursive: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Flush what the backing directory does not have yet (under PATH, default all) and
    /// run the flusher until the journal is empty — also files other flushers queued or
    /// left unfinished.
    Flush {
        #[arg(default_value = "bb:/")]
        path: String,
        /// Bytes per second to write to the backing directory (0: unbounded).
        #[arg(long, default_value_t = 0)]
        bandwidth: u64,
        /// Seconds a claim on a file lasts without renewal (a dead flusher's files are
        /// taken over after this).
        #[arg(long, default_value_t = 30)]
        lease: u64,
        /// Flushers working at once (each with its own connections), on different files.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Read every copy back from the backing directory and check it again before it
        /// gets its name (a second pass over the backing store).
        #[arg(long)]
        readback: bool,
        /// Write through the page cache instead of O_DIRECT.
        #[arg(long)]
        buffered: bool,
    },
    /// Bring paths of the backing directory into the cache (directories recursively).
    StageIn {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// The flush journal: queued and running flushes, and what is not flushed yet.
    Status,
    /// Mount the file system at DIR (FUSE) until `umount DIR`. Files are flushed to the
    /// backing directory as they are closed; at unmount whatever is still unflushed is
    /// flushed, or listed with --no-flush-on-unmount.
    Mount {
        dir: PathBuf,
        #[arg(long)]
        read_only: bool,
        /// Do not flush files as they are closed.
        #[arg(long)]
        no_flush_on_close: bool,
        /// At unmount, list what is unflushed instead of flushing it.
        #[arg(long)]
        no_flush_on_unmount: bool,
        /// Let other users than the one mounting use the mount (FUSE's allow_other).
        #[arg(long)]
        allow_other: bool,
    },
}

fn options(a: &BbArgs) -> Options {
    Options {
        name: a.name.clone(),
        chunk_size: a.chunk,
        depth: a.depth,
        backing: a.backing.clone(),
        ..Options::default()
    }
}

/// `bb:/x/y` → `Some("/x/y")`.
fn bb_path(s: &str) -> Option<&str> {
    s.strip_prefix("bb:")
        .map(|p| if p.is_empty() { "/" } else { p })
}

fn need_bb(s: &str) -> Res<&str> {
    bb_path(s).ok_or_else(|| format!("{s}: a burst-buffer path is written bb:/PATH").into())
}

fn fs_err(path: &str, e: FsError) -> Box<dyn std::error::Error> {
    format!("{path}: {e}").into()
}

impl BbArgs {
    /// The backing directory given (`--backing` or the environment).
    #[cfg(test)]
    pub fn backing(&self) -> Option<&std::path::Path> {
        self.backing.as_deref()
    }
}

pub fn run(servers: &str, config: Config, args: BbArgs) -> Res<u8> {
    let opts = options(&args);
    if let Verb::Mount {
        dir,
        read_only,
        no_flush_on_close,
        no_flush_on_unmount,
        allow_other,
    } = &args.verb
    {
        return mount(
            servers,
            config,
            opts,
            dir,
            *read_only,
            !*no_flush_on_close,
            !*no_flush_on_unmount,
            *allow_other,
        );
    }
    let (config_copy, opts_copy) = (config.clone(), opts.clone());
    let client = Client::new(servers, config)?;
    let mut fs = Fs::open(client, opts)?;
    match args.verb {
        Verb::Cp { recursive, paths } => cp(&mut fs, recursive, &paths),
        Verb::Ls { path } => ls(&mut fs, need_bb(&path)?),
        Verb::Stat { path } => stat(&mut fs, need_bb(&path)?),
        Verb::Mkdir { parents, path } => {
            let p = need_bb(&path)?;
            mkdir(&mut fs, p, parents).map_err(|e| fs_err(p, e))?;
            Ok(0)
        }
        Verb::Rm { recursive, paths } => {
            for p in &paths {
                let p = need_bb(p)?;
                rm(&mut fs, p, recursive).map_err(|e| fs_err(p, e))?;
            }
            Ok(0)
        }
        Verb::Flush {
            path,
            bandwidth,
            lease,
            jobs,
            readback,
            buffered,
        } => {
            let p = need_bb(&path)?;
            let jobs = jobs.max(1);
            let fopts = FlushOptions {
                lease: Duration::from_secs(lease.max(1)),
                // The bound is the whole flush's: shared by the jobs.
                bandwidth: (bandwidth > 0).then_some(bandwidth / jobs as u64),
                readback,
                direct: !buffered,
                ..FlushOptions::default()
            };
            if jobs == 1 {
                return run_flush(&mut fs, Some(p), fopts);
            }
            let i = fs.resolve(p.as_bytes()).map_err(|e| fs_err(p, e))?;
            let n = flush::enqueue_dirty(&mut fs, i.id)?;
            eprintln!("queued {n} unflushed under {p}");
            let handles: Vec<_> = (0..jobs)
                .map(|_| {
                    let (servers, config, opts, fopts) = (
                        servers.to_string(),
                        config_copy.clone(),
                        opts_copy.clone(),
                        fopts.clone(),
                    );
                    std::thread::spawn(move || -> Result<u8, String> {
                        let c = Client::new(servers.as_str(), config).map_err(|e| e.to_string())?;
                        let mut fs = Fs::open(c, opts).map_err(|e| e.to_string())?;
                        run_flush(&mut fs, None, fopts).map_err(|e| e.to_string())
                    })
                })
                .collect();
            let mut code = 0;
            for h in handles {
                match h.join() {
                    Ok(Ok(c)) => code = code.max(c),
                    Ok(Err(e)) => {
                        eprintln!("memfabric: flush: {e}");
                        code = 2;
                    }
                    Err(_) => code = 2,
                }
            }
            Ok(code)
        }
        Verb::StageIn { paths } => {
            for p in &paths {
                let p = need_bb(p)?;
                stage_in(&mut fs, p).map_err(|e| fs_err(p, e))?;
            }
            Ok(0)
        }
        Verb::Status => status(&mut fs),
        Verb::Mount { .. } => unreachable!("handled above"),
    }
}

fn split_parent(path: &str) -> (&str, &str) {
    let t = path.trim_end_matches('/');
    match t.rfind('/') {
        Some(i) => (&t[..i.max(1)], &t[i + 1..]),
        None => ("/", t),
    }
}

fn mkdir(fs: &mut Fs, path: &str, parents: bool) -> Result<Inode, FsError> {
    if parents {
        let mut at = fs.get_inode(ROOT)?;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            at = match fs.lookup(at.id, c.as_bytes()) {
                Ok(i) if i.kind == Kind::Dir => i,
                Ok(_) => return Err(FsError::NotDir),
                Err(FsError::NotFound) => {
                    fs.create(at.id, c.as_bytes(), Kind::Dir, 0o755, uid(), gid(), b"")?
                }
                Err(e) => return Err(e),
            };
        }
        return Ok(at);
    }
    let (parent, name) = split_parent(path);
    let p = fs.resolve(parent.as_bytes())?;
    fs.create(p.id, name.as_bytes(), Kind::Dir, 0o755, uid(), gid(), b"")
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}
fn gid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.gid())
        .unwrap_or(0)
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

fn cp(fs: &mut Fs, recursive: bool, paths: &[String]) -> Res<u8> {
    let (srcs, dst) = paths.split_at(paths.len() - 1);
    let dst = &dst[0];
    let many = srcs.len() > 1;
    for src in srcs {
        match (bb_path(src), bb_path(dst)) {
            (None, Some(d)) => {
                let src = Path::new(src);
                let m = std::fs::metadata(src).map_err(|e| format!("{}: {e}", src.display()))?;
                let target = into_target(fs, d, src.file_name(), many)?;
                if m.is_dir() {
                    if !recursive {
                        return Err(format!("{}: is a directory (use -r)", src.display()).into());
                    }
                    copy_dir_in(fs, src, &target)?;
                } else {
                    copy_file_in(fs, src, &target, m.permissions())?;
                }
            }
            (Some(s), None) => {
                let i = fs.resolve(s.as_bytes()).map_err(|e| fs_err(s, e))?;
                let dst = Path::new(dst);
                let target = if dst.is_dir() {
                    dst.join(split_parent(s).1)
                } else {
                    dst.to_path_buf()
                };
                if i.kind == Kind::Dir {
                    if !recursive {
                        return Err(format!("{s}: is a directory (use -r)").into());
                    }
                    copy_dir_out(fs, &i, &target)?;
                } else {
                    copy_file_out(fs, &i, s, &target)?;
                }
            }
            (Some(_), Some(_)) => {
                return Err("copying within the burst buffer: use the mount (cp there)".into())
            }
            (None, None) => return Err("one side of cp must be a bb:/ path".into()),
        }
    }
    Ok(0)
}

/// `cp x bb:/d` puts x in /d when /d is a directory (or there are several sources).
fn into_target(fs: &mut Fs, d: &str, name: Option<&std::ffi::OsStr>, many: bool) -> Res<String> {
    let is_dir = matches!(fs.resolve(d.as_bytes()), Ok(i) if i.kind == Kind::Dir);
    if is_dir || many || d.ends_with('/') {
        let name = name.ok_or("source has no name")?.to_string_lossy();
        Ok(format!("{}/{}", d.trim_end_matches('/'), name))
    } else {
        Ok(d.to_string())
    }
}

fn create_or_truncate(fs: &mut Fs, path: &str, mode: u32) -> Result<Inode, FsError> {
    let (parent, name) = split_parent(path);
    let p = fs.resolve(parent.as_bytes())?;
    match fs.lookup(p.id, name.as_bytes()) {
        Ok(i) if i.kind == Kind::Dir => Err(FsError::IsDir),
        Ok(i) => {
            fs.truncate(i.id, 0)?;
            Ok(i)
        }
        Err(FsError::NotFound) => {
            fs.create(p.id, name.as_bytes(), Kind::File, mode, uid(), gid(), b"")
        }
        Err(e) => Err(e),
    }
}

fn copy_file_in(fs: &mut Fs, src: &Path, dst: &str, perm: std::fs::Permissions) -> Res<()> {
    use std::os::unix::fs::PermissionsExt;
    let i = create_or_truncate(fs, dst, perm.mode() & 0o7777).map_err(|e| fs_err(dst, e))?;
    write_file_from(fs, src, &i, dst)
}

/// Writes local file `src` into burst-buffer file `i` (empty), pipelined, with a progress
/// bar.
fn write_file_from(fs: &mut Fs, src: &Path, i: &Inode, dst: &str) -> Res<()> {
    let mut f = std::fs::File::open(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let len = f.metadata()?.len();
    let b = bar(len, dst);
    fs.open_write(i.id).map_err(|e| fs_err(dst, e))?;
    let cs = fs.chunk_size() as usize;
    let mut buf = vec![0u8; cs * 4];
    let mut at = 0u64;
    let r: Res<()> = (|| loop {
        let n = read_full(&mut f, &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        fs.write(i.id, at, &buf[..n]).map_err(|e| fs_err(dst, e))?;
        at += n as u64;
        b.set_position(at);
    })();
    let published = fs.close_write(i.id);
    b.finish_and_clear();
    r?;
    published.map_err(|e| fs_err(dst, e))?;
    Ok(())
}

fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn copy_dir_in(fs: &mut Fs, src: &Path, dst: &str) -> Res<()> {
    let d = mkdir(fs, dst, true).map_err(|e| fs_err(dst, e))?;
    copy_dir_into(fs, src, &d, dst)
}

/// Copies the entries of local directory `src` into directory `d` (`shown`: its path for
/// messages), names as the bytes they are.
fn copy_dir_into(fs: &mut Fs, src: &Path, d: &Inode, shown: &str) -> Res<()> {
    use std::os::unix::ffi::OsStrExt;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let name = e.file_name();
        let n = name.as_bytes();
        let child_shown = format!("{}/{}", shown.trim_end_matches('/'), name.to_string_lossy());
        let m = std::fs::symlink_metadata(e.path())?;
        if m.is_dir() {
            let sub = match fs.lookup(d.id, n) {
                Ok(i) if i.kind == Kind::Dir => i,
                Ok(_) => return Err(fs_err(&child_shown, FsError::NotDir)),
                Err(FsError::NotFound) => fs
                    .create(d.id, n, Kind::Dir, 0o755, uid(), gid(), b"")
                    .map_err(|e| fs_err(&child_shown, e))?,
                Err(err) => return Err(fs_err(&child_shown, err)),
            };
            copy_dir_into(fs, &e.path(), &sub, &child_shown)?;
        } else if m.file_type().is_symlink() {
            let target = std::fs::read_link(e.path())?;
            fs.create(
                d.id,
                n,
                Kind::Symlink,
                0o777,
                uid(),
                gid(),
                target.as_os_str().as_bytes(),
            )
            .map_err(|e| fs_err(&child_shown, e))?;
        } else if m.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let i = match fs.lookup(d.id, n) {
                Ok(i) if i.kind == Kind::Dir => return Err(fs_err(&child_shown, FsError::IsDir)),
                Ok(i) => {
                    fs.truncate(i.id, 0).map_err(|e| fs_err(&child_shown, e))?;
                    i
                }
                Err(FsError::NotFound) => fs
                    .create(
                        d.id,
                        n,
                        Kind::File,
                        m.permissions().mode() & 0o7777,
                        uid(),
                        gid(),
                        b"",
                    )
                    .map_err(|e| fs_err(&child_shown, e))?,
                Err(err) => return Err(fs_err(&child_shown, err)),
            };
            write_file_from(fs, &e.path(), &i, &child_shown)?;
        }
    }
    Ok(())
}

fn copy_file_out(fs: &mut Fs, i: &Inode, name: &str, dst: &Path) -> Res<()> {
    if i.kind == Kind::Symlink {
        use std::os::unix::ffi::OsStrExt;
        let _ = std::fs::remove_file(dst);
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&i.target), dst)?;
        return Ok(());
    }
    fs.drop_cached(i.id);
    let mut out = std::fs::File::create(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let b = bar(i.size, name);
    let step = fs.chunk_size() as usize * 4;
    let mut at = 0u64;
    loop {
        let data = fs.read(i.id, at, step).map_err(|e| fs_err(name, e))?;
        if data.is_empty() {
            break;
        }
        out.write_all(&data)?;
        at += data.len() as u64;
        b.set_position(at);
    }
    out.sync_all()?;
    b.finish_and_clear();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(i.mode & 0o7777))?;
    Ok(())
}

fn copy_dir_out(fs: &mut Fs, d: &Inode, dst: &Path) -> Res<()> {
    std::fs::create_dir_all(dst)?;
    for e in fs.readdir(d.id)? {
        let i = fs.get_inode(e.id)?;
        let child = dst.join(std::ffi::OsStr::from_bytes_lossless(&e.name));
        if i.kind == Kind::Dir {
            copy_dir_out(fs, &i, &child)?;
        } else {
            copy_file_out(fs, &i, &String::from_utf8_lossy(&e.name), &child)?;
        }
    }
    Ok(())
}

trait FromBytes {
    fn from_bytes_lossless(b: &[u8]) -> &std::ffi::OsStr;
}
impl FromBytes for std::ffi::OsStr {
    fn from_bytes_lossless(b: &[u8]) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b)
    }
}

fn mode_string(i: &Inode) -> String {
    let t = match i.kind {
        Kind::Dir => 'd',
        Kind::Symlink => 'l',
        Kind::File => '-',
    };
    let mut s = String::from(t);
    for shift in [6, 3, 0] {
        let b = (i.mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn flushed_mark(i: &Inode) -> &'static str {
    if i.flags & memfabric_bb::layout::FLAG_STUB != 0 {
        "backing"
    } else if flush::is_dirty(i) {
        "unflushed"
    } else {
        "flushed"
    }
}

fn ls(fs: &mut Fs, path: &str) -> Res<u8> {
    let i = fs.resolve(path.as_bytes()).map_err(|e| fs_err(path, e))?;
    let mut out = std::io::stdout().lock();
    let rows = if i.kind == Kind::Dir {
        let mut v = Vec::new();
        for e in fs.readdir(i.id).map_err(|e| fs_err(path, e))? {
            v.push((e.name.clone(), fs.getattr(e.id)?));
        }
        v
    } else {
        vec![(split_parent(path).1.as_bytes().to_vec(), i)]
    };
    for (name, i) in rows {
        writeln!(
            out,
            "{} {:>12} {:<9} {}{}",
            mode_string(&i),
            i.size,
            flushed_mark(&i),
            String::from_utf8_lossy(&name),
            if i.kind == Kind::Symlink {
                format!(" -> {}", String::from_utf8_lossy(&i.target))
            } else {
                String::new()
            }
        )?;
    }
    Ok(0)
}

fn stat(fs: &mut Fs, path: &str) -> Res<u8> {
    let i = fs.resolve(path.as_bytes()).map_err(|e| fs_err(path, e))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "path      {path}")?;
    writeln!(out, "id        {}", i.id)?;
    writeln!(out, "kind      {:?}", i.kind)?;
    writeln!(out, "mode      {} ({:04o})", mode_string(&i), i.mode)?;
    writeln!(out, "owner     {}:{}", i.uid, i.gid)?;
    writeln!(out, "size      {}", i.size)?;
    writeln!(
        out,
        "chunks    {} of {} bytes",
        i.written_chunks().count(),
        i.chunk_size
    )?;
    writeln!(out, "gen       {}", i.gen)?;
    writeln!(
        out,
        "version   {} (flushed {})",
        i.version, i.flushed_version
    )?;
    writeln!(out, "state     {}", flushed_mark(&i))?;
    writeln!(out, "mtime     {}.{:09}", i.mtime.secs, i.mtime.nanos)?;
    writeln!(
        out,
        "sha256    {}",
        i.sha256
            .map_or("(not known: written out of order)".into(), |s| hex(&s))
    )?;
    if let Some(r) = flush::get_record(fs, i.id)? {
        writeln!(
            out,
            "flush     {:?}, {} of {} bytes{}",
            r.state,
            r.done,
            r.size,
            if r.error.is_empty() {
                String::new()
            } else {
                format!(", error: {}", String::from_utf8_lossy(&r.error))
            }
        )?;
    }
    Ok(0)
}

fn rm(fs: &mut Fs, path: &str, recursive: bool) -> Result<(), FsError> {
    let (parent, name) = split_parent(path);
    if name.is_empty() {
        return Err(FsError::Invalid("cannot remove the root".into()));
    }
    let p = fs.resolve(parent.as_bytes())?;
    rm_entry(fs, p.id, name.as_bytes(), recursive)
}

/// Removes `name` of directory `parent` (by ids and byte names: any name a directory can
/// hold), a directory with what it holds when `recursive`.
fn rm_entry(fs: &mut Fs, parent: u64, name: &[u8], recursive: bool) -> Result<(), FsError> {
    let i = fs.lookup(parent, name)?;
    if i.kind == Kind::Dir {
        if !recursive {
            return Err(FsError::IsDir);
        }
        for e in fs.readdir(i.id)? {
            rm_entry(fs, i.id, &e.name, true)?;
        }
    }
    let gone = fs.remove(parent, name, i.kind == Kind::Dir)?;
    flush::note_removed(fs, gone.id).map(|_| ())
}

fn stage_in(fs: &mut Fs, path: &str) -> Result<(), FsError> {
    let i = fs.resolve(path.as_bytes())?;
    stage_in_id(fs, &i)
}

fn stage_in_id(fs: &mut Fs, i: &Inode) -> Result<(), FsError> {
    match i.kind {
        Kind::File => fs.stage_if_stub(i.id),
        Kind::Symlink => Ok(()),
        Kind::Dir => {
            for e in fs.readdir(i.id)? {
                let child = fs.get_inode(e.id)?;
                stage_in_id(fs, &child)?;
            }
            Ok(())
        }
    }
}

fn run_flush(fs: &mut Fs, under: Option<&str>, opts: FlushOptions) -> Res<u8> {
    if fs.backing().is_none() {
        return Err("flush needs --backing DIR (or MEMFABRIC_BB_BACKING)".into());
    }
    if let Some(p) = under {
        let i = fs.resolve(p.as_bytes()).map_err(|e| fs_err(p, e))?;
        let n = flush::enqueue_dirty(fs, i.id)?;
        eprintln!("queued {n} unflushed under {p}");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut flusher = Flusher::new(opts);
    let mut current: Option<ProgressBar> = None;
    let sum = flusher.run(fs, &stop, &mut |ev| match ev {
        Event::Started {
            path,
            size,
            resumed_at,
        } => {
            let b = bar(*size, &String::from_utf8_lossy(path));
            b.set_position(*resumed_at);
            if *resumed_at > 0 {
                // Said on stderr even when the bar is not drawn (not a terminal).
                b.suspend(|| {
                    eprintln!(
                        "resuming {} at {resumed_at} bytes",
                        String::from_utf8_lossy(path)
                    )
                });
            }
            current = Some(b);
        }
        Event::Progress { done, .. } => {
            if let Some(b) = &current {
                b.set_position(*done);
            }
        }
        Event::Finished { path, size, sha256 } => {
            if let Some(b) = current.take() {
                b.finish_and_clear();
            }
            eprintln!(
                "flushed {} ({size} bytes, sha256 {})",
                String::from_utf8_lossy(path),
                hex(sha256)
            );
        }
        Event::Failed { path, error } => {
            if let Some(b) = current.take() {
                b.finish_and_clear();
            }
            eprintln!("failed {}: {error}", String::from_utf8_lossy(path));
        }
    })?;
    let _ = stop.load(Ordering::Relaxed);
    for p in &sum.open_for_writing {
        eprintln!(
            "left queued (open for writing): {}",
            String::from_utf8_lossy(p)
        );
    }
    eprintln!(
        "{} files, {} bytes flushed, {} failed",
        sum.files,
        sum.bytes,
        sum.failed.len()
    );
    Ok(if sum.failed.is_empty() { 0 } else { 2 })
}

fn status(fs: &mut Fs) -> Res<u8> {
    let mut out = std::io::stdout().lock();
    let q = flush::queued(fs)?;
    writeln!(out, "flush journal: {} queued", q.len())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    for r in &q {
        let lease = if r.lease_until_ms > now {
            format!("lease {} ms left", r.lease_until_ms - now)
        } else if r.owner != 0 {
            "lease expired".to_string()
        } else {
            String::new()
        };
        writeln!(
            out,
            "  {:?} {} {}/{} bytes {}",
            r.state,
            String::from_utf8_lossy(&r.path),
            r.done,
            r.size,
            lease
        )?;
    }
    let mut dirty = Vec::new();
    let mut stack = vec![(ROOT, String::new())];
    while let Some((d, p)) = stack.pop() {
        for e in fs.readdir(d)? {
            let i = fs.get_inode(e.id)?;
            let path = format!("{p}/{}", String::from_utf8_lossy(&e.name));
            if flush::is_dirty(&i) {
                dirty.push((path.clone(), i.size));
            }
            if i.kind == Kind::Dir {
                stack.push((e.id, path));
            }
        }
    }
    writeln!(
        out,
        "unflushed: {} ({} bytes)",
        dirty.len(),
        dirty.iter().map(|d| d.1).sum::<u64>()
    )?;
    for (p, size) in dirty {
        writeln!(out, "  {p} {size}")?;
    }
    Ok(0)
}

#[allow(clippy::too_many_arguments)]
fn mount(
    servers: &str,
    config: Config,
    opts: Options,
    dir: &Path,
    read_only: bool,
    flush_on_close: bool,
    flush_on_unmount: bool,
    allow_other: bool,
) -> Res<u8> {
    if !Path::new("/dev/fuse").exists() {
        return Err(
            "FUSE is not available here: /dev/fuse is missing (load the fuse module, \
                    or in a container give it the device)"
                .into(),
        );
    }
    if !dir.is_dir() {
        return Err(format!("{}: not a directory", dir.display()).into());
    }
    let mopts = MountOptions {
        read_only,
        flush_on_close: flush_on_close && opts.backing.is_some(),
        flush: FlushOptions::default(),
    };
    let make = |servers: String, config: Config, opts: Options| {
        Box::new(move || {
            let c = Client::new(servers.as_str(), config).map_err(FsError::from)?;
            Fs::open(c, opts)
        }) as memfabric_bb::mount::FsFactory
    };
    let flusher = mopts
        .flush_on_close
        .then(|| make(servers.to_string(), config.clone(), opts.clone()));
    let (fsys, bg) = BbMount::start(
        make(servers.to_string(), config.clone(), opts.clone()),
        &mopts,
        flusher,
    )?;
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        fuser::MountOption::FSName(format!("memfabric-bb:{}", opts.name)),
        fuser::MountOption::Subtype("memfabric".into()),
        fuser::MountOption::DefaultPermissions,
        if read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    if allow_other {
        fcfg.acl = fuser::SessionACL::All;
    }
    eprintln!(
        "memfabric bb: {} mounted at {} (umount {} to end)",
        opts.name,
        dir.display(),
        dir.display()
    );
    fuser::mount(fsys, dir, &fcfg).map_err(|e| format!("mount {}: {e}", dir.display()))?;
    // Unmounted: the kernel released every file, so the flusher has all there is.
    let mut code = 0;
    if let Some(bg) = bg {
        for e in bg.finish() {
            eprintln!("memfabric bb: flush: {e}");
            code = 2;
        }
    }
    if read_only || opts.backing.is_none() {
        return Ok(code);
    }
    let client = Client::new(servers, config)?;
    let mut fs = Fs::open(client, opts)?;
    if flush_on_unmount {
        let r = run_flush(&mut fs, Some("/"), FlushOptions::default())?;
        Ok(code.max(r))
    } else {
        status(&mut fs)?;
        Ok(code)
    }
}
