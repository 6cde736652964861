//! The objects a burst-buffer file system keeps in the cache: their keys and their bytes.
//!
//! A file system named `F` is a set of keys under `bb:F:` (docs/burst-buffer.md):
//!
//! | key | object |
//! |---|---|
//! | `bb:F:sb` | superblock: format version, chunk size |
//! | `bb:F:next` | the id counter (`incr`) |
//! | `bb:F:i:<id>` | an inode ([`Inode`]): kind, mode, size, times, generation, the bitmap of chunks written, the sha256 of the last flushed content |
//! | `bb:F:d:<id>` | a directory's entries ([`Dir`]) |
//! | `bb:F:c:<id>:<gen>:<n>` | chunk n of generation gen of a file ([`chunk_encode`]) |
//! | `bb:F:l:<name>` | a lock (an `add` with an expiry) |
//! | `bb:F:j` | the flush journal's queue ([`Journal`]) |
//! | `bb:F:f:<id>` | one file's flush record ([`FlushRecord`]) |
//!
//! Every object carries a magic, a format version and a crc32c over its bytes, so a
//! damaged or foreign value is refused ([`LayoutError`]), never misread. No I/O here.

use sha2::Digest;

/// The root directory's id.
pub const ROOT: u64 = 1;
/// The format this code writes and reads.
pub const FORMAT: u8 = 1;
/// Longest name in a directory, as on Linux.
pub const NAME_MAX: usize = 255;
/// Longest path a flush record holds (Linux's PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// Bytes of a chunk object before its data.
pub const CHUNK_HEADER: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("not a {0} object (bad magic)")]
    Magic(&'static str),
    #[error("{0} object of format {1}, this build reads format {FORMAT}")]
    Format(&'static str, u8),
    #[error("{0} object is truncated")]
    Truncated(&'static str),
    #[error("{0} object fails its checksum")]
    Checksum(&'static str),
    #[error("{0} object is malformed: {1}")]
    Malformed(&'static str, &'static str),
}

/// Names the keys of one file system.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `name`: 1 to 64 of `[A-Za-z0-9_.-]`, so that every key is a valid memcached key.
    pub fn new(name: &str) -> Option<Keys> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        ok.then(|| Keys {
            prefix: format!("bb:{name}:"),
        })
    }
    fn key(&self, rest: std::fmt::Arguments) -> Vec<u8> {
        format!("{}{}", self.prefix, rest).into_bytes()
    }
    pub fn superblock(&self) -> Vec<u8> {
        self.key(format_args!("sb"))
    }
    pub fn next_id(&self) -> Vec<u8> {
        self.key(format_args!("next"))
    }
    pub fn inode(&self, id: u64) -> Vec<u8> {
        self.key(format_args!("i:{id}"))
    }
    pub fn dir(&self, id: u64) -> Vec<u8> {
        self.key(format_args!("d:{id}"))
    }
    pub fn chunk(&self, id: u64, gen: u64, n: u64) -> Vec<u8> {
        self.key(format_args!("c:{id}:{gen}:{n}"))
    }
    pub fn lock(&self, what: &str) -> Vec<u8> {
        self.key(format_args!("l:{what}"))
    }
    pub fn journal(&self) -> Vec<u8> {
        self.key(format_args!("j"))
    }
    pub fn flush_record(&self, id: u64) -> Vec<u8> {
        self.key(format_args!("f:{id}"))
    }
}

/// Appends fixed-width little-endian fields.
struct Out(Vec<u8>);

impl Out {
    fn new(magic: &[u8; 4]) -> Out {
        let mut v = Vec::with_capacity(128);
        v.extend_from_slice(magic);
        v.push(FORMAT);
        Out(v)
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes32(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn finish(mut self) -> Vec<u8> {
        let crc = memfabric_checksum::crc32c(&self.0);
        self.u32(crc);
        self.0
    }
}

/// Reads what [`Out`] wrote, checking magic, format and checksum first.
struct In<'a> {
    what: &'static str,
    b: &'a [u8],
}

impl<'a> In<'a> {
    fn new(what: &'static str, magic: &[u8; 4], all: &'a [u8]) -> Result<In<'a>, LayoutError> {
        if all.len() < 9 {
            return Err(LayoutError::Truncated(what));
        }
        if &all[..4] != magic {
            return Err(LayoutError::Magic(what));
        }
        if all[4] != FORMAT {
            return Err(LayoutError::Format(what, all[4]));
        }
        let (body, crc) = all.split_at(all.len() - 4);
        if memfabric_checksum::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err(LayoutError::Checksum(what));
        }
        Ok(In {
            what,
            b: &body[5..],
        })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], LayoutError> {
        if self.b.len() < n {
            return Err(LayoutError::Truncated(self.what));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, LayoutError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, LayoutError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, LayoutError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn i64(&mut self) -> Result<i64, LayoutError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes32(&mut self, max: usize) -> Result<&'a [u8], LayoutError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(LayoutError::Malformed(self.what, "length over its limit"));
        }
        self.take(n)
    }
    fn end(self) -> Result<(), LayoutError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(LayoutError::Malformed(self.what, "trailing bytes"))
        }
    }
}

