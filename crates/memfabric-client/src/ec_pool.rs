//! Erasure coding in the pool: a `set` of a value at or above `ec_threshold` becomes
//! RS(k, m) fragments ([`crate::ec::Code`]) stored under the key on the next `k + m`
//! distinct servers along the ring (fragment `i` on the `i`-th), written at once like a
//! replicated set; a read that meets a fragment asks k more of the value's servers at once
//! (data fragments first; the others only if needed) and rebuilds the value from the first
//! `k` fragments of one write that may be trusted (late binding). An `add`, `replace` or
//! `cas` of such a value is coded too: the leader decides the condition on its own
//! fragment, then the others get theirs as a set's. Everything else —
//! policies, hints, tasks — is [`crate::replicate`]'s.
//!
//! A read decodes with the code the fragment names, not only the pool's own: a value
//! written by a pool with another `ec` (or by this pool before its `ec` changed) is read
//! back whole by any resilient pool over the same servers, never handed out as the raw
//! bytes of one fragment.
//!
//! How many fragments must be stored for a write to succeed (`WritePolicy`): `all` k+m,
//! `quorum` a majority of the k+m but at least k (4 of 4+2, so that with m servers down a
//! write still succeeds), `one` k (the least from which the value can be read).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use memfabric_proto::ec_fragment::{FragmentHeader, WriteId, HEADER_LEN, MAGIC as FRAGMENT_MAGIC};

use crate::client::{Client, Handle};
use crate::ec::{Code, EcGeometry};
use crate::error::Error;
use crate::op::{Op, Reply, StoreMode, StoreStatus, Value};
use crate::replicate::{follower_op, gat_exptime, repair_add};
use crate::tasks::{Background, CodedLead, EcRead, EcWriting, Kind, Task, WritePolicy};

/// Codes other than the pool's kept for reads (each holds its coding matrices).
const OTHER_CODES_KEPT: usize = 4;

/// Times a read may start again with the code of a newer write it met.
const MAX_CODE_SWITCHES: u8 = 2;

/// Fragments that must be stored for a write of RS(`k`, `m`) to succeed under `policy`.
pub(crate) fn ec_needed(policy: WritePolicy, k: usize, m: usize) -> usize {
    match policy {
        WritePolicy::All => k + m,
        WritePolicy::Quorum => k.max((k + m) / 2 + 1),
        WritePolicy::One => k,
    }
}

/// How many times a coded write is made again with a newer stripe after servers kept a
/// newer write's fragments (`Client::ec_rewrite`). Two writers that keep racing on one
/// key each give up after this many; the key then holds the newest of their writes.
const MAX_REWRITES: u8 = 3;

impl Client {
    /// Whether `op` stores a value to erasure-code (a `set`, or an `add`, `replace` or
    /// `cas`, whose condition the leader's fragment decides): a value at or above the
    /// threshold, in a pool with a code and enough servers for all its fragments.
    pub(crate) fn wants_ec(&self, op: &Op) -> bool {
        let Some(code) = &self.ec_code else {
            return false;
        };
        matches!(op, Op::Store {
                mode: StoreMode::Set | StoreMode::Add | StoreMode::Replace | StoreMode::Cas,
                value,
                ..
            } if value.len() >= self.config.ec_threshold.max(1))
            && self.servers.len() >= code.total_shards()
    }

    /// Whether a value read is a fragment of a coded value, of any code: intact (its
    /// header names the code and is checked, payload included), or damaged or of the old
    /// format under a checked header (a fragment lost: the value is read from the others).
    pub(crate) fn is_fragment(&self, v: &Value) -> bool {
        memfabric_proto::ec_fragment::code_of(&v.data).is_some()
    }

    /// The code RS(`k`, `m`): the pool's own, or one kept for reading values coded
    /// otherwise (a few are kept; `None` for a geometry no code can have).
    pub(crate) fn code_for(&mut self, k: u8, m: u8) -> Option<Arc<Code>> {
        let fits = |c: &Arc<Code>| c.is(k, m);
        if let Some(c) = self.ec_code.as_ref().filter(|c| fits(c)) {
            return Some(c.clone());
        }
        if let Some(c) = self.other_codes.iter().find(|c| fits(c)) {
            return Some(c.clone());
        }
        let code = Arc::new(Code::new(k, m).ok()?);
        if self.other_codes.len() >= OTHER_CODES_KEPT {
            self.other_codes.remove(0);
        }
        self.other_codes.push(code.clone());
        Some(code)
    }

    /// Whether `code` is this pool's own.
    fn is_pool_code(&self, code: &Arc<Code>) -> bool {
        self.ec_code.as_ref().is_some_and(|c| Arc::ptr_eq(c, code))
    }

    /// A stripe id higher than any this client gave before and, across clients, ordered by
    /// time (microseconds since the epoch, shifted, with a per-client counter below).
    fn next_stripe(&mut self) -> u64 {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let s = (micros << 8).max(self.last_stripe.saturating_add(1));
        self.last_stripe = s;
        s
    }

