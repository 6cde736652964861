//! The flush to the backing directory: a journal in the cache, leases, and a copy that
//! puts a file at its destination whole and verified or not at all.
//!
//! Protocol (docs/burst-buffer.md has its crash cases):
//! 1. **Enqueue**: a flush record (`bb:F:f:<id>`: generation, version, size, destination
//!    path) is written as `Queued` and the file's id is added to the journal's queue
//!    (`bb:F:j`), under the journal lock. Both are ordinary items of the pool, so they
//!    are replicated like everything else.
//! 2. **Claim**: a flusher takes a queued record, or one whose lease has run out (its
//!    flusher died), and writes itself in as owner with a lease.
//! 3. **Copy**: groups of chunks (each checked by its crc) into the flusher's own
//!    temporary file beside the destination (`.<name>.mfbb-<id>-<flusher>.tmp`), written
//!    by a write-behind thread that also hashes; every few MiB the record gets the bytes
//!    done and the crc of every chunk-sized window written, and the lease is renewed — if
//!    the record has another owner by then, this flusher stops (and removes its file).
//! 4. **Finish**: fsync; the sha256 of what went out is compared with the last flush's
//!    when the content has not changed since (`readback`: the whole temporary file is read
//!    back and checked again); the inode must still be the version copied and not open for
//!    writing, the lease still ours; only then is the file renamed to its final name and
//!    the directory fsynced. The record becomes `Done` with the sha256, the inode's
//!    `flushed_version` is set, the id leaves the queue.
//!
//! A flusher that resumes someone else's copy copies its recorded, crc-checked windows into
//! its own temporary file, removes the other one, and goes on from there.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::fs::{bytes_path, Fs, FsError, Result};
use crate::layout::{now_ms, FlushRecord, FlushState, Inode, Journal, Kind, FLAG_STUB, ROOT};

/// How a flusher works.
#[derive(Debug, Clone)]
pub struct FlushOptions {
    /// How long a claim lasts without renewal: a dead flusher's files are taken over after
    /// this.
    pub lease: Duration,
    /// Bytes per second written to the backing directory (None: as fast as it takes).
    pub bandwidth: Option<u64>,
    /// Bytes between two progress records (and lease renewals).
    pub checkpoint_bytes: u64,
    /// Tries of one file before it is marked failed (a copy that does not verify).
    pub attempts: u32,
    /// Write whole windows with O_DIRECT where the backing file system allows it.
    pub direct: bool,
    /// Bytes written per call (whole chunks, at least one): fewer, larger I/Os.
    pub write_bytes: usize,
    /// After the fsync, read the whole temporary file back and check it again (each
    /// window's crc and the sha256) before the rename: costs a second pass over the
    /// backing store. Without it, the copy is checked as it goes out (every chunk's crc
    /// from the cache, the last flush's sha256 when the content has not changed since).
    pub readback: bool,
}

impl Default for FlushOptions {
    fn default() -> FlushOptions {
        FlushOptions {
            lease: Duration::from_secs(30),
            bandwidth: None,
            checkpoint_bytes: 8 << 20,
            attempts: 3,
            direct: true,
            write_bytes: 4 << 20,
            readback: false,
        }
    }
}

/// What a flusher reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Started {
        path: Vec<u8>,
        size: u64,
        resumed_at: u64,
    },
    Progress {
        path: Vec<u8>,
        done: u64,
        size: u64,
    },
    Finished {
        path: Vec<u8>,
        size: u64,
        sha256: [u8; 32],
    },
    Failed {
        path: Vec<u8>,
        error: String,
    },
}

/// What a run of the flusher did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub files: usize,
    pub bytes: u64,
    pub failed: Vec<(Vec<u8>, String)>,
    /// Queued but left for later: open for writing (flushed once their writers close).
    pub open_for_writing: Vec<Vec<u8>>,
}

fn get_journal(fs: &mut Fs) -> Result<Journal> {
    let key = fs.keys().journal();
    match fs.client().get(&key)? {
        Some(v) => Ok(Journal::decode(&v.data)?),
        None => Ok(Journal::default()),
    }
}

fn put_journal(fs: &mut Fs, j: &Journal) -> Result<()> {
    let key = fs.keys().journal();
    Ok(fs.client().set(&key, &j.encode(), 0, 0)?)
}

pub fn get_record(fs: &mut Fs, id: u64) -> Result<Option<FlushRecord>> {
    let key = fs.keys().flush_record(id);
    match fs.client().get(&key)? {
        Some(v) => Ok(Some(FlushRecord::decode(&v.data)?)),
        None => Ok(None),
    }
}

fn put_record(fs: &mut Fs, r: &FlushRecord) -> Result<()> {
    let key = fs.keys().flush_record(r.id);
    Ok(fs.client().set(&key, &r.encode(), 0, 0)?)
}

