//! A connection's unsent replies: copied bytes and pinned item values, in order.
//!
//! Small replies are copied into byte buffers; a large value is queued as a
//! [`PinnedItem`] and written from item memory with `writev`, so a reply never needs a
//! heap copy of a large value, and a client that does not read costs the server its
//! queued *copied* bytes (bounded by the output cap) plus pins on item memory that is
//! already counted in `-m`. Both count toward the connection's output cap
//! (`docs/connections.md`), which is checked between requests and between the keys of a
//! multiget.
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use memfabric_store::PinnedItem;

/// At most this many pieces go to one `writev` (well under Linux's IOV_MAX of 1024).
const MAX_IOVECS: usize = 64;

/// The largest byte segment kept as `spare`: a reply's header line fits, and an idle
/// connection holds at most this much for it.
const SPARE_MAX: usize = 1024;

enum Segment {
    Bytes(Vec<u8>),
    Pinned(PinnedItem),
    /// The place of a reply that is not ready (a command that answered "pending"):
    /// nothing after it is written until `fill` puts the reply here. With the bytes the
    /// reply may take (counted in `reserved` until it is filled).
    Hole(u64, usize),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Bytes(b) => b.len(),
            Segment::Pinned(p) => p.value_len(),
            Segment::Hole(..) => 0,
        }
    }
}

/// Queued reply bytes: sealed segments, then the open byte buffer `tail` that executors
/// append to.
#[derive(Default)]
pub struct OutQueue {
    segments: VecDeque<Segment>,
    /// Bytes of the first segment (or of `tail`, when there is no segment) already sent.
    sent: usize,
    tail: Vec<u8>,
    /// A small written-out byte segment kept for the next `seal_tail`, so that a reply
    /// with a pinned value (its header line sealed, then its trailer) allocates nothing
    /// (`SPARE_MAX`).
    spare: Vec<u8>,
    /// Unsent bytes in pinned segments, and how many such segments there are.
    pinned: usize,
    pinned_values: usize,
    /// Unsent bytes in all segments and the tail.
    queued: usize,
    /// Holes not filled yet.
    holes: usize,
    /// Bytes the replies owed at the holes may take.
    reserved: usize,
}

/// A position in the queue to roll back to (see [`OutQueue::truncate`]).
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    segments: usize,
    tail: usize,
}

impl OutQueue {
    pub fn new() -> OutQueue {
        OutQueue::default()
    }

    /// Unsent bytes (copied and pinned).
    pub fn len(&self) -> usize {
        self.queued + self.tail.len() - self.tail_sent()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unsent bytes that are pinned item memory rather than copies.
    pub fn pinned_bytes(&self) -> usize {
        self.pinned
    }

    /// Pinned values queued (for `stats`).
    pub fn pinned_values(&self) -> usize {
        self.pinned_values
    }

    fn tail_sent(&self) -> usize {
        if self.segments.is_empty() {
            self.sent
        } else {
            0
        }
    }

    /// The open buffer replies are appended to.
    pub fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.tail
    }

    /// Keep the place of a reply that is not ready: replies appended after it wait until
    /// [`OutQueue::fill`] puts that reply here.
    pub fn push_hole(&mut self, ticket: u64, reserve: usize) {
        self.seal_tail();
        self.holes += 1;
        self.reserved += reserve;
        self.segments.push_back(Segment::Hole(ticket, reserve));
    }

    /// Bytes the replies still owed may take (what their commands said when they
    /// answered "pending"): output the connection has committed to but not queued yet.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Holes not filled yet (replies the connection still owes before later ones).
    pub fn holes(&self) -> usize {
        self.holes
    }

    /// Nothing left to write and no reply still owed.
    pub fn is_done(&self) -> bool {
        self.is_empty() && self.holes == 0
    }

    /// Put the reply `with` (everything queued in it) where hole `ticket` is. Returns
    /// false if there is no such hole.
    pub fn fill(&mut self, ticket: u64, mut with: OutQueue) -> bool {
        let Some(at) = self
            .segments
            .iter()
            .position(|s| matches!(s, Segment::Hole(t, _) if *t == ticket))
        else {
            return false;
        };
        if let Some(Segment::Hole(_, r)) = self.segments.get(at) {
            self.reserved -= *r;
        }
        with.seal_tail();
        debug_assert_eq!(with.sent, 0);
        self.holes -= 1;
        self.holes += with.holes;
        self.reserved += with.reserved;
        self.queued += with.queued;
        self.pinned += with.pinned;
        self.pinned_values += with.pinned_values;
        let tail = self.segments.split_off(at + 1);
        self.segments.pop_back();
        self.segments.extend(with.segments.drain(..));
        self.segments.extend(tail);
        with.reset();
        true
    }