    /// How many of `servers` are not marked down.
    fn up_among(&self, servers: &[usize]) -> usize {
        servers.iter().filter(|&&s| self.is_up(s)).count()
    }

    /// Where a coded write of `key` goes: the pool's code (held apart from self while the
    /// fragments are issued; it stays in self too, where opening a connection looks, so
    /// a connection opened meanwhile is probed and gets its hints like any other), the
    /// value's `k + m` servers, and how many fragments must be stored. Overwriting
    /// fragments on fewer servers than needed would leave neither the old value nor the
    /// new one readable (the write hole): with servers known to be down, the write does
    /// not start.
    fn ec_write_plan(&mut self, key: &[u8]) -> Result<(Arc<Code>, Vec<usize>, usize), Error> {
        let Some(code) = self.ec_code.clone() else {
            return Err(Error::Protocol("no code".into()));
        };
        let (k, n) = (code.data_shards(), code.total_shards());
        let copies = self.ring.successors(key, n);
        let needed = ec_needed(self.config.write_policy, k, n - k);
        let up = self.up_among(&copies);
        if up < needed {
            self.counters.ops_short += 1;
            return Err(Error::NotEnoughCopies {
                acked: 0,
                needed: needed as u8,
                copies: n as u8,
                cause: format!("only {up} of the value's servers are up; nothing was written"),
            });
        }
        Ok((code, copies, needed))
    }

    /// Encodes the value and writes fragment `i` to the `i`-th server along the ring.
    pub(crate) fn submit_ec_write(&mut self, op: Op) -> Handle {
        let Op::Store { key, .. } = &op else {
            return self.fail_now(Error::Protocol("not a set".into()));
        };
        let key = key.clone();
        let (code, copies, needed) = match self.ec_write_plan(&key) {
            Ok(plan) => plan,
            Err(e) => return self.fail_now(e),
        };
        self.counters.ec_writes += 1;
        self.remember_coded(&key);
        let stripe = self.next_stripe();
        let h = self.new_handle();
        let mut task = Task::new(
            key,
            copies,
            needed,
            Kind::Fanout {
                op,
                per_copy: Vec::new(),
                any: false,
                cas: 0,
                ec: Some(EcWriting {
                    stripe,
                    superseded: 0,
                    newest_kept: 0,
                    rewrites: 0,
                    conditional: false,
                }),
            },
        );
        // Nothing is settled until every fragment is issued.
        let was = std::mem::replace(&mut self.settling, true);
        self.issue_ec_fragments(h.0, &mut task, &code, stripe);
        self.decide(h.0, &mut task);
        self.tasks.insert(h.0, task);
        self.settling = was;
        self.settle();
        h
    }

    /// An `add`, `replace` or `cas` of a value the pool codes. The condition is the
    /// leader's (the first of the value's first `plain_copies` servers that can be read,
    /// where a `gets` of a coded value takes its CAS value from), so the leader gets the
    /// operation with its own fragment; once it stored, the other servers get theirs as a
    /// coded `set` does (`Client::ec_lead_stored`). The value takes the memory of its
    /// fragments, not of `plain_copies` whole copies. A failed condition changes nothing
    /// anywhere.
    pub(crate) fn submit_ec_conditional(&mut self, op: Op) -> Handle {
        let Op::Store { key, value, .. } = &op else {
            return self.fail_now(Error::Protocol("not a store".into()));
        };
        let (key, value) = (key.clone(), value.clone());
        let (code, copies, needed) = match self.ec_write_plan(&key) {
            Ok(plan) => plan,
            Err(e) => return self.fail_now(e),
        };
        let stripe = self.next_stripe();
        let started = Instant::now();
        let fragments = code.encode(stripe, &value);
        self.counters.encode_ns += started.elapsed().as_nanos() as u64;
        let fragments: Vec<Bytes> = match fragments {
            Ok(f) => f.into_iter().map(|f| code.share(f)).collect(),
            // Not reachable for a valid code.
            Err(e) => return self.fail_now(Error::Protocol(e.to_string())),
        };
        let h = self.new_handle();
        let task = Task::new(
            key,
            copies,
            needed,
            Kind::Lead {
                op,
                reply: None,
                coded: Some(Box::new(CodedLead { stripe, fragments })),
            },
        );
        self.launch(h, task)
    }