/// The superblock: what every client of the file system must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub chunk_size: u32,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::new(b"MFBS");
        o.u32(self.chunk_size);
        o.finish()
    }
    pub fn decode(b: &[u8]) -> Result<Superblock, LayoutError> {
        let mut i = In::new("superblock", b"MFBS", b)?;
        let chunk_size = i.u32()?;
        i.end()?;
        if chunk_size == 0 {
            return Err(LayoutError::Malformed("superblock", "chunk size 0"));
        }
        Ok(Superblock { chunk_size })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
        }
    }
    fn from_code(c: u8, what: &'static str) -> Result<Kind, LayoutError> {
        match c {
            1 => Ok(Kind::File),
            2 => Ok(Kind::Dir),
            3 => Ok(Kind::Symlink),
            _ => Err(LayoutError::Malformed(what, "unknown kind")),
        }
    }
    /// The file-type bits of `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
        }
    }
}

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
    pub fn to_system(self) -> std::time::SystemTime {
        if self.secs >= 0 {
            std::time::UNIX_EPOCH + std::time::Duration::new(self.secs as u64, self.nanos)
        } else {
            std::time::UNIX_EPOCH - std::time::Duration::from_secs(self.secs.unsigned_abs())
                + std::time::Duration::from_nanos(self.nanos as u64)
        }
    }
    pub fn from_system(t: std::time::SystemTime) -> Time {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Time {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let mut secs = -(d.as_secs() as i64);
                let mut nanos = 0;
                if d.subsec_nanos() > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - d.subsec_nanos();
                }
                Time { secs, nanos }
            }
        }
    }
}

/// Inode flag: the content is in the backing directory and not (yet) in the cache.
pub const FLAG_STUB: u8 = 1;
/// Inode flag: a directory whose backing directory's entries have been merged in.
pub const FLAG_LISTED: u8 = 2;
/// Inode flag: a directory made in the cache; nothing below it is read through.
pub const FLAG_OPAQUE: u8 = 4;

/// A file, directory or symbolic link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub id: u64,
    pub kind: Kind,
    /// Permission bits (and set-id/sticky bits), without the file type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub chunk_size: u32,
    /// Changes when the content is replaced whole (truncation to 0): chunk keys carry it,
    /// so chunks of an older content are never read as the new one's.
    pub gen: u64,
    /// Bumped by every change of content that is published (close, fsync).
    pub version: u64,
    /// The version last flushed to the backing directory (0: never).
    pub flushed_version: u64,
    /// Until when (unix ms) a client has the file open for writing: a flusher leaves it
    /// alone meanwhile (its chunks change in place). Renewed at every publication, cleared
    /// at the last close; a writer that died stops holding it when the time passes.
    pub writing_until_ms: u64,
    /// A directory's parent (the root is its own).
    pub parent: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub flags: u8,
    /// sha256 of the content as the last flush wrote it (set by the flusher, cleared by
    /// any change): what `sha256sum` of the flushed copy gives.
    pub sha256: Option<[u8; 32]>,
    /// A symbolic link's target.
    pub target: Vec<u8>,
    /// Bit n set: chunk n was written (a clear bit inside the size is a hole: zeros).
    pub chunks: Vec<u8>,
}