/// Whether an inode has content the backing directory does not have yet.
pub fn is_dirty(i: &Inode) -> bool {
    i.flags & FLAG_STUB == 0 && i.version > i.flushed_version
}

/// Queues file (or directory, or link) `id` for flushing to its current path, if the
/// backing directory does not have it (there) yet; whether it was queued.
pub fn enqueue(fs: &mut Fs, id: u64) -> Result<bool> {
    let inode = fs.get_inode(id)?;
    let path = fs.path_of(id)?;
    if path.len() > crate::layout::PATH_MAX {
        return Err(FsError::NameTooLong);
    }
    if !is_dirty(&inode) {
        // Clean, but renamed since its flush (or its last move failed): the backing copy
        // moves too.
        match get_record(fs, id).unwrap_or(None) {
            Some(r)
                if matches!(r.state, FlushState::Done | FlushState::Failed) && r.path != path => {}
            _ => return Ok(false),
        }
    }
    fs.with_lock("j", |fs| {
        // A record that does not decode is replaced.
        let old = get_record(fs, id).unwrap_or(None);
        let (mut prev_path, mut prev_sha256, mut stale_tmp) = (Vec::new(), None, Vec::new());
        if let Some(r) = &old {
            let same = r.version == inode.version && r.gen == inode.gen && r.path == path;
            // Queued, or being copied (or left half-copied by a flusher that died: the
            // next one resumes it) — keep its progress. A copy in progress under a live
            // lease is never taken from its flusher: if the file changed, that flusher
            // sees it before the rename and copies the new version, and queues it again if
            // it changed after.
            let pending = matches!(r.state, FlushState::Queued | FlushState::Copying);
            let live = r.state == FlushState::Copying && r.lease_until_ms > now_ms();
            if (same && pending) || live {
                let mut j = get_journal(fs)?;
                if !j.queued.contains(&id) {
                    j.queued.push(id);
                    put_journal(fs, &j)?;
                }
                return Ok(true);
            }
            if r.state == FlushState::Done {
                prev_path = r.path.clone();
                prev_sha256 = r.sha256;
            } else {
                prev_path = r.prev_path.clone();
                prev_sha256 = r.prev_sha256;
            }
            stale_tmp = abandoned_tmp(r);
        }
        let rec = FlushRecord {
            id,
            gen: inode.gen,
            version: inode.version,
            size: inode.size,
            path: path.clone(),
            state: FlushState::Queued,
            owner: 0,
            lease_until_ms: 0,
            done: 0,
            crcs: Vec::new(),
            sha256: None,
            error: Vec::new(),
            prev_path,
            prev_sha256,
            tmp_tag: 0,
            stale_tmp,
        };
        put_record(fs, &rec)?;
        let mut j = get_journal(fs)?;
        if !j.queued.contains(&id) {
            j.queued.push(id);
            put_journal(fs, &j)?;
        }
        Ok(true)
    })
}

/// The temporary file a record's copy left behind (relative to the backing directory),
/// if it had one: whoever processes the record that replaces it removes it.
fn abandoned_tmp(r: &FlushRecord) -> Vec<u8> {
    if r.done == 0 || r.path.is_empty() {
        return r.stale_tmp.clone();
    }
    let dest = bytes_path(&r.path);
    tmp_path(&dest, r.id, r.tmp_tag)
        .into_os_string()
        .into_encoded_bytes()
}

/// Queues `top` and everything under it that the backing directory does not have yet
/// (or has under an older name); the number queued.
pub fn enqueue_dirty(fs: &mut Fs, top: u64) -> Result<usize> {
    let mut n = 0;
    if top != ROOT && enqueue(fs, top)? {
        n += 1;
    }
    if fs.get_inode(top)?.kind != Kind::Dir {
        return Ok(n);
    }
    let mut stack = vec![top];
    // What the cache has (read-through stubs below are clean: nothing to walk into).
    while let Some(d) = stack.pop() {
        for e in fs.readdir_cached(d)? {
            if enqueue(fs, e.id)? {
                n += 1;
            }
            if e.kind == Kind::Dir {
                stack.push(e.id);
            }
        }
    }
    Ok(n)
}