    /// The leader of coded conditional store `t` stored its fragment (`reply`): the task
    /// becomes the coded write of the value, with the leader's fragment counted, and the
    /// servers after the leader get theirs (those before it could not be read, and were
    /// counted failed when it was chosen). From here on it is a coded `set` of the value
    /// (failed servers are suspected, the policy decides), except that it is never
    /// written again: a server that kept a newer write's fragment holds a write the
    /// leader took after this one (`EcWriting::conditional`).
    pub(crate) fn ec_lead_stored(
        &mut self,
        id: u64,
        t: &mut Task,
        leader: usize,
        reply: &Reply,
        coded: CodedLead,
    ) {
        let Kind::Lead { op, .. } = &t.kind else {
            return;
        };
        let set = follower_op(op);
        let pos = t.copies.iter().position(|&c| c == leader).unwrap_or(0);
        let followers: Vec<(usize, Op)> = t.copies[pos + 1..]
            .iter()
            .zip(coded.fragments[pos + 1..].iter())
            .map(|(&s, f)| (s, fragment_store(&set, f.clone())))
            .collect();
        let cas = match reply {
            Reply::Stored(StoreStatus::Stored { cas }) => *cas,
            _ => 0,
        };
        t.acked = 1;
        self.counters.copies_written += 1;
        self.counters.ec_writes += 1;
        self.remember_coded(&t.key);
        t.kind = Kind::Fanout {
            op: set,
            per_copy: Vec::new(),
            any: false,
            cas,
            ec: Some(EcWriting {
                stripe: coded.stripe,
                superseded: 0,
                newest_kept: 0,
                rewrites: 0,
                conditional: true,
            }),
        };
        drop(coded);
        for (s, op) in followers {
            self.fanout_copy(id, t, s, op);
        }
        self.decide(id, t);
    }

    /// Codes the value of write task `t` under `stripe` and writes fragment `i` to its
    /// `i`-th server. The data fragments go out first; the parity is computed while they
    /// travel (a rendezvous transfer is pulled by the server meanwhile).
    fn issue_ec_fragments(&mut self, id: u64, t: &mut Task, code: &Arc<Code>, stripe: u64) {
        let Kind::Fanout {
            op: set @ Op::Store { value, .. },
            ..
        } = &t.kind
        else {
            return;
        };
        let (set, value) = (set.clone(), value.clone());
        let store = |f: Bytes| fragment_store(&set, f);
        let copies = t.copies.clone();
        let started = Instant::now();
        let data: Vec<Bytes> = code
            .encode_data(stripe, &value)
            .into_iter()
            .map(|f| code.share(f))
            .collect();
        self.counters.encode_ns += started.elapsed().as_nanos() as u64;
        for (&s, f) in copies.iter().zip(data.iter()) {
            self.fanout_copy(id, t, s, store(f.clone()));
        }
        let started = Instant::now();
        let parity = code.encode_parity(stripe, value.len(), &data);
        self.counters.encode_ns += started.elapsed().as_nanos() as u64;
        drop(data);
        match parity {
            Ok(parity) => {
                for (&s, f) in copies[code.data_shards()..].iter().zip(parity) {
                    self.fanout_copy(id, t, s, store(code.share(f)));
                }
            }
            Err(e) => {
                // Not reachable for a valid code; the parity copies count as failed.
                t.failed += copies.len() - code.data_shards();
                t.last_err = Some(Error::Protocol(e.to_string()));
            }
        }
    }

    /// A coded write that every server answered, some of them keeping a newer write's
    /// fragment instead of this one's (memfabricd over UCX, `StoreMode::SetFragment`):
    /// written again, to all its servers, with a stripe newer than any they kept, at most
    /// `MAX_REWRITES` times. Two writers racing thus end with every server holding the
    /// same write; and a write made after another by a client whose clock is behind
    /// (its stripe older) still becomes the value, as it did before servers kept the
    /// newer write. Also after the write was delivered (a `quorum` or `one` write whose
    /// last servers refused it): otherwise a newer write left on a few servers (its
    /// writer failed part way, its clock ahead) would refuse every later write there.
    /// Returns false when the write is not to be made again: the budget is spent, or
    /// fewer of its servers are up than it needs (overwriting fewer would open the write
    /// hole, as `submit_ec_write` knows).
    pub(crate) fn ec_rewrite(&mut self, id: u64, t: &mut Task) -> bool {
        let Kind::Fanout { ec: Some(w), .. } = &t.kind else {
            return false;
        };
        if w.superseded == 0 || w.rewrites >= MAX_REWRITES || t.outstanding > 0 || w.conditional {
            return false;
        }
        if self.up_among(&t.copies) < t.needed {
            return false;
        }
        let Some(code) = self.ec_code.clone() else {
            return false;
        };
        let stripe = self.next_stripe().max(w.newest_kept.saturating_add(1));
        self.last_stripe = self.last_stripe.max(stripe);
        if let Kind::Fanout {
            ec: Some(w), cas, ..
        } = &mut t.kind
        {
            w.stripe = stripe;
            w.superseded = 0;
            w.newest_kept = 0;
            w.rewrites += 1;
            *cas = 0;
        }
        self.counters.ec_rewrites += 1;
        t.acked = 0;
        t.failed = 0;
        t.refused = 0;
        t.last_err = None;
        // The copies that failed the last round were suspected for it; this round judges
        // them afresh (a suspect that now stores would otherwise get a delete after it).
        t.suspects.clear();
        self.issue_ec_fragments(id, t, &code, stripe);
        true
    }

