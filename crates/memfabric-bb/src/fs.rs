//! The file system over a pool: namespace operations, pipelined chunk writes and reads,
//! close-to-open publication, truncation, and read-through from a backing directory.
//!
//! One [`Fs`] is one client's view (it owns a [`Client`]; it is not shared between
//! threads). Several clients — processes, mounts, flushers — may use the same file system
//! at once: namespace changes take a lock in the cache (an `add` with an expiry) around
//! their read-modify-write, and file contents follow close-to-open consistency
//! (docs/burst-buffer.md): what a writer wrote is visible to an `open` that starts after
//! the writer's `close` or `fsync` returned.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use memfabric_client::{Client, Error as CacheError, Handle, Reply, StoreStatus};

use crate::layout::{
    chunk_decode, chunk_encode, chunk_seal, now_ms, valid_name, Dir, Entry, Inode, Keys, Kind,
    LayoutError, Superblock, Time, CHUNK_HEADER, FLAG_LISTED, FLAG_OPAQUE, FLAG_STUB, NAME_MAX,
    ROOT, WHITEOUT,
};

/// Every way a file-system operation fails, each with the errno a local file system gives.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("no space left in the cache: {0}")]
    NoSpace(String),
    #[error("file too large")]
    TooBig,
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    #[error("{0} is locked by another client")]
    Locked(String),
    /// Another client changed what this operation looked at between its look and its
    /// change (retried inside; EAGAIN if it keeps happening).
    #[error("{0} changed while it was being changed")]
    Raced(String),
    #[error("damaged or lost object: {0}")]
    Corrupt(String),
    #[error("cache: {0}")]
    Cache(CacheError),
    #[error("backing directory: {0}")]
    Backing(String, i32),
}

impl FsError {
    /// The errno a local file system would answer.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::TooBig => libc::EFBIG,
            FsError::NotSupported(_) => libc::EOPNOTSUPP,
            FsError::Locked(_) | FsError::Raced(_) => libc::EAGAIN,
            FsError::Corrupt(_) | FsError::Cache(_) => libc::EIO,
            FsError::Backing(_, e) => *e,
        }
    }
    fn backing(e: std::io::Error, what: &Path) -> FsError {
        FsError::Backing(
            format!("{}: {e}", what.display()),
            e.raw_os_error().unwrap_or(libc::EIO),
        )
    }
}

impl From<CacheError> for FsError {
    fn from(e: CacheError) -> FsError {
        // memcached's answer to a set that needs memory it may not evict for (`-M`) or
        // cannot find: the cache is full, as a disk is.
        let full = |s: &str| s.contains("out of memory");
        match &e {
            CacheError::Server(s) if full(s) => FsError::NoSpace(s.clone()),
            CacheError::NotEnoughCopies { cause, .. } if full(cause) => {
                FsError::NoSpace(cause.clone())
            }
            _ => FsError::Cache(e),
        }
    }
}

impl From<LayoutError> for FsError {
    fn from(e: LayoutError) -> FsError {
        FsError::Corrupt(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// How to open a file system.
#[derive(Debug, Clone)]
pub struct Options {
    /// The file system's name: its keys are `bb:<name>:...` (several share a pool).
    pub name: String,
    /// Chunk size of a new file system (0: the largest power of two up to 512 KiB that
    /// fits the servers' item size limit). An existing one keeps its own.
    pub chunk_size: u32,
    /// Chunk writes and reads in flight per file.
    pub depth: usize,
    /// The backing directory (the parallel file system): read-through of paths not in the
    /// cache, and where flushes go.
    pub backing: Option<PathBuf>,
    /// How long a lock in the cache lives if its holder dies (seconds).
    pub lock_ttl: u32,
    /// How long to wait for a lock another client holds.
    pub lock_wait: Duration,
    /// Deadline of each cache request this layer waits for.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            name: "default".into(),
            chunk_size: 0,
            depth: 16,
            backing: None,
            lock_ttl: 30,
            lock_wait: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
        }
    }
}

/// How long an open for writing keeps flushers away without a publication (a writer that
/// died stops holding its file after this).
pub const WRITE_LEASE_MS: u64 = 120_000;

/// The largest chunk (data and header) the servers' item size limit leaves room for: an
/// item also holds its header and key.
fn chunk_fits(chunk: u32, item_max: usize) -> bool {
    chunk as usize + CHUNK_HEADER + 256 <= item_max
}

/// Bytes of a chunk this writer wrote, not yet stored: the chunk object's header room,
/// then the chunk's bytes up to the last one written (zeros where nothing was), and which
/// ranges are this writer's.
struct Partial {
    obj: Vec<u8>,
    dirty: Vec<(usize, usize)>,
}

impl Partial {
    fn new(cs: usize) -> Partial {
        let mut obj = Vec::with_capacity(CHUNK_HEADER + cs);
        obj.resize(CHUNK_HEADER, 0);
        Partial {
            obj,
            dirty: Vec::new(),
        }
    }
    fn put(&mut self, within: usize, piece: &[u8]) {
        let (from, to) = (CHUNK_HEADER + within, CHUNK_HEADER + within + piece.len());
        if self.obj.len() < to {
            self.obj.resize(to, 0);
        }
        self.obj[from..to].copy_from_slice(piece);
        self.dirty.push((within, within + piece.len()));
        self.dirty.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.dirty.len());
        for &(a, b) in &self.dirty {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        self.dirty = merged;
    }
    fn covers(&self, cs: usize) -> bool {
        self.dirty == [(0, cs)]
    }
    /// `base` (the chunk's stored bytes) with this writer's ranges over it.
    fn over(&self, base: &[u8]) -> Vec<u8> {
        let end = self.dirty.last().map_or(0, |d| d.1).max(base.len());
        let mut out = Vec::with_capacity(CHUNK_HEADER + end);
        out.resize(CHUNK_HEADER, 0);
        out.extend_from_slice(base);
        out.resize(CHUNK_HEADER + end, 0);
        for &(a, b) in &self.dirty {
            out[CHUNK_HEADER + a..CHUNK_HEADER + b]
                .copy_from_slice(&self.obj[CHUNK_HEADER + a..CHUNK_HEADER + b]);
        }
        out
    }
}

/// Partly written chunks a writer keeps before merging some into the store.
const MAX_PARTIALS: usize = 64;

/// What a writer of one file has not published yet.
struct WriteState {
    /// The inode as it was when writing started (generation, chunk size, bitmap).
    base: Inode,
    /// Chunks this writer wrote only parts of: merged with the stored chunk under the
    /// inode's lock (at publication, or when there are too many), so that writers of
    /// disjoint parts of one chunk all keep theirs.
    partial: BTreeMap<u64, Partial>,
    /// Chunk writes in flight, oldest first.
    inflight: VecDeque<(Handle, u64)>,
    /// Chunks this writer stored whole (or merged).
    written: BTreeSet<u64>,
    /// The size after this writer's writes.
    size: u64,
    /// The first failure: every later write and publication fails with it (what was
    /// written since the last publication is not published), until the last close.
    failed: Option<FsError>,
    /// Open handles writing this file.
    writers: usize,
}

/// Decoded chunks kept for readers, and reads in flight (read-ahead).
#[derive(Default)]
struct ReadCache {
    /// (id, gen, chunk) → (the inode version it was read at, data).
    chunks: HashMap<(u64, u64, u64), (u64, Bytes)>,
    order: VecDeque<(u64, u64, u64)>,
    pending: HashMap<(u64, u64, u64), (u64, Handle)>,
}

/// Attributes a caller may change (`setattr`).
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
}