/// After `id` was removed from the cache: if an earlier flush put it in the backing
/// directory, its copy there is removed too (by the flusher, in journal order, and only
/// if it is still what was flushed: see [`remove_previous_copy`]).
pub fn note_removed(fs: &mut Fs, id: u64) -> Result<bool> {
    fs.with_lock("j", |fs| {
        let Some(r) = get_record(fs, id).unwrap_or(None) else {
            return Ok(false);
        };
        let (prev_path, prev_sha256) = if r.state == FlushState::Done {
            (r.path.clone(), r.sha256)
        } else {
            (r.prev_path.clone(), r.prev_sha256)
        };
        if prev_path.is_empty() && abandoned_tmp(&r).is_empty() {
            return Ok(false);
        }
        let rec = FlushRecord {
            id,
            gen: 0,
            version: 0,
            size: 0,
            path: Vec::new(),
            state: FlushState::Queued,
            owner: 0,
            lease_until_ms: 0,
            done: 0,
            crcs: Vec::new(),
            sha256: None,
            error: Vec::new(),
            prev_path,
            prev_sha256,
            tmp_tag: 0,
            stale_tmp: abandoned_tmp(&r),
        };
        put_record(fs, &rec)?;
        let mut j = get_journal(fs)?;
        j.queued.retain(|&q| q != id);
        j.queued.push(id);
        put_journal(fs, &j)?;
        Ok(true)
    })
}

/// The journal's queue with each record (for `bb status`).
pub fn queued(fs: &mut Fs) -> Result<Vec<FlushRecord>> {
    let j = get_journal(fs)?;
    let mut out = Vec::new();
    for id in j.queued {
        if let Some(r) = get_record(fs, id)? {
            out.push(r);
        }
    }
    Ok(out)
}

enum Claim {
    Got(Box<FlushRecord>),
    /// Others hold leases on everything left.
    Wait,
    /// Nothing left but files open for writing (their paths).
    Empty(Vec<Vec<u8>>),
}

fn claim(fs: &mut Fs, owner: u64, opts: &FlushOptions) -> Result<Claim> {
    fs.with_lock("j", |fs| {
        let mut j = get_journal(fs)?;
        let before = j.queued.len();
        let mut keep = Vec::new();
        let mut got = None;
        let mut others = false;
        let mut busy = Vec::new();
        for id in j.queued.drain(..) {
            // Gone, or not decodable (damaged): dropped from the queue, never a wedge.
            let Some(mut r) = get_record(fs, id).unwrap_or(None) else {
                continue;
            };
            match r.state {
                FlushState::Done | FlushState::Failed => continue,
                FlushState::Copying if r.lease_until_ms > now_ms() && r.owner != owner => {
                    others = true;
                }
                _ if got.is_none() => {
                    // Open for writing somewhere: its chunks change in place; wait for
                    // the close.
                    let writing = !r.path.is_empty()
                        && fs
                            .get_inode(id)
                            .is_ok_and(|i| i.writing_until_ms > now_ms());
                    if writing {
                        busy.push(r.path.clone());
                        keep.push(id);
                        continue;
                    }
                    r.state = FlushState::Copying;
                    r.owner = owner;
                    r.lease_until_ms = now_ms() + opts.lease.as_millis() as u64;
                    put_record(fs, &r)?;
                    got = Some(r);
                }
                _ => {}
            }
            keep.push(id);
        }
        j.queued = keep;
        if j.queued.len() != before {
            put_journal(fs, &j)?;
        }
        Ok(match got {
            Some(r) => Claim::Got(Box::new(r)),
            None if others => Claim::Wait,
            None => Claim::Empty(busy),
        })
    })
}

/// Saves progress and renews the lease; false if another flusher owns the record now.
fn checkpoint(fs: &mut Fs, rec: &mut FlushRecord, opts: &FlushOptions) -> Result<bool> {
    fs.with_lock("j", |fs| {
        match get_record(fs, rec.id)? {
            Some(cur) if cur.owner == rec.owner && cur.state == FlushState::Copying => {}
            _ => return Ok(false),
        }
        rec.lease_until_ms = now_ms() + opts.lease.as_millis() as u64;
        put_record(fs, rec)?;
        Ok(true)
    })
}

/// Gives a claimed record back to the queue (its file is being written).
fn requeue(fs: &mut Fs, rec: &mut FlushRecord) -> Result<()> {
    fs.with_lock("j", |fs| {
        match get_record(fs, rec.id)? {
            Some(cur) if cur.owner == rec.owner => {}
            _ => return Ok(()),
        }
        rec.state = FlushState::Queued;
        rec.owner = 0;
        rec.lease_until_ms = 0;
        put_record(fs, rec)
    })
}

fn finish(fs: &mut Fs, rec: &mut FlushRecord, state: FlushState) -> Result<()> {
    let id = rec.id;
    rec.state = state;
    fs.with_lock("j", |fs| {
        match get_record(fs, id)? {
            Some(cur) if cur.owner == rec.owner => {}
            _ => return Ok(()),
        }
        put_record(fs, rec)?;
        let mut j = get_journal(fs)?;
        j.queued.retain(|&q| q != id);
        put_journal(fs, &j)
    })
}