    /// A read met a fragment on server `s`: ask k more of the value's servers at once (k + 1
    /// fragments: late binding with one spare), the others only if those do not do.
    pub(crate) fn ec_read_begin(&mut self, id: u64, t: &mut Task, s: usize, v: Value) {
        // Checked once (payload checksum included) and kept for the fragment list below;
        // a damaged one names its code, and its server counts as one without a fragment.
        let first = FragmentHeader::decode(&v.data).ok().map(|(h, _)| h);
        let geometry = memfabric_proto::ec_fragment::code_of(&v.data);
        let Some(code) = geometry.and_then(|(k, m)| self.code_for(k, m)) else {
            // Not reachable: the caller checked the header.
            let e = Error::Protocol("a fragment whose code cannot be built".into());
            return self.deliver(id, t, Err(e));
        };
        let (k, n) = (code.data_shards(), code.total_shards());
        let servers = self.ring.successors(&t.key, n);
        let Kind::Read {
            op,
            order,
            next,
            missed,
            ec,
            ..
        } = &mut t.kind
        else {
            return;
        };
        let op = op.clone();
        let asked: Vec<usize> = order[..*next].to_vec();
        let mut read = EcRead {
            code: code.clone(),
            servers: servers.clone(),
            frags: Vec::new(),
            missing: Vec::new(),
            failed: 0,
            flags: v.flags,
            unasked: Vec::new(),
            other: None,
            code_switches: 0,
            decoded: None,
            cas_at: Vec::new(),
            repair_owed: false,
        };
        let mut to_ask = Vec::new();
        for (pos, &srv) in servers.iter().enumerate() {
            if srv == s {
                match first {
                    Some(h) => {
                        read.frags.push((pos, h, v.data.clone()));
                        read.cas_at.push((pos, v.cas));
                    }
                    None => read.missing.push(pos),
                }
            } else if missed.contains(&srv) {
                read.missing.push(pos);
            } else if asked.contains(&srv) || !self.ready_to_read(srv) {
                read.failed += 1;
            } else {
                to_ask.push(srv);
            }
        }
        *ec = Some(Box::new(read));
        t.needed = ec_needed(self.config.write_policy, k, n - k);
        t.copies = servers;
        if self.is_pool_code(&code) {
            // Read straight from the fragments next time; a value of another code is
            // found through its primary again.
            self.remember_coded(&t.key);
        }
        // Late binding with one spare, as a read of a key known to be coded does: enough
        // servers for k + 1 fragments, data fragments first (they need no decoding); the
        // rest only if those do not do. Asking all k + m would move m - 1 more fragments
        // (a sixth more bytes at 4+2) and let parity race the data it stands in for.
        let have = match &t.kind {
            Kind::Read { ec: Some(read), .. } => read.frags.len(),
            _ => 0,
        };
        let now = (k + 1).saturating_sub(have).min(to_ask.len());
        let later = to_ask.split_off(now);
        if let Kind::Read { ec: Some(read), .. } = &mut t.kind {
            read.unasked = later;
        }
        for srv in to_ask {
            self.step(id, t, srv, op.clone());
        }
        self.ec_decide(id, t);
    }

    /// What a read of a pool without `ec` or `replicas` gives its caller: never one
    /// fragment of a coded value as the value (`Config::raw_fragments` aside).
    pub(crate) fn not_a_fragment(&self, result: Result<Reply, Error>) -> Result<Reply, Error> {
        match &result {
            Ok(Reply::Value(Some(v)))
                if !self.config.raw_fragments
                    && !self.resilient()
                    && v.data.starts_with(&FRAGMENT_MAGIC) =>
            {
                match EcGeometry::of_fragment(&v.data) {
                    Some(g) => Err(Error::CodedValue {
                        k: g.k,
                        m: g.m,
                        cause: "not done by this read (only a blocking get, gets, gat or \
                                get_multi of a pool listing the value's servers does)"
                            .into(),
                    }),
                    None => result,
                }
            }
            _ => result,
        }
    }

    /// `op` (a get or gat) read whole with RS(`k`, `m`) by a pool without `ec` or
    /// `replicas`, whose plain read of the key met one of its fragments.
    pub(crate) fn read_whole(&mut self, op: Op, k: u8, m: u8) -> Result<Option<Value>, Error> {
        let coded = |cause: String| Error::CodedValue { k, m, cause };
        let Some(code) = self.code_for(k, m) else {
            return Err(coded("a code this client cannot build".into()));
        };
        let n = code.total_shards();
        if self.servers.len() < n {
            return Err(coded(format!(
                "the pool has {} server(s); the value is spread over {n}",
                self.servers.len()
            )));
        }
        let key = op.key().unwrap_or_default().to_vec();
        let h = self.new_handle();
        let h = self.ec_read_with(code, op, key, h);
        match self.wait(h, self.config.timeout * 4) {
            Ok(Reply::Value(v)) => Ok(v),
            Ok(r) => Err(coded(format!("unexpected reply {r:?}"))),
            Err(e) => Err(coded(e.to_string())),
        }
    }

