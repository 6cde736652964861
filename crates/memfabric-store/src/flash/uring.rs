//! The io_uring engine for flash reads: one thread keeps up to `depth` device reads in
//! flight for as many lookups, where the thread pool (`psync`) keeps one per thread.
//!
//! A lookup (`FlashReader::lookup`/`advance`) says which device read it needs; the
//! engine submits it into memory it owns, and when the completion comes back feeds the
//! bytes to the lookup, which asks for its next read (another candidate slot, a chained
//! item's next piece) or ends; then `done` is called with the caller's context and the
//! result, on this thread. New lookups wait in a bounded queue; the thread sleeps in
//! `io_uring_enter` until a read completes or a lookup is queued (a byte on a pipe,
//! whose read is always in flight).
//!
//! `probe` is the start-up check that io_uring reads work here (a kernel without it, a
//! seccomp filter, `kernel.io_uring_disabled`).
//!
//! The only `unsafe` is handing the kernel a submission that points into memory: every
//! such buffer is owned by this thread's table of operations (or is the wake buffer,
//! which lives as long as the thread) until its completion has been reaped, and the
//! thread reaps every submission before it ends.
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use io_uring::{opcode, types, IoUring};

use super::{aligned, DeviceRead};
use crate::store::{FlashCandidates, FlashHit, FlashLookup, FlashReader, LookupStep};

/// The completion that stands for "a lookup was queued" (the pipe read).
const WAKE: u64 = u64::MAX;

/// Reads a lookup submitted to the engine: the key, where to look, and the caller's
/// context handed back with the result.
type Job<T> = (Vec<u8>, FlashCandidates, T);

/// An io_uring read engine with its thread.
pub struct UringReads<T: Send + 'static> {
    tx: Mutex<Option<SyncSender<Job<T>>>>,
    wake: Mutex<std::io::PipeWriter>,
    /// A byte is on its way to the engine (set by submitters, cleared by the engine):
    /// at most one byte is ever in the pipe.
    notified: Arc<AtomicBool>,
    /// Lookups queued or in flight.
    pub queued: Arc<AtomicU64>,
    /// The ring failed and the engine reads with `pread` instead (`fail_over`).
    failed: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Check that io_uring reads work here: a ring, and one read of the tier's first 4 KiB.
pub fn probe(reader: &FlashReader) -> io::Result<()> {
    let file = reader
        .first_file()
        .ok_or_else(|| io::Error::other("no flash tier"))?;
    let mut ring = IoUring::new(2)?;
    let (mut buf, start) = aligned(4096);
    let read = opcode::Read::new(types::Fd(file.as_raw_fd()), buf[start..].as_mut_ptr(), 4096)
        .offset(0)
        .build()
        .user_data(1);
    // SAFETY: `buf` outlives the read: it is dropped below only once the read's
    // completion was reaped, and leaked if the ring failed before that.
    unsafe { ring.submission().push(&read) }.map_err(|_| io::Error::other("queue full"))?;
    let submitted = ring.submit_and_wait(1);
    let res = ring.completion().next().map(|c| c.result());
    match (submitted, res) {
        (Ok(_), Some(r)) if r >= 0 => Ok(()),
        (Ok(_), Some(e)) => Err(io::Error::from_raw_os_error(-e)),
        (r, _) => {
            std::mem::forget(buf);
            Err(r.err().unwrap_or_else(|| io::Error::other("no completion")))
        }
    }
}

impl<T: Send + 'static> UringReads<T> {
    /// Start the engine: at most `depth` lookups in flight, `queue` more waiting; `done`
    /// gets each lookup's context and result.
    pub fn start(
        reader: FlashReader,
        depth: usize,
        queue: usize,
        done: impl FnMut(T, Option<FlashHit>) + Send + 'static,
    ) -> io::Result<UringReads<T>> {
        let depth = depth.max(1);
        let ring = IoUring::new((depth + 1).next_power_of_two() as u32)?;
        let (wake_rx, wake_tx) = std::io::pipe()?;
        let (tx, rx) = sync_channel::<Job<T>>(queue);
        let notified = Arc::new(AtomicBool::new(false));
        let queued = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicBool::new(false));
        let engine = Engine {
            reader,
            ring,
            rx,
            wake_rx,
            wake_buf: Box::new([0u8; 64]),
            wake_armed: false,
            notified: Arc::clone(&notified),
            queued: Arc::clone(&queued),
            failed: Arc::clone(&failed),
            ops: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            done,
        };
        let thread = std::thread::Builder::new()
            .name("mf-flash-uring".into())
            .spawn(move || engine.run())?;
        Ok(UringReads {
            tx: Mutex::new(Some(tx)),
            wake: Mutex::new(wake_tx),
            notified,
            queued,
            failed,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Did the ring fail (the engine reads with `pread` since)?
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Queue a lookup. `Err` gives the context back when the queue is full or the engine
    /// stopped (the caller reads some other way).
    pub fn submit(&self, key: Vec<u8>, cands: FlashCandidates, ctx: T) -> Result<(), T> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else {
            return Err(ctx);
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send((key, cands, ctx)) {
            Ok(()) => {
                self.nudge();
                Ok(())
            }
            Err(TrySendError::Full((_, _, ctx)) | TrySendError::Disconnected((_, _, ctx))) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                Err(ctx)
            }
        }
    }

    /// Wake the engine if no wake-up is on its way already.
    fn nudge(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = self
                .wake
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write(&[1]);
        }
    }
}