/// A flusher: claims queued files and copies them until the journal is empty.
pub struct Flusher {
    pub opts: FlushOptions,
    owner: u64,
}

impl Flusher {
    pub fn new(opts: FlushOptions) -> Flusher {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&(std::process::id(), Instant::now(), now_ms()), &mut h);
        Flusher {
            opts,
            owner: std::hash::Hasher::finish(&h) | 1,
        }
    }

    /// Flushes until nothing is queued (waiting for files other flushers hold until their
    /// leases end or they finish), or until `stop` is set.
    pub fn run(
        &mut self,
        fs: &mut Fs,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Summary> {
        let mut sum = Summary::default();
        while !stop.load(Ordering::Relaxed) {
            match claim(fs, self.owner, &self.opts)? {
                Claim::Empty(busy) => {
                    sum.open_for_writing = busy;
                    break;
                }
                Claim::Wait => std::thread::sleep(Duration::from_millis(100)),
                Claim::Got(mut rec) => match self.copy(fs, &mut rec, stop, on_event) {
                    Ok(Some(size)) => {
                        sum.files += 1;
                        sum.bytes += size;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let msg = e.to_string();
                        on_event(&Event::Failed {
                            path: rec.path.clone(),
                            error: msg.clone(),
                        });
                        sum.failed.push((rec.path.clone(), msg.clone()));
                        rec.error = msg.into_bytes();
                        // A cache that does not answer: leave it queued for the next try.
                        if matches!(e, FsError::Cache(_) | FsError::Locked(_)) {
                            return Err(e);
                        }
                        finish(fs, &mut rec, FlushState::Failed)?;
                    }
                },
            }
        }
        Ok(sum)
    }

    /// Copies one claimed file; its size when it was flushed, None when another flusher
    /// took it over.
    fn copy(
        &mut self,
        fs: &mut Fs,
        rec: &mut FlushRecord,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Option<u64>> {
        let Some(root) = fs.backing().map(Path::to_path_buf) else {
            return Err(FsError::Invalid("no backing directory to flush to".into()));
        };
        // What an abandoned copy of this file left goes first.
        if !rec.stale_tmp.is_empty() {
            let _ = std::fs::remove_file(root.join(bytes_path(&rec.stale_tmp)));
            rec.stale_tmp.clear();
        }
        let inode = match fs.get_inode(rec.id) {
            Ok(i) if !rec.path.is_empty() => i,
            // Removed from the cache: so is the copy an earlier flush made.
            Ok(_) | Err(FsError::NotFound) => {
                remove_previous_copy(fs, &root, rec);
                finish(fs, rec, FlushState::Done)?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // Where the file is now (renamed since it was queued: there).
        if let Ok(cur) = fs.path_of(rec.id) {
            if cur != rec.path {
                if rec.done > 0 {
                    let old = tmp_path(&root.join(bytes_path(&rec.path)), rec.id, rec.tmp_tag);
                    let _ = std::fs::remove_file(old);
                }
                rec.path = cur;
                rec.done = 0;
                rec.crcs.clear();
            }
        }
        if inode.gen != rec.gen || inode.version != rec.version || inode.size != rec.size {
            // Written again since it was queued: flush what it is now.
            rec.gen = inode.gen;
            rec.version = inode.version;
            rec.size = inode.size;
            rec.done = 0;
            rec.crcs.clear();
        }
        let mut dest = root.join(bytes_path(&rec.path));
        let parent = dest.parent().unwrap_or(&root).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(|e| io_err(e, &parent))?;
        match inode.kind {
            Kind::Dir => {
                std::fs::create_dir_all(&dest).map_err(|e| io_err(e, &dest))?;
                set_mode(&dest, inode.mode)?;
                remove_previous_copy(fs, &root, rec);
                self.mark_flushed(fs, &inode, None)?;
                finish(fs, rec, FlushState::Done)?;
                return Ok(Some(0));
            }
            Kind::Symlink => {
                let tmp = tmp_path(&dest, rec.id, self.owner);
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(bytes_path(&inode.target), &tmp)
                    .map_err(|e| io_err(e, &tmp))?;
                publish(fs, &inode, &tmp, &dest)?;
                remove_previous_copy(fs, &root, rec);
                self.mark_flushed(fs, &inode, None)?;
                finish(fs, rec, FlushState::Done)?;
                return Ok(Some(0));
            }
            Kind::File => {}
        }
        let mut inode = inode;
        let mut mismatches = 0;
        loop {
            let copied = match self.copy_file(fs, rec, &inode, &dest, stop, on_event) {
                Ok(c) => c,
                // Removed while it was copied (after the last progress record, which would
                // have shown it): its temporary file goes, and nothing failed.
                Err(e) => {
                    if matches!(fs.get_inode(rec.id), Err(FsError::NotFound)) {
                        let _ = std::fs::remove_file(tmp_path(&dest, rec.id, self.owner));
                        remove_previous_copy(fs, &root, rec);
                        finish(fs, rec, FlushState::Done)?;
                        return Ok(None);
                    }
                    return Err(e);
                }
            };
            match copied {
                Copied::Verified(sha) => {
                    rec.sha256 = Some(sha);
                    remove_previous_copy(fs, &root, rec);
                    self.mark_flushed(fs, &inode, Some(sha))?;
                    finish(fs, rec, FlushState::Done)?;
                    on_event(&Event::Finished {
                        path: rec.path.clone(),
                        size: rec.size,
                        sha256: sha,
                    });
                    // Changed between the last check and now: it goes again.
                    if fs.get_inode(rec.id).is_ok_and(|i| is_dirty(&i)) {
                        enqueue(fs, rec.id)?;
                    }
                    return Ok(Some(rec.size));
                }
                Copied::LostLease => {
                    // Whoever has the record now does not use this flusher's file.
                    let _ = std::fs::remove_file(tmp_path(&dest, rec.id, self.owner));
                    return Ok(None);
                }
                Copied::Stopped => return Ok(None),
                Copied::Mismatch | Copied::Changed => {
                    let now = match fs.get_inode(rec.id) {
                        Ok(i) => i,
                        Err(FsError::NotFound) => {
                            let _ = std::fs::remove_file(tmp_path(&dest, rec.id, self.owner));
                            finish(fs, rec, FlushState::Done)?;
                            return Ok(None);
                        }
                        Err(e) => return Err(e),
                    };
                    if now.writing_until_ms > now_ms() {
                        // Opened for writing meanwhile: back in the queue for its close.
                        requeue(fs, rec)?;
                        return Ok(None);
                    }
                    let changed =
                        now.gen != rec.gen || now.version != rec.version || now.size != rec.size;
                    if !changed {
                        mismatches += 1;
                        if mismatches >= self.opts.attempts.max(1) {
                            return Err(FsError::Corrupt(format!(
                                "{}: the copy did not verify in {} tries",
                                dest.display(),
                                mismatches
                            )));
                        }
                    }
                    // Renamed while it was copied: the copy goes where the file is now
                    // (the copy under the old name, if an earlier flush made one, is
                    // removed when this one is in place).
                    let here = fs.path_of(rec.id)?;
                    if here != rec.path {
                        let _ = std::fs::remove_file(tmp_path(&dest, rec.id, self.owner));
                        rec.path = here;
                        dest = root.join(bytes_path(&rec.path));
                        let parent = dest.parent().unwrap_or(&root).to_path_buf();
                        std::fs::create_dir_all(&parent).map_err(|e| io_err(e, &parent))?;
                    }
                    rec.gen = now.gen;
                    rec.version = now.version;
                    rec.size = now.size;
                    rec.done = 0;
                    rec.crcs.clear();
                    inode = now;
                }
            }
        }
    }

    fn mark_flushed(&self, fs: &mut Fs, flushed: &Inode, sha256: Option<[u8; 32]>) -> Result<()> {
        let id = flushed.id;
        fs.with_lock(&format!("i{id}"), |fs| {
            let mut i = fs.get_inode(id)?;
            if i.version == flushed.version && i.gen == flushed.gen {
                i.flushed_version = i.version;
                if sha256.is_some() {
                    i.sha256 = sha256;
                }
                fs.put_inode(&i)?;
            }
            Ok(())
        })
    }

    fn copy_file(
        &mut self,
        fs: &mut Fs,
        rec: &mut FlushRecord,
        inode: &Inode,
        dest: &Path,
        stop: &AtomicBool,
        on_event: &mut dyn FnMut(&Event),
    ) -> Result<Copied> {
        let cs = inode.chunk_size as u64;
        // This flusher's own temporary file: a flusher that lost its lease but still runs
        // writes only into its own, which nobody renames any more.
        let tmp = tmp_path(dest, rec.id, self.owner);
        let prev = (rec.tmp_tag != self.owner).then(|| tmp_path(dest, rec.id, rec.tmp_tag));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(prev.is_some())
            .open(&tmp)
            .map_err(|e| io_err(e, &tmp))?;
        // Whole aligned windows bypass the page cache (O_DIRECT), as a parallel file
        // system's clients write, where the file system allows it.
        let direct = if self.opts.direct && cs.is_multiple_of(DIRECT_ALIGN as u64) {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&tmp)
                .ok()
        } else {
            None
        };
        // (A bandwidth bound writes chunk by chunk, so that it paces evenly.)
        let group = if self.opts.bandwidth.is_some() {
            1
        } else {
            (self.opts.write_bytes / cs as usize).max(1)
        };
        // The recorded progress: the windows in the temporary file that holds it (another
        // flusher's: copied into ours), each checked against its crc, hashed in order;
        // anything that does not check out starts the copy over.
        let mut sha = sha2::Sha256::new();
        let src = match &prev {
            Some(p) => File::open(p).ok(),
            None => f.try_clone().ok(),
        };
        let whole_windows = rec.done.is_multiple_of(cs) && rec.crcs.len() as u64 == rec.done / cs;
        let mut good = 0u64;
        if let (Some(src), true) = (&src, whole_windows) {
            let mut window = vec![0u8; cs as usize];
            for (i, crc) in rec.crcs.iter().enumerate() {
                let at = i as u64 * cs;
                if src.read_exact_at(&mut window, at).is_err()
                    || memfabric_checksum::crc32c(&window) != *crc
                {
                    break;
                }
                if prev.is_some() {
                    f.write_all_at(&window, at).map_err(|e| io_err(e, &tmp))?;
                }
                sha.update(&window);
                good += cs;
            }
        }
        if good != rec.done {
            rec.done = 0;
            rec.crcs.clear();
            sha = sha2::Sha256::new();
        }
        if let Some(p) = &prev {
            let _ = std::fs::remove_file(p);
        }
        rec.tmp_tag = self.owner;
        f.set_len(rec.done).map_err(|e| io_err(e, &tmp))?;
        on_event(&Event::Started {
            path: rec.path.clone(),
            size: rec.size,
            resumed_at: rec.done,
        });
        // The writer thread also hashes (in order), beside the fetching and checking here.
        let mut out = WriteBehind::new(&f, direct.as_ref(), cs as usize * group, sha)
            .map_err(|e| io_err(e, &tmp))?;
        let started = Instant::now();
        let mut written_here = 0u64;
        let mut since_checkpoint = 0u64;
        let mut last_checkpoint = Instant::now();
        while rec.done < rec.size {
            if stop.load(Ordering::Relaxed) {
                out.drain().map_err(|e| io_err(e, &tmp))?;
                let _ = checkpoint(fs, rec, &self.opts)?;
                return Ok(Copied::Stopped);
            }
            // Up to `group` chunk windows, each checked (crc from the cache) and summed,
            // while the previous group is being written.
            let mut buf = out.take().map_err(|e| io_err(e, &tmp))?;
            let window = buf.slice_mut();
            let start = rec.done;
            let mut filled = 0usize;
            while filled < window.len() && start + (filled as u64) < rec.size {
                let pos = start + filled as u64;
                let n = pos / cs;
                let len = (rec.size - pos).min(cs) as usize;
                let data = fs.chunk_content(inode, n)?;
                let have = data.len().min(len);
                let w = &mut window[filled..filled + len];
                w[..have].copy_from_slice(&data[..have]);
                w[have..].fill(0);
                rec.crcs.push(memfabric_checksum::crc32c(w));
                filled += len;
                if len < cs as usize {
                    break;
                }
            }
            out.submit(buf, filled, start);
            rec.done += filled as u64;
            written_here += filled as u64;
            since_checkpoint += filled as u64;
            if let Some(bw) = self.opts.bandwidth.filter(|&b| b > 0) {
                let due = Duration::from_secs_f64(written_here as f64 / bw as f64);
                let spent = started.elapsed();
                if due > spent {
                    std::thread::sleep(due - spent);
                }
            }
            if since_checkpoint >= self.opts.checkpoint_bytes
                || last_checkpoint.elapsed() >= self.opts.lease / 4
            {
                // The record says only what is in the file.
                out.drain().map_err(|e| io_err(e, &tmp))?;
                if !checkpoint(fs, rec, &self.opts)? {
                    return Ok(Copied::LostLease);
                }
                since_checkpoint = 0;
                last_checkpoint = Instant::now();
                on_event(&Event::Progress {
                    path: rec.path.clone(),
                    done: rec.done,
                    size: rec.size,
                });
            }
        }
        out.drain().map_err(|e| io_err(e, &tmp))?;
        let Some(digest) = out.finish() else {
            return Ok(Copied::Mismatch);
        };
        f.sync_all().map_err(|e| io_err(e, &tmp))?;
        // Flushed before (then renamed): the same content must give the same digest.
        if inode.sha256.is_some_and(|s| s != digest) {
            return Ok(Copied::Mismatch);
        }
        if self.opts.readback && !self.read_back(&tmp, cs, rec, &digest)? {
            return Ok(Copied::Mismatch);
        }
        // Still the content that was copied (no publication, no writer since)?
        let now = fs.get_inode(rec.id)?;
        if now.gen != inode.gen || now.version != inode.version || now.writing_until_ms > now_ms() {
            return Ok(Copied::Changed);
        }
        // The lease must still be ours before the rename makes the file visible.
        if !checkpoint(fs, rec, &self.opts)? {
            return Ok(Copied::LostLease);
        }
        set_mode(&tmp, inode.mode)?;
        let times = std::fs::FileTimes::new()
            .set_modified(inode.mtime.to_system())
            .set_accessed(inode.atime.to_system());
        let _ = f.set_times(times);
        f.sync_all().map_err(|e| io_err(e, &tmp))?;
        drop(f);
        publish(fs, inode, &tmp, dest)?;
        Ok(Copied::Verified(digest))
    }

    /// Reads the temporary file back from the backing store: every window's crc and the
    /// whole file's sha256 as written.
    fn read_back(&self, tmp: &Path, cs: u64, rec: &FlushRecord, digest: &[u8; 32]) -> Result<bool> {
        let mut f = File::open(tmp).map_err(|e| io_err(e, tmp))?;
        let mut sha = sha2::Sha256::new();
        let mut buf = vec![0u8; cs as usize];
        let mut i = 0usize;
        let mut total = 0u64;
        loop {
            let mut got = 0;
            while got < buf.len() {
                match f.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err(e, tmp)),
                }
            }
            if got == 0 {
                break;
            }
            if rec.crcs.get(i) != Some(&memfabric_checksum::crc32c(&buf[..got])) {
                return Ok(false);
            }
            sha.update(&buf[..got]);
            total += got as u64;
            i += 1;
        }
        let again: [u8; 32] = sha.finalize().into();
        Ok(total == rec.size && i == rec.crcs.len() && &again == digest)
    }
}