impl Inode {
    pub fn new(id: u64, kind: Kind, mode: u32, parent: u64, chunk_size: u32) -> Inode {
        let now = Time::now();
        Inode {
            id,
            kind,
            mode: mode & 0o7777,
            uid: 0,
            gid: 0,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: 0,
            chunk_size,
            gen: 1,
            version: 0,
            flushed_version: 0,
            writing_until_ms: 0,
            parent,
            atime: now,
            mtime: now,
            ctime: now,
            flags: 0,
            sha256: None,
            target: Vec::new(),
            chunks: Vec::new(),
        }
    }

    pub fn has_chunk(&self, n: u64) -> bool {
        let byte = (n / 8) as usize;
        byte < self.chunks.len() && self.chunks[byte] & (1 << (n % 8)) != 0
    }

    pub fn set_chunk(&mut self, n: u64) {
        let byte = (n / 8) as usize;
        if self.chunks.len() <= byte {
            self.chunks.resize(byte + 1, 0);
        }
        self.chunks[byte] |= 1 << (n % 8);
    }

    /// Forgets chunks at and after `n`.
    pub fn clear_chunks_from(&mut self, n: u64) {
        let byte = (n / 8) as usize;
        if byte < self.chunks.len() {
            self.chunks[byte] &= (1u8 << (n % 8)).wrapping_sub(1);
            self.chunks.truncate(byte + 1);
        }
        while self.chunks.last() == Some(&0) {
            self.chunks.pop();
        }
    }

    /// Chunk numbers whose bit is set.
    pub fn written_chunks(&self) -> impl Iterator<Item = u64> + '_ {
        self.chunks.iter().enumerate().flat_map(|(i, b)| {
            (0..8)
                .filter(move |bit| b & (1 << bit) != 0)
                .map(move |bit| i as u64 * 8 + bit)
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::new(b"MFBI");
        o.u64(self.id);
        o.u8(self.kind.code());
        o.u32(self.mode);
        o.u32(self.uid);
        o.u32(self.gid);
        o.u32(self.nlink);
        o.u64(self.size);
        o.u32(self.chunk_size);
        o.u64(self.gen);
        o.u64(self.version);
        o.u64(self.flushed_version);
        o.u64(self.writing_until_ms);
        o.u64(self.parent);
        for t in [self.atime, self.mtime, self.ctime] {
            o.i64(t.secs);
            o.u32(t.nanos);
        }
        o.u8(self.flags);
        match &self.sha256 {
            Some(s) => {
                o.u8(1);
                o.0.extend_from_slice(s);
            }
            None => o.u8(0),
        }
        o.bytes32(&self.target);
        o.bytes32(&self.chunks);
        o.finish()
    }

    pub fn decode(b: &[u8]) -> Result<Inode, LayoutError> {
        const W: &str = "inode";
        let mut i = In::new(W, b"MFBI", b)?;
        let id = i.u64()?;
        let kind = Kind::from_code(i.u8()?, W)?;
        let mode = i.u32()?;
        let uid = i.u32()?;
        let gid = i.u32()?;
        let nlink = i.u32()?;
        let size = i.u64()?;
        let chunk_size = i.u32()?;
        let gen = i.u64()?;
        let version = i.u64()?;
        let flushed_version = i.u64()?;
        let writing_until_ms = i.u64()?;
        let parent = i.u64()?;
        let mut times = [Time::default(); 3];
        for t in &mut times {
            t.secs = i.i64()?;
            t.nanos = i.u32()?;
            if t.nanos >= 1_000_000_000 {
                return Err(LayoutError::Malformed(W, "nanoseconds"));
            }
        }
        let flags = i.u8()?;
        let sha256 = match i.u8()? {
            0 => None,
            1 => Some(i.take(32)?.try_into().unwrap()),
            _ => return Err(LayoutError::Malformed(W, "sha256 flag")),
        };
        let target = i.bytes32(4096)?.to_vec();
        let chunks = i.bytes32(1 << 24)?.to_vec();
        i.end()?;
        if chunk_size == 0 {
            return Err(LayoutError::Malformed(W, "chunk size 0"));
        }
        Ok(Inode {
            id,
            kind,
            mode,
            uid,
            gid,
            nlink,
            size,
            chunk_size,
            gen,
            version,
            flushed_version,
            writing_until_ms,
            parent,
            atime: times[0],
            mtime: times[1],
            ctime: times[2],
            flags,
            sha256,
            target,
            chunks,
        })
    }
}

/// One name in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub id: u64,
    pub kind: Kind,
}