    /// A read of a key this client knows to be coded: straight to the fragments, the
    /// first k+1 servers at once (late binding: the first k of one trusted write win).
    pub(crate) fn ec_read_direct(&mut self, op: Op, key: Vec<u8>, h: Handle) -> Handle {
        let Some(code) = self.ec_code.clone() else {
            return self.fail_now(Error::NoServers);
        };
        self.ec_read_with(code, op, key, h)
    }

    /// A coded read with `code`: its first k+1 servers at once, the others if needed.
    fn ec_read_with(&mut self, code: Arc<Code>, op: Op, key: Vec<u8>, h: Handle) -> Handle {
        let (k, n) = (code.data_shards(), code.total_shards());
        let servers = self.ring.successors(&key, n);
        let read = EcRead {
            code,
            servers: servers.clone(),
            frags: Vec::new(),
            missing: Vec::new(),
            failed: 0,
            flags: 0,
            unasked: servers.clone(),
            other: None,
            code_switches: 0,
            decoded: None,
            cas_at: Vec::new(),
            repair_owed: false,
        };
        let needed = ec_needed(self.config.write_policy, k, n - k);
        let task = Task::new(
            key,
            servers,
            needed,
            Kind::Read {
                op,
                order: Vec::new(),
                next: 0,
                missed: Vec::new(),
                asked: 0,
                ec: Some(Box::new(read)),
            },
        );
        self.launch(h, task)
    }

    /// Asks up to `want` more of the value's servers (those that can be read).
    pub(crate) fn ec_ask_more(&mut self, id: u64, t: &mut Task, want: usize) {
        let mut asked = 0;
        while asked < want {
            let Kind::Read {
                op, ec: Some(read), ..
            } = &mut t.kind
            else {
                return;
            };
            if read.unasked.is_empty() {
                return;
            }
            let srv = read.unasked.remove(0);
            let op = op.clone();
            if self.ready_to_read(srv) {
                self.step(id, t, srv, op);
                asked += 1;
            } else if let Kind::Read { ec: Some(read), .. } = &mut t.kind {
                read.failed += 1;
                t.last_err = Some(self.down(srv));
            }
        }
    }

    /// The read met a newer write made with another code (`o` is one of its fragments):
    /// start again with that code, asking all of its servers.
    fn ec_read_with_other_code(&mut self, id: u64, t: &mut Task, o: FragmentHeader) {
        let Some(code) = self.code_for(o.k, o.m) else {
            let e = Error::Protocol("a fragment whose code cannot be built".into());
            return self.deliver(id, t, Err(e));
        };
        let (k, n) = (code.data_shards(), code.total_shards());
        let servers = self.ring.successors(&t.key, n);
        let Kind::Read { ec: Some(read), .. } = &mut t.kind else {
            return;
        };
        **read = EcRead {
            code,
            servers: servers.clone(),
            frags: Vec::new(),
            missing: Vec::new(),
            failed: 0,
            flags: read.flags,
            unasked: servers.clone(),
            other: None,
            code_switches: read.code_switches + 1,
            decoded: None,
            cas_at: Vec::new(),
            repair_owed: false,
        };
        t.needed = ec_needed(self.config.write_policy, k, n - k);
        t.copies = servers;
        let key = t.key.clone();
        self.coded.remove(&key);
        self.ec_ask_more(id, t, n);
        if t.outstanding == 0 {
            self.ec_decide(id, t);
        }
    }

    /// Remembers that `key` holds a coded value (bounded: forgotten all at once when
    /// full; a forgotten key is read primary first again).
    pub(crate) fn remember_coded(&mut self, key: &[u8]) {
        if self.coded.len() >= self.config.ec_known_keys {
            self.coded.clear();
        }
        if self.config.ec_known_keys > 0 {
            self.coded.insert(key.to_vec());
        }
    }

    /// One of the value's servers answered.
    pub(crate) fn ec_read_step(
        &mut self,
        id: u64,
        t: &mut Task,
        s: usize,
        result: Result<Reply, Error>,
    ) {
        let Kind::Read { ec: Some(read), .. } = &mut t.kind else {
            return;
        };
        let Some(pos) = read.servers.iter().position(|&x| x == s) else {
            return;
        };
        if t.delivered {
            // The value was decoded before this server answered: what it holds still
            // counts for the repair, and a miss still gets its fragment back, whichever
            // order the replies were read in.
            if read.decoded.is_none() {
                return;
            }
            match result {
                // As before the decode: a fragment of this code (of any write) is heard.
                Ok(Reply::Value(Some(v))) => match FragmentHeader::decode(&v.data) {
                    Ok((h, _)) if read.code.is(h.k, h.m) => {
                        read.frags.push((pos, h, v.data.clone()));
                    }
                    _ => read.missing.push(pos),
                },
                Ok(Reply::Value(None)) => {
                    read.missing.push(pos);
                    read.repair_owed = true;
                }
                _ => read.failed += 1,
            }
            return self.ec_repair_once_heard(id, t);
        }
        match result {
            Ok(Reply::Value(Some(v))) => match FragmentHeader::decode(&v.data) {
                Ok((h, _)) if read.code.is(h.k, h.m) => {
                    read.flags = v.flags;
                    read.frags.push((pos, h, v.data.clone()));
                    read.cas_at.push((pos, v.cas));
                }
                Err(e) if pos == 0 && !e.is_fragment() => {
                    // The primary holds a value that is not coded (written since, small):
                    // what a read of an uncoded key returns. (A damaged fragment, or one
                    // of the old format, is a fragment lost, below.)
                    let key = t.key.clone();
                    self.coded.remove(&key);
                    t.acked = 1;
                    self.deliver(id, t, Ok(Reply::Value(Some(v))));
                    return;
                }
                // A fragment of another code: a write made with that code (another
                // pool's, or before this pool's code changed); read with it if newest.
                Ok((h, _)) => {
                    read.missing.push(pos);
                    if read.other.is_none_or(|o| o.write() < h.write()) {
                        read.other = Some(h);
                    }
                }
                Err(_) => read.missing.push(pos),
            },
            Ok(Reply::Value(None)) => read.missing.push(pos),
            Ok(_) => read.failed += 1,
            Err(e) => {
                read.failed += 1;
                t.last_err = Some(e);
            }
        }
        self.ec_decide(id, t);
    }