impl<T: Send + 'static> Drop for UringReads<T> {
    fn drop(&mut self) {
        // Closing the queue, then a wake-up: the engine finishes what is in flight and
        // ends.
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.notified.store(false, Ordering::Release);
        self.nudge();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// A lookup whose device read is in flight: the read's memory lives here until its
/// completion is reaped.
struct Op<T> {
    lk: FlashLookup,
    ctx: T,
    d: DeviceRead,
    buf: Vec<u8>,
    start: usize,
    /// Bytes read so far (a short read is continued).
    got: usize,
}

struct Engine<T, F: FnMut(T, Option<FlashHit>)> {
    reader: FlashReader,
    ring: IoUring,
    rx: Receiver<Job<T>>,
    wake_rx: std::io::PipeReader,
    wake_buf: Box<[u8; 64]>,
    /// The pipe read into `wake_buf` is in flight.
    wake_armed: bool,
    notified: Arc<AtomicBool>,
    queued: Arc<AtomicU64>,
    failed: Arc<AtomicBool>,
    /// Lookups in flight, by slot (a completion's user data is its slot).
    ops: Vec<Option<Op<T>>>,
    free: Vec<usize>,
    done: F,
}

impl<T: Send + 'static, F: FnMut(T, Option<FlashHit>)> Engine<T, F> {
    fn run(mut self) {
        let mut closed = false;
        loop {
            while !closed && !self.free.is_empty() {
                match self.rx.try_recv() {
                    Ok((key, cands, ctx)) => {
                        let lk = self.reader.lookup(key, cands);
                        self.step(lk, ctx, None);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => closed = true,
                }
            }
            // The pipe read is armed again only after the queue was looked at: a lookup
            // queued since then left a byte in the pipe, which this read takes at once.
            if !self.wake_armed && !closed {
                self.wake_armed = self.arm_wake();
            }
            let in_flight = self.ops.len() - self.free.len();
            // Closed: end once nothing is in flight, the pipe read included (the byte
            // `UringReads::drop` writes after closing the queue completes it).
            if closed && in_flight == 0 && !self.wake_armed {
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // Interrupted, or the kernel short of resources for now: reap what
                // completed and try again.
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => {
                    // The ring failed: what is in flight is finished with plain reads,
                    // and so is everything after (the memory of reads the kernel may
                    // still hold is leaked rather than freed under it).
                    eprintln!("memfabric flash tier: io_uring failed ({e}); reading with pread");
                    self.fail_over();
                    return;
                }
            }
            let cqes: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (ud, res) in cqes {
                if ud == WAKE {
                    self.wake_armed = false;
                    self.notified.store(false, Ordering::Release);
                    continue;
                }
                let slot = ud as usize;
                let Some(mut op) = self.ops.get_mut(slot).and_then(Option::take) else {
                    continue;
                };
                let r = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else if res == 0 {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end",
                    ))
                } else if op.got + (res as usize) < op.d.len {
                    // A short read: read the rest into the same memory.
                    op.got += res as usize;
                    if self.submit_read(slot, &mut op) {
                        self.ops[slot] = Some(op);
                        continue;
                    }
                    let r = self.reader.device_read(&op.d);
                    self.free.push(slot);
                    self.finish_sync(op.lk, op.ctx, Some(r));
                    continue;
                } else {
                    Ok((op.buf, op.start))
                };
                self.free.push(slot);
                self.step(op.lk, op.ctx, Some(r));
            }
        }
    }

    /// Take a lookup as far as it goes: submit its next read, or hand its result over.
    fn step(&mut self, mut lk: FlashLookup, ctx: T, done: Option<io::Result<(Vec<u8>, usize)>>) {
        let d = match self.reader.advance(&mut lk, done) {
            LookupStep::Done(hit) => {
                self.queued.fetch_sub(1, Ordering::Relaxed);
                (self.done)(ctx, hit);
                return;
            }
            LookupStep::Read(d) => d,
        };
        let Some(slot) = self.free.pop() else {
            // Not expected (a lookup starts only with a free slot): read here.
            let r = self.reader.device_read(&d);
            return self.finish_sync(lk, ctx, Some(r));
        };
        let (buf, start) = aligned(d.len);
        let mut op = Op {
            lk,
            ctx,
            d,
            buf,
            start,
            got: 0,
        };
        if self.submit_read(slot, &mut op) {
            self.ops[slot] = Some(op);
        } else {
            self.free.push(slot);
            let r = self.reader.device_read(&op.d);
            self.finish_sync(op.lk, op.ctx, Some(r));
        }
    }

    /// Queue the read of `op` (what is still to read of it) as `slot`. The caller then
    /// puts `op` into `self.ops[slot]`, where its memory stays until the completion.
    /// False when it could not be queued.
    fn submit_read(&mut self, slot: usize, op: &mut Op<T>) -> bool {
        let Some(file) = self.reader.device_file(&op.d) else {
            return false;
        };
        let fd = file.as_raw_fd();
        let at = op.start + op.got;
        let len = (op.d.len - op.got) as u32;
        let read = opcode::Read::new(types::Fd(fd), op.buf[at..].as_mut_ptr(), len)
            .offset(op.d.pos + op.got as u64)
            .build()
            .user_data(slot as u64);
        // SAFETY: the memory the read fills (`op.buf[at..at + len]`) is the heap block of
        // `op.buf`, which the caller moves into `self.ops[slot]` (moving the Vec does not
        // move its block) and which is dropped only after the completion with user data
        // `slot` is reaped (`run`); `run` ends only with nothing in flight, and if it
        // unwinds or the ring fails, the blocks of reads in flight are leaked instead
        // (`Drop`, `fail_over`). The file is the tier's, open as long as `self.reader`
        // holds the store.
        unsafe { self.ring.submission().push(&read) }.is_ok()
    }

    /// Finish a lookup here, with `pread`.
    fn finish_sync(
        &mut self,
        mut lk: FlashLookup,
        ctx: T,
        mut done: Option<io::Result<(Vec<u8>, usize)>>,
    ) {
        loop {
            match self.reader.advance(&mut lk, done.take()) {
                LookupStep::Done(hit) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    (self.done)(ctx, hit);
                    return;
                }
                LookupStep::Read(d) => done = Some(self.reader.device_read(&d)),
            }
        }
    }

    /// Keep a read of the wake pipe in flight. False if it could not be queued.
    fn arm_wake(&mut self) -> bool {
        let read = opcode::Read::new(
            types::Fd(self.wake_rx.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            self.wake_buf.len() as u32,
        )
        .build()
        .user_data(WAKE);
        // SAFETY: `wake_buf` is a box this engine owns for its whole life, and `run`
        // reaps this read (writing a byte to the pipe itself if need be) before it ends.
        unsafe { self.ring.submission().push(&read) }.is_ok()
    }

    /// The ring failed: the lookups in flight start over with `pread` (their buffers,
    /// which the kernel may still write, are leaked), then every queued lookup is served
    /// the same way until the queue closes.
    fn fail_over(&mut self) {
        self.failed.store(true, Ordering::Relaxed);
        for slot in 0..self.ops.len() {
            if let Some(op) = self.ops[slot].take() {
                let Op {
                    lk, ctx, d, buf, ..
                } = op;
                std::mem::forget(buf);
                let r = self.reader.device_read(&d);
                self.finish_sync(lk, ctx, Some(r));
            }
        }
        if self.wake_armed {
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 64])));
            self.wake_armed = false;
        }
        while let Ok((key, cands, ctx)) = self.rx.recv() {
            let lk = self.reader.lookup(key, cands);
            self.finish_sync(lk, ctx, None);
        }
    }
}

impl<T, F: FnMut(T, Option<FlashHit>)> Drop for Engine<T, F> {
    /// `run` ends with nothing in flight and nothing queued; this is for a panic on the
    /// engine thread (the ring's fd closing does not wait for the kernel to stop
    /// writing): the memory of every read in flight is leaked rather than freed, and
    /// every lookup in flight or queued is answered as a miss, so that nobody waits for
    /// an engine that is gone.
    fn drop(&mut self) {
        if self.wake_armed {
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 64])));
        }
        let mut unanswered = Vec::new();
        for op in self.ops.iter_mut().filter_map(Option::take) {
            std::mem::forget(op.buf);
            unanswered.push(op.ctx);
        }
        while let Ok((_, _, ctx)) = self.rx.try_recv() {
            unanswered.push(ctx);
        }
        for ctx in unanswered {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            (self.done)(ctx, None);
        }
    }
}