/// A page-aligned buffer (O_DIRECT wants aligned memory).
struct AlignedBuf {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let at = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, at, len }
    }
    fn slice_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
    fn slice(&self, len: usize) -> &[u8] {
        &self.raw[self.at..self.at + len]
    }
}

/// Writes to the temporary file on its own thread, so that the next group of chunks is
/// fetched, checked and hashed while the previous one goes to the backing store (two
/// buffers: one filling, one writing).
struct WriteBehind {
    to: Option<std::sync::mpsc::SyncSender<(AlignedBuf, usize, u64)>>,
    back: std::sync::mpsc::Receiver<(AlignedBuf, std::io::Result<()>)>,
    free: Vec<AlignedBuf>,
    outstanding: usize,
    thread: Option<std::thread::JoinHandle<sha2::Sha256>>,
}

impl WriteBehind {
    /// `sha`: the hash of what is already in the file; the thread goes on with every
    /// buffer it writes, in order.
    fn new(
        f: &File,
        direct: Option<&File>,
        len: usize,
        mut sha: sha2::Sha256,
    ) -> std::io::Result<WriteBehind> {
        let f = f.try_clone()?;
        let direct = direct.map(File::try_clone).transpose()?;
        let (to, jobs) = std::sync::mpsc::sync_channel::<(AlignedBuf, usize, u64)>(2);
        let (done, back) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("bb-flush-io".into())
            .spawn(move || {
                for (buf, n, pos) in jobs {
                    let w = buf.slice(n);
                    let r = match &direct {
                        Some(d) if n.is_multiple_of(DIRECT_ALIGN) => d.write_all_at(w, pos),
                        _ => f.write_all_at(w, pos),
                    };
                    sha.update(w);
                    if done.send((buf, r)).is_err() {
                        break;
                    }
                }
                sha
            })?;
        Ok(WriteBehind {
            to: Some(to),
            back,
            free: vec![AlignedBuf::new(len), AlignedBuf::new(len)],
            outstanding: 0,
            thread: Some(thread),
        })
    }

