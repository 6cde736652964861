//! The FUSE file system: a POSIX mount over [`Fs`], with files flushed to the backing
//! directory in the background when they are closed.
//!
//! Inode numbers are the file system's ids (the root is 1, as FUSE's). Every operation
//! runs under one lock on the [`Fs`] (one client), so the kernel's requests are served one
//! at a time; chunk I/O inside one request is pipelined. Permission checks are the
//! kernel's (`default_permissions`), from the mode and owners the inodes keep.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::flush::{self, FlushOptions, Flusher};
use crate::fs::{Fs, FsError, SetAttr};
use crate::layout::{Inode, Kind, Time, NAME_MAX};

/// How long the kernel may keep names and attributes: short, so that other clients'
/// changes show soon (close-to-open holds regardless: an open re-reads the inode).
const TTL: Duration = Duration::from_secs(1);

struct Open {
    id: u64,
    write: bool,
}

/// What the cache thread owns: the client is not `Send`, so it lives on one thread and
/// the kernel's requests come to it as jobs.
struct State {
    fs: Fs,
    open: HashMap<u64, Open>,
    /// Each open directory's listing, taken at opendir: offsets stay valid while
    /// entries are added, removed or renamed (POSIX leaves those unspecified, but never a
    /// skipped or repeated entry).
    listings: HashMap<u64, Vec<(u64, FileType, Vec<u8>)>>,
    next_fh: u64,
    flush_queue: Option<mpsc::Sender<u64>>,
}

impl State {
    /// A removed file's flushed copy is removed from the backing directory too.
    fn note_removed(&mut self, id: u64) {
        if self.flush_queue.is_some() && matches!(flush::note_removed(&mut self.fs, id), Ok(true)) {
            self.queue_flush(id);
        }
    }

    fn queue_flush(&self, id: u64) {
        if let Some(tx) = &self.flush_queue {
            let _ = tx.send(id);
        }
    }
}

type Job = Box<dyn FnOnce(&mut State) + Send>;

/// Mount settings.
#[derive(Debug, Clone)]
pub struct MountOptions {
    pub read_only: bool,
    /// Queue a file for flushing to the backing directory when its last writer closes it.
    pub flush_on_close: bool,
    pub flush: FlushOptions,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            read_only: false,
            flush_on_close: true,
            flush: FlushOptions::default(),
        }
    }
}

/// The FUSE side of a mount: hands each request to the cache thread and answers the
/// kernel with the result.
pub struct BbMount {
    jobs: mpsc::Sender<Job>,
    chunk_size: u32,
}

