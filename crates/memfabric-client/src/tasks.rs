//! The state of the pool's replicated and erasure-coded operations, and what it reports:
//! the write policies, acknowledgement counts, the pool's counters, hints, and the tasks
//! ([`crate::replicate`] drives them, [`crate::ec_pool`] adds coding). Types only, below
//! the client, so that the client can hold them without depending on the code that
//! drives them.

use std::collections::HashSet;

use bytes::Bytes;
use memfabric_proto::ec_fragment::{FragmentHeader, WriteId};

use crate::error::Error;
use crate::op::{Op, Reply};

/// How many copies must acknowledge a write before it succeeds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WritePolicy {
    /// Every copy; one unreachable copy fails the write.
    All,
    /// A majority of the copies (2 of 3); the rest finish in the background.
    #[default]
    Quorum,
    /// The first copy to answer; the others finish in the background.
    One,
}

impl WritePolicy {
    /// Acknowledgements needed out of `copies`.
    pub fn needed(self, copies: usize) -> usize {
        match self {
            WritePolicy::All => copies,
            WritePolicy::Quorum => copies / 2 + 1,
            WritePolicy::One => copies.min(1),
        }
    }
}

impl std::str::FromStr for WritePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(WritePolicy::All),
            "quorum" => Ok(WritePolicy::Quorum),
            "one" => Ok(WritePolicy::One),
            _ => Err(format!("unknown write policy '{s}' (all, quorum, one)")),
        }
    }
}

impl std::fmt::Display for WritePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WritePolicy::All => "all",
            WritePolicy::Quorum => "quorum",
            WritePolicy::One => "one",
        })
    }
}

/// How many copies acknowledged an operation (a write: stored it; a read: answered) out of
/// how many the key has. Unreplicated operations have one copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acks {
    pub acked: u8,
    pub copies: u8,
}

impl Acks {
    pub(crate) fn single(ok: bool) -> Acks {
        Acks {
            acked: u8::from(ok),
            copies: 1,
        }
    }
}

/// The pool's own counters (`memfabric --counters` prints them).
#[derive(Debug, Clone, Default)]
pub struct PoolCounters {
    /// Copies that acknowledged a replicated write.
    pub copies_written: u64,
    /// Copies that failed a replicated write (each then deleted or hinted).
    pub copy_write_failures: u64,
    /// Replicated operations that ended with fewer copies than their policy needs.
    pub ops_short: u64,
    /// Reads answered by a copy other than the first asked.
    pub reads_failed_over: u64,
    /// Values written back to copies that missed them.
    pub read_repairs: u64,
    /// Read repairs not made because `max_background` requests were in flight.
    pub read_repairs_skipped: u64,
    /// Keys remembered for a server that could not take a write.
    pub hints_recorded: u64,
    /// Hinted (or failed) copies deleted.
    pub hinted_deletes: u64,
    /// Servers flushed because they had more hints than `max_hints`.
    pub hint_flushes: u64,
    /// Reconnects that found a server with a new `instance_id` (it restarted, empty).
    pub restarts_detected: u64,
    /// Background probes of servers lost to a timeout (the pool reconnects to one only
    /// once its probe reached it), and those that did not reach it.
    pub reconnect_probes: u64,
    pub reconnect_probes_failed: u64,
    /// Connects made inline (blocking the client) that failed.
    pub connect_failures: u64,
    /// Values written erasure coded, and the time spent encoding them (nanoseconds).
    pub ec_writes: u64,
    pub encode_ns: u64,
    /// Erasure-coded values read; of them, rebuilt with parity (a data fragment was not
    /// among the first k), read while a server of the value failed or lacked its
    /// fragment (degraded), and the time spent decoding (nanoseconds).
    pub ec_reads: u64,
    pub decodes: u64,
    pub degraded_reads: u64,
    pub decode_ns: u64,
    /// Reads that found fragments of a coded value but fewer than k of any write, with
    /// more of its servers answering without one than a write leaves out (fragments
    /// evicted, deleted by a pool of a narrower code, or on servers that restarted
    /// empty): reported as misses.
    pub ec_lost_reads: u64,
    /// Fragments written back to servers that missed them.
    pub fragment_repairs: u64,
    /// Fragment writes a server did not store because it held a fragment of a newer
    /// write of the key (memfabricd over UCX: two writers raced, the newer one won there).
    pub ec_fragments_superseded: u64,
    /// Coded writes made again with a newer stripe after servers kept a newer write's
    /// fragments (a writer racing, or one whose clock is ahead).
    pub ec_rewrites: u64,
}