/// A file system in the cache, as one client sees it.
pub struct Fs {
    client: Client,
    keys: Keys,
    opts: Options,
    chunk_size: u32,
    item_max: usize,
    writes: HashMap<u64, WriteState>,
    cache: ReadCache,
    lock_owner: u64,
    /// Opens of files through this client (see [`Fs::hold`]).
    held: HashMap<u64, usize>,
    /// Unlinked files still open here: deleted at their last close.
    orphans: HashMap<u64, Inode>,
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() | 1
}

impl Fs {
    /// Opens the file system `opts.name` on the pool, creating it (superblock, root) if
    /// the pool has none.
    pub fn open(mut client: Client, opts: Options) -> Result<Fs> {
        let keys = Keys::new(&opts.name).ok_or_else(|| {
            FsError::Invalid(format!(
                "file system name {:?}: 1 to 64 of A-Z a-z 0-9 _ . -",
                opts.name
            ))
        })?;
        let item_max = item_size_max(&mut client)?;
        let mut fs = Fs {
            client,
            keys,
            chunk_size: 0,
            item_max,
            writes: HashMap::new(),
            cache: ReadCache::default(),
            lock_owner: random_u64(),
            held: HashMap::new(),
            orphans: HashMap::new(),
            opts,
        };
        let sb = match fs.client.get(&fs.keys.superblock())? {
            Some(v) => Superblock::decode(&v.data)?,
            None => {
                let chunk_size = match fs.opts.chunk_size {
                    0 => {
                        let mut c = 512 * 1024u32;
                        while c > 4096 && !chunk_fits(c, item_max) {
                            c /= 2;
                        }
                        c
                    }
                    c => c,
                };
                let sb = Superblock { chunk_size };
                if !chunk_fits(chunk_size, item_max) {
                    return Err(too_large_chunk(chunk_size, item_max));
                }
                if !fs.client.add(&fs.keys.superblock(), &sb.encode(), 0, 0)? {
                    // Another client created it first: use theirs.
                    let v = fs
                        .client
                        .get(&fs.keys.superblock())?
                        .ok_or_else(|| FsError::Corrupt("superblock vanished".into()))?;
                    Superblock::decode(&v.data)?
                } else {
                    sb
                }
            }
        };
        if !chunk_fits(sb.chunk_size, item_max) {
            return Err(too_large_chunk(sb.chunk_size, item_max));
        }
        fs.chunk_size = sb.chunk_size;
        if fs.client.get(&fs.keys.inode(ROOT))?.is_none() {
            let mut root = Inode::new(ROOT, Kind::Dir, 0o755, ROOT, sb.chunk_size);
            // The creator owns the root, as mkfs makes it.
            root.uid = current_uid();
            root.gid = current_gid();
            fs.client
                .add(&fs.keys.dir(ROOT), &Dir::default().encode(), 0, 0)?;
            fs.client.add(&fs.keys.inode(ROOT), &root.encode(), 0, 0)?;
            fs.client.add(&fs.keys.next_id(), b"1", 0, 0)?;
        }
        Ok(fs)
    }