/// Whiteout: a name removed from the cache that the backing directory still has; it hides
/// the backing file from read-through (an entry with id 0).
pub const WHITEOUT: u64 = 0;

/// A directory's entries, in the order they were added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dir {
    pub entries: Vec<Entry>,
}

impl Dir {
    pub fn find(&self, name: &[u8]) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
    pub fn remove(&mut self, name: &[u8]) -> Option<Entry> {
        let i = self.entries.iter().position(|e| e.name == name)?;
        Some(self.entries.remove(i))
    }
    /// Entries that name something (not whiteouts).
    pub fn live(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().filter(|e| e.id != WHITEOUT)
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::new(b"MFBD");
        o.u32(self.entries.len() as u32);
        for e in &self.entries {
            o.u64(e.id);
            o.u8(e.kind.code());
            o.u8(e.name.len() as u8);
            o.0.extend_from_slice(&e.name);
        }
        o.finish()
    }
    pub fn decode(b: &[u8]) -> Result<Dir, LayoutError> {
        const W: &str = "directory";
        let mut i = In::new(W, b"MFBD", b)?;
        let n = i.u32()? as usize;
        // Each entry is at least 11 bytes: refuse a count the bytes cannot hold before
        // reserving room for it.
        if n > i.b.len() / 11 {
            return Err(LayoutError::Truncated(W));
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let id = i.u64()?;
            let kind = Kind::from_code(i.u8()?, W)?;
            let len = i.u8()? as usize;
            let name = i.take(len)?.to_vec();
            if !valid_name(&name) {
                return Err(LayoutError::Malformed(W, "invalid name"));
            }
            entries.push(Entry { name, id, kind });
        }
        i.end()?;
        Ok(Dir { entries })
    }
}

/// A name a directory may hold: 1 to 255 bytes, no `/` or NUL, not `.` or `..`.
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|&b| b == b'/' || b == 0)
}

/// A chunk object: header (magic, format, file id, generation, chunk number, data
/// length, crc32c of the data, crc32c of the header) then the data.
pub fn chunk_encode(id: u64, gen: u64, n: u64, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHUNK_HEADER + data.len());
    v.extend_from_slice(b"MFBC");
    v.push(FORMAT);
    v.extend_from_slice(&[0; 3]);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&gen.to_le_bytes());
    v.extend_from_slice(&n.to_le_bytes());
    v.extend_from_slice(&(data.len() as u32).to_le_bytes());
    v.extend_from_slice(&memfabric_checksum::crc32c(data).to_le_bytes());
    debug_assert_eq!(v.len(), CHUNK_HEADER);
    v.extend_from_slice(data);
    v
}