    /// A buffer to fill: a free one, or the next one the writer gives back.
    fn take(&mut self) -> std::io::Result<AlignedBuf> {
        if let Some(b) = self.free.pop() {
            return Ok(b);
        }
        self.wait_one()?;
        Ok(self.free.pop().expect("a buffer came back"))
    }

    fn wait_one(&mut self) -> std::io::Result<()> {
        let Ok((buf, r)) = self.back.recv() else {
            self.outstanding = 0;
            return Err(std::io::Error::other("the flush writer thread died"));
        };
        self.outstanding -= 1;
        self.free.push(buf);
        r
    }

    fn submit(&mut self, buf: AlignedBuf, len: usize, pos: u64) {
        self.outstanding += 1;
        if let Some(to) = &self.to {
            // A writer that died is reported by the next take or drain.
            let _ = to.send((buf, len, pos));
        }
    }

    /// Waits until everything submitted is written; the first error.
    fn drain(&mut self) -> std::io::Result<()> {
        let mut first = Ok(());
        while self.outstanding > 0 {
            if let Err(e) = self.wait_one() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl WriteBehind {
    /// Ends the writer (after `drain`) and returns the sha256 of the whole file (None if
    /// the writer thread died).
    fn finish(mut self) -> Option<[u8; 32]> {
        self.to.take();
        let sha = self.thread.take()?.join().ok()?;
        Some(sha.finalize().into())
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.to.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// O_DIRECT's alignment of buffers, offsets and lengths (a page, enough for 512-byte and
/// 4 KiB sector devices).
const DIRECT_ALIGN: usize = 4096;

/// The copy an earlier flush made under a name the file no longer has (renamed or
/// removed in the cache) goes: a file only if it is still exactly what that flush wrote
/// (its sha256), a directory only if it is empty and its path is not in the cache's
/// namespace. Then the parent directories that became empty and are not in the cache's
/// namespace go too. Nothing the burst buffer did not write is ever removed.
fn remove_previous_copy(fs: &mut Fs, root: &Path, rec: &FlushRecord) {
    if rec.prev_path.is_empty() || rec.prev_path == rec.path {
        return;
    }
    let old = root.join(bytes_path(&rec.prev_path));
    let Ok(m) = std::fs::symlink_metadata(&old) else {
        return;
    };
    // Only what the cache's namespace no longer has a name for (without reading the
    // backing directory through: that would make a stub of the very copy).
    let in_cache =
        |fs: &mut Fs, rel: &[u8]| !matches!(fs.resolve_cached(rel), Err(FsError::NotFound));
    if in_cache(fs, &rec.prev_path) {
        return;
    }
    let removed = match rec.prev_sha256 {
        Some(sha) if m.is_file() => {
            sha256_of_file(&old).is_some_and(|d| d == sha) && std::fs::remove_file(&old).is_ok()
        }
        None if m.is_dir() => std::fs::remove_dir(&old).is_ok(),
        None if m.file_type().is_symlink() => std::fs::remove_file(&old).is_ok(),
        _ => false,
    };
    if !removed {
        return;
    }
    let mut dir = old.parent().map(Path::to_path_buf);
    while let Some(d) = dir {
        let _ = sync_dir(&d);
        let Ok(rel) = d.strip_prefix(root) else {
            break;
        };
        if rel.as_os_str().is_empty() || in_cache(fs, rel.as_os_str().as_encoded_bytes()) {
            break;
        }
        if std::fs::remove_dir(&d).is_err() {
            break;
        }
        dir = d.parent().map(Path::to_path_buf);
    }
}

/// sha256 of a file, read in pieces.
fn sha256_of_file(p: &Path) -> Option<[u8; 32]> {
    let mut f = File::open(p).ok()?;
    let mut sha = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(sha.finalize().into()),
            Ok(n) => sha.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

enum Copied {
    Verified([u8; 32]),
    Mismatch,
    /// The file changed (published, or opened for writing) while it was copied.
    Changed,
    LostLease,
    Stopped,
}

/// `.<name>.mfbb-<id>-<tag>.tmp` beside the destination, where tag names the flusher
/// that writes it (the record says whose holds the progress); never the final name.
pub fn tmp_path(dest: &Path, id: u64, tag: u64) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.as_encoded_bytes().to_vec())
        .unwrap_or_default();
    let suffix = format!(".mfbb-{id}-{tag:x}.tmp");
    // Keep the temporary name within NAME_MAX.
    let keep = name.len().min(255 - 1 - suffix.len());
    let mut t = b".".to_vec();
    t.extend_from_slice(&name[..keep]);
    t.extend_from_slice(suffix.as_bytes());
    dest.with_file_name(bytes_path(&t))
}

/// Makes the finished copy `tmp` the backing file `dest` (rename, then the directory
/// synced), under the lock of the file's directory in the cache, which hides `dest` with a
/// whiteout if the file has been renamed or removed meanwhile.
fn publish(fs: &mut Fs, inode: &Inode, tmp: &Path, dest: &Path) -> Result<()> {
    let name = dest
        .file_name()
        .map_or(Vec::new(), |n| n.as_encoded_bytes().to_vec());
    fs.publish_in_backing(inode.parent, &name, inode.kind, || {
        std::fs::rename(tmp, dest).map_err(|e| io_err(e, dest))?;
        sync_dir(dest.parent().unwrap_or(Path::new("/")))
    })
}

fn io_err(e: std::io::Error, p: &Path) -> FsError {
    FsError::Backing(
        format!("{}: {e}", p.display()),
        e.raw_os_error().unwrap_or(libc::EIO),
    )
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| io_err(e, p))
}

fn sync_dir(p: &Path) -> Result<()> {
    File::open(p)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(e, p))
}