    pub fn chunk_size(&self) -> u32 {
        self.chunk_size
    }
    pub fn backing(&self) -> Option<&Path> {
        self.opts.backing.as_deref()
    }
    pub fn options(&self) -> &Options {
        &self.opts
    }
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }
    pub fn item_size_max(&self) -> usize {
        self.item_max
    }

    // ---- objects ----

    pub fn get_inode(&mut self, id: u64) -> Result<Inode> {
        match self.client.get(&self.keys.inode(id))? {
            Some(v) => {
                let i = Inode::decode(&v.data)?;
                if i.id != id {
                    return Err(FsError::Corrupt(format!("inode {id} holds inode {}", i.id)));
                }
                Ok(i)
            }
            None => Err(FsError::NotFound),
        }
    }

    pub(crate) fn put_inode(&mut self, i: &Inode) -> Result<()> {
        Ok(self.client.set(&self.keys.inode(i.id), &i.encode(), 0, 0)?)
    }

    /// Read-modify-write of an inode under its lock (`i<id>`), so that concurrent changes
    /// of different fields (a chmod, a flush mark, a new entry's nlink) are not lost.
    /// Locks nest directory (`d`) first, inode (`i`) second, never the other way.
    pub(crate) fn update_inode(&mut self, id: u64, f: impl FnOnce(&mut Inode)) -> Result<Inode> {
        self.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            f(&mut i);
            fs.put_inode(&i)?;
            Ok(i)
        })
    }

    fn get_dir(&mut self, id: u64) -> Result<Dir> {
        match self.client.get(&self.keys.dir(id))? {
            Some(v) => Ok(Dir::decode(&v.data)?),
            None => Err(FsError::Corrupt(format!(
                "directory {id} has no entries object"
            ))),
        }
    }

    fn put_dir(&mut self, id: u64, d: &Dir) -> Result<()> {
        let b = d.encode();
        if b.len() + 512 > self.item_max {
            return Err(FsError::NoSpace(format!(
                "directory {id} would hold {} entries ({} bytes), over the item size limit",
                d.entries.len(),
                b.len()
            )));
        }
        Ok(self.client.set(&self.keys.dir(id), &b, 0, 0)?)
    }

    /// A new id: the counter in the cache, checked against existing inodes by the `add`
    /// that creates the inode (a counter that was lost and restarted cannot reuse an id).
    fn alloc_inode(&mut self, mut make: impl FnMut(u64) -> Inode) -> Result<Inode> {
        for attempt in 0..64 {
            let key = self.keys.next_id();
            let step = if attempt == 0 {
                1
            } else {
                1 << attempt.min(20)
            };
            let id = match self.client.incr(&key, step)? {
                Some(n) => n,
                None => {
                    self.client.add(&key, b"1", 0, 0)?;
                    continue;
                }
            };
            if id <= ROOT {
                continue;
            }
            let inode = make(id);
            if self
                .client
                .add(&self.keys.inode(id), &inode.encode(), 0, 0)?
            {
                return Ok(inode);
            }
        }
        Err(FsError::Corrupt("no free inode id found".into()))
    }

    /// Runs `f` holding the cache lock `name` (an `add` of a key with an expiry, so a dead
    /// holder's lock ends by itself).
    pub(crate) fn with_lock<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut Fs) -> Result<T>,
    ) -> Result<T> {
        let key = self.keys.lock(name);
        let owner = self.lock_owner.to_string();
        let deadline = Instant::now() + self.opts.lock_wait;
        let mut pause = Duration::from_micros(200);
        loop {
            if self
                .client
                .add(&key, owner.as_bytes(), 0, self.opts.lock_ttl)?
            {
                break;
            }
            if Instant::now() >= deadline {
                return Err(FsError::Locked(name.to_string()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        let r = f(self);
        // Only our own: a lock that outlived its expiry may be someone else's by now.
        if matches!(self.client.get(&key), Ok(Some(v)) if v.data == owner.as_bytes()) {
            let _ = self.client.delete(&key);
        }
        r
    }

    // ---- names ----

    /// The entry `name` of directory `parent`, reading it through from the backing
    /// directory when the cache does not have it.
    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<Inode> {
        self.lookup_in(parent, name, true)
    }

    /// The entry `name` of directory `parent` as the cache has it (no read-through).
    pub fn lookup_cached(&mut self, parent: u64, name: &[u8]) -> Result<Inode> {
        self.lookup_in(parent, name, false)
    }

    fn lookup_in(&mut self, parent: u64, name: &[u8], read_through: bool) -> Result<Inode> {
        check_name(name)?;
        let p = self.get_inode(parent)?;
        if p.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        let dir = self.get_dir(parent)?;
        match dir.find(name) {
            Some(e) if e.id == WHITEOUT => Err(FsError::NotFound),
            Some(e) => {
                let id = e.id;
                self.get_inode(id)
            }
            // A directory made in the cache is opaque: nothing below it comes from the
            // backing directory (a removed one's flushed files must not reappear).
            None if !read_through || p.flags & FLAG_OPAQUE != 0 => Err(FsError::NotFound),
            None => match self.backing_path_of_child(&p, name)? {
                Some(path) => self.stub_from_backing(parent, name, &path),
                None => Err(FsError::NotFound),
            },
        }
    }

    /// The live entries of a directory as the cache has them (no read-through).
    pub fn readdir_cached(&mut self, id: u64) -> Result<Vec<Entry>> {
        if self.get_inode(id)?.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(self.get_dir(id)?.live().cloned().collect())
    }

    /// The inode at `path` as the cache has it (no read-through).
    pub fn resolve_cached(&mut self, path: &[u8]) -> Result<Inode> {
        let mut at = self.get_inode(ROOT)?;
        for c in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            if c == b".." {
                at = self.get_inode(at.parent)?;
                continue;
            }
            at = self.lookup_cached(at.id, c)?;
        }
        Ok(at)
    }

    /// The live entries of a directory (merging in the backing directory's the first time).
    pub fn readdir(&mut self, id: u64) -> Result<Vec<Entry>> {
        let mut d = self.get_inode(id)?;
        if d.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if d.flags & FLAG_LISTED == 0 {
            if let Some(path) = self.backing_path_of(&d)? {
                self.merge_backing_dir(&mut d, &path)?;
            }
        }
        Ok(self.get_dir(id)?.live().cloned().collect())
    }

    /// Creates a file, directory or symbolic link (the arguments of mknod/mkdir/symlink
    /// and the caller's identity, as FUSE hands them over).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: u32,
        uid: u32,
        gid: u32,
        target: &[u8],
    ) -> Result<Inode> {
        check_name(name)?;
        let cs = self.chunk_size;
        let name_s = name.to_vec();
        let target = target.to_vec();
        let backing = self.backing_path_of_child_if_any(parent, name)?;
        let made = self.with_lock(&format!("d{parent}"), |fs| {
            let p = fs.get_inode(parent)?;
            if p.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            let mut dir = fs.get_dir(parent)?;
            match dir.find(&name_s) {
                Some(e) if e.id != WHITEOUT => return Err(FsError::Exists),
                Some(_) => {}
                None if backing.is_some() => return Err(FsError::Exists),
                None => {}
            }
            // A set-group-ID directory gives its group to what is made in it (and the
            // bit to its subdirectories), as on a local file system.
            let setgid = p.mode & libc::S_ISGID != 0;
            let gid = if setgid { p.gid } else { gid };
            let mode = if setgid && kind == Kind::Dir {
                mode | libc::S_ISGID
            } else {
                mode
            };
            let inode = fs.alloc_inode(|id| {
                let mut i = Inode::new(id, kind, mode, parent, cs);
                i.uid = uid;
                i.gid = gid;
                i.target = target.clone();
                // Version 1, flushed 0: the backing directory does not have it yet.
                i.version = 1;
                if kind == Kind::Symlink {
                    i.size = target.len() as u64;
                }
                // A new directory has nothing in the backing directory to merge, and
                // nothing below it is read through.
                if kind == Kind::Dir {
                    i.flags |= FLAG_LISTED | FLAG_OPAQUE;
                }
                i
            })?;
            if kind == Kind::Dir {
                fs.client
                    .set(&fs.keys.dir(inode.id), &Dir::default().encode(), 0, 0)?;
            }
            dir.remove(&name_s);
            dir.entries.push(Entry {
                name: name_s.clone(),
                id: inode.id,
                kind,
            });
            if let Err(e) = fs.put_dir(parent, &dir) {
                let _ = fs.client.delete(&fs.keys.inode(inode.id));
                return Err(e);
            }
            fs.update_inode(parent, |p| {
                p.mtime = Time::now();
                p.ctime = p.mtime;
                if kind == Kind::Dir {
                    p.nlink += 1;
                }
            })?;
            Ok(inode)
        })?;
        Ok(made)
    }

    /// Removes a name: a file or link (`dir == false`) or an empty directory. Returns what
    /// it named (its objects are gone).
    pub fn remove(&mut self, parent: u64, name: &[u8], dir: bool) -> Result<Inode> {
        check_name(name)?;
        // Resolve first (read-through), so that a backing-only name gets its whiteout.
        let target = self.lookup(parent, name)?;
        let in_backing = self.backing_path_of_child_if_any(parent, name)?.is_some();
        let name_s = name.to_vec();
        let removed = self.with_lock(&format!("d{parent}"), |fs| {
            let mut d = fs.get_dir(parent)?;
            let e = match d.find(&name_s) {
                Some(e) if e.id != WHITEOUT && e.id == target.id => e.clone(),
                _ => return Err(FsError::NotFound),
            };
            let inode = fs.get_inode(e.id)?;
            match (dir, inode.kind) {
                (false, Kind::Dir) => return Err(FsError::IsDir),
                (true, k) if k != Kind::Dir => return Err(FsError::NotDir),
                (true, _) => {
                    // A directory read through but never listed may still have backing
                    // entries: it is empty only if the backing directory is too.
                    let sub = fs.readdir(inode.id)?;
                    if !sub.is_empty() {
                        return Err(FsError::NotEmpty);
                    }
                }
                _ => {}
            }
            d.remove(&name_s);
            if in_backing {
                d.entries.push(Entry {
                    name: name_s.clone(),
                    id: WHITEOUT,
                    kind: inode.kind,
                });
            }
            fs.put_dir(parent, &d)?;
            fs.update_inode(parent, |p| {
                p.mtime = Time::now();
                p.ctime = p.mtime;
                if inode.kind == Kind::Dir {
                    p.nlink = p.nlink.saturating_sub(1);
                }
            })?;
            Ok(inode)
        })?;
        self.forget_objects(&removed);
        Ok(removed)
    }

    /// Deletes what an unlinked inode held (best effort: what is left is garbage no name
    /// reaches, and the cache evicts it like any cold item). A file this client holds
    /// open keeps everything until its last release, as POSIX keeps an unlinked open file.
    fn forget_objects(&mut self, inode: &Inode) {
        if self.held.contains_key(&inode.id) {
            self.orphans.insert(inode.id, inode.clone());
            return;
        }
        self.writes.remove(&inode.id);
        self.drop_cached(inode.id);
        let mut hs = Vec::new();
        for n in inode.written_chunks() {
            hs.push(self.client.submit(memfabric_client::Op::Delete {
                key: self.keys.chunk(inode.id, inode.gen, n),
            }));
        }
        if inode.kind == Kind::Dir {
            let _ = self.client.delete(&self.keys.dir(inode.id));
        }
        let _ = self.client.wait_all(&hs, self.opts.timeout);
        let _ = self.client.delete(&self.keys.inode(inode.id));
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent`, replacing what is there as
    /// rename(2) does. `noreplace`: fail with EEXIST instead (RENAME_NOREPLACE).
    pub fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        noreplace: bool,
    ) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.rename_once(parent, name, new_parent, new_name, noreplace) {
                Err(FsError::Raced(_)) if tries < 8 => tries += 1,
                r => return r,
            }
        }
    }

    fn rename_once(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        noreplace: bool,
    ) -> Result<()> {
        check_name(name)?;
        check_name(new_name)?;
        let src = self.lookup(parent, name)?;
        // A read-through directory takes its backing entries along: merged before it
        // moves, since below its new name the backing directory has none.
        if src.kind == Kind::Dir && src.flags & FLAG_LISTED == 0 {
            self.readdir(src.id)?;
        }
        let dst = match self.lookup(new_parent, new_name) {
            Ok(d) => Some(d),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let np = self.get_inode(new_parent)?;
        if np.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if let Some(d) = &dst {
            if d.id == src.id {
                return Ok(());
            }
            if noreplace {
                return Err(FsError::Exists);
            }
            match (src.kind == Kind::Dir, d.kind == Kind::Dir) {
                (false, true) => return Err(FsError::IsDir),
                (true, false) => return Err(FsError::NotDir),
                (true, true) if !self.readdir(d.id)?.is_empty() => return Err(FsError::NotEmpty),
                _ => {}
            }
        }
        if src.kind == Kind::Dir {
            // Not into itself or below it.
            let mut at = new_parent;
            for depth in 0.. {
                if depth > 4096 {
                    return Err(FsError::Corrupt("directory loop".into()));
                }
                if at == src.id {
                    return Err(FsError::Invalid(
                        "a directory cannot move below itself".into(),
                    ));
                }
                if at == ROOT {
                    break;
                }
                at = self.get_inode(at)?.parent;
            }
        }
        let (a, b) = (parent.min(new_parent), parent.max(new_parent));
        let name_s = name.to_vec();
        let new_name_s = new_name.to_vec();
        let replaced = self.with_lock(&format!("d{a}"), |fs| {
            let body = |fs: &mut Fs| -> Result<Option<Inode>> {
                let mut sd = fs.get_dir(parent)?;
                match sd.find(&name_s) {
                    Some(e) if e.id == src.id => {}
                    _ => return Err(FsError::NotFound),
                }
                let mut dd = if parent == new_parent {
                    None
                } else {
                    Some(fs.get_dir(new_parent)?)
                };
                let target_dir = dd.as_mut().unwrap_or(&mut sd);
                let old = target_dir.remove(&new_name_s).filter(|e| e.id != WHITEOUT);
                if old.as_ref().map(|e| e.id) != dst.as_ref().map(|d| d.id) {
                    // Changed since we looked: look again.
                    return Err(FsError::Raced(format!("directory {new_parent}")));
                }
                target_dir.entries.push(Entry {
                    name: new_name_s.clone(),
                    id: src.id,
                    kind: src.kind,
                });
                sd.remove(&name_s);
                // Looked at under the directory's lock, which a flusher holds while it
                // publishes a copy under this name (`publish_in_backing`): either the copy
                // is there now and gets its whiteout here, or the flusher finds the name
                // gone and puts the whiteout itself.
                let src_in_backing = fs.backing_path_of_child_if_any(parent, &name_s)?.is_some();
                if src_in_backing {
                    sd.entries.push(Entry {
                        name: name_s.clone(),
                        id: WHITEOUT,
                        kind: src.kind,
                    });
                }
                if let Some(dd) = &dd {
                    fs.put_dir(new_parent, dd)?;
                }
                fs.put_dir(parent, &sd)?;
                let now = Time::now();
                fs.update_inode(src.id, |m| {
                    m.parent = new_parent;
                    m.ctime = now;
                    // Its backing copy is under the old name: a file or link is flushed
                    // again under the new one (and the old copy removed).
                    if m.kind != Kind::Dir && m.flags & FLAG_STUB == 0 {
                        m.version += 1;
                    }
                })?;
                let dir_moved = src.kind == Kind::Dir && parent != new_parent;
                let replaced_dir = dst.as_ref().is_some_and(|d| d.kind == Kind::Dir);
                fs.update_inode(parent, |p| {
                    p.mtime = now;
                    p.ctime = now;
                    if dir_moved {
                        p.nlink = p.nlink.saturating_sub(1);
                    }
                    if parent == new_parent && replaced_dir {
                        p.nlink = p.nlink.saturating_sub(1);
                    }
                })?;
                if parent != new_parent {
                    fs.update_inode(new_parent, |q| {
                        q.mtime = now;
                        q.ctime = now;
                        if dir_moved && !replaced_dir {
                            q.nlink += 1;
                        }
                    })?;
                }
                Ok(dst.clone())
            };
            if a == b {
                body(fs)
            } else {
                fs.with_lock(&format!("d{b}"), body)
            }
        })?;
        if let Some(old) = replaced {
            self.forget_objects(&old);
        }
        Ok(())
    }

    /// Runs `publish` (the flusher's rename of a verified copy of a file to `parent`/`name`
    /// in the backing directory) under the directory's lock, as renames and removals in the
    /// cache take it. If the cache no longer has the file under that name (renamed or
    /// removed meanwhile; it will be flushed again, or its copies removed), a whiteout
    /// hides the copy just published, so that read-through does not bring the old name
    /// back before the next flush removes it.
    pub(crate) fn publish_in_backing(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        publish: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let name = name.to_vec();
        self.with_lock(&format!("d{parent}"), |fs| {
            publish()?;
            match fs.get_inode(parent) {
                Ok(_) => {}
                // The directory itself is gone: its removal takes care of its backing copy.
                Err(FsError::NotFound) => return Ok(()),
                Err(e) => return Err(e),
            }
            let mut d = fs.get_dir(parent)?;
            if d.find(&name).is_some() {
                // The file itself, another file of that name (which hides the copy), or a
                // whiteout already.
                return Ok(());
            }
            d.entries.push(Entry {
                name,
                id: WHITEOUT,
                kind,
            });
            fs.put_dir(parent, &d)
        })
    }

    /// Changes attributes; a size truncates or extends the file.
    pub fn setattr(&mut self, id: u64, a: &SetAttr) -> Result<Inode> {
        if let Some(size) = a.size {
            self.truncate(id, size)?;
        }
        // A read-through file whose attributes change becomes the cache's own (its
        // content staged first: the stub's times identify its backing file).
        if a.mode.is_some()
            || a.uid.is_some()
            || a.gid.is_some()
            || a.mtime.is_some()
            || a.atime.is_some()
        {
            self.stage_if_stub(id)?;
        }
        self.publish(id)?;
        self.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            if let Some(m) = a.mode {
                i.mode = m & 0o7777;
            }
            if let Some(u) = a.uid {
                i.uid = u;
            }
            if let Some(g) = a.gid {
                i.gid = g;
            }
            if let Some(t) = a.atime {
                i.atime = t;
            }
            if let Some(t) = a.mtime {
                i.mtime = t;
            }
            i.ctime = Time::now();
            // The backing copy carries mode and times too: it is out of date now.
            if a.mode.is_some() || a.uid.is_some() || a.gid.is_some() || a.mtime.is_some() {
                i.version += 1;
            }
            fs.put_inode(&i)?;
            Ok(i)
        })
    }

    /// Sets the size: chunks past it are forgotten and the last one is cut, so that an
    /// extension later reads zeros there, as truncate(2) promises.
    pub fn truncate(&mut self, id: u64, size: u64) -> Result<()> {
        self.publish(id)?;
        self.stage_if_stub(id)?;
        let (old, now) = self.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            if i.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            let cs = i.chunk_size as u64;
            let old = i.clone();
            if size == i.size {
                return Ok((old, i));
            }
            if size == 0 {
                i.gen += 1;
                i.chunks.clear();
            } else if size < i.size {
                let last = (size - 1) / cs;
                let keep = (size - last * cs) as usize;
                if i.has_chunk(last) && keep < cs as usize {
                    let key = fs.keys.chunk(id, i.gen, last);
                    if let Some(v) = fs.client.get(&key)? {
                        let data = chunk_decode(&v.data, id, i.gen, last)?;
                        if data.len() > keep {
                            let cut = chunk_encode(id, i.gen, last, &data[..keep]);
                            fs.client.set(&key, &cut, 0, 0)?;
                        }
                    }
                }
                i.clear_chunks_from(last + 1);
            }
            i.size = size;
            i.sha256 = None;
            i.version += 1;
            i.mtime = Time::now();
            i.ctime = i.mtime;
            fs.put_inode(&i)?;
            Ok((old, i))
        })?;
        self.drop_cached(id);
        // A writer of this file goes on from the truncated content (generation, chunks,
        // size); what it had was published above.
        if let Some(w) = self.writes.get_mut(&id) {
            w.base = now.clone();
            w.size = now.size;
            w.written.clear();
        }
        // Chunks of the old content that no longer belong to the file.
        let mut hs = Vec::new();
        for n in old.written_chunks() {
            if now.gen != old.gen || !now.has_chunk(n) {
                hs.push(self.client.submit(memfabric_client::Op::Delete {
                    key: self.keys.chunk(id, old.gen, n),
                }));
            }
        }
        let _ = self.client.wait_all(&hs, self.opts.timeout);
        Ok(())
    }

    // ---- contents ----

    /// An open of `id` through this client: an unlink or a rename over it keeps its
    /// content until the matching [`Fs::unhold`].
    pub fn hold(&mut self, id: u64) {
        *self.held.entry(id).or_default() += 1;
    }

    /// The matching close of [`Fs::hold`]: an unlinked file's last one deletes it.
    pub fn unhold(&mut self, id: u64) {
        let Some(n) = self.held.get_mut(&id) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.held.remove(&id);
            if let Some(inode) = self.orphans.remove(&id) {
                self.forget_objects(&inode);
            }
        }
    }

    /// Prepares a file for writing through this client (an open for writing).
    pub fn open_write(&mut self, id: u64) -> Result<()> {
        self.stage_if_stub(id)?;
        if let Some(w) = self.writes.get_mut(&id) {
            w.writers += 1;
            return Ok(());
        }
        let base = self.get_inode(id)?;
        if base.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        let base = self.update_inode(id, |i| i.writing_until_ms = now_ms() + WRITE_LEASE_MS)?;
        self.drop_cached(id);
        self.writes.insert(
            id,
            WriteState {
                size: base.size,
                base,
                partial: BTreeMap::new(),
                inflight: VecDeque::new(),
                written: BTreeSet::new(),
                failed: None,
                writers: 1,
            },
        );
        Ok(())
    }

    /// Writes `data` at `offset` (the file must be open for writing here). Whole chunks go
    /// out at once, many in flight; parts of chunks wait in memory to be merged with the
    /// stored chunk under the inode's lock.
    pub fn write(&mut self, id: u64, offset: u64, data: &[u8]) -> Result<usize> {
        if !self.writes.contains_key(&id) {
            self.open_write(id)?;
            self.writes.get_mut(&id).unwrap().writers = 0;
        }
        if let Some(e) = &self.writes[&id].failed {
            return Err(e.clone());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::TooBig)?;
        let cs = self.writes[&id].base.chunk_size as u64;
        // The chunk bitmap must fit one item.
        if end.div_ceil(cs) / 8 + 4096 > self.item_max as u64 {
            return Err(FsError::TooBig);
        }
        let mut at = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let n = at / cs;
            let within = (at % cs) as usize;
            let take = rest.len().min(cs as usize - within);
            let piece = &rest[..take];
            let w = self.writes.get_mut(&id).unwrap();
            if within == 0 && take == cs as usize {
                // A whole chunk goes out as it is (one copy, into the chunk object), over
                // whatever parts of it were waiting.
                w.partial.remove(&n);
                let gen = w.base.gen;
                self.send_object(id, n, chunk_encode(id, gen, n, piece))?;
            } else {
                let p = w
                    .partial
                    .entry(n)
                    .or_insert_with(|| Partial::new(cs as usize));
                p.put(within, piece);
                if p.covers(cs as usize) {
                    let whole = w.partial.remove(&n).unwrap();
                    self.send_object(id, n, whole.obj)?;
                } else if w.partial.len() > MAX_PARTIALS {
                    let oldest: Vec<u64> =
                        w.partial.keys().take(MAX_PARTIALS / 2).copied().collect();
                    self.with_lock(&format!("i{id}"), |fs| fs.merge_partials(id, &oldest))?;
                }
            }
            at += take as u64;
            rest = &rest[take..];
        }
        let w = self.writes.get_mut(&id).unwrap();
        w.size = w.size.max(end);
        Ok(data.len())
    }

    /// Stores chunks `ns` of this writer's partial chunks: each stored chunk read (as it
    /// is now), this writer's ranges put over it, written back and waited for. The caller
    /// holds the inode's lock, so two writers' merges of one chunk do not interleave.
    fn merge_partials(&mut self, id: u64, ns: &[u64]) -> Result<()> {
        let cur = self.get_inode(id)?;
        let gen = self.writes[&id].base.gen;
        if cur.gen != gen {
            return Err(self.fail(
                id,
                FsError::Corrupt(format!(
                    "file {id} was truncated by another client while this one wrote it"
                )),
            ));
        }
        for &n in ns {
            let Some(p) = self.writes.get_mut(&id).unwrap().partial.remove(&n) else {
                continue;
            };
            let stored = cur.has_chunk(n) || self.writes[&id].written.contains(&n);
            let base = if stored {
                self.read_chunk_for_write(id, n)?
            } else {
                Vec::new()
            };
            self.send_object(id, n, p.over(&base))?;
        }
        self.wait_inflight(id, None)
    }

    /// Records a failure as the writer's (sticky) and returns it.
    fn fail(&mut self, id: u64, e: FsError) -> FsError {
        if let Some(w) = self.writes.get_mut(&id) {
            w.failed.get_or_insert(e.clone());
        }
        e
    }

    /// The stored content of chunk `n` of a file being written (its writes in flight
    /// finished first).
    fn read_chunk_for_write(&mut self, id: u64, n: u64) -> Result<Vec<u8>> {
        self.wait_inflight(id, Some(n))?;
        let gen = self.writes[&id].base.gen;
        match self.client.get(&self.keys.chunk(id, gen, n)) {
            Ok(Some(v)) => Ok(chunk_decode(&v.data, id, gen, n)?.to_vec()),
            Ok(None) => Err(self.fail(
                id,
                FsError::Corrupt(format!("chunk {n} of file {id} is lost")),
            )),
            Err(e) => Err(self.fail(id, e.into())),
        }
    }

    /// Sends chunk object `obj` (its header is written here), keeping at most the depth
    /// of writes in flight.
    fn send_object(&mut self, id: u64, n: u64, mut obj: Vec<u8>) -> Result<()> {
        let depth = self.opts.depth.max(1);
        while self.writes[&id].inflight.len() >= depth {
            self.wait_oldest(id)?;
        }
        let w = self.writes.get_mut(&id).unwrap();
        let gen = w.base.gen;
        w.written.insert(n);
        chunk_seal(&mut obj, id, gen, n);
        let value = Bytes::from(obj);
        let h = self.client.iset(&self.keys.chunk(id, gen, n), value, 0, 0);
        self.writes.get_mut(&id).unwrap().inflight.push_back((h, n));
        Ok(())
    }

    fn wait_oldest(&mut self, id: u64) -> Result<()> {
        let Some((h, n)) = self.writes.get_mut(&id).unwrap().inflight.pop_front() else {
            return Ok(());
        };
        let r = self.client.wait(h, self.opts.timeout);
        let err = match r {
            Ok(Reply::Stored(StoreStatus::Stored { .. })) => None,
            Ok(r) => Some(FsError::Corrupt(format!(
                "chunk {n} of file {id}: unexpected answer {r:?}"
            ))),
            Err(e) => Some(FsError::from(e)),
        };
        match err {
            Some(e) => Err(self.fail(id, e)),
            None => Ok(()),
        }
    }

    /// Waits for the writes in flight of a file (of chunk `only`, or all).
    fn wait_inflight(&mut self, id: u64, only: Option<u64>) -> Result<()> {
        let Some(w) = self.writes.get(&id) else {
            return Ok(());
        };
        if let Some(n) = only {
            if !w.inflight.iter().any(|(_, c)| *c == n) {
                return Ok(());
            }
        }
        let mut first = None;
        while !self.writes[&id].inflight.is_empty() {
            if let Err(e) = self.wait_oldest(id) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Makes everything written through this client visible to others (fsync, close):
    /// under the inode's lock, partial chunks are merged with the stored ones, every
    /// write in flight is waited for, and the inode is updated — merged with what other
    /// writers of the same file published meanwhile. Returns the published inode, or
    /// `None` when there was nothing to publish. After a failure nothing more is
    /// published (the failure is returned again) until the last close.
    pub fn publish(&mut self, id: u64) -> Result<Option<Inode>> {
        let Some(w) = self.writes.get(&id) else {
            return Ok(None);
        };
        if let Some(e) = &w.failed {
            return Err(e.clone());
        }
        let last = w.writers == 0;
        if w.written.is_empty()
            && w.partial.is_empty()
            && w.inflight.is_empty()
            && w.size == w.base.size
        {
            if last {
                // The last writer closes without having written: it no longer holds the
                // file.
                self.writes.remove(&id);
                self.update_inode(id, |i| i.writing_until_ms = 0)?;
            }
            return Ok(None);
        }
        let published = self.with_lock(&format!("i{id}"), |fs| {
            let ns: Vec<u64> = fs.writes[&id].partial.keys().copied().collect();
            fs.merge_partials(id, &ns)?;
            fs.wait_inflight(id, None)?;
            let w = &fs.writes[&id];
            if let Some(e) = &w.failed {
                return Err(e.clone());
            }
            let written: Vec<u64> = w.written.iter().copied().collect();
            let (size, gen) = (w.size, w.base.gen);
            let mut i = fs.get_inode(id)?;
            if i.gen != gen {
                return Err(fs.fail(
                    id,
                    FsError::Corrupt(format!(
                        "file {id} was truncated by another client while this one wrote it"
                    )),
                ));
            }
            for n in &written {
                i.set_chunk(*n);
            }
            // The content changes: its digest (the last flush's) no longer holds.
            i.sha256 = None;
            i.size = i.size.max(size);
            i.writing_until_ms = if last { 0 } else { now_ms() + WRITE_LEASE_MS };
            i.version += 1;
            i.mtime = Time::now();
            i.ctime = i.mtime;
            fs.put_inode(&i)?;
            Ok(i)
        })?;
        let w = self.writes.get_mut(&id).unwrap();
        if last {
            self.writes.remove(&id);
        } else {
            w.written.clear();
            w.size = published.size;
            w.base = published.clone();
        }
        self.drop_cached(id);
        Ok(Some(published))
    }

    /// An open for writing ends: publishes, and forgets the writer state when it was the
    /// last (a failed writer's unpublished writes are dropped then, and its failure
    /// returned).
    pub fn close_write(&mut self, id: u64) -> Result<Option<Inode>> {
        if let Some(w) = self.writes.get_mut(&id) {
            w.writers = w.writers.saturating_sub(1);
        }
        let r = self.publish(id);
        if self.writes.get(&id).is_some_and(|w| w.writers == 0) {
            let failed = self.writes.remove(&id).and_then(|w| w.failed).is_some();
            if failed {
                let _ = self.update_inode(id, |i| i.writing_until_ms = 0);
            }
        }
        r
    }

    /// The attributes of a file as this client sees them (its own unpublished writes
    /// included).
    pub fn getattr(&mut self, id: u64) -> Result<Inode> {
        let mut i = self.get_inode(id)?;
        if let Some(w) = self.writes.get(&id) {
            i.size = i.size.max(w.size);
        }
        Ok(i)
    }

    /// Drops what this client remembers of a file's content (an open for reading starts
    /// from what is published: close-to-open).
    pub fn drop_cached(&mut self, id: u64) {
        let c = &mut self.cache;
        c.chunks.retain(|k, _| k.0 != id);
        c.order.retain(|k| k.0 != id);
        let stale: Vec<_> = c.pending.keys().filter(|k| k.0 == id).copied().collect();
        for k in stale {
            if let Some((_, h)) = c.pending.remove(&k) {
                let _ = self.client.wait(h, self.opts.timeout);
            }
        }
    }

    /// Reads up to `len` bytes at `offset`, with read-ahead of the following chunks.
    pub fn read(&mut self, id: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.stage_if_stub(id)?;
        let mut inode = self.get_inode(id)?;
        if inode.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        if let Some(w) = self.writes.get(&id) {
            inode.size = inode.size.max(w.size);
        }
        if offset >= inode.size {
            return Ok(Vec::new());
        }
        let end = inode.size.min(offset + len as u64);
        let cs = inode.chunk_size as u64;
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut at = offset;
        while at < end {
            let n = at / cs;
            let within = (at % cs) as usize;
            let take = ((end - at) as usize).min(cs as usize - within);
            let data = self.chunk_content(&inode, n)?;
            let have = data.len().saturating_sub(within).min(take);
            if have > 0 {
                out.extend_from_slice(&data[within..within + have]);
            }
            out.resize(out.len() + (take - have), 0);
            at += take as u64;
        }
        Ok(out)
    }

    /// Chunk `n`'s bytes (shorter than a chunk when the rest is zeros).
    pub(crate) fn chunk_content(&mut self, inode: &Inode, n: u64) -> Result<Bytes> {
        let id = inode.id;
        if let Some(w) = self.writes.get(&id) {
            let stored = w.written.contains(&n) || w.base.has_chunk(n);
            if w.partial.contains_key(&n) {
                // This writer's parts over the chunk as stored.
                let base = if stored {
                    self.read_chunk_for_write(id, n)?
                } else {
                    Vec::new()
                };
                let over = self.writes[&id].partial[&n].over(&base);
                return Ok(Bytes::from(over).slice(CHUNK_HEADER..));
            }
            if w.written.contains(&n) {
                return Ok(Bytes::from(self.read_chunk_for_write(id, n)?));
            }
        }
        if !inode.has_chunk(n) {
            return Ok(Bytes::new());
        }
        let gen = inode.gen;
        let k = (id, gen, n);
        // Chunks change in place between versions: a cached one serves only the version
        // it was read at.
        match self.cache.chunks.get(&k) {
            Some((v, b)) if *v == inode.version => {
                let b = b.clone();
                self.read_ahead(inode, n + 1);
                return Ok(b);
            }
            Some(_) => {
                self.cache.chunks.remove(&k);
            }
            None => {}
        }
        let h = match self.cache.pending.remove(&k) {
            Some((v, h)) if v == inode.version => h,
            Some((_, stale)) => {
                let _ = self.client.wait(stale, self.opts.timeout);
                self.client.iget(&self.keys.chunk(id, gen, n))
            }
            None => self.client.iget(&self.keys.chunk(id, gen, n)),
        };
        self.read_ahead(inode, n + 1);
        let r = self.client.wait(h, self.opts.timeout)?;
        let data = match r {
            Reply::Value(Some(v)) => {
                let d = chunk_decode(&v.data, id, gen, n)?;
                v.data.slice_ref(d)
            }
            Reply::Value(None) => {
                return Err(FsError::Corrupt(format!(
                    "chunk {n} of file {id} is lost (evicted, or every copy gone)"
                )))
            }
            r => return Err(FsError::Corrupt(format!("unexpected answer {r:?}"))),
        };
        self.keep_cached(k, inode.version, data.clone());
        Ok(data)
    }

    fn keep_cached(&mut self, k: (u64, u64, u64), version: u64, data: Bytes) {
        let cap = self.opts.depth.max(1) * 2 + 4;
        while self.cache.order.len() >= cap {
            if let Some(old) = self.cache.order.pop_front() {
                self.cache.chunks.remove(&old);
            }
        }
        if self.cache.chunks.insert(k, (version, data)).is_none() {
            self.cache.order.push_back(k);
        }
    }

    /// Starts reads of the chunks from `from` on (up to the depth ahead), collecting the
    /// ones that finished.
    fn read_ahead(&mut self, inode: &Inode, from: u64) {
        let cs = inode.chunk_size as u64;
        let last = inode.size.div_ceil(cs);
        let depth = self.opts.depth.max(1) as u64;
        for n in from..(from + depth).min(last) {
            let k = (inode.id, inode.gen, n);
            if !inode.has_chunk(n)
                || self.cache.chunks.contains_key(&k)
                || self.cache.pending.contains_key(&k)
            {
                continue;
            }
            let h = self.client.iget(&self.keys.chunk(inode.id, inode.gen, n));
            self.cache.pending.insert(k, (inode.version, h));
        }
        let keys: Vec<_> = self.cache.pending.keys().copied().collect();
        for k in keys {
            let (version, h) = self.cache.pending[&k];
            if let Some(r) = self.client.test(h) {
                self.cache.pending.remove(&k);
                if let Ok(Reply::Value(Some(v))) = r {
                    if let Ok(d) = chunk_decode(&v.data, k.0, k.1, k.2) {
                        let d = v.data.slice_ref(d);
                        self.keep_cached(k, version, d);
                    }
                }
            }
        }
    }

    // ---- paths ----

    /// The inode at `path` (absolute within the file system, `/` separated).
    pub fn resolve(&mut self, path: &[u8]) -> Result<Inode> {
        let mut at = self.get_inode(ROOT)?;
        for c in path
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            if c == b".." {
                at = self.get_inode(at.parent)?;
                continue;
            }
            if at.kind != Kind::Dir {
                return Err(FsError::NotDir);
            }
            at = self.lookup(at.id, c)?;
        }
        Ok(at)
    }

    /// The path of an inode from the root, walking its parents.
    pub fn path_of(&mut self, id: u64) -> Result<Vec<u8>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut at = id;
        for _ in 0..4096 {
            if at == ROOT {
                parts.reverse();
                return Ok(parts.join(&b'/'));
            }
            let i = self.get_inode(at)?;
            let d = self.get_dir(i.parent)?;
            let e = d
                .entries
                .iter()
                .find(|e| e.id == at)
                .ok_or(FsError::NotFound)?;
            parts.push(e.name.clone());
            at = i.parent;
        }
        Err(FsError::Corrupt("directory loop".into()))
    }

    // ---- the backing directory ----

    /// Where a directory's content is in the backing directory, if there is one.
    fn backing_path_of(&mut self, d: &Inode) -> Result<Option<PathBuf>> {
        let Some(root) = self.opts.backing.clone() else {
            return Ok(None);
        };
        let rel = self.path_of(d.id)?;
        Ok(Some(root.join(bytes_path(&rel))))
    }

    /// The backing path of `name` in `parent` when something exists there.
    fn backing_path_of_child(&mut self, parent: &Inode, name: &[u8]) -> Result<Option<PathBuf>> {
        let Some(dir) = self.backing_path_of(parent)? else {
            return Ok(None);
        };
        let p = dir.join(bytes_path(name));
        Ok(std::fs::symlink_metadata(&p).is_ok().then_some(p))
    }

    fn backing_path_of_child_if_any(
        &mut self,
        parent: u64,
        name: &[u8],
    ) -> Result<Option<PathBuf>> {
        if self.opts.backing.is_none() {
            return Ok(None);
        }
        let p = self.get_inode(parent)?;
        self.backing_path_of_child(&p, name)
    }

    /// An inode for a backing file or directory, its content left where it is until it is
    /// opened (a stub) or listed.
    fn stub_from_backing(&mut self, parent: u64, name: &[u8], path: &Path) -> Result<Inode> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path).map_err(|e| FsError::backing(e, path))?;
        let kind = if m.is_dir() {
            Kind::Dir
        } else if m.file_type().is_symlink() {
            Kind::Symlink
        } else if m.is_file() {
            Kind::File
        } else {
            return Err(FsError::NotSupported(
                "special files in the backing directory",
            ));
        };
        let target = if kind == Kind::Symlink {
            std::fs::read_link(path)
                .map_err(|e| FsError::backing(e, path))?
                .into_os_string()
                .into_encoded_bytes()
        } else {
            Vec::new()
        };
        let cs = self.chunk_size;
        let name_s = name.to_vec();
        let root = self.opts.backing.clone().unwrap_or_default();
        let rel = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .as_os_str()
            .as_encoded_bytes()
            .to_vec();
        self.with_lock(&format!("d{parent}"), |fs| {
            let mut dir = fs.get_dir(parent)?;
            if let Some(e) = dir.find(&name_s) {
                // Another client staged it meanwhile (or removed it: a whiteout).
                return if e.id == WHITEOUT {
                    Err(FsError::NotFound)
                } else {
                    let id = e.id;
                    fs.get_inode(id)
                };
            }
            let inode = fs.alloc_inode(|id| {
                let mut i = Inode::new(id, kind, m.mode(), parent, cs);
                i.uid = m.uid();
                i.gid = m.gid();
                i.mtime = Time {
                    secs: m.mtime(),
                    nanos: m.mtime_nsec() as u32,
                };
                i.atime = i.mtime;
                i.ctime = i.mtime;
                match kind {
                    Kind::File => {
                        i.size = m.len();
                        i.flags |= FLAG_STUB;
                        i.target = rel.clone();
                    }
                    Kind::Symlink => {
                        i.size = target.len() as u64;
                        i.target = target.clone();
                    }
                    Kind::Dir => {}
                }
                // Read through: it is what the backing directory has, nothing to flush.
                i.version = 1;
                i.flushed_version = 1;
                i
            })?;
            if kind == Kind::Dir {
                fs.client
                    .set(&fs.keys.dir(inode.id), &Dir::default().encode(), 0, 0)?;
            }
            dir.entries.push(Entry {
                name: name_s.clone(),
                id: inode.id,
                kind,
            });
            fs.put_dir(parent, &dir)?;
            Ok(inode)
        })
    }

    /// Adds the backing directory's names the cache does not have, once per directory.
    fn merge_backing_dir(&mut self, d: &mut Inode, path: &Path) -> Result<()> {
        let names: Vec<Vec<u8>> = match std::fs::read_dir(path) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().into_encoded_bytes())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(FsError::backing(e, path)),
        };
        let present: BTreeSet<Vec<u8>> = self
            .get_dir(d.id)?
            .entries
            .into_iter()
            .map(|e| e.name)
            .collect();
        for name in names {
            if !present.contains(&name) && valid_name(&name) {
                match self.stub_from_backing(d.id, &name, &path.join(bytes_path(&name))) {
                    Ok(_) | Err(FsError::NotSupported(_)) | Err(FsError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let id = d.id;
        self.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            i.flags |= FLAG_LISTED;
            fs.put_inode(&i)
        })
    }

    /// Brings a stub's content from the backing directory into the cache.
    pub fn stage_if_stub(&mut self, id: u64) -> Result<()> {
        let i = self.get_inode(id)?;
        if i.flags & FLAG_STUB == 0 {
            return Ok(());
        }
        let Some(root) = self.opts.backing.clone() else {
            return Err(FsError::NotSupported(
                "the file's content is in the backing directory: open the file system with its backing directory",
            ));
        };
        let path = root.join(bytes_path(&i.target));
        // The backing file must still be the one the stub was made from (a rename or a
        // flush may have put another file at that path since): else ESTALE, never another
        // file's bytes.
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&path).map_err(|e| FsError::backing(e, &path))?;
        if m.len() != i.size || m.mtime() != i.mtime.secs || m.mtime_nsec() as u32 != i.mtime.nanos
        {
            return Err(FsError::Backing(
                format!(
                    "{}: changed in the backing directory since it was read through",
                    path.display()
                ),
                libc::ESTALE,
            ));
        }
        self.stage_in_file(id, &path, true)
    }

    /// Copies a local file's content into file `id` (replacing its content). The copy
    /// goes to a new generation that nobody reads until it is complete; then, in one step
    /// under the inode's lock, the inode switches to it. A copy that fails publishes
    /// nothing (the file is as it was). `clean`: the result counts as flushed (it came
    /// from the backing directory).
    pub fn stage_in_file(&mut self, id: u64, path: &Path, clean: bool) -> Result<()> {
        use std::io::Read;
        let mut f = std::fs::File::open(path).map_err(|e| FsError::backing(e, path))?;
        let before = self.get_inode(id)?;
        let cs = before.chunk_size as usize;
        let gen = before.gen + 1;
        let depth = self.opts.depth.max(1);
        let mut inflight: VecDeque<Handle> = VecDeque::new();
        let mut chunks = Vec::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; cs];
        let copied = (|| -> Result<()> {
            loop {
                let mut got = 0;
                while got < cs {
                    match f.read(&mut buf[got..]) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(FsError::backing(e, path)),
                    }
                }
                if got == 0 {
                    break;
                }
                let n = size / cs as u64;
                while inflight.len() >= depth {
                    let h = inflight.pop_front().unwrap();
                    stored(self.client.wait(h, self.opts.timeout))?;
                }
                let obj = Bytes::from(chunk_encode(id, gen, n, &buf[..got]));
                inflight.push_back(self.client.iset(&self.keys.chunk(id, gen, n), obj, 0, 0));
                chunks.push(n);
                size += got as u64;
                if got < cs {
                    break;
                }
            }
            while let Some(h) = inflight.pop_front() {
                stored(self.client.wait(h, self.opts.timeout))?;
            }
            Ok(())
        })();
        if let Err(e) = copied {
            for h in inflight {
                let _ = self.client.wait(h, self.opts.timeout);
            }
            self.forget_chunks(id, gen, &chunks);
            return Err(e);
        }
        let switched = self.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            if i.gen != before.gen || i.version != before.version {
                // Staged or written by someone else meanwhile: theirs stands.
                return Ok(None);
            }
            let old = i.clone();
            i.gen = gen;
            i.chunks.clear();
            for n in &chunks {
                i.set_chunk(*n);
            }
            i.size = size;
            i.flags &= !FLAG_STUB;
            i.sha256 = None;
            i.version += 1;
            if clean {
                i.flushed_version = i.version;
            }
            fs.put_inode(&i)?;
            Ok(Some(old))
        })?;
        match switched {
            Some(old) => {
                let olds: Vec<u64> = old.written_chunks().collect();
                self.forget_chunks(id, old.gen, &olds);
            }
            None => self.forget_chunks(id, gen, &chunks),
        }
        self.drop_cached(id);
        Ok(())
    }

    /// Deletes chunk objects no inode points at any more (best effort).
    fn forget_chunks(&mut self, id: u64, gen: u64, ns: &[u64]) {
        let hs: Vec<Handle> = ns
            .iter()
            .map(|&n| {
                self.client.submit(memfabric_client::Op::Delete {
                    key: self.keys.chunk(id, gen, n),
                })
            })
            .collect();
        let _ = self.client.wait_all(&hs, self.opts.timeout);
    }
}

/// A chunk write's answer as a result.
fn stored(r: std::result::Result<Reply, CacheError>) -> Result<()> {
    match r {
        Ok(Reply::Stored(StoreStatus::Stored { .. })) => Ok(()),
        Ok(r) => Err(FsError::Corrupt(format!("unexpected answer {r:?}"))),
        Err(e) => Err(e.into()),
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if !valid_name(name) {
        return Err(FsError::Invalid(format!(
            "name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

fn too_large_chunk(chunk: u32, item_max: usize) -> FsError {
    FsError::Invalid(format!(
        "chunk size {chunk} does not fit the servers' item size limit ({item_max} bytes, \
         memcached's -I, less {} bytes of chunk header and room for the item's own): \
         use a smaller chunk or start the servers with a larger -I",
        CHUNK_HEADER + 256
    ))
}

/// The smallest `item_size_max` among the pool's servers that answer `stats settings`.
fn item_size_max(client: &mut Client) -> Result<usize> {
    let mut min: Option<usize> = None;
    let mut last_err = None;
    for (_, r) in client.stats(Some("settings")) {
        match r {
            Ok(s) => {
                if let Some((_, v)) = s.iter().find(|(k, _)| k == "item_size_max") {
                    if let Ok(n) = v.parse::<usize>() {
                        min = Some(min.map_or(n, |m| m.min(n)));
                    }
                }
            }
            Err(e) => last_err = Some(e),
        }
    }
    match (min, last_err) {
        (Some(n), _) => Ok(n),
        (None, Some(e)) => Err(e.into()),
        (None, None) => Ok(1024 * 1024),
    }
}

pub(crate) fn bytes_path(b: &[u8]) -> PathBuf {
    PathBuf::from(std::ffi::OsString::from_vec_bytes(b.to_vec()))
}

trait FromVecBytes {
    fn from_vec_bytes(v: Vec<u8>) -> Self;
}

impl FromVecBytes for std::ffi::OsString {
    fn from_vec_bytes(v: Vec<u8>) -> Self {
        use std::os::unix::ffi::OsStringExt;
        std::ffi::OsString::from_vec(v)
    }
}

fn current_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

fn current_gid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.gid())
        .unwrap_or(0)
}