    /// Queue a pinned value after everything appended so far.
    pub fn push_pinned(&mut self, pin: PinnedItem) {
        self.seal_tail();
        self.queued += pin.value_len();
        self.pinned += pin.value_len();
        self.pinned_values += 1;
        self.segments.push_back(Segment::Pinned(pin));
    }

    fn seal_tail(&mut self) {
        if self.tail.is_empty() {
            return;
        }
        let tail = std::mem::replace(&mut self.tail, std::mem::take(&mut self.spare));
        if self.segments.is_empty() && self.sent > 0 {
            // The tail was partly written: only its rest is queued.
            self.queued += tail.len() - self.sent;
        } else {
            self.queued += tail.len();
        }
        self.segments.push_back(Segment::Bytes(tail));
    }

    pub fn mark(&self) -> Mark {
        Mark {
            segments: self.segments.len(),
            tail: self.tail.len(),
        }
    }

    /// Drop everything queued after `mark` (a command that fails after it started its
    /// reply). Only valid while nothing after the mark was written.
    pub fn truncate(&mut self, mark: Mark) {
        if self.segments.len() > mark.segments {
            // The open buffer was started after the mark.
            self.tail.clear();
        }
        while self.segments.len() > mark.segments {
            match self.segments.pop_back() {
                Some(Segment::Pinned(p)) => {
                    self.queued -= p.value_len();
                    self.pinned -= p.value_len();
                    self.pinned_values -= 1;
                }
                Some(Segment::Hole(_, r)) => {
                    self.holes -= 1;
                    self.reserved -= r;
                }
                Some(Segment::Bytes(b)) => {
                    self.queued -= b.len();
                    if self.segments.len() == mark.segments {
                        // This was the tail at the mark: keep its first part open.
                        self.tail = b;
                        self.tail.truncate(mark.tail);
                        return;
                    }
                }
                None => break,
            }
        }
        self.tail.truncate(mark.tail);
    }

    /// Whether bytes are queued that a write could send now (not all of them behind a
    /// reply still owed).
    pub fn has_writable(&self) -> bool {
        match self.segments.front() {
            Some(Segment::Hole(..)) => false,
            Some(_) => true,
            None => !self.tail.is_empty(),
        }
    }

    /// Write as much as `w` takes without blocking; returns bytes written. Stops at
    /// `WouldBlock` (returned as `Ok` with what was written before it).
    pub fn write_to(&mut self, w: &mut impl Write) -> io::Result<usize> {
        let mut total = 0;
        while !self.is_empty() {
            let n = {
                let mut slices = Slices {
                    at: [IoSlice::new(&[]); MAX_IOVECS],
                    len: 0,
                };
                let mut skip = self.sent;
                let mut blocked = false;
                'fill: for seg in &self.segments {
                    match seg {
                        Segment::Hole(..) => {
                            blocked = true;
                            break;
                        }
                        Segment::Bytes(b) => {
                            slices.push(IoSlice::new(&b[skip..]));
                            skip = 0;
                        }
                        Segment::Pinned(p) => {
                            for s in p.value_slices() {
                                if skip >= s.len() {
                                    skip -= s.len();
                                    continue;
                                }
                                slices.push(IoSlice::new(&s[skip..]));
                                skip = 0;
                                if slices.len() == MAX_IOVECS {
                                    break 'fill;
                                }
                            }
                        }
                    }
                    if slices.len() == MAX_IOVECS {
                        break;
                    }
                }
                if !blocked && slices.len() < MAX_IOVECS && !self.tail.is_empty() {
                    slices.push(IoSlice::new(&self.tail[self.tail_sent()..]));
                }
                if slices.len() == 0 {
                    // Only replies behind an unfilled hole are left.
                    break;
                }
                match w.write_vectored(slices.as_slice()) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.consume(n);
            total += n;
        }
        if self.is_done() {
            self.reset();
        }
        Ok(total)
    }