    /// A read that decoded the value and met a server without its fragment repairs once
    /// it has heard every server of the value: it asks those it had not (late binding
    /// asks k + 1), and repairs after the last answer. Which fragment a server lacks
    /// follows from what the others hold, not from its position alone: after the server
    /// list changed (a server replaced by one at another address), positions and
    /// fragments no longer match, and a guess made from k + 1 answers gave a server a
    /// second copy of a fragment an unheard one held, for good (`add` keeps it).
    fn ec_repair_once_heard(&mut self, id: u64, t: &mut Task) {
        let Kind::Read { ec: Some(read), .. } = &t.kind else {
            return;
        };
        if !read.repair_owed || read.decoded.is_none() || !self.config.read_repair {
            return;
        }
        let unasked = read.unasked.len();
        if unasked > 0 {
            self.ec_ask_more(id, t, unasked);
        }
        if t.outstanding > 0 {
            return;
        }
        let Kind::Read { ec: Some(read), .. } = &mut t.kind else {
            return;
        };
        read.repair_owed = false;
        self.ec_repair(t);
    }

    /// Writes the delivered value's fragments back to the servers that answered without
    /// one (read repair; `add`, so a write since wins). The fragments expire with the
    /// value: a gat's time, else the time a holder reports. Called once every server of
    /// the value was asked (`ec_repair_once_heard`).
    fn ec_repair(&mut self, t: &Task) {
        let Kind::Read {
            op, ec: Some(read), ..
        } = &t.kind
        else {
            return;
        };
        let Some((write, value)) = &read.decoded else {
            return;
        };
        let positions = &read.missing;
        if positions.is_empty() {
            return;
        }
        // A server that did not answer (down, timed out) may hold any fragment: its own
        // position's while the list is the one the value was written with, another once
        // the list changed (a server replaced at another address), and no read can tell
        // which. A guess gave the repaired server a second copy of the fragment the
        // unheard one held, for good. So the repair waits for a read that hears every
        // server (the key is read again), or for `memfabric repair` and the background
        // refill of a restarted server, which list every server's keys.
        let unheard = (0..read.servers.len())
            .any(|p| !positions.contains(&p) && !read.frags.iter().any(|f| f.0 == p));
        if unheard {
            self.counters.read_repairs_skipped += positions.len() as u64;
            return;
        }
        let source = read
            .frags
            .iter()
            .find(|f| f.1.write() == *write)
            .map(|f| read.servers[f.0]);
        let (Some(source), Ok(frags)) = (source, read.code.encode(write.stripe, value)) else {
            return;
        };
        // Each server gets its own position's fragment, unless another server holds that
        // one (placed by a ring of other servers: a server replaced by one on another
        // port); then a fragment no server holds. Two copies of one fragment leave the
        // key a failure closer to loss than it looks.
        let mut taken: Vec<usize> = read
            .frags
            .iter()
            .filter(|f| f.1.write() == *write)
            .map(|f| usize::from(f.1.index))
            .collect();
        let writes = positions
            .iter()
            .filter_map(|&pos| {
                let index = crate::ec::free_index(pos, &mut taken, frags.len())?;
                let op = repair_add(&t.key, Bytes::from(frags[index].clone()), read.flags);
                Some((read.servers[pos], Background::FragmentRepair, op))
            })
            .collect();
        let exptime = gat_exptime(op);
        self.repair_copies(source, exptime, writes);
    }

