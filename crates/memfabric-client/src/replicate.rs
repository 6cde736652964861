//! Replication in the pool: `replicas` more copies of every key on the next distinct
//! servers along the ketama ring, a write policy saying how many copies must acknowledge,
//! reads that go on to the next copy on an error, a timeout **or a miss**, read repair,
//! and hints that keep a copy which missed a write from ever being read stale.
//!
//! A replicated operation is a [`Task`] under the caller's handle: it issues ordinary
//! requests ("steps", each with the pool's deadline) through the same core as every
//! other request, is advanced as they finish ([`Client::settle`]), and delivers one
//! result the moment it is decided; what it still has in flight then finishes in the
//! background. The semantics of every operation are in `docs/resilience.md`; in short:
//!
//! - `set`, `delete`, `touch` go to every copy at once (fan-out).
//! - `add`, `replace`, `cas`, `append`, `prepend`, `incr`, `decr` are conditional: they
//!   run on one copy, the *leader* (the first copy that can be read), and only when it
//!   succeeds are the others made to agree — with a `set` of the same value for
//!   add/replace/cas, with the same operation for append/prepend/incr/decr (a copy whose
//!   counter then disagrees with the leader's is deleted). A coded pool codes an
//!   add/replace/cas of a big value: the leader gets its fragment, the others theirs
//!   (`crate::ec_pool`).
//! - `get`, `gets`, `gat` read the copies one after another, primary first (or from a
//!   random one with `randomize_reads`), and report a miss only when enough copies missed
//!   that no acknowledged write can hide on the copies that could not be asked.
//! - A copy that failed a write (timeout, connection lost, an error reply) may keep an
//!   older value. If its connection is alive the key is deleted there at once; otherwise
//!   the key is remembered (a *hint*) and deleted first thing when the server is connected
//!   again — and until then that server is not read. Too many hints for one server and it
//!   is flushed instead. Deleting rather than rewriting makes the copy miss, and a miss
//!   is read past and repaired; it is never stale.

use std::sync::Arc;

use bytes::Bytes;

use crate::client::{Client, Done, Handle};
use crate::error::Error;
use crate::op::{Op, Reply, StoreMode, StoreStatus, Ttl, Value};
use crate::refill;
use crate::repair::{RepairCounters, RepairJob};
use crate::tasks::{lock_hints, refusal, Background, Child, Kind, Role, Task};
pub use crate::tasks::{Acks, PoolCounters, WritePolicy};
use crate::transport::ConnId;

fn to_u8(n: usize) -> u8 {
    n.min(u8::MAX as usize) as u8
}