impl PoolCounters {
    pub fn pairs(&self) -> Vec<(String, u64)> {
        [
            ("copies_written", self.copies_written),
            ("copy_write_failures", self.copy_write_failures),
            ("ops_short", self.ops_short),
            ("reads_failed_over", self.reads_failed_over),
            ("read_repairs", self.read_repairs),
            ("read_repairs_skipped", self.read_repairs_skipped),
            ("hints_recorded", self.hints_recorded),
            ("hinted_deletes", self.hinted_deletes),
            ("hint_flushes", self.hint_flushes),
            ("restarts_detected", self.restarts_detected),
            ("reconnect_probes", self.reconnect_probes),
            ("reconnect_probes_failed", self.reconnect_probes_failed),
            ("connect_failures", self.connect_failures),
            ("ec_writes", self.ec_writes),
            ("encode_ns", self.encode_ns),
            ("ec_reads", self.ec_reads),
            ("decodes", self.decodes),
            ("degraded_reads", self.degraded_reads),
            ("decode_ns", self.decode_ns),
            ("ec_lost_reads", self.ec_lost_reads),
            ("fragment_repairs", self.fragment_repairs),
            ("ec_fragments_superseded", self.ec_fragments_superseded),
            ("ec_rewrites", self.ec_rewrites),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A server's hints, shared with the pool's background repairs: a repair must not copy
/// a value from a server that still owes a delete of it (`crate::refill`).
pub(crate) type SharedHints = std::sync::Arc<std::sync::Mutex<ServerHints>>;

/// Locks `h` (a panic elsewhere while it was held leaves the hints usable).
pub(crate) fn lock_hints(h: &SharedHints) -> std::sync::MutexGuard<'_, ServerHints> {
    h.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What must happen on a server before it may be read again.
#[derive(Debug, Default)]
pub(crate) struct ServerHints {
    /// Keys whose write failed there while it could not be reached.
    pub(crate) keys: HashSet<Vec<u8>>,
    /// More than `max_hints` keys: flush the server instead.
    pub(crate) overflow: bool,
}

impl ServerHints {
    /// Is a delete (or a flush) of `key` owed to this server?
    pub(crate) fn owes(&self, key: &[u8]) -> bool {
        self.overflow || self.keys.contains(key)
    }
}

/// Why a request was issued on the pool's behalf.
#[derive(Debug)]
pub(crate) enum Role {
    /// A step of the task under handle id `task`.
    Step { task: u64 },
    /// Delete a copy that may be stale.
    Hint { key: Vec<u8> },
    /// Flush a server that had too many hints.
    Flush,
    /// Ask a server for its instance id and whether it keeps newer writes, on connection
    /// `conn`, just made (the answer is about that connection's server).
    Probe { conn: crate::transport::ConnId },
    /// Work nobody waits for, bounded by `max_background`.
    Background(Background),
    /// Read repair of a value read without its expiry time: ask the server it was read
    /// from how long it still lives (one background request), then send these writes
    /// (server, counter, store) with that time.
    RepairTtl(Vec<(usize, Background, Op)>),
}

/// What a background request does (its counter).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Background {
    /// Write a value back to a copy that missed it.
    Repair,
    /// Write a fragment back to a server that missed it.
    FragmentRepair,
    /// Give the other copies a gat's new expiry time.
    Touch,
}

#[derive(Debug)]
pub(crate) struct Child {
    pub(crate) role: Role,
    pub(crate) server: usize,
}

/// A replicated operation in progress.
pub(crate) struct Task {
    /// The caller has its result (or stopped waiting for it).
    pub(crate) delivered: bool,
    pub(crate) abandoned: bool,
    /// Steps in flight.
    pub(crate) outstanding: usize,
    pub(crate) key: Vec<u8>,
    pub(crate) copies: Vec<usize>,
    pub(crate) needed: usize,
    pub(crate) acked: usize,
    pub(crate) failed: usize,
    /// Of `failed`, copies that refused the request itself ([`refusal`]): nothing was
    /// applied there, and every copy would refuse it alike.
    pub(crate) refused: usize,
    pub(crate) last_err: Option<Error>,
    /// Copies that failed this write while its outcome was open: deleted (or hinted)
    /// once it succeeds, left alone if it fails (they may hold the newest acknowledged
    /// value, which a failed write does not replace).
    pub(crate) suspects: Vec<usize>,
    /// The write was delivered as a success.
    pub(crate) succeeded: bool,
    pub(crate) kind: Kind,
}

impl Task {
    /// A task not yet started: nothing in flight, acknowledged or failed.
    pub(crate) fn new(key: Vec<u8>, copies: Vec<usize>, needed: usize, kind: Kind) -> Task {
        Task {
            delivered: false,
            abandoned: false,
            outstanding: 0,
            key,
            copies,
            needed,
            acked: 0,
            failed: 0,
            refused: 0,
            last_err: None,
            suspects: Vec::new(),
            succeeded: false,
            kind,
        }
    }
}

pub(crate) enum Kind {
    /// get/gets/gat: one copy after another; once a copy answers with a fragment of an
    /// erasure-coded value, all the value's servers at once (`ec`).
    Read {
        op: Op,
        order: Vec<usize>,
        next: usize,
        missed: Vec<usize>,
        asked: usize,
        ec: Option<Box<EcRead>>,
    },
    /// set/delete/touch: every copy at once (`per_copy[i]`, when given, is what copy `i`
    /// gets instead of `op`: an erasure-coded value's fragments); `any` = some copy
    /// deleted/touched.
    Fanout {
        op: Op,
        per_copy: Vec<Op>,
        any: bool,
        cas: u64,
        /// A coded write (its fragments, not `op`, went to the copies).
        ec: Option<EcWriting>,
    },
    /// Conditional operations: the leader, then the others. `coded`: an `add`,
    /// `replace` or `cas` of a value the pool codes; the leader gets its own fragment
    /// under the condition, and once it stored, the task becomes the coded write of the
    /// other fragments (a `Fanout` with `ec`).
    Lead {
        op: Op,
        reply: Option<Reply>,
        coded: Option<Box<CodedLead>>,
    },
}

/// The fragments of a conditional store's value, coded before the leader is asked.
pub(crate) struct CodedLead {
    pub(crate) stripe: u64,
    /// Fragment `i`, for the `i`-th of the task's copies.
    pub(crate) fragments: Vec<Bytes>,
}

/// Whether `e` is a server (or the client's encoder) refusing the request itself — a
/// `CLIENT_ERROR` (an `incr` of a value that is not a number), a value over the item size
/// limit, a key the protocol cannot carry — rather than failing to take it: nothing was
/// applied, and every copy would answer the same. A replicated operation that only met
/// refusals gives the refusal, as one server would, not `NotEnoughCopies`.
pub(crate) fn refusal(e: &Error) -> bool {
    matches!(e, Error::Client(_) | Error::TooLarge | Error::InvalidKey)
}

/// A coded write in flight.
pub(crate) struct EcWriting {
    /// The stripe its fragments carry (a newer one after each rewrite).
    pub(crate) stripe: u64,
    /// Servers that kept a newer write's fragment instead of this write's, and the
    /// newest stripe they kept.
    pub(crate) superseded: usize,
    pub(crate) newest_kept: u64,
    /// Times it was written again with a newer stripe (`Client::ec_rewrite`).
    pub(crate) rewrites: u8,
    /// An `add`, `replace` or `cas` whose leader stored its fragment: never written
    /// again. A server that kept a newer write's fragment holds a write the leader took
    /// after this one (one that reached the leader first would have failed the
    /// condition), so that write is the value and counts as this one's acknowledgement
    /// there; rewriting would undo it.
    pub(crate) conditional: bool,
}

/// A read that found a fragment: what the value's servers answered.
pub(crate) struct EcRead {
    /// The code the value was written with: the pool's, or the one the first fragment
    /// found names (a value another pool coded, or this pool before its code changed).
    pub(crate) code: std::sync::Arc<crate::ec::Code>,
    /// The value's servers, fragment `i` on `servers[i]`.
    pub(crate) servers: Vec<usize>,
    /// Fragments of this code that arrived: (position, header, bytes).
    pub(crate) frags: Vec<(usize, FragmentHeader, Bytes)>,
    /// Positions that answered without a fragment of this code (a miss, or something else).
    pub(crate) missing: Vec<usize>,
    /// Positions that could not be asked or failed.
    pub(crate) failed: usize,
    pub(crate) flags: u32,
    /// Servers of the value not asked yet (a read of a key known to be coded asks k+1
    /// first, the others only if those do not do).
    pub(crate) unasked: Vec<usize>,
    /// The newest fragment of another code that answered: a write made with another code
    /// (another pool's, or this pool's before its code changed), read with that code if
    /// it is newer than anything of this one.
    pub(crate) other: Option<FragmentHeader>,
    /// How many times the read started again with another code (bounded: writes of
    /// several codes racing could otherwise send it back and forth).
    pub(crate) code_switches: u8,
    /// The write delivered (its id and value), kept until the read's last reply so a
    /// server whose miss arrives after the decode still gets its fragment back.
    pub(crate) decoded: Option<(WriteId, Bytes)>,
    /// The CAS value of each fragment of this code that arrived, by position (a `gets`
    /// gives the leader's: `Client::ec_leader_cas`).
    pub(crate) cas_at: Vec<(usize, u64)>,
    /// A server answered without its fragment: the repair waits until every server of
    /// the value has been heard (`Client::ec_repair_once_heard`).
    pub(crate) repair_owed: bool,
}

/// An append or prepend in a pool that codes values, made in steps
/// ([`crate::modify`]): the step in flight, under the caller's handle `user`.
pub(crate) struct Modify {
    pub(crate) user: u64,
    /// The append or prepend (`Noop` once only the write's outcome is awaited).
    pub(crate) op: Op,
    pub(crate) step: ModifyStep,
}

pub(crate) enum ModifyStep {
    /// Reading the key; `coded_at` is a server holding a fragment of the value read, when
    /// it was coded.
    Read { coded_at: Option<usize> },
    /// Asking that server how long the coded value `value` still lives.
    Ttl { value: crate::op::Value },
    /// Writing: the outcome is the caller's.
    Write,
}