    /// Rebuilds the value once it may be trusted: the newest write seen has `k` fragments
    /// and the servers not heard from are too few to hide a newer acknowledged write; or,
    /// when every server has answered, the newest write that has `k` (a newer one with
    /// fewer was never acknowledged).
    pub(crate) fn ec_decide(&mut self, id: u64, t: &mut Task) {
        if t.delivered {
            return;
        }
        let Kind::Read { ec: Some(read), .. } = &t.kind else {
            return;
        };
        let code = read.code.clone();
        let (k, n) = (code.data_shards(), code.total_shards());
        let count = |write: WriteId| fragments_of(read, write);
        let newest = read.frags.iter().map(|f| f.1.write()).max();
        let heard = read.frags.len() + read.missing.len();
        let unheard = n - heard;
        let key_gone = newest.is_none() && read.failed == 0 && read.unasked.is_empty();
        let chosen = match newest {
            Some(st) if count(st) >= k && unheard < t.needed => Some(st),
            _ if t.outstanding == 0 && read.failed == 0 => {
                let mut writes: Vec<WriteId> = read.frags.iter().map(|f| f.1.write()).collect();
                writes.sort_unstable_by(|a, b| b.cmp(a));
                writes.into_iter().find(|&w| count(w) >= k)
            }
            _ => None,
        };
        // A newer write of another code than any of this one's: that write is the value.
        let newer_other = read
            .other
            .filter(|o| chosen.or(newest).is_none_or(|w| o.write() > w));
        if let Some(o) = newer_other.filter(|_| read.code_switches < MAX_CODE_SWITCHES) {
            if t.outstanding > 0 {
                return; // the rest first: they may hold more of either write
            }
            return self.ec_read_with_other_code(id, t, o);
        }
        if chosen.is_some() && self.ec_wait_for_leader(id, t) {
            return;
        }
        let Kind::Read { ec: Some(read), .. } = &t.kind else {
            return;
        };
        let count = |write: WriteId| fragments_of(read, write);
        let Some(write) = chosen else {
            if t.outstanding == 0 && !read.unasked.is_empty() {
                // Not decided with those asked: ask the rest.
                let more = read.unasked.len();
                self.ec_ask_more(id, t, more);
                if t.outstanding > 0 {
                    return;
                }
                return self.ec_decide(id, t);
            }
            if t.outstanding == 0 {
                // Reported as the copies that answered usefully: the most fragments of
                // any one write (counting every server that answered read as "5 of 6
                // copies answered, 4 needed" for a read that found 3).
                t.acked = read
                    .frags
                    .iter()
                    .map(|f| count(f.1.write()))
                    .max()
                    .unwrap_or(0);
                // Too few fragments of any write, and more servers answered without one
                // than can be missing while k remain (more than m), or, with every server
                // heard, than an acknowledged write leaves out: whatever was written has
                // lost fragments since (evicted, deleted by a pool of a narrower code,
                // on servers that restarted empty) and cannot come back. A miss, as when
                // every copy of a replicated value is gone; not an error that would stay
                // until the key is written again. Fragments of two writes and no more
                // misses than that (writers racing, a read racing a write) stay an error,
                // as does a newer write of another code this read may no longer switch to.
                // Servers that did not answer may hold a fragment: only the first test
                // holds with failures.
                let lost = newer_other.is_none()
                    && (read.missing.len() > n - k
                        || (read.failed == 0 && read.missing.len() > n - t.needed));
                if key_gone || lost {
                    // No fragment anywhere (deleted, or never coded): a miss.
                    if lost && !key_gone {
                        self.counters.ec_lost_reads += 1;
                    }
                    let key = t.key.clone();
                    self.coded.remove(&key);
                    self.deliver(id, t, Ok(Reply::Value(None)));
                } else {
                    self.deliver_short(id, t);
                }
            }
            return;
        };
        // Each fragment was checked (checksums included) when it arrived.
        let pieces: Vec<(FragmentHeader, &[u8])> = read
            .frags
            .iter()
            .filter(|f| f.1.write() == write)
            .map(|f| (f.1, &f.2[HEADER_LEN..]))
            .collect();
        let rebuilt = (0..k).any(|i| {
            !read
                .frags
                .iter()
                .any(|f| f.1.write() == write && usize::from(f.1.index) == i)
        });
        let start = Instant::now();
        let decoded = Some(code.decode_checked(&pieces));
        self.counters.decode_ns += start.elapsed().as_nanos() as u64;
        self.counters.ec_reads += 1;
        if rebuilt {
            self.counters.decodes += 1;
        }
        if read.failed > 0 || !read.missing.is_empty() {
            self.counters.degraded_reads += 1;
        }
        let value = match decoded {
            Some(Ok(v)) => Bytes::from(v),
            Some(Err(e)) => {
                t.last_err = Some(Error::Protocol(e.to_string()));
                self.deliver_short(id, t);
                return;
            }
            None => return,
        };
        // Write the fragments back to servers that answered without one; a miss that
        // arrives after this decode is repaired when it does (`ec_read_step`).
        t.acked = count(write);
        if let Kind::Read { ec: Some(read), .. } = &mut t.kind {
            read.decoded = Some((write, value.clone()));
            read.repair_owed = !read.missing.is_empty();
        }
        self.ec_repair_once_heard(id, t);
        self.ec_touch_unasked(t);
        let flags = match &t.kind {
            Kind::Read { ec: Some(read), .. } => read.flags,
            _ => 0,
        };
        let cas = self.ec_leader_cas(t, write);
        self.deliver(
            id,
            t,
            Ok(Reply::Value(Some(Value {
                data: value,
                flags,
                cas,
            }))),
        );
    }