    /// Copy up to `buf.len()` unsent bytes into `buf` and count them as sent (UDP frames
    /// its datagrams this way). Returns how many were copied.
    pub fn read_into(&mut self, buf: &mut [u8]) -> usize {
        let mut w = SliceWriter { buf, at: 0 };
        // A SliceWriter never fails; it stops taking bytes when full.
        let n = self.write_to(&mut w).unwrap_or(0);
        debug_assert_eq!(n, w.at);
        n
    }

    /// Account `n` written bytes, releasing fully written segments (and their pins).
    fn consume(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self
                .segments
                .front()
                .filter(|s| !matches!(s, Segment::Hole(..)))
            else {
                // Only the tail is left.
                self.sent += n;
                return;
            };
            let left = front.len() - self.sent;
            let take = left.min(n);
            n -= take;
            self.queued -= take;
            if matches!(front, Segment::Pinned(_)) {
                self.pinned -= take;
            }
            if take == left {
                match self.segments.pop_front() {
                    Some(Segment::Pinned(_)) => self.pinned_values -= 1,
                    Some(Segment::Bytes(mut b)) if b.capacity() <= SPARE_MAX => {
                        b.clear();
                        self.spare = b;
                    }
                    _ => {}
                }
                self.sent = 0;
            } else {
                self.sent += take;
            }
        }
    }

    /// Everything was written: forget it, and do not keep a huge buffer for an idle
    /// connection.
    fn reset(&mut self) {
        self.segments.clear();
        self.holes = 0;
        self.reserved = 0;
        self.tail.clear();
        self.sent = 0;
        self.queued = 0;
        self.pinned = 0;
        self.pinned_values = 0;
        if self.tail.capacity() > 256 << 10 {
            self.tail = Vec::new();
        }
    }

    /// Drop everything queued (releasing its pins).
    pub fn clear(&mut self) {
        self.reset();
    }

    /// All unsent bytes as one buffer (tests, logs).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        let mut skip = self.sent;
        for seg in &self.segments {
            match seg {
                Segment::Bytes(b) => v.extend_from_slice(&b[skip..]),
                Segment::Pinned(p) => {
                    let mut value = Vec::with_capacity(p.value_len());
                    p.read_value(&mut value);
                    v.extend_from_slice(&value[skip..]);
                }
                // Logs and tests see what is written so far.
                Segment::Hole(..) => return v,
            }
            skip = 0;
        }
        v.extend_from_slice(&self.tail[self.tail_sent()..]);
        v
    }

    /// Take every unsent byte out as one buffer (tests, logs).
    pub fn take_vec(&mut self) -> Vec<u8> {
        let v = self.to_vec();
        self.reset();
        v
    }
}

/// The pieces of one `writev`, without a heap allocation per write.
struct Slices<'a> {
    at: [IoSlice<'a>; MAX_IOVECS],
    len: usize,
}