/// Writes the header of a chunk object whose data already follows the header's room
/// (`obj[CHUNK_HEADER..]`): the writer fills chunks in place and sends them without a copy.
pub fn chunk_seal(obj: &mut [u8], id: u64, gen: u64, n: u64) {
    let (h, data) = obj.split_at_mut(CHUNK_HEADER);
    h[..4].copy_from_slice(b"MFBC");
    h[4] = FORMAT;
    h[5..8].fill(0);
    h[8..16].copy_from_slice(&id.to_le_bytes());
    h[16..24].copy_from_slice(&gen.to_le_bytes());
    h[24..32].copy_from_slice(&n.to_le_bytes());
    h[32..36].copy_from_slice(&(data.len() as u32).to_le_bytes());
    h[36..40].copy_from_slice(&memfabric_checksum::crc32c(data).to_le_bytes());
}

/// The data of a chunk object, checked against what it must be: chunk `n` of generation
/// `gen` of file `id`, whole (its crc).
pub fn chunk_decode(b: &[u8], id: u64, gen: u64, n: u64) -> Result<&[u8], LayoutError> {
    const W: &str = "chunk";
    if b.len() < CHUNK_HEADER {
        return Err(LayoutError::Truncated(W));
    }
    if &b[..4] != b"MFBC" {
        return Err(LayoutError::Magic(W));
    }
    if b[4] != FORMAT {
        return Err(LayoutError::Format(W, b[4]));
    }
    if b[5..8] != [0, 0, 0] {
        return Err(LayoutError::Malformed(W, "reserved bytes"));
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    if u64_at(8) != id || u64_at(16) != gen || u64_at(24) != n {
        return Err(LayoutError::Malformed(W, "another chunk's header"));
    }
    let len = u32_at(32) as usize;
    let data = &b[CHUNK_HEADER..];
    if data.len() != len {
        return Err(LayoutError::Truncated(W));
    }
    if memfabric_checksum::crc32c(data) != u32_at(36) {
        return Err(LayoutError::Checksum(W));
    }
    Ok(data)
}

/// The flush journal's queue: ids of files with a flush record to work on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Journal {
    pub queued: Vec<u64>,
}

impl Journal {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::new(b"MFBJ");
        o.u32(self.queued.len() as u32);
        for id in &self.queued {
            o.u64(*id);
        }
        o.finish()
    }
    pub fn decode(b: &[u8]) -> Result<Journal, LayoutError> {
        let mut i = In::new("journal", b"MFBJ", b)?;
        let n = i.u32()? as usize;
        if n > i.b.len() / 8 {
            return Err(LayoutError::Truncated("journal"));
        }
        let queued = (0..n).map(|_| i.u64()).collect::<Result<_, _>>()?;
        i.end()?;
        Ok(Journal { queued })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushState {
    /// Waiting for a flusher.
    Queued,
    /// A flusher holds the lease and is copying.
    Copying,
    /// At the destination, verified.
    Done,
    /// Given up (the file is gone, or its content cannot be read whole).
    Failed,
}

/// One file's flush: what is copied where, and how far it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushRecord {
    pub id: u64,
    /// The inode's generation and version being flushed.
    pub gen: u64,
    pub version: u64,
    pub size: u64,
    /// Path relative to the backing directory.
    pub path: Vec<u8>,
    pub state: FlushState,
    /// Who holds the lease (a random number per flusher) and until when (unix ms).
    pub owner: u64,
    pub lease_until_ms: u64,
    /// Bytes already in the temporary file, verified chunk by chunk.
    pub done: u64,
    /// crc32c of each chunk-sized window written so far (of the bytes as they are in the
    /// file: holes as zeros): the final check re-reads the temporary file against them.
    pub crcs: Vec<u32>,
    /// sha256 of the file at the destination (Done) or why it failed (Failed).
    pub sha256: Option<[u8; 32]>,
    pub error: Vec<u8>,
    /// Where an earlier flush of this file put it, and what it wrote there: after the file
    /// was renamed in the cache, that copy is removed once the new one is in place (if it
    /// is still exactly what was flushed).
    pub prev_path: Vec<u8>,
    pub prev_sha256: Option<[u8; 32]>,
    /// Whose temporary file holds the `done` bytes (each flusher writes its own, so a
    /// flusher that lost its lease but still runs cannot touch the next one's).
    pub tmp_tag: u64,
    /// A temporary file an abandoned copy left (relative to the backing directory), to be
    /// removed by whoever processes this record.
    pub stale_tmp: Vec<u8>,
}