/// A small, non-cryptographic spread for `randomize_reads` (splitmix64 of the handle id
/// and the clock).
fn spread(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Client {
    /// Whether operations go through tasks (a replicated pool).
    pub(crate) fn resilient(&self) -> bool {
        self.config.replicas > 0 || self.ec_code.is_some()
    }

    /// Copies of a value that is not erasure coded: `replicas + 1`, and in a pool with
    /// RS(k, m) at least `m + 1`, so that small values survive the same `m` failures.
    pub(crate) fn plain_copies(&self) -> usize {
        let m = self.config.ec.map_or(0, |g| g.m);
        usize::from(self.config.replicas.max(m)) + 1
    }

    /// The pool's counters: replication, repairs, hints.
    pub fn pool_counters(&self) -> &PoolCounters {
        &self.counters
    }

    /// Whether server `s` may be read now: it is up, and every delete of a copy that may
    /// be stale there has been sent on its connection. A request on a connection takes
    /// effect after the ones sent before it (TCP pipelines in order; UCX active messages
    /// arrive in order, and a one-sided GET waits until the requests before it are done),
    /// so a read sent after the deletes cannot see what they delete. Hints waiting for a
    /// connection get one here (and are sent first on it).
    pub(crate) fn ready_to_read(&mut self, s: usize) -> bool {
        if !self.is_up(s) {
            return false;
        }
        let owes_nothing = {
            let hints = lock_hints(&self.servers[s].hints);
            hints.keys.is_empty() && !hints.overflow
        };
        if owes_nothing {
            return true;
        }
        match self.servers[s].conn {
            // Connecting sends the hints first (`on_connect`).
            None => self.ensure_conn(s).is_ok(),
            Some(conn) => {
                self.replay_hints(s, conn);
                true
            }
        }
    }

    /// Issues a request on the pool's behalf on a connection just opened (before anything
    /// else on it).
    fn issue_first(&mut self, s: usize, conn: ConnId, role: Role, op: Op) {
        let h = self.new_handle();
        self.child_of.insert(h.0, Child { role, server: s });
        self.submit_on(s, conn, h, op);
    }

    /// A new connection to server `s` of a replicated pool: ask who it is, then delete
    /// what may be stale on it (or flush it), before any other request on the connection.
    pub(crate) fn on_connect(&mut self, s: usize, conn: ConnId) {
        // Learnt again from this connection's answer (the server may have been replaced).
        self.servers[s].keeps_newer_write = false;
        self.servers[s].awaiting_probe = false;
        self.servers[s].held.clear();
        match self.transport_instance(conn) {
            Some(id) => self.learn_instance(s, id),
            // Asked first on the connection: the answer is this run's, whatever follows.
            None => {
                self.issue_first(
                    s,
                    conn,
                    Role::Probe { conn },
                    Op::Stats {
                        group: Some("fabric".into()),
                    },
                );
                // Fragments wait for that answer (`Client::submit_on`).
                self.servers[s].awaiting_probe = true;
            }
        }
        self.replay_hints(s, conn);
    }

    /// Sends the deletes (or the flush) that server `s`'s hints call for on `conn`.
    fn replay_hints(&mut self, s: usize, conn: ConnId) {
        let (flush, keys) = {
            let mut hints = lock_hints(&self.servers[s].hints);
            let flush = std::mem::take(&mut hints.overflow);
            let keys: Vec<Vec<u8>> = hints.keys.drain().collect();
            (flush, keys)
        };
        if flush {
            self.issue_first(s, conn, Role::Flush, Op::FlushAll { delay: 0 });
        } else {
            for key in keys {
                let op = Op::Delete { key: key.clone() };
                self.issue_first(s, conn, Role::Hint { key }, op);
            }
        }
    }

    /// The servers that may still hold copies this client knows to be stale: per server,
    /// the keys whose delete (a hint) is owed or not yet confirmed, and whether a flush
    /// is owed instead. They are kept in this client only: once it is dropped (its
    /// process exits) before they are delivered, nothing keeps a later client from
    /// reading those copies when the server answers again (a paused server, say), so a
    /// short-lived client should say so (the `memfabric` CLI warns and exits 3).
    pub fn hints_outstanding(&self) -> Vec<(String, usize, bool)> {
        let mut out = Vec::new();
        for (s, server) in self.servers.iter().enumerate() {
            let (mut keys, mut flush) = {
                let hints = lock_hints(&server.hints);
                (hints.keys.len(), hints.overflow)
            };
            for c in self.child_of.values().filter(|c| c.server == s) {
                match c.role {
                    Role::Hint { .. } => keys += 1,
                    Role::Flush => flush = true,
                    _ => {}
                }
            }
            if keys > 0 || flush {
                out.push((server.name.clone(), keys, flush));
            }
        }
        out
    }

    /// Copy `s` failed write `t`. A successful write makes the copies that missed it
    /// stale: they are deleted. A failed one replaced nothing that was acknowledged, so
    /// the copies it did not reach keep what they have; deleting them could delete the
    /// last copy of the newest acknowledged value (every copy may have missed the write,
    /// or taken it without the acknowledgement coming back).
    pub(crate) fn suspect_copy(&mut self, t: &mut Task, s: usize) {
        self.counters.copy_write_failures += 1;
        if t.succeeded {
            let key = t.key.clone();
            self.distrust_copy(s, &key);
        } else if !t.delivered {
            t.suspects.push(s);
        }
    }

    /// Server `s` says it is run `id`: a different run than before restarted empty.
    fn learn_instance(&mut self, s: usize, id: String) {
        let old = self.servers[s].instance.replace(id.clone());
        if old.is_some_and(|o| o != id) {
            self.counters.restarts_detected += 1;
            if self.config.background_repair {
                let _ = self.repair(s, false);
            }
        }
    }

    /// Refills server `index` from the pool's other servers in a background thread, as
    /// the pool does by itself when it sees a server restarted empty (memfabricd's
    /// `instance_id` changed; memcached has none, so with memcached servers call this
    /// after restarting one). The thread walks the other servers' key lists (`lru_crawler
    /// metadump`) and writes back, with `add`, every value or fragment `index` should
    /// hold, at most `repair_bandwidth` bytes per second; a repair of the same server
    /// still running is stopped first. Of several clients that repair the same server,
    /// one does (a claim key on the server); `force` takes the claim even when another
    /// client holds it or finished a repair in the last ten minutes. Progress: [`Client::repair_counters`],
    /// [`Client::repairs_running`]. Dropping the client stops its repairs.
    pub fn repair(&mut self, index: usize, force: bool) -> Result<(), Error> {
        if !self.resilient() {
            return Err(Error::Config(
                "repair needs a replicated (replicas > 0) or erasure-coded pool".into(),
            ));
        }
        if index >= self.servers.len() {
            return Err(Error::Config(format!(
                "no server {index} (the pool has {})",
                self.servers.len()
            )));
        }
        // Ended repairs go (their threads are done); one of the same server is stopped.
        self.repairs.retain(RepairJob::running);
        for j in self.repairs.iter().filter(|j| j.target == index) {
            j.ask_to_stop();
        }
        let plan = refill::Plan {
            servers: self.servers.iter().map(|s| s.addr.clone()).collect(),
            ring: self.ring.clone(),
            target: index,
            force,
            plain_copies: self.plain_copies(),
            ec: self.config.ec,
            bandwidth: self.config.repair_bandwidth,
            timeout: self.config.timeout,
            connect_timeout: self.config.connect_timeout,
            credentials: self.config.credentials.clone(),
            tls: self.config.tls.clone(),
            hints: self.servers.iter().map(|s| Arc::clone(&s.hints)).collect(),
        };
        let job = refill::spawn(plan, Arc::clone(&self.repair_tally))
            .map_err(|e| Error::Config(format!("cannot start a repair thread: {e}")))?;
        self.repairs.push(job);
        Ok(())
    }

    /// Repairs still running.
    pub fn repairs_running(&mut self) -> usize {
        self.repairs.retain(RepairJob::running);
        self.repairs.len()
    }

    /// What the pool's repairs have done so far.
    pub fn repair_counters(&self) -> RepairCounters {
        self.repair_tally.snapshot()
    }

    /// What kept the pool's latest repairs from finishing (a server that did not answer,
    /// a key list that could not be read, a repair stopped), joined with "; ".
    pub fn repair_problem(&self) -> Option<String> {
        self.repair_tally.last_problem()
    }

    /// Copy `s` of `key` failed a write and may hold an older value: delete it now if the
    /// server can be reached, else remember to delete it before the server is read again.
    pub(crate) fn distrust_copy(&mut self, s: usize, key: &[u8]) {
        if self.is_up(s) && self.servers[s].conn.is_some() {
            let op = Op::Delete { key: key.to_vec() };
            let child = Child {
                role: Role::Hint { key: key.to_vec() },
                server: s,
            };
            self.issue(s, op, Some(child));
        } else {
            self.hint(s, key);
        }
    }

    fn hint(&mut self, s: usize, key: &[u8]) {
        let max = self.config.max_hints;
        let mut hints = lock_hints(&self.servers[s].hints);
        if hints.overflow {
            return;
        }
        if hints.keys.len() >= max {
            hints.overflow = true;
            hints.keys.clear();
            return;
        }
        if hints.keys.insert(key.to_vec()) {
            self.counters.hints_recorded += 1;
        }
    }

    /// Starts a replicated operation under a new handle.
    pub(crate) fn submit_resilient(&mut self, op: Op) -> Handle {
        self.overtake_read_repairs(&op);
        if self.modifies_by_reading(&op) {
            return self.submit_modify(op);
        }
        self.submit_task(op)
    }

    /// A read repair that is still asking the expiry time of the value it copies sends
    /// its `add` later, after whatever this client does next. It must not then bring
    /// back a value that a delete (or flush) meanwhile removed, nor one a write replaced
    /// (the new value may not have reached the copy the repair fills): any change of the
    /// key through this pool cancels the repair (`read_repairs_skipped`).
    fn overtake_read_repairs(&mut self, op: &Op) {
        if self.repairs_waiting.is_empty() {
            return;
        }
        match op {
            Op::Get { .. } | Op::Gat { .. } | Op::Ttl { .. } | Op::Stats { .. } => {}
            Op::Version | Op::Noop => {}
            Op::FlushAll { .. } => {
                for w in self.repairs_waiting.values_mut() {
                    w.overtaken = true;
                }
            }
            _ => {
                if let Some(w) = op.key().and_then(|k| self.repairs_waiting.get_mut(k)) {
                    w.overtaken = true;
                }
            }
        }
    }

    /// [`Client::submit_resilient`] as one task: an append or prepend is sent as it is.
    pub(crate) fn submit_task(&mut self, op: Op) -> Handle {
        let key = op.key().unwrap_or_default().to_vec();
        if self.wants_ec(&op) {
            return match &op {
                Op::Store {
                    mode: StoreMode::Set,
                    ..
                } => self.submit_ec_write(op),
                _ => self.submit_ec_conditional(op),
            };
        }
        let plain = self.plain_copies();
        // Deletes and touches reach every server an erasure-coded value may be on.
        let wide = match &op {
            Op::Delete { .. } | Op::Touch { .. } => {
                plain.max(self.ec_code.as_ref().map_or(0, |c| c.total_shards()))
            }
            _ => plain,
        };
        let copies = self.ring.successors(&key, wide);
        if copies.is_empty() {
            return self.fail_now(Error::NoServers);
        }
        let h = self.new_handle();
        if matches!(op, Op::Get { .. } | Op::Gat { .. }) && self.coded.contains(&key) {
            return self.ec_read_direct(op, key, h);
        }
        if matches!(op, Op::Store { .. } | Op::Delete { .. }) {
            // Stored whole (or gone) now.
            self.coded.remove(&key);
        }
        // A delete in a pool that codes values must reach enough of the k+m servers that
        // fewer than k fragments can be left: the policy counts all of them.
        let needed = self.config.write_policy.needed(copies.len());
        let kind = match &op {
            Op::Get { .. } | Op::Gat { .. } => {
                let mut order = copies.clone();
                if self.config.randomize_reads {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos() as u64);
                    let r = (spread(h.0 ^ nanos.rotate_left(32)) % order.len() as u64) as usize;
                    order.rotate_left(r);
                }
                Kind::Read {
                    op,
                    order,
                    next: 0,
                    missed: Vec::new(),
                    asked: 0,
                    ec: None,
                }
            }
            Op::Store {
                mode: StoreMode::Set,
                ..
            }
            | Op::Delete { .. }
            | Op::Touch { .. } => Kind::Fanout {
                op,
                per_copy: Vec::new(),
                any: false,
                cas: 0,
                ec: None,
            },
            _ => Kind::Lead {
                op,
                reply: None,
                coded: None,
            },
        };
        self.launch(h, Task::new(key, copies, needed, kind))
    }

    /// Starts `task` under handle `h`. Steps that fail at once are queued as events;
    /// none is handled before the task is in the map.
    pub(crate) fn launch(&mut self, h: Handle, mut task: Task) -> Handle {
        let was = std::mem::replace(&mut self.settling, true);
        self.start(h.0, &mut task);
        self.tasks.insert(h.0, task);
        self.settling = was;
        self.settle();
        h
    }

    pub(crate) fn step(&mut self, id: u64, task: &mut Task, s: usize, op: Op) {
        task.outstanding += 1;
        self.issue(
            s,
            op,
            Some(Child {
                role: Role::Step { task: id },
                server: s,
            }),
        );
    }

    /// One copy of a fan-out: sent to server `s`, or counted failed if it is down.
    pub(crate) fn fanout_copy(&mut self, id: u64, t: &mut Task, s: usize, op: Op) {
        if self.is_up(s) {
            self.step(id, t, s, op);
            return;
        }
        t.failed += 1;
        t.last_err = Some(self.down(s));
        match op {
            // Whatever the outcome, the key is to be gone there too.
            Op::Delete { .. } => self.distrust_copy(s, &t.key.clone()),
            Op::Touch { .. } => {}
            _ => self.suspect_copy(t, s),
        }
    }

    fn start(&mut self, id: u64, t: &mut Task) {
        match &t.kind {
            Kind::Read { ec: Some(read), .. } => {
                let k = read.code.data_shards();
                self.ec_ask_more(id, t, k + 1);
                if t.outstanding == 0 {
                    self.ec_decide(id, t);
                }
            }
            Kind::Read { .. } => self.read_next(id, t),
            Kind::Fanout { op, per_copy, .. } => {
                let ops: Vec<Op> = (0..t.copies.len())
                    .map(|i| per_copy.get(i).unwrap_or(op).clone())
                    .collect();
                for (s, op) in t.copies.clone().into_iter().zip(ops) {
                    self.fanout_copy(id, t, s, op);
                }
                self.decide(id, t);
            }
            Kind::Lead { op, coded, .. } => {
                // A coded value's leader is among its first `plain_copies` servers, where
                // a `gets` takes the CAS value from (`Client::ec_cas_leader`).
                let candidates = match coded {
                    Some(_) => self.plain_copies().min(t.copies.len()),
                    None => t.copies.len(),
                };
                let fragments = coded.as_ref().map(|c| c.fragments.clone());
                let op = op.clone();
                let copies = t.copies[..candidates].to_vec();
                let Some(pos) = copies.into_iter().position(|s| self.ready_to_read(s)) else {
                    t.failed = t.copies.len();
                    t.last_err = Some(self.down(t.copies[0]));
                    self.decide(id, t);
                    return;
                };
                // Copies before the leader could not be read: what they hold may be
                // older than what the leader will hold.
                let before: Vec<usize> = t.copies[..pos].to_vec();
                for s in before {
                    t.failed += 1;
                    self.suspect_copy(t, s);
                }
                let leader = t.copies[pos];
                let op = match fragments {
                    Some(f) => op.with_value(f[pos].clone()),
                    None => op,
                };
                self.step(id, t, leader, op);
            }
        }
    }

    pub(crate) fn down(&self, s: usize) -> Error {
        Error::ServerDown {
            server: self.servers[s].name.clone(),
        }
    }

    /// Asks the next copy that can be read, or decides the read when none is left.
    fn read_next(&mut self, id: u64, t: &mut Task) {
        let m = self.config.ec.map_or(0, |g| usize::from(g.m));
        loop {
            let Kind::Read {
                order,
                next,
                asked,
                missed,
                ..
            } = &mut t.kind
            else {
                return;
            };
            if order.len() > t.copies.len() && missed.len() > m {
                // Asking the other fragment servers (below): more than m of the key's
                // servers hold nothing, so no k fragments are left anywhere.
                break;
            }
            let Some(&s) = order.get(*next) else {
                break;
            };
            *next += 1;
            *asked += 1;
            if self.ready_to_read(s) {
                let op = match &t.kind {
                    Kind::Read { op, .. } => op.clone(),
                    _ => unreachable!(),
                };
                self.step(id, t, s, op);
                return;
            }
            t.failed += 1;
            t.last_err = Some(self.down(s));
        }
        // In a pool that codes values, a copy that did not answer may hold a fragment of
        // a coded value whose first fragments were lost (evicted, or on servers that
        // restarted empty): the key's other fragment servers are asked, one after
        // another until more than m servers hold nothing, before the read is called a
        // miss, and a fragment found there starts a coded read (a plain value found
        // there is no copy of this key's and reads as a miss). A miss costs those extra
        // requests only while one of the key's first m + 1 servers does not answer.
        let can_code = self
            .config
            .ec
            .is_some_and(|g| self.servers.len() >= usize::from(g.k) + usize::from(g.m));
        if t.failed > 0 && can_code {
            if let (Some(g), Kind::Read { order, missed, .. }) = (self.config.ec, &mut t.kind) {
                if order.len() == t.copies.len() && missed.len() <= usize::from(g.m) {
                    let more: Vec<usize> = self
                        .ring
                        .successors(&t.key, usize::from(g.k) + usize::from(g.m))
                        .into_iter()
                        .filter(|s| !order.contains(s))
                        .collect();
                    if !more.is_empty() {
                        order.extend(more);
                        return self.read_next(id, t);
                    }
                }
            }
        }
        // Every copy asked or skipped, no hit: a miss only if enough copies missed that
        // any acknowledged write would have reached one of them.
        let Kind::Read { missed, .. } = &t.kind else {
            return;
        };
        let n = t.copies.len();
        let missed = missed.iter().filter(|s| t.copies.contains(s)).count();
        t.acked = missed;
        if missed > n - t.needed {
            self.deliver(id, t, Ok(Reply::Value(None)));
        } else {
            self.deliver_short(id, t);
        }
    }

    pub(crate) fn deliver(&mut self, id: u64, t: &mut Task, result: Result<Reply, Error>) {
        if t.delivered {
            return;
        }
        t.delivered = true;
        if result.is_ok() && !matches!(t.kind, Kind::Read { .. }) {
            t.succeeded = true;
            let key = t.key.clone();
            for s in std::mem::take(&mut t.suspects) {
                self.distrust_copy(s, &key);
            }
        } else {
            t.suspects.clear();
        }
        if !t.abandoned {
            let acks = Acks {
                acked: to_u8(t.acked),
                copies: to_u8(t.copies.len()),
            };
            self.note_coded_source(id, t);
            self.finish(id, Done { result, acks });
        }
    }

    pub(crate) fn deliver_short(&mut self, id: u64, t: &mut Task) {
        if t.acked == 0 && t.refused > 0 && t.refused == t.failed {
            if let Some(e) = t.last_err.clone().filter(refusal) {
                return self.deliver(id, t, Err(e));
            }
        }
        self.counters.ops_short += 1;
        let cause = t
            .last_err
            .as_ref()
            .map_or_else(|| "no copy reachable".to_string(), Error::to_string);
        let e = Error::NotEnoughCopies {
            acked: to_u8(t.acked),
            needed: to_u8(t.needed),
            copies: to_u8(t.copies.len()),
            cause,
        };
        self.deliver(id, t, Err(e));
    }

    /// Delivers a write once enough copies acknowledged, or once too many failed and the
    /// rest answered.
    pub(crate) fn decide(&mut self, id: u64, t: &mut Task) {
        // A coded write some of whose servers kept a newer write's fragment: once every
        // server answered, made again with a newer stripe, also when it was delivered
        // already (`ec_rewrite`); when it may not be made again, those servers hold a
        // newer write of the key, which counts as this one's acknowledgement there (as if
        // this one had come first).
        let superseded = match &t.kind {
            Kind::Fanout { ec: Some(w), .. } => w.superseded,
            _ => 0,
        };
        if superseded > 0 && t.outstanding == 0 && (t.delivered || t.acked < t.needed) {
            if self.ec_rewrite(id, t) {
                return self.decide(id, t);
            }
            t.acked += superseded;
            if let Kind::Fanout { ec: Some(w), .. } = &mut t.kind {
                w.superseded = 0;
            }
        }
        if t.delivered {
            return;
        }
        let n = t.copies.len();
        if t.acked >= t.needed {
            let reply = match &t.kind {
                Kind::Fanout { op, any, cas, .. } => match op {
                    Op::Delete { .. } => Reply::Deleted(*any),
                    Op::Touch { .. } => Reply::Touched(*any),
                    _ => Reply::Stored(StoreStatus::Stored { cas: *cas }),
                },
                Kind::Lead { reply, .. } => match reply {
                    Some(r) => r.clone(),
                    None => return,
                },
                Kind::Read { .. } => return,
            };
            self.deliver(id, t, Ok(reply));
        } else if t.failed > n - t.needed && t.outstanding == 0 {
            // Failures are not hurried: once every copy has answered, the error says
            // exactly how many copies hold the write.
            self.deliver_short(id, t);
        }
    }

    /// Handles the finished steps, hints, probes and repairs, until none is left. Steps
    /// may issue further steps; a nested call (from the back-pressure wait inside an
    /// issue) leaves the queue to the outer one.
    pub(crate) fn settle(&mut self) {
        if self.settling {
            return;
        }
        self.settling = true;
        while let Some((child, result)) = self.events.pop_front() {
            let s = child.server;
            match child.role {
                Role::Step { task } => {
                    if let Some(mut t) = self.tasks.remove(&task) {
                        t.outstanding -= 1;
                        self.on_step(task, &mut t, s, result);
                        if !(t.delivered && t.outstanding == 0) {
                            self.tasks.insert(task, t);
                        }
                    }
                }
                Role::Hint { key } => match result {
                    Ok(Reply::Deleted(_)) => self.counters.hinted_deletes += 1,
                    _ => self.hint(s, &key),
                },
                Role::Flush => match result {
                    Ok(Reply::Ok) => self.counters.hint_flushes += 1,
                    _ => lock_hints(&self.servers[s].hints).overflow = true,
                },
                Role::Probe { conn } => {
                    // Whatever it says (memcached answers `ERROR`), the requests held
                    // behind it go now. Only for the connection it was asked on: an
                    // answer settled after that one was replaced says nothing of the new
                    // one's server.
                    let keeps = matches!(&result, Ok(Reply::Stats(stats))
                        if stats.iter().any(|(k, v)| k == "ms_keep_newer_write" && v == "1"));
                    if self.servers[s].conn == Some(conn) {
                        self.servers[s].keeps_newer_write = keeps;
                        self.release_held(s, conn);
                    }
                    if let Ok(Reply::Stats(stats)) = result {
                        let stat = |name: &str| {
                            stats
                                .iter()
                                .find(|(k, _)| k == name)
                                .map(|(_, v)| v.clone())
                        };
                        if let Some(id) = stat("instance_id") {
                            self.learn_instance(s, id);
                        }
                    }
                }
                Role::RepairTtl(writes) => {
                    self.background_inflight -= 1;
                    let key = writes.first().and_then(|w| w.2.key()).unwrap_or_default();
                    let overtaken = match self.repairs_waiting.get_mut(key) {
                        Some(w) => {
                            let overtaken = w.overtaken;
                            w.waiting = w.waiting.saturating_sub(1);
                            if w.waiting == 0 {
                                self.repairs_waiting.remove(key);
                            }
                            overtaken
                        }
                        None => false,
                    };
                    if overtaken {
                        self.counters.read_repairs_skipped += writes.len() as u64;
                        continue;
                    }
                    match result.map(|r| match r {
                        Reply::Ttl(Some(Ttl::Never)) => Some(0),
                        Reply::Ttl(Some(Ttl::Seconds(left))) if left > 0 => Some(exptime_in(left)),
                        _ => None,
                    }) {
                        Ok(Some(exptime)) => self.repair_copies(s, Some(exptime), writes),
                        _ => self.counters.read_repairs_skipped += writes.len() as u64,
                    }
                }
                Role::Background(kind) => {
                    self.background_inflight -= 1;
                    if let Ok(Reply::Stored(StoreStatus::Stored { .. })) = result {
                        match kind {
                            Background::Repair => self.counters.read_repairs += 1,
                            Background::FragmentRepair => self.counters.fragment_repairs += 1,
                            Background::Touch => {}
                        }
                    }
                }
            }
        }
        self.settling = false;
    }

    fn on_step(&mut self, id: u64, t: &mut Task, s: usize, result: Result<Reply, Error>) {
        let key = t.key.clone();
        match &mut t.kind {
            Kind::Read { ec: Some(_), .. } => self.ec_read_step(id, t, s, result),
            Kind::Read { missed, .. } => match result {
                Ok(Reply::Value(Some(v))) if self.is_fragment(&v) => {
                    self.ec_read_begin(id, t, s, v)
                }
                Ok(Reply::Value(Some(v))) if t.copies.contains(&s) => self.read_hit(id, t, s, v),
                Ok(Reply::Value(_)) => {
                    missed.push(s);
                    self.read_next(id, t);
                }
                Ok(r) => {
                    t.failed += 1;
                    t.last_err = Some(Error::Protocol(format!("unexpected reply {r:?}")));
                    self.read_next(id, t);
                }
                Err(e) => {
                    t.failed += 1;
                    t.refused += usize::from(refusal(&e));
                    t.last_err = Some(e);
                    self.read_next(id, t);
                }
            },
            Kind::Fanout {
                op, any, cas, ec, ..
            } => {
                if let (Some(w), Ok(Reply::Stored(StoreStatus::Superseded { stripe }))) =
                    (ec.as_mut(), &result)
                {
                    // The server kept a fragment of a newer write of the key
                    // (`StoreMode::SetFragment`): neither stored nor failed; once every
                    // server answered, the write is made again (`ec_rewrite`).
                    w.superseded += 1;
                    w.newest_kept = w.newest_kept.max(*stripe);
                    self.counters.ec_fragments_superseded += 1;
                    self.decide(id, t);
                    return;
                }
                let ok = match (&*op, result) {
                    (Op::Store { .. }, Ok(Reply::Stored(StoreStatus::Stored { cas: c }))) => {
                        if *cas == 0 || s == t.copies[0] {
                            *cas = c;
                        }
                        true
                    }
                    (Op::Delete { .. }, Ok(Reply::Deleted(d)))
                    | (Op::Touch { .. }, Ok(Reply::Touched(d))) => {
                        *any |= d;
                        true
                    }
                    (_, Ok(r)) => {
                        t.last_err = Some(Error::Protocol(format!("unexpected reply {r:?}")));
                        false
                    }
                    (_, Err(e)) => {
                        t.refused += usize::from(refusal(&e));
                        t.last_err = Some(e);
                        false
                    }
                };
                let is_delete = matches!(op, Op::Delete { .. });
                let is_touch = matches!(op, Op::Touch { .. });
                if ok {
                    t.acked += 1;
                    if !is_touch {
                        self.counters.copies_written += 1;
                    }
                } else {
                    t.failed += 1;
                    if is_delete {
                        self.counters.copy_write_failures += 1;
                        self.distrust_copy(s, &key);
                    } else if !is_touch {
                        self.suspect_copy(t, s);
                    }
                }
                self.decide(id, t);
            }
            Kind::Lead { op, reply, coded } => {
                if reply.is_none() {
                    // The leader's answer.
                    match result {
                        Ok(r) if coded.is_some() && succeeded(&r) => {
                            let coded = coded.take().map(|c| *c);
                            if let Some(c) = coded {
                                self.ec_lead_stored(id, t, s, &r, c);
                            }
                        }
                        Ok(r) if succeeded(&r) => {
                            t.acked = 1;
                            self.counters.copies_written += 1;
                            let follow = follower_op(op);
                            *reply = Some(r);
                            let pos = t.copies.iter().position(|&c| c == s).unwrap_or(0);
                            let followers: Vec<usize> = t.copies[pos + 1..].to_vec();
                            for f in followers {
                                if self.is_up(f) {
                                    self.step(id, t, f, follow.clone());
                                } else {
                                    t.failed += 1;
                                    t.last_err = Some(self.down(f));
                                    self.suspect_copy(t, f);
                                }
                            }
                            self.decide(id, t);
                        }
                        Ok(r) => {
                            // The condition failed on the leader: nothing changed anywhere,
                            // so the copies before it that could not be read are not stale
                            // (they hold what they held).
                            t.acked = 1;
                            t.suspects.clear();
                            self.deliver(id, t, Ok(r));
                        }
                        // Refused by the leader (not a number, too large): nothing
                        // changed anywhere, and one server would answer the same.
                        Err(e) if refusal(&e) => self.deliver(id, t, Err(e)),
                        Err(e) => {
                            // The leader may or may not have applied it; the others did
                            // not: a failure, whose outcome on the leader is open (as a
                            // timed-out request's is).
                            self.counters.copy_write_failures += 1;
                            t.failed = t.copies.len();
                            t.last_err = Some(e);
                            self.decide(id, t);
                        }
                    }
                } else {
                    let agreed = match (reply.as_ref(), &result) {
                        (Some(Reply::Counter(Some(want))), Ok(Reply::Counter(Some(got)))) => {
                            want == got
                        }
                        (Some(Reply::Counter(_)), _) => false,
                        (_, Ok(Reply::Stored(StoreStatus::Stored { .. }))) => true,
                        _ => false,
                    };
                    if agreed {
                        t.acked += 1;
                        self.counters.copies_written += 1;
                    } else {
                        t.failed += 1;
                        match result {
                            // It answered, differently from the leader: its value is
                            // wrong whatever the outcome.
                            Ok(_) => {
                                self.counters.copy_write_failures += 1;
                                self.distrust_copy(s, &key);
                            }
                            Err(e) => {
                                t.last_err = Some(e);
                                self.suspect_copy(t, s);
                            }
                        }
                    }
                    self.decide(id, t);
                }
            }
        }
    }

    /// A read found the value on copy `s`: deliver it, write it back to the copies that
    /// missed it, and for gat give the other copies the new expiry time too.
    fn read_hit(&mut self, id: u64, t: &mut Task, source: usize, v: Value) {
        let Kind::Read {
            op, missed, asked, ..
        } = &t.kind
        else {
            return;
        };
        if *asked > 1 || t.failed > 0 {
            self.counters.reads_failed_over += 1;
        }
        let exptime = gat_exptime(op);
        let missed = missed.clone();
        t.acked = 1 + missed.len();
        if self.config.read_repair && !missed.is_empty() {
            // `add`: never overwrite a value written meanwhile.
            let writes = missed
                .into_iter()
                .map(|m| {
                    let op = repair_add(&t.key, Bytes::clone(&v.data), v.flags);
                    (m, Background::Repair, op)
                })
                .collect();
            self.repair_copies(source, exptime, writes);
        }
        if let Some(exptime) = exptime {
            let Kind::Read { order, next, .. } = &t.kind else {
                return;
            };
            let rest: Vec<usize> = order[*next..].to_vec();
            for o in rest {
                if self.is_up(o) {
                    let op = Op::Touch {
                        key: t.key.clone(),
                        exptime,
                    };
                    self.in_background(o, Background::Touch, op);
                }
            }
        }
        self.deliver(id, t, Ok(Reply::Value(Some(v))));
    }

    /// Read repair: sends `writes` (stores whose expiry time is still to be filled in)
    /// with the expiry time of the value they copy, read from server `source`. A plain
    /// read does not learn that time, so `source` is asked first (`exptime` is `None`);
    /// a gat gives it. A copy written without its expiry time would outlive the value
    /// and later serve it after it expired; when the time cannot be learnt (a server
    /// too old to answer, or the value gone or in its last second) nothing is written.
    pub(crate) fn repair_copies(
        &mut self,
        source: usize,
        exptime: Option<u32>,
        mut writes: Vec<(usize, Background, Op)>,
    ) {
        let Some(exptime) = exptime else {
            let Some(key) = writes.first().and_then(|w| w.2.key().map(<[u8]>::to_vec)) else {
                return;
            };
            if self.background_inflight >= self.config.max_background {
                self.counters.read_repairs_skipped += writes.len() as u64;
                return;
            }
            self.background_inflight += 1;
            // Counted before the request goes out: a request that fails at once may be
            // handled before `issue` returns.
            self.repairs_waiting.entry(key.clone()).or_default().waiting += 1;
            let child = Child {
                role: Role::RepairTtl(writes),
                server: source,
            };
            self.issue(source, Op::Ttl { key }, Some(child));
            return;
        };
        for (s, kind, mut op) in writes.drain(..) {
            if let Op::Store { exptime: e, .. } = &mut op {
                *e = exptime;
            }
            if !self.in_background(s, kind, op) {
                self.counters.read_repairs_skipped += 1;
            }
        }
    }

    /// Issues `op` to server `s` in the background (nobody waits for it), unless
    /// `max_background` such requests are in flight; false when it was not issued.
    pub(crate) fn in_background(&mut self, s: usize, kind: Background, op: Op) -> bool {
        if self.background_inflight >= self.config.max_background {
            return false;
        }
        self.background_inflight += 1;
        let child = Child {
            role: Role::Background(kind),
            server: s,
        };
        self.issue(s, op, Some(child));
        true
    }

    /// The caller stopped waiting for task `id`: its steps finish in the background.
    /// `None` when `id` is not a task.
    pub(crate) fn abandon_task(&mut self, id: u64) -> Option<Error> {
        let t = self.tasks.get_mut(&id)?;
        if t.delivered {
            return None;
        }
        t.delivered = true;
        t.abandoned = true;
        let server = t
            .copies
            .first()
            .map_or_else(String::new, |&s| self.servers[s].name.clone());
        Some(Error::Timeout { server })
    }
}