impl<'a> Slices<'a> {
    fn push(&mut self, s: IoSlice<'a>) {
        if let Some(slot) = self.at.get_mut(self.len) {
            *slot = s;
            self.len += 1;
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_slice(&self) -> &[IoSlice<'a>] {
        &self.at[..self.len]
    }
}

/// `Write` into a fixed slice, taking what fits.
struct SliceWriter<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Write for SliceWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.buf.len() - self.at;
        if room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = room.min(data.len());
        self.buf[self.at..self.at + n].copy_from_slice(&data[..n]);
        self.at += n;
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            match self.write(b) {
                Ok(k) => {
                    n += k;
                    if k < b.len() {
                        break;
                    }
                }
                Err(e) if n == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `chunk` bytes per call, then says WouldBlock every other call.
    struct Trickle {
        got: Vec<u8>,
        chunk: usize,
        block_next: bool,
    }

    impl Write for Trickle {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            let block = self.block_next;
            self.block_next = !block;
            if block {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = data.len().min(self.chunk);
            self.got.extend_from_slice(&data[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn bytes_written_in_pieces_arrive_whole_and_in_order() {
        let mut q = OutQueue::new();
        q.bytes().extend_from_slice(b"hello ");
        q.seal_tail();
        q.bytes().extend_from_slice(b"world");
        let mut w = Trickle {
            got: Vec::new(),
            chunk: 3,
            block_next: false,
        };
        while !q.is_empty() {
            q.write_to(&mut w).unwrap();
            // Appending while partly written keeps the order.
            if w.got.len() == 3 {
                q.bytes().extend_from_slice(b"!");
            }
        }
        assert_eq!(w.got, b"hello world!");
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn truncate_to_a_mark_drops_only_what_came_after() {
        let mut q = OutQueue::new();
        q.bytes().extend_from_slice(b"keep");
        let m = q.mark();
        q.bytes().extend_from_slice(b"drop");
        q.seal_tail();
        q.bytes().extend_from_slice(b"more");
        q.truncate(m);
        assert_eq!(q.to_vec(), b"keep");
        assert_eq!(q.len(), 4);
    }

    fn pinned(store: &memfabric_store::Store, key: &[u8]) -> PinnedItem {
        let opts = memfabric_store::GetOptions::default();
        store.get_pinned(key, &opts).expect("stored").1
    }

    #[test]
    fn pinned_values_are_written_between_their_bytes_and_released() {
        let store =
            memfabric_store::Store::new(memfabric_store::StoreConfig::default()).expect("store");
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        store.store(memfabric_store::SetMode::Set, b"k", &big, 0, 0, 0);
        let mut q = OutQueue::new();
        q.bytes().extend_from_slice(b"head ");
        q.push_pinned(pinned(&store, b"k"));
        q.bytes().extend_from_slice(b" mid ");
        q.push_pinned(pinned(&store, b"k"));
        q.bytes().extend_from_slice(b" tail");
        assert_eq!(q.pinned_values(), 2);
        assert_eq!(q.pinned_bytes(), 2 * big.len());
        let mut want = b"head ".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b" mid ");
        want.extend_from_slice(&big);
        want.extend_from_slice(b" tail");
        assert_eq!(q.len(), want.len());
        let mut w = Trickle {
            got: Vec::new(),
            chunk: 70_001,
            block_next: false,
        };
        while !q.is_empty() {
            q.write_to(&mut w).unwrap();
        }
        assert!(w.got == want, "bytes differ");
        assert_eq!(q.pinned_values(), 0);
        assert_eq!(q.pinned_bytes(), 0);
    }

    #[test]
    fn truncating_past_a_pinned_value_drops_its_pin() {
        let store =
            memfabric_store::Store::new(memfabric_store::StoreConfig::default()).expect("store");
        store.store(memfabric_store::SetMode::Set, b"k", &[7u8; 50_000], 0, 0, 0);
        let mut q = OutQueue::new();
        q.bytes().extend_from_slice(b"keep");
        let m = q.mark();
        q.bytes().extend_from_slice(b"VALUE");
        q.push_pinned(pinned(&store, b"k"));
        q.bytes().extend_from_slice(b"\r\n");
        q.truncate(m);
        assert_eq!(q.to_vec(), b"keep");
        assert_eq!(q.pinned_values(), 0);
        assert_eq!(q.pinned_bytes(), 0);
    }

    #[test]
    fn read_into_frames_bytes_across_segments() {
        let mut q = OutQueue::new();
        q.bytes().extend_from_slice(b"abc");
        q.seal_tail();
        q.bytes().extend_from_slice(b"defgh");
        let mut buf = [0u8; 4];
        assert_eq!(q.read_into(&mut buf), 4);
        assert_eq!(&buf, b"abcd");
        assert_eq!(q.len(), 4);
        assert_eq!(q.read_into(&mut buf), 4);
        assert_eq!(&buf, b"efgh");
        assert!(q.is_empty());
    }

    #[test]
    fn only_bytes_before_an_owed_reply_are_writable() {
        let mut q = OutQueue::new();
        assert!(!q.has_writable());
        q.push_hole(7, 0);
        q.bytes().extend_from_slice(b"after");
        assert!(!q.has_writable(), "everything waits for reply 7");
        let mut reply = OutQueue::new();
        reply.bytes().extend_from_slice(b"seven");
        assert!(q.fill(7, reply));
        assert!(q.has_writable());
        let mut sink = Vec::new();
        q.write_to(&mut sink).unwrap();
        assert_eq!(sink, b"sevenafter");
        assert!(!q.has_writable());
    }
}
