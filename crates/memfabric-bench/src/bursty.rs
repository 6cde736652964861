//! The bursty I/O benchmark (Boldio's §5.4): W writers each write a checkpoint of F
//! files x S bytes, then read it back (a restart), through the burst buffer and straight
//! to the backing directory with fsync (the "Lustre-direct" baseline) in the same run;
//! then the burst buffer flushes to the backing directory, against that directory's raw
//! sequential write speed (`dd oflag=direct`) measured in the same run.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use memfabric_bb::flush::{self, FlushOptions, Flusher};
use memfabric_bb::fs::{Fs, Options};
use memfabric_bb::layout::{Kind, ROOT};
use memfabric_client::{Client, Config};
use serde::Serialize;

/// How writers lay their blocks out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Each writer its own files, front to back (N-N, sequential).
    Sequential,
    /// One shared file per checkpoint file index, writers interleaved block by block
    /// (N-1, strided).
    Strided,
    /// Each writer its own files, blocks in a shuffled order (N-N, random).
    Random,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Pattern, String> {
        match s {
            "sequential" => Ok(Pattern::Sequential),
            "strided" => Ok(Pattern::Strided),
            "random" => Ok(Pattern::Random),
            _ => Err(format!("{s}: sequential, strided or random")),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct BurstyConfig {
    pub writers: usize,
    pub files: usize,
    /// Bytes each writer writes per file index (a shared file holds writers x this).
    pub file_size: u64,
    /// Bytes per write/read call.
    pub block: usize,
    pub chunk: u32,
    pub depth: usize,
    pub pattern: Pattern,
    /// Flushers working at once.
    pub flushers: usize,
    pub progress: bool,
}

impl BurstyConfig {
    pub fn total(&self) -> u64 {
        self.writers as u64 * self.files as u64 * self.file_size
    }
    pub fn validate(&self) -> Result<(), String> {
        if self.writers == 0 || self.files == 0 || self.block == 0 || self.file_size == 0 {
            return Err("writers, files, block and file size must be above 0".into());
        }
        if !self.file_size.is_multiple_of(self.block as u64) {
            return Err(format!(
                "file size {} is not a multiple of the block {}",
                self.file_size, self.block
            ));
        }
        Ok(())
    }
}

/// One phase's result.
#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    pub name: String,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
}

impl Phase {
    fn new(name: &str, bytes: u64, d: Duration) -> Phase {
        let s = d.as_secs_f64().max(1e-9);
        Phase {
            name: name.into(),
            bytes,
            seconds: s,
            mb_per_s: bytes as f64 / s / 1e6,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct BurstyResult {
    pub raw_direct_write: Phase,
    pub direct_write: Phase,
    pub direct_read: Phase,
    pub bb_write: Phase,
    pub bb_read: Phase,
    pub flush: Phase,
    /// bb_write / direct_write speed.
    pub write_speedup: f64,
    /// bb_read / direct_read speed.
    pub read_speedup: f64,
    /// flush / raw speed.
    pub flush_of_raw: f64,
}

/// The bytes every block starts from (random, made once): a block is this with where it
/// belongs stamped over its first 24 bytes, so that making and checking a block cost a
/// copy and a compare, not the benchmark's own CPU time.
fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut v = vec![0u8; len];
    for word in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        word.copy_from_slice(&bytes[..word.len()]);
    }
    v
}

/// The block `b` of writer `w`'s file `f`.
fn fill_block(buf: &mut [u8], base: &[u8], w: usize, f: usize, b: u64) {
    buf.copy_from_slice(&base[..buf.len()]);
    let stamp = [w as u64, f as u64, b];
    for (i, v) in stamp.iter().enumerate() {
        if buf.len() >= (i + 1) * 8 {
            buf[i * 8..(i + 1) * 8].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Where block `b` (0-based, of this writer's blocks) of writer `w` goes in its file, and
/// the file's name.
fn place(cfg: &BurstyConfig, w: usize, f: usize, b: u64) -> (String, u64) {
    let bs = cfg.block as u64;
    match cfg.pattern {
        Pattern::Strided => (
            format!("ckpt.{f}"),
            (b * cfg.writers as u64 + w as u64) * bs,
        ),
        _ => (format!("ckpt.{f}.rank{w}"), b * bs),
    }
}

/// The order writer `w` writes its blocks in.
fn order(cfg: &BurstyConfig, w: usize, f: usize) -> Vec<u64> {
    let n = cfg.file_size / cfg.block as u64;
    let mut v: Vec<u64> = (0..n).collect();
    if cfg.pattern == Pattern::Random {
        let mut x = (w as u64 * 31 + f as u64 + 7) | 1;
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    v
}

/// Prints the bytes done once a second while a phase runs.
struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(on: bool, name: &str, total: u64) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = on.then(|| {
            let (done, stop, name) = (done.clone(), stop.clone(), name.to_string());
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut last = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    if last.elapsed() >= Duration::from_secs(1) {
                        last = Instant::now();
                        let d = done.load(Ordering::Relaxed);
                        eprintln!(
                            "bursty: {name}: {} / {} MiB ({:.0}%), {:.0} MB/s",
                            d >> 20,
                            total >> 20,
                            d as f64 * 100.0 / total.max(1) as f64,
                            d as f64 / t0.elapsed().as_secs_f64() / 1e6
                        );
                    }
                }
            })
        });
        Progress { done, stop, thread }
    }
    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Runs `f(w)` on W threads started together; the wall time from the start to the last.
fn parallel(n: usize, f: impl Fn(usize) -> Res<()> + Send + Sync + 'static) -> Res<Duration> {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|w| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                f(w)
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    let mut err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => err = Some(e),
            Err(_) => err = Some("a worker panicked".into()),
        }
    }
    let took = t0.elapsed();
    err.map_or(Ok(took), Err)
}

/// `dd if=/dev/zero of=DIR/raw bs=1M count=N oflag=direct`: the backing directory's raw
/// sequential write speed.
pub fn raw_write(dir: &Path, bytes: u64) -> Res<Phase> {
    let target = dir.join("raw.dd");
    let count = (bytes >> 20).max(1);
    let t0 = Instant::now();
    let out = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", target.display()))
        .args(["bs=1M", &format!("count={count}"), "oflag=direct"])
        .output()?;
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&target);
    if !out.status.success() {
        return Err(format!("dd: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(Phase::new("raw write (dd oflag=direct)", count << 20, took))
}

/// Drops a file's pages from the page cache, so that reading it back comes from the
/// backing store, as a restart on other nodes would.
fn evict(path: &Path) -> Res<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    nix::fcntl::posix_fadvise(
        f.as_raw_fd(),
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )?;
    Ok(())
}

/// Writes the checkpoint straight to `dir` (each file fsynced), then reads it back.
pub fn direct(cfg: &BurstyConfig, dir: &Path) -> Res<(Phase, Phase)> {
    std::fs::create_dir_all(dir)?;
    let total = cfg.total();
    let p = Progress::start(cfg.progress, "direct write", total);
    let (c, d, done) = (cfg.clone(), dir.to_path_buf(), p.done.clone());
    let took = parallel(cfg.writers, move |w| {
        let mut buf = vec![0u8; c.block];
        let base = pattern(c.block);
        for f in 0..c.files {
            let (name, _) = place(&c, w, f, 0);
            let file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(d.join(&name))?;
            for b in order(&c, w, f) {
                let (_, at) = place(&c, w, f, b);
                fill_block(&mut buf, &base, w, f, b);
                file.write_all_at(&buf, at)?;
                done.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
            file.sync_all()?;
        }
        Ok(())
    })?;
    p.finish();
    let write = Phase::new("direct write + fsync", total, took);
    for e in std::fs::read_dir(dir)? {
        evict(&e?.path())?;
    }
    let p = Progress::start(cfg.progress, "direct read", total);
    let (c, d, done) = (cfg.clone(), dir.to_path_buf(), p.done.clone());
    let took = parallel(cfg.writers, move |w| {
        let mut buf = vec![0u8; c.block];
        let mut want = vec![0u8; c.block];
        let base = pattern(c.block);
        for f in 0..c.files {
            let (name, _) = place(&c, w, f, 0);
            let file = std::fs::File::open(d.join(&name))?;
            for b in 0..c.file_size / c.block as u64 {
                let (_, at) = place(&c, w, f, b);
                file.read_exact_at(&mut buf, at)?;
                fill_block(&mut want, &base, w, f, b);
                if buf != want {
                    return Err(format!("{name}: block {b} differs").into());
                }
                done.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    })?;
    p.finish();
    Ok((write, Phase::new("direct read", total, took)))
}

/// What a burst-buffer phase needs to open its clients.
#[derive(Clone)]
pub struct Pool {
    pub servers: String,
    pub config: Config,
    pub fs: Options,
}

impl Pool {
    fn open(&self) -> Res<Fs> {
        let c = Client::new(self.servers.as_str(), self.config.clone())?;
        Ok(Fs::open(c, self.fs.clone())?)
    }
}

/// Absorbs the checkpoint into the burst buffer, then reads it back (new clients: a
/// restart).
pub fn burst_buffer(cfg: &BurstyConfig, pool: &Pool) -> Res<(Phase, Phase)> {
    let total = cfg.total();
    // The files (and, for N-1, the shared ones) exist before the writers start.
    let mut fs = pool.open()?;
    let dir = fs.create(ROOT, b"ckpt", Kind::Dir, 0o755, 0, 0, b"")?.id;
    for w in 0..cfg.writers {
        for f in 0..cfg.files {
            let (name, _) = place(cfg, w, f, 0);
            if fs.lookup(dir, name.as_bytes()).is_err() {
                fs.create(dir, name.as_bytes(), Kind::File, 0o644, 0, 0, b"")?;
            }
        }
    }
    drop(fs);
    let p = Progress::start(cfg.progress, "burst buffer write", total);
    let (c, pl, done) = (cfg.clone(), pool.clone(), p.done.clone());
    let took = parallel(cfg.writers, move |w| {
        let mut fs = pl.open()?;
        let mut buf = vec![0u8; c.block];
        let base = pattern(c.block);
        for f in 0..c.files {
            let (name, _) = place(&c, w, f, 0);
            let id = fs.resolve(format!("/ckpt/{name}").as_bytes())?.id;
            fs.open_write(id)?;
            for b in order(&c, w, f) {
                let (_, at) = place(&c, w, f, b);
                fill_block(&mut buf, &base, w, f, b);
                fs.write(id, at, &buf)?;
                done.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
            fs.close_write(id)?;
        }
        Ok(())
    })?;
    p.finish();
    let write = Phase::new("burst buffer write + close", total, took);
    let p = Progress::start(cfg.progress, "burst buffer read", total);
    let (c, pl, done) = (cfg.clone(), pool.clone(), p.done.clone());
    let took = parallel(cfg.writers, move |w| {
        let mut fs = pl.open()?;
        let mut want = vec![0u8; c.block];
        let base = pattern(c.block);
        for f in 0..c.files {
            let (name, _) = place(&c, w, f, 0);
            let id = fs.resolve(format!("/ckpt/{name}").as_bytes())?.id;
            for b in 0..c.file_size / c.block as u64 {
                let (_, at) = place(&c, w, f, b);
                let got = fs.read(id, at, c.block)?;
                fill_block(&mut want, &base, w, f, b);
                if got != want {
                    return Err(format!("{name}: block {b} differs").into());
                }
                done.fetch_add(got.len() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    })?;
    p.finish();
    Ok((write, Phase::new("burst buffer read", total, took)))
}

/// Flushes the checkpoint to the backing directory with `cfg.flushers` flushers.
pub fn flush_phase(cfg: &BurstyConfig, pool: &Pool) -> Res<Phase> {
    let total = cfg.total();
    let mut fs = pool.open()?;
    let queued = flush::enqueue_dirty(&mut fs, ROOT)?;
    if queued == 0 {
        return Err("nothing to flush".into());
    }
    drop(fs);
    let p = Progress::start(cfg.progress, "flush", total);
    let (pl, done) = (pool.clone(), p.done.clone());
    let took = parallel(cfg.flushers.max(1), move |_| {
        let mut fs = pl.open()?;
        let mut last = 0u64;
        let sum = Flusher::new(FlushOptions::default()).run(
            &mut fs,
            &AtomicBool::new(false),
            &mut |ev| match ev {
                flush::Event::Started { resumed_at, .. } => last = *resumed_at,
                flush::Event::Progress { done: d, .. } => {
                    done.fetch_add(d - last, Ordering::Relaxed);
                    last = *d;
                }
                flush::Event::Finished { size, .. } => {
                    done.fetch_add(size - last, Ordering::Relaxed);
                    last = 0;
                }
                flush::Event::Failed { .. } => {}
            },
        )?;
        if let Some((p, e)) = sum.failed.first() {
            return Err(format!("flush of {} failed: {e}", String::from_utf8_lossy(p)).into());
        }
        Ok(())
    })?;
    p.finish();
    Ok(Phase::new("flush to the backing directory", total, took))
}

/// Checks the flushed checkpoint in the backing directory, byte for byte.
pub fn check_flushed(cfg: &BurstyConfig, dir: &Path) -> Res<()> {
    let mut buf = vec![0u8; cfg.block];
    let mut want = vec![0u8; cfg.block];
    let base = pattern(cfg.block);
    for w in 0..cfg.writers {
        for f in 0..cfg.files {
            let (name, _) = place(cfg, w, f, 0);
            let file = std::fs::File::open(dir.join("ckpt").join(&name))?;
            for b in 0..cfg.file_size / cfg.block as u64 {
                let (_, at) = place(cfg, w, f, b);
                file.read_exact_at(&mut buf, at)?;
                fill_block(&mut want, &base, w, f, b);
                if buf != want {
                    return Err(format!("flushed {name}: block {b} differs").into());
                }
            }
        }
    }
    Ok(())
}

/// A scratch directory under the backing directory, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn speedups(r: &mut BurstyResult) {
    r.write_speedup = r.bb_write.mb_per_s / r.direct_write.mb_per_s.max(1e-9);
    r.read_speedup = r.bb_read.mb_per_s / r.direct_read.mb_per_s.max(1e-9);
    r.flush_of_raw = r.flush.mb_per_s / r.raw_direct_write.mb_per_s.max(1e-9);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pattern: Pattern) -> BurstyConfig {
        BurstyConfig {
            writers: 3,
            files: 2,
            file_size: 4 * 4096,
            block: 4096,
            chunk: 8192,
            depth: 4,
            pattern,
            flushers: 1,
            progress: false,
        }
    }

    #[test]
    fn every_pattern_writes_each_byte_of_each_file_exactly_once() {
        for pattern in [Pattern::Sequential, Pattern::Strided, Pattern::Random] {
            let c = cfg(pattern);
            let mut seen = std::collections::HashMap::<(String, u64), usize>::new();
            for w in 0..c.writers {
                for f in 0..c.files {
                    let o = order(&c, w, f);
                    let mut sorted = o.clone();
                    sorted.sort();
                    assert_eq!(sorted, (0..4).collect::<Vec<_>>(), "{pattern:?}");
                    for b in o {
                        *seen.entry(place(&c, w, f, b)).or_default() += 1;
                    }
                }
            }
            assert!(
                seen.values().all(|&n| n == 1),
                "{pattern:?}: a block written twice"
            );
            assert_eq!(seen.len() as u64 * 4096, c.total());
        }
    }
}