/// A read repair's write: `add` (never overwriting a value written meanwhile), its
/// expiry time filled in by [`Client::repair_copies`].
pub(crate) fn repair_add(key: &[u8], value: Bytes, flags: u32) -> Op {
    Op::Store {
        mode: StoreMode::Add,
        key: key.to_vec(),
        value,
        flags,
        exptime: 0,
        cas: 0,
    }
}

/// The expiry time a read sets (a gat's), which its repairs then use.
pub(crate) fn gat_exptime(op: &Op) -> Option<u32> {
    match op {
        Op::Gat { exptime, .. } => Some(*exptime),
        _ => None,
    }
}

/// The memcached expiry time for `secs` seconds from now: relative up to 30 days, an
/// absolute unix time beyond (memcached reads larger numbers as absolute times).
pub(crate) fn exptime_in(secs: u32) -> u32 {
    const RELATIVE_MAX: u32 = 60 * 60 * 24 * 30;
    if secs <= RELATIVE_MAX {
        return secs;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(now + u64::from(secs)).unwrap_or(u32::MAX)
}

/// Whether a conditional operation took effect.
fn succeeded(r: &Reply) -> bool {
    matches!(
        r,
        Reply::Stored(StoreStatus::Stored { .. }) | Reply::Counter(Some(_))
    )
}

/// What the other copies are sent once the leader applied `op`: the same value for the
/// operations that replace it, the same operation for those that modify it.
pub(crate) fn follower_op(op: &Op) -> Op {
    match op {
        Op::Store {
            mode: StoreMode::Add | StoreMode::Replace | StoreMode::Cas,
            key,
            value,
            flags,
            exptime,
            ..
        } => Op::Store {
            mode: StoreMode::Set,
            key: key.clone(),
            value: value.clone(),
            flags: *flags,
            exptime: *exptime,
            cas: 0,
        },
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_need_all_a_majority_or_one() {
        assert_eq!(WritePolicy::All.needed(3), 3);
        assert_eq!(WritePolicy::Quorum.needed(3), 2);
        assert_eq!(WritePolicy::Quorum.needed(2), 2);
        assert_eq!(WritePolicy::Quorum.needed(1), 1);
        assert_eq!(WritePolicy::Quorum.needed(5), 3);
        assert_eq!(WritePolicy::One.needed(3), 1);
        assert_eq!("quorum".parse::<WritePolicy>(), Ok(WritePolicy::Quorum));
        assert!("most".parse::<WritePolicy>().is_err());
    }

    #[test]
    fn conditional_operations_are_followed_by_a_set_or_themselves() {
        let add = Op::Store {
            mode: StoreMode::Add,
            key: b"k".to_vec(),
            value: Bytes::from_static(b"v"),
            flags: 3,
            exptime: 9,
            cas: 0,
        };
        match follower_op(&add) {
            Op::Store {
                mode: StoreMode::Set,
                flags: 3,
                exptime: 9,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        let incr = Op::Arith {
            key: b"k".to_vec(),
            delta: 2,
            incr: true,
        };
        assert_eq!(follower_op(&incr), incr);
    }
}