    /// A `gat` of a coded value gives its new expiry time to the value's servers it did
    /// not ask (late binding asks k+1 of k+m): each fragment must live as long as the
    /// value, or the value would later stand on fewer than k+m of them, one server
    /// failure closer to lost.
    fn ec_touch_unasked(&mut self, t: &Task) {
        let Kind::Read {
            op, ec: Some(read), ..
        } = &t.kind
        else {
            return;
        };
        let Some(exptime) = gat_exptime(op) else {
            return;
        };
        for srv in read.unasked.clone() {
            if self.is_up(srv) {
                let op = Op::Touch {
                    key: t.key.clone(),
                    exptime,
                };
                self.in_background(srv, Background::Touch, op);
            }
        }
    }

    /// The position of a coded value's leader, for a read that gives a CAS value
    /// (`gets`, `gat`): the first of its first `plain_copies` servers that is up, where a
    /// conditional operation (`cas`) on the key goes.
    fn ec_cas_leader(&self, t: &Task) -> Option<usize> {
        let Kind::Read {
            op, ec: Some(read), ..
        } = &t.kind
        else {
            return None;
        };
        if !wants_cas(op) {
            return None;
        }
        let plain = self.plain_copies();
        read.servers.iter().take(plain).position(|&s| self.is_up(s))
    }

    /// The CAS value a coded read gives: that of the write's fragment on the leader. A
    /// `cas` goes to the leader, where every later write of the key (each rewrites all
    /// fragments) or append changes it; 0 when the leader's fragment was not read (a
    /// `cas` with it then answers `EXISTS`) or the read did not ask for one.
    fn ec_leader_cas(&self, t: &Task, write: WriteId) -> u64 {
        let (Some(leader), Kind::Read { ec: Some(read), .. }) = (self.ec_cas_leader(t), &t.kind)
        else {
            return 0;
        };
        let of_write = read
            .frags
            .iter()
            .any(|f| f.0 == leader && f.1.write() == write);
        match read.cas_at.iter().find(|c| c.0 == leader) {
            Some(&(_, cas)) if of_write => cas,
            _ => 0,
        }
    }

    /// A `gets` or `gat` whose value can be rebuilt before the leader's fragment arrived:
    /// waits for it (while anything is in flight), asking the leader if it was not yet,
    /// so that the CAS value given is one a `cas` can use. True while waiting.
    fn ec_wait_for_leader(&mut self, id: u64, t: &mut Task) -> bool {
        if t.outstanding == 0 {
            return false;
        }
        let (
            Some(leader),
            Kind::Read {
                op, ec: Some(read), ..
            },
        ) = (self.ec_cas_leader(t), &t.kind)
        else {
            return false;
        };
        let heard = read.frags.iter().any(|f| f.0 == leader) || read.missing.contains(&leader);
        if heard {
            return false;
        }
        let srv = read.servers[leader];
        if let Some(i) = read.unasked.iter().position(|&u| u == srv) {
            let op = op.clone();
            if let Kind::Read { ec: Some(read), .. } = &mut t.kind {
                read.unasked.remove(i);
            }
            self.step(id, t, srv, op);
        }
        true
    }
}

/// Fragment `value` of the coded `set` (its key, flags and expiry), as sent: servers that
/// can keep the newest of two racing writes' fragments do (`StoreMode::SetFragment`).
fn fragment_store(set: &Op, value: Bytes) -> Op {
    match set {
        Op::Store {
            key,
            flags,
            exptime,
            ..
        } => Op::Store {
            mode: StoreMode::SetFragment,
            key: key.clone(),
            value,
            flags: *flags,
            exptime: *exptime,
            cas: 0,
        },
        other => other.clone(),
    }
}

/// Distinct fragments of `write` a read holds: a fragment found twice (misplaced by
/// another pool, or a copy) counts once, as decoding counts it.
fn fragments_of(read: &EcRead, write: WriteId) -> usize {
    read.frags
        .iter()
        .filter(|f| f.1.write() == write)
        .map(|f| f.1.index)
        .collect::<std::collections::HashSet<u8>>()
        .len()
}

/// Whether a read gives its caller a CAS value (`gets`, `gat`).
fn wants_cas(op: &Op) -> bool {
    matches!(op, Op::Get { cas: true, .. } | Op::Gat { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_needed_per_policy() {
        assert_eq!(ec_needed(WritePolicy::All, 4, 2), 6);
        assert_eq!(ec_needed(WritePolicy::Quorum, 4, 2), 4);
        assert_eq!(ec_needed(WritePolicy::Quorum, 3, 3), 4);
        assert_eq!(ec_needed(WritePolicy::Quorum, 10, 4), 10);
        assert_eq!(ec_needed(WritePolicy::One, 4, 2), 4);
    }
}
