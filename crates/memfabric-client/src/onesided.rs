//! One-sided GET: the client reads the key's index buckets and then the item straight
//! from memfabricd's registered memory with RMA reads, and accepts the value only when
//! every check passes (docs/one-sided.md). This module holds the read's state machine;
//! `ucx/rma.rs` posts the reads it asks for and feeds their results back.
//!
//! A GET takes three rounds of reads:
//! 1. **probe**: the control block's live words (flush CAS, flush time, clock) and both
//!    candidate buckets, in parallel;
//! 2. **item**: the chunk a tag-matching slot points at (its class gives the chunk size,
//!    so one read fetches header, key and value);
//! 3. **confirm**: that bucket again and the item's `seq` word, in parallel: the bucket
//!    version and the slot, and the item's seq, must not have changed since rounds 1
//!    and 2.
//!
//! A read that raced a writer is retried a few times, then served two-sided. Misses,
//! dead items and chained (multi-chunk) items are always served two-sided: the server's
//! answer is authoritative.
use memfabric_proto::onesided::{self as os, Bucket, Geometry, ItemOk, KeyHash, Live, Slot};

/// Rounds of reads a GET may start over before it is served two-sided.
pub const MAX_ATTEMPTS: u8 = 4;

/// What a one-sided read needs of one server, learnt at connect.
#[derive(Clone, Debug)]
pub struct Remote {
    pub geo: Geometry,
    pub arena_base: u64,
    pub arena_len: u64,
    pub index_base: u64,
    /// Seconds to add to our clock to get the server's (from WELCOME).
    pub clock_offset: i64,
}

impl Remote {
    pub fn live_addr(&self) -> u64 {
        self.index_base + self.geo.buckets() * os::BUCKET_BYTES as u64 + os::CTL_LIVE.start as u64
    }

    pub fn bucket_addr(&self, b: u64) -> u64 {
        self.index_base + b * os::BUCKET_BYTES as u64
    }

    /// The server's clock: its control block's word, or our clock corrected by the offset
    /// measured at connect, whichever is later (the block's word is refreshed a few times
    /// a second).
    pub fn now(&self, live: &Live) -> u32 {
        let ours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let est = (ours + self.clock_offset).clamp(0, u32::MAX as i64) as u32;
        est.max(live.now)
    }
}

/// Why a GET was served two-sided after all (counted per reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// No slot with the key: a miss is confirmed by the server.
    Miss,
    /// The item is expired or flushed by the server clock: the server decides.
    Dead,
    /// The value spans several chunks.
    Chained,
    /// Still racing writers after `MAX_ATTEMPTS` rounds.
    Raced,
    /// The slot names flash or an impossible location.
    BadSlot,
    /// An RMA read failed.
    ReadError,
}

impl Fallback {
    pub const ALL: [Fallback; 6] = [
        Fallback::Miss,
        Fallback::Dead,
        Fallback::Chained,
        Fallback::Raced,
        Fallback::BadSlot,
        Fallback::ReadError,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fallback::Miss => "miss",
            Fallback::Dead => "dead",
            Fallback::Chained => "chained",
            Fallback::Raced => "raced",
            Fallback::BadSlot => "bad_slot",
            Fallback::ReadError => "read_error",
        }
    }
}

/// A read the state machine wants posted: `len` bytes at `addr` of the arena or index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    pub part: u8,
    pub arena: bool,
    pub addr: u64,
    pub len: usize,
}

/// What to do next.
#[derive(Debug)]
pub enum Step {
    /// Post these reads (all of one round) and feed their results to `on_read`.
    Post(Vec<Read>),
    /// Wait for more results of the current round.
    Wait,
    /// Done: the value (a range of `chunk`), and the access hint to send.
    Hit {
        ok: ItemOk,
        chunk: Vec<u8>,
        hint: (u64, u32),
    },
    /// Serve it two-sided.
    Fallback(Fallback),
}