impl FlushRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Out::new(b"MFBF");
        o.u64(self.id);
        o.u64(self.gen);
        o.u64(self.version);
        o.u64(self.size);
        o.bytes32(&self.path);
        o.u8(match self.state {
            FlushState::Queued => 0,
            FlushState::Copying => 1,
            FlushState::Done => 2,
            FlushState::Failed => 3,
        });
        o.u64(self.owner);
        o.u64(self.lease_until_ms);
        o.u64(self.done);
        o.u32(self.crcs.len() as u32);
        for c in &self.crcs {
            o.u32(*c);
        }
        match &self.sha256 {
            Some(s) => {
                o.u8(1);
                o.0.extend_from_slice(s);
            }
            None => o.u8(0),
        }
        // What decode accepts: a long error message is cut, never made unreadable.
        o.bytes32(&self.error[..self.error.len().min(PATH_MAX)]);
        o.bytes32(&self.prev_path);
        match &self.prev_sha256 {
            Some(s) => {
                o.u8(1);
                o.0.extend_from_slice(s);
            }
            None => o.u8(0),
        }
        o.u64(self.tmp_tag);
        o.bytes32(&self.stale_tmp);
        o.finish()
    }
    pub fn decode(b: &[u8]) -> Result<FlushRecord, LayoutError> {
        const W: &str = "flush record";
        let mut i = In::new(W, b"MFBF", b)?;
        let id = i.u64()?;
        let gen = i.u64()?;
        let version = i.u64()?;
        let size = i.u64()?;
        let path = i.bytes32(PATH_MAX)?.to_vec();
        let state = match i.u8()? {
            0 => FlushState::Queued,
            1 => FlushState::Copying,
            2 => FlushState::Done,
            3 => FlushState::Failed,
            _ => return Err(LayoutError::Malformed(W, "state")),
        };
        let owner = i.u64()?;
        let lease_until_ms = i.u64()?;
        let done = i.u64()?;
        let n = i.u32()? as usize;
        if n > i.b.len() / 4 {
            return Err(LayoutError::Truncated(W));
        }
        let crcs = (0..n).map(|_| i.u32()).collect::<Result<_, _>>()?;
        let sha256 = match i.u8()? {
            0 => None,
            1 => Some(i.take(32)?.try_into().unwrap()),
            _ => return Err(LayoutError::Malformed(W, "sha256 flag")),
        };
        let error = i.bytes32(PATH_MAX)?.to_vec();
        let prev_path = i.bytes32(PATH_MAX)?.to_vec();
        let prev_sha256 = match i.u8()? {
            0 => None,
            1 => Some(i.take(32)?.try_into().unwrap()),
            _ => return Err(LayoutError::Malformed(W, "sha256 flag")),
        };
        let tmp_tag = i.u64()?;
        let stale_tmp = i.bytes32(PATH_MAX)?.to_vec();
        i.end()?;
        Ok(FlushRecord {
            id,
            gen,
            version,
            size,
            path,
            state,
            owner,
            lease_until_ms,
            done,
            crcs,
            sha256,
            error,
            prev_path,
            prev_sha256,
            tmp_tag,
            stale_tmp,
        })
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// sha256 as lowercase hex.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inode() -> Inode {
        let mut i = Inode::new(7, Kind::File, 0o100644, ROOT, 4096);
        i.size = 12345;
        i.sha256 = Some([9; 32]);
        i.set_chunk(0);
        i.set_chunk(2);
        i.set_chunk(17);
        i
    }

    #[test]
    fn objects_round_trip_and_refuse_damage() {
        let i = inode();
        assert_eq!(i.mode, 0o644, "the type bits are not kept in mode");
        let b = i.encode();
        assert_eq!(Inode::decode(&b).unwrap(), i);
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x40;
            assert!(Inode::decode(&d).is_err(), "flip at {at} accepted");
        }
        for len in 0..b.len() {
            assert!(Inode::decode(&b[..len]).is_err());
        }
        let dir = Dir {
            entries: vec![
                Entry {
                    name: b"a".to_vec(),
                    id: 3,
                    kind: Kind::File,
                },
                Entry {
                    name: vec![b'x'; 255],
                    id: WHITEOUT,
                    kind: Kind::Dir,
                },
            ],
        };
        assert_eq!(Dir::decode(&dir.encode()).unwrap(), dir);
        assert_eq!(dir.live().count(), 1);
        let j = Journal {
            queued: vec![4, 5, 6],
        };
        assert_eq!(Journal::decode(&j.encode()).unwrap(), j);
        let r = FlushRecord {
            id: 4,
            gen: 2,
            version: 3,
            size: 100,
            path: b"a/b".to_vec(),
            state: FlushState::Copying,
            owner: 77,
            lease_until_ms: 1,
            done: 64,
            crcs: vec![1, 2],
            sha256: None,
            error: Vec::new(),
            prev_path: b"a/old".to_vec(),
            prev_sha256: Some([3; 32]),
            tmp_tag: 9,
            stale_tmp: b"a/.b.mfbb-4-7.tmp".to_vec(),
        };
        assert_eq!(FlushRecord::decode(&r.encode()).unwrap(), r);
        assert!(
            Inode::decode(&r.encode()).is_err(),
            "another object's magic"
        );
    }

    #[test]
    fn chunks_are_checked_against_their_place() {
        let c = chunk_encode(7, 2, 5, b"hello");
        let mut sealed = vec![0u8; CHUNK_HEADER];
        sealed.extend_from_slice(b"hello");
        chunk_seal(&mut sealed, 7, 2, 5);
        assert_eq!(sealed, c, "sealed in place as encoded");
        assert_eq!(chunk_decode(&c, 7, 2, 5).unwrap(), b"hello");
        assert!(chunk_decode(&c, 7, 2, 6).is_err(), "another chunk number");
        assert!(chunk_decode(&c, 7, 3, 5).is_err(), "another generation");
        assert!(chunk_decode(&c, 8, 2, 5).is_err(), "another file");
        let mut d = c.clone();
        *d.last_mut().unwrap() ^= 1;
        assert_eq!(
            chunk_decode(&d, 7, 2, 5),
            Err(LayoutError::Checksum("chunk"))
        );
        assert!(chunk_decode(&c[..c.len() - 1], 7, 2, 5).is_err());
    }

    #[test]
    fn chunk_bitmap() {
        let mut i = inode();
        assert_eq!(i.written_chunks().collect::<Vec<_>>(), vec![0, 2, 17]);
        i.clear_chunks_from(2);
        assert_eq!(i.written_chunks().collect::<Vec<_>>(), vec![0]);
        assert_eq!(i.chunks.len(), 1);
        i.clear_chunks_from(0);
        assert!(i.chunks.is_empty());
        assert!(!i.has_chunk(1000));
    }

    #[test]
    fn names_and_keys() {
        assert!(valid_name(b"a b"));
        assert!(!valid_name(b""));
        assert!(!valid_name(b".."));
        assert!(!valid_name(b"a/b"));
        assert!(!valid_name(&[b'a'; 256]));
        assert!(Keys::new("bad name").is_none());
        let k = Keys::new("ckpt").unwrap();
        assert_eq!(k.chunk(3, 1, 9), b"bb:ckpt:c:3:1:9");
        assert!(memfabric_client::op::valid_key(&k.chunk(
            u64::MAX,
            u64::MAX,
            u64::MAX
        )));
    }
}