/// A background flusher fed by the mount: ids of closed files.
pub struct BackgroundFlusher {
    thread: Option<std::thread::JoinHandle<()>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl BackgroundFlusher {
    /// Waits for the flusher to finish what was queued (the mount must be gone) and
    /// returns what failed.
    pub fn finish(mut self) -> Vec<String> {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Makes a file system on the thread that will use it (a client is not `Send`).
pub type FsFactory = Box<dyn FnOnce() -> Result<Fs, FsError> + Send>;

impl BbMount {
    /// Starts the cache thread (and, with `flusher`, a background flusher on its own
    /// client, which flushes files as they are closed).
    pub fn start(
        make_fs: FsFactory,
        opts: &MountOptions,
        flusher: Option<FsFactory>,
    ) -> Result<(BbMount, Option<BackgroundFlusher>), FsError> {
        let mut bg = None;
        let mut flush_tx = None;
        if let (Some(make), true) = (flusher, opts.flush_on_close && !opts.read_only) {
            let (tx, rx) = mpsc::channel::<u64>();
            let (ready_tx, ready_rx) = mpsc::channel();
            let errors = Arc::new(Mutex::new(Vec::new()));
            let errs = errors.clone();
            let fopts = opts.flush.clone();
            let thread = std::thread::Builder::new()
                .name("bb-flusher".into())
                .spawn(move || {
                    let mut ffs = match make() {
                        Ok(f) => {
                            let _ = ready_tx.send(Ok(()));
                            f
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let mut flusher = Flusher::new(fopts);
                    let stop = AtomicBool::new(false);
                    let push = |m: String| errs.lock().unwrap_or_else(|e| e.into_inner()).push(m);
                    while let Ok(id) = rx.recv() {
                        let mut ids = vec![id];
                        ids.extend(rx.try_iter());
                        ids.sort_unstable();
                        ids.dedup();
                        for id in ids {
                            // A directory (made, or renamed with what it holds) brings
                            // everything under it.
                            match flush::enqueue_dirty(&mut ffs, id) {
                                Ok(_) | Err(FsError::NotFound) => {}
                                Err(e) => push(format!("queue file {id}: {e}")),
                            }
                        }
                        match flusher.run(&mut ffs, &stop, &mut |_| {}) {
                            Ok(s) => {
                                for (p, e) in s.failed {
                                    push(format!("{}: {e}", String::from_utf8_lossy(&p)));
                                }
                            }
                            Err(e) => push(format!("flusher: {e}")),
                        }
                    }
                })
                .map_err(|e| FsError::Invalid(format!("spawn the flusher thread: {e}")))?;
            ready_rx
                .recv()
                .map_err(|_| FsError::Invalid("the flusher thread died".into()))??;
            flush_tx = Some(tx);
            bg = Some(BackgroundFlusher {
                thread: Some(thread),
                errors,
            });
        }
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("bb-cache".into())
            .spawn(move || {
                let fs = match make_fs() {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(fs.chunk_size()));
                let mut state = State {
                    fs,
                    open: HashMap::new(),
                    listings: HashMap::new(),
                    next_fh: 1,
                    flush_queue: flush_tx,
                };
                while let Ok(job) = rx.recv() {
                    job(&mut state);
                }
            })
            .map_err(|e| FsError::Invalid(format!("spawn the cache thread: {e}")))?;
        let chunk_size = ready_rx
            .recv()
            .map_err(|_| FsError::Invalid("the cache thread died".into()))??;
        Ok((BbMount { jobs, chunk_size }, bg))
    }

    /// Runs `f` on the cache thread and returns its result (EIO if that thread is gone).
    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, FsError> + Send + 'static,
    ) -> Result<T, Errno> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        if self.jobs.send(job).is_err() {
            return Err(Errno::from_i32(libc::EIO));
        }
        match rx.recv() {
            Ok(r) => r.map_err(|e| errno(&e)),
            Err(_) => Err(Errno::from_i32(libc::EIO)),
        }
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn attr(i: &Inode) -> FileAttr {
    FileAttr {
        ino: INodeNo(i.id),
        size: i.size,
        blocks: i.size.div_ceil(512),
        atime: i.atime.to_system(),
        mtime: i.mtime.to_system(),
        ctime: i.ctime.to_system(),
        crtime: i.ctime.to_system(),
        kind: file_type(i.kind),
        perm: (i.mode & 0o7777) as u16,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: 0,
        blksize: i.chunk_size,
        flags: 0,
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn time_of(t: TimeOrNow) -> Time {
    match t {
        TimeOrNow::Now => Time::now(),
        TimeOrNow::SpecificTime(s) => Time::from_system(s),
    }
}

impl Filesystem for BbMount {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let cs = self.chunk_size;
        let _ = config.set_max_write(cs.clamp(4096, 1 << 20));
        let _ = config.set_max_readahead(cs.clamp(4096, 1 << 20));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if name.len() > NAME_MAX {
            return reply.error(Errno::from_i32(libc::ENAMETOOLONG));
        }
        let name = name.as_bytes().to_vec();
        match self.call(move |s| {
            let i = s.fs.lookup(parent.0, &name)?;
            s.fs.getattr(i.id)
        }) {
            Ok(i) => reply.entry(&TTL, &attr(&i), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.call(move |s| s.fs.getattr(ino.0)) {
            Ok(i) => reply.attr(&TTL, &attr(&i)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_of),
            mtime: mtime.map(time_of),
        };
        match self.call(move |s| {
            s.fs.setattr(ino.0, &a)?;
            // Size, mode, owner and times are all in the backing copy.
            if a.size.is_some()
                || a.mode.is_some()
                || a.uid.is_some()
                || a.gid.is_some()
                || a.mtime.is_some()
            {
                s.queue_flush(ino.0);
            }
            s.fs.getattr(ino.0)
        }) {
            Ok(i) => reply.attr(&TTL, &attr(&i)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.call(move |s| {
            let i = s.fs.get_inode(ino.0)?;
            if i.kind == Kind::Symlink {
                Ok(i.target)
            } else {
                Err(FsError::Invalid("not a symbolic link".into()))
            }
        }) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.as_bytes().to_vec();
        let (uid, gid) = (req.uid(), req.gid());
        match self.call(move |s| {
            let i =
                s.fs.create(parent.0, &name, Kind::Dir, mode & !umask, uid, gid, b"")?;
            s.queue_flush(i.id);
            Ok(i)
        }) {
            Ok(i) => reply.entry(&TTL, &attr(&i), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes().to_vec();
        match self.call(move |s| {
            let gone = s.fs.remove(parent.0, &name, false)?;
            s.note_removed(gone.id);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes().to_vec();
        match self.call(move |s| {
            let gone = s.fs.remove(parent.0, &name, true)?;
            s.note_removed(gone.id);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = link_name.as_bytes().to_vec();
        let target = target.as_os_str().as_bytes().to_vec();
        let (uid, gid) = (req.uid(), req.gid());
        match self.call(move |s| {
            let i =
                s.fs.create(parent.0, &name, Kind::Symlink, 0o777, uid, gid, &target)?;
            s.queue_flush(i.id);
            Ok(i)
        }) {
            Ok(i) => reply.entry(&TTL, &attr(&i), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        match self.call(move |s| {
            s.fs.rename(parent.0, &name, newparent.0, &newname, noreplace)?;
            // Its new path is where it is flushed to now.
            if let Ok(i) = s.fs.lookup(newparent.0, &newname) {
                s.queue_flush(i.id);
            }
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        match self.call(move |s| {
            if write {
                s.fs.open_write(ino.0)?;
            } else {
                // Close-to-open: this open reads what is published now.
                s.fs.drop_cached(ino.0);
                s.fs.stage_if_stub(ino.0)?;
            }
            let fh = s.next_fh;
            s.next_fh += 1;
            s.open.insert(fh, Open { id: ino.0, write });
            s.fs.hold(ino.0);
            Ok(fh)
        }) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.call(move |s| s.fs.read(ino.0, offset, size as usize)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        match self.call(move |s| s.fs.write(ino.0, offset, &data)) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): what was written is published (close-to-open), and its errors are
        // close's.
        match self.call(move |s| {
            if s.open.get(&fh.0).is_some_and(|o| o.write) {
                s.fs.publish(ino.0)?;
            }
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.call(move |s| {
            let Some(o) = s.open.remove(&fh.0) else {
                return Ok(());
            };
            let r = if o.write {
                let r = s.fs.close_write(o.id);
                s.queue_flush(o.id);
                r.map(|_| ())
            } else {
                Ok(())
            };
            s.fs.unhold(o.id);
            r
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.call(move |s| s.fs.publish(ino.0).map(|_| ())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.call(move |s| {
            let entries = s.fs.readdir(ino.0)?;
            let parent = s.fs.get_inode(ino.0)?.parent;
            let mut all: Vec<(u64, FileType, Vec<u8>)> = vec![
                (ino.0, FileType::Directory, b".".to_vec()),
                (parent, FileType::Directory, b"..".to_vec()),
            ];
            all.extend(
                entries
                    .into_iter()
                    .map(|e| (e.id, file_type(e.kind), e.name)),
            );
            let fh = s.next_fh;
            s.next_fh += 1;
            s.listings.insert(fh, all);
            Ok(fh)
        }) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let all = match self.call(move |s| {
            Ok(s.listings
                .get(&fh.0)
                .map(|l| l.iter().skip(offset as usize).cloned().collect::<Vec<_>>()))
        }) {
            Ok(Some(rest)) => rest,
            Ok(None) => return reply.error(Errno::from_i32(libc::EBADF)),
            Err(e) => return reply.error(e),
        };
        for (i, (id, kind, name)) in all.into_iter().enumerate() {
            let next = offset + i as u64 + 1;
            if reply.add(INodeNo(id), next, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _ = self.call(move |s| {
            s.listings.remove(&fh.0);
            Ok(())
        });
        reply.ok()
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // A directory change is in the cache when its call returns.
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bsize = self.chunk_size;
        let r = self.call(move |s| {
            let (mut limit, mut used) = (0u64, 0u64);
            for (_, r) in s.fs.client().stats(None) {
                if let Ok(st) = r {
                    let get = |k: &str| {
                        st.iter()
                            .find(|(n, _)| n == k)
                            .and_then(|(_, v)| v.parse::<u64>().ok())
                            .unwrap_or(0)
                    };
                    limit += get("limit_maxbytes");
                    used += get("bytes");
                }
            }
            Ok((limit, used))
        });
        match r {
            Ok((limit, used)) => {
                let blocks = limit / bsize as u64;
                let free = limit.saturating_sub(used) / bsize as u64;
                reply.statfs(blocks, free, free, 1 << 32, 1 << 31, bsize, 255, bsize)
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.as_bytes().to_vec();
        let (uid, gid) = (req.uid(), req.gid());
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        match self.call(move |s| {
            let i =
                s.fs.create(parent.0, &name, Kind::File, mode & !umask, uid, gid, b"")?;
            if write {
                s.fs.open_write(i.id)?;
            }
            let fh = s.next_fh;
            s.next_fh += 1;
            s.open.insert(fh, Open { id: i.id, write });
            s.fs.hold(i.id);
            Ok((i, fh))
        }) {
            Ok((i, fh)) => reply.created(
                &TTL,
                &attr(&i),
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}