#[derive(Debug)]
enum Stage {
    Probe,
    Item,
    Confirm,
}

/// One GET in flight.
#[derive(Debug)]
pub struct GetRead {
    key: Vec<u8>,
    kh: KeyHash,
    stage: Stage,
    outstanding: u8,
    pub attempts: u8,
    failed: bool,
    live: Live,
    buckets: [Option<Bucket>; 2],
    /// Tag matches of this round: (bucket 0/1, slot), tried in order.
    candidates: Vec<(usize, Slot)>,
    /// The candidate being read, and its item once it passed the checks.
    current: Option<(usize, Slot)>,
    item: Option<(ItemOk, Vec<u8>)>,
    confirm_bucket: Option<Bucket>,
    confirm_seq: Option<u32>,
    /// Why the last item read was refused, for `item_checked`.
    rejected: Option<os::Reject>,
    /// How many rounds started over because a writer was in the way.
    pub retries: u8,
}

impl GetRead {
    pub fn new(remote: &Remote, key: Vec<u8>) -> (GetRead, Step) {
        let kh = remote.geo.hash(&key);
        let mut g = GetRead {
            key,
            kh,
            stage: Stage::Probe,
            outstanding: 0,
            attempts: 0,
            failed: false,
            live: Live::default(),
            buckets: [None, None],
            candidates: Vec::new(),
            current: None,
            item: None,
            confirm_bucket: None,
            confirm_seq: None,
            rejected: None,
            retries: 0,
        };
        let step = g.probe(remote);
        (g, step)
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    fn post(&mut self, reads: Vec<Read>) -> Step {
        self.outstanding = reads.len() as u8;
        self.failed = false;
        Step::Post(reads)
    }

    fn probe(&mut self, remote: &Remote) -> Step {
        self.attempts += 1;
        if self.attempts > MAX_ATTEMPTS {
            return Step::Fallback(Fallback::Raced);
        }
        self.stage = Stage::Probe;
        self.buckets = [None, None];
        self.candidates.clear();
        self.current = None;
        self.item = None;
        self.rejected = None;
        let b = os::BUCKET_BYTES;
        self.post(vec![
            Read {
                part: 0,
                arena: false,
                addr: remote.live_addr(),
                len: os::CTL_LIVE.len(),
            },
            Read {
                part: 1,
                arena: false,
                addr: remote.bucket_addr(self.kh.b1),
                len: b,
            },
            Read {
                part: 2,
                arena: false,
                addr: remote.bucket_addr(self.kh.b2),
                len: b,
            },
        ])
    }

    fn retry(&mut self, remote: &Remote) -> Step {
        self.retries += 1;
        self.probe(remote)
    }

    /// Read the next candidate's chunk, or give up on the slots found.
    fn next_candidate(&mut self, remote: &Remote) -> Step {
        while !self.candidates.is_empty() {
            let (bi, slot) = self.candidates.remove(0);
            if slot.flash {
                return Step::Fallback(Fallback::BadSlot);
            }
            let Some(size) = remote.geo.chunk_size(slot.class) else {
                continue; // a slot read mid-change: the confirm round would refuse it
            };
            if slot.off % 8 != 0
                || slot
                    .off
                    .checked_add(size as u64)
                    .is_none_or(|end| end > remote.arena_len)
            {
                continue;
            }
            self.current = Some((bi, slot));
            self.stage = Stage::Item;
            return self.post(vec![Read {
                part: 0,
                arena: true,
                addr: remote.arena_base + slot.off,
                len: size,
            }]);
        }
        Step::Fallback(Fallback::Miss)
    }

    /// The result of read `part` of the current round: its bytes, or None if it failed.
    pub fn on_read(&mut self, remote: &Remote, part: u8, data: Option<Vec<u8>>) -> Step {
        self.outstanding = self.outstanding.saturating_sub(1);
        let Some(data) = data else {
            self.failed = true;
            return if self.outstanding == 0 {
                Step::Fallback(Fallback::ReadError)
            } else {
                Step::Wait
            };
        };
        match (&self.stage, part) {
            (Stage::Probe, 0) => self.live = Live::decode(&data),
            (Stage::Probe, p @ (1 | 2)) => {
                self.buckets[p as usize - 1] = Some(Bucket::decode(&data))
            }
            (Stage::Item, _) => self.item_read(remote, data),
            (Stage::Confirm, 0) => self.confirm_bucket = Some(Bucket::decode(&data)),
            (Stage::Confirm, _) => self.confirm_seq = Some(os::item_seq(&data)),
            _ => {}
        }
        if self.outstanding > 0 {
            return Step::Wait;
        }
        if self.failed {
            return Step::Fallback(Fallback::ReadError);
        }
        match self.stage {
            Stage::Probe => self.probed(remote),
            Stage::Item => self.item_checked(remote),
            Stage::Confirm => self.confirmed(remote),
        }
    }

    fn probed(&mut self, remote: &Remote) -> Step {
        let (Some(b1), Some(b2)) = (self.buckets[0], self.buckets[1]) else {
            return Step::Fallback(Fallback::ReadError);
        };
        if !b1.stable() || !b2.stable() {
            return self.retry(remote);
        }
        let tag = self.kh.tag;
        self.candidates = b1
            .matches(tag)
            .map(|s| (0, s))
            .chain(b2.matches(tag).map(|s| (1, s)))
            .collect();
        self.next_candidate(remote)
    }

    /// Stash the item read; `item_checked` decides once the round is complete.
    fn item_read(&mut self, remote: &Remote, chunk: Vec<u8>) {
        let now = remote.now(&self.live);
        match os::check_item(&chunk, &self.key, &self.live, now) {
            Ok(ok) => self.item = Some((ok, chunk)),
            Err(r) => {
                self.item = None;
                self.rejected = Some(r);
            }
        }
    }

    fn item_checked(&mut self, remote: &Remote) -> Step {
        if let Some(r) = self.rejected.take() {
            use os::Reject as R;
            return match r {
                R::OtherKey => self.next_candidate(remote),
                R::Expired | R::Flushed => Step::Fallback(Fallback::Dead),
                R::Chained => Step::Fallback(Fallback::Chained),
                R::Torn | R::NotLinked | R::Malformed | R::Checksum => self.retry(remote),
            };
        }
        let Some((bi, slot)) = self.current else {
            return Step::Fallback(Fallback::ReadError);
        };
        self.stage = Stage::Confirm;
        self.confirm_bucket = None;
        self.confirm_seq = None;
        let b = if bi == 0 { self.kh.b1 } else { self.kh.b2 };
        self.post(vec![
            Read {
                part: 0,
                arena: false,
                addr: remote.bucket_addr(b),
                len: os::BUCKET_BYTES,
            },
            Read {
                part: 1,
                arena: true,
                addr: remote.arena_base + slot.off,
                len: 8,
            },
        ])
    }

    fn confirmed(&mut self, remote: &Remote) -> Step {
        let (Some((bi, slot)), Some(now_bucket), Some(seq)) =
            (self.current, self.confirm_bucket, self.confirm_seq)
        else {
            return Step::Fallback(Fallback::ReadError);
        };
        let Some(before) = self.buckets[bi] else {
            return Step::Fallback(Fallback::ReadError);
        };
        let Some((ok, chunk)) = self.item.take() else {
            return Step::Fallback(Fallback::ReadError);
        };
        let unchanged = now_bucket.version == before.version
            && now_bucket.slots.contains(&slot.raw)
            && seq == ok.seq;
        if !unchanged {
            return self.retry(remote);
        }
        Step::Hit {
            hint: (slot.off, ok.seq),
            ok,
            chunk,
        }
    }
}
