//! The one-sided GET path: at connect, whether a server's memory is read with RMA (and
//! its geometry, from the control block); then each GET's reads of buckets and items
//! (`crate::onesided` decides what to read and checks it), the fall back to a two-sided
//! request when a read is not conclusive, and the batched access hints sent back to the
//! server.
use std::time::{Duration, Instant};

use bytes::Bytes;
use memfabric_proto::onesided as os;
use memfabric_proto::ucx_wire as fp;
use memfabric_ucx as mf;

use super::{BytesBuf, Rma, UcxTransport, RMA_TOKEN, SEND_TOKEN};
use crate::onesided::{Fallback, GetRead, Remote, Step};
use crate::op::{Op, Reply, Value};
use crate::transport::{Completion, ConnId, GetMode};

/// Access hints are sent once this many one-sided hits are pending (or when idle).
const HINT_BATCH: usize = 256;
/// Pending access hints are also sent at least this often while GETs keep the transport
/// busy.
pub(super) const HINT_MAX_AGE: Duration = Duration::from_millis(50);
/// Slots of the table of items already hinted in the current batch (direct-mapped): an
/// item read again before the batch goes out is not hinted twice. The server needs one
/// hint per item per batch to keep it from the eviction tail (memcached itself bumps an
/// item at most once a minute); more only cost it CPU.
const HINTED_SLOTS: usize = 1024;
/// An empty slot of that table (an odd seq is never an item's).
const NOT_HINTED: (u64, u32) = (u64::MAX, 1);

impl UcxTransport {
    /// Drive the one-sided GETs in flight on `conn` to completion (their completions are
    /// delivered by the next `progress`), so that a request submitted after them cannot
    /// overtake them. Bounded: a server that stops answering fails them by its timeouts.
    pub(super) fn finish_onesided(&mut self, conn: ConnId) {
        let pending = |t: &Self| t.onesided.values().any(|g| g.conn == conn);
        if !pending(self) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut done = Vec::new();
        let mut events = std::collections::VecDeque::new();
        while pending(self) && Instant::now() < deadline {
            self.w.progress();
            self.w.drain_into(&mut events);
            events.extend(self.local_events.drain(..));
            while let Some(e) = events.pop_front() {
                self.handle(e, &mut done);
            }
        }
        self.deferred.append(&mut done);
    }

    /// Decide at connect whether GETs to this server go one-sided, and learn its geometry
    /// from the control block (one RMA read). Any failure leaves the server two-sided.
    pub(super) fn setup_rma(
        &mut self,
        ep: &mut mf::Endpoint,
        welcome: &fp::Welcome,
        timeout: Duration,
    ) -> Option<Rma> {
        if self.get_mode == GetMode::TwoSided || welcome.index_len <= os::CTL_BYTES as u64 {
            return None;
        }
        let arena = ep.unpack_rkey(&welcome.arena_rkey).ok()?;
        let index = ep.unpack_rkey(&welcome.index_rkey).ok()?;
        // Same-host shared memory: mapped here, read with plain copies.
        let mapped = ep.map_region(arena, welcome.arena_base, welcome.arena_len as usize)
            && ep.map_region(index, welcome.index_base, welcome.index_len as usize);
        if self.get_mode == GetMode::Auto && !mapped && !has_native_get_lane(ep) {
            return None;
        }
        let ctl_addr = welcome.index_base + welcome.index_len - os::CTL_BYTES as u64;
        let block = self.read_now(ep, ctl_addr, index, os::CTL_BYTES, timeout)?;
        let (geo, _) = os::decode_control(&block).ok()?;
        if geo.index_len() != welcome.index_len || geo.arena_len > welcome.arena_len {
            return None;
        }
        let ours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let theirs = welcome.started_unix as i64 + welcome.clock as i64;
        Some(Rma {
            remote: Remote {
                geo,
                arena_base: welcome.arena_base,
                arena_len: welcome.arena_len,
                index_base: welcome.index_base,
                clock_offset: theirs - ours,
            },
            mapped,
            arena,
            index,
            hints: Vec::new(),
            hinted: vec![NOT_HINTED; HINTED_SLOTS].into_boxed_slice(),
            alive_at: Instant::now(),
        })
    }

    /// One RMA read, waited for (connect time only).
    pub(super) fn read_now(
        &mut self,
        ep: &mf::Endpoint,
        addr: u64,
        rkey: mf::RemoteKey,
        len: usize,
        timeout: Duration,
    ) -> Option<Vec<u8>> {
        const TOKEN: mf::Token = RMA_TOKEN | 3;
        let take = |b: Option<Box<dyn std::any::Any>>| {
            b.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b)
        };
        match self
            .w
            .get(ep, addr, rkey, Box::new(vec![0u8; len]), TOKEN)
            .ok()?
        {
            mf::Posted::Done(b) => take(b),
            mf::Posted::Pending => {
                let deadline = Instant::now() + timeout;
                let mut events = std::collections::VecDeque::new();
                while Instant::now() < deadline {
                    self.w.progress();
                    self.w.drain_into(&mut events);
                    while let Some(e) = events.pop_front() {
                        match e {
                            mf::Event::Done {
                                token: TOKEN,
                                result,
                                buf,
                            } => {
                                return result.ok().and_then(|()| take(buf));
                            }
                            other => self.local_events.push_back(other),
                        }
                    }
                }
                None
            }
        }
    }

    /// Post the reads of a one-sided GET's next round as UCX `get`s (reads from mapped
    /// memory never come here: `onesided_get_mapped` does them inline).
    pub(super) fn post_reads(
        &mut self,
        conn: ConnId,
        opaque: u64,
        reads: &[crate::onesided::Read],
    ) -> bool {
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_ref()) else {
            return false;
        };
        for r in reads {
            let rkey = if r.arena { rma.arena } else { rma.index };
            let token = RMA_TOKEN | (opaque << 2) | r.part as u64;
            match self
                .w
                .get(ep, r.addr, rkey, Box::new(vec![0u8; r.len]), token)
            {
                Ok(mf::Posted::Pending) => {}
                Ok(mf::Posted::Done(buf)) => self.local_events.push_back(mf::Event::Done {
                    token,
                    result: Ok(()),
                    buf,
                }),
                Err(e) => self.local_events.push_back(mf::Event::Done {
                    token,
                    result: Err(e),
                    buf: None,
                }),
            }
        }
        true
    }

    /// Act on what a one-sided GET's state machine says.
    pub(super) fn onesided_step(&mut self, opaque: u64, step: Step, done: &mut Vec<Completion>) {
        match step {
            Step::Wait => {}
            Step::Post(reads) => {
                let conn = self.onesided.get(&opaque).map(|g| g.conn);
                if !conn.is_some_and(|c| self.post_reads(c, opaque, &reads)) {
                    self.onesided_fallback(opaque, Fallback::ReadError, done);
                }
            }
            Step::Hit { ok, chunk, hint } => {
                let Some(g) = self.onesided.remove(&opaque) else {
                    return;
                };
                self.counters.retries += g.read.retries as u64;
                self.onesided_hit(g.conn, g.id, g.want_cas, ok, chunk, hint, done);
            }
            Step::Fallback(why) => self.onesided_fallback(opaque, why, done),
        }
    }

    /// A one-sided GET from memory mapped into this process (same-host shared memory):
    /// every round of reads is a plain copy, so the whole read runs here, at once, with
    /// none of the request machinery.
    pub(super) fn onesided_get_mapped(
        &mut self,
        conn: ConnId,
        id: u64,
        key: &[u8],
        want_cas: bool,
        done: &mut Vec<Completion>,
    ) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_ref()) else {
            return;
        };
        let (mut read, mut step) = GetRead::new(&rma.remote, key.to_vec());
        let outcome = loop {
            match step {
                Step::Post(reads) => {
                    step = Step::Wait;
                    for r in &reads {
                        let rkey = if r.arena { rma.arena } else { rma.index };
                        let mut buf = vec![0u8; r.len];
                        let ok = ep.read_mapped(rkey, r.addr, &mut buf);
                        step = read.on_read(&rma.remote, r.part, ok.then_some(buf));
                    }
                }
                // Every read of the round is in: a state machine that still waits is
                // confused; the server answers instead.
                Step::Wait => break Err(Fallback::ReadError),
                Step::Hit { ok, chunk, hint } => break Ok((ok, chunk, hint)),
                Step::Fallback(why) => break Err(why),
            }
        };
        self.counters.retries += read.retries as u64;
        match outcome {
            Ok((ok, chunk, hint)) => self.onesided_hit(conn, id, want_cas, ok, chunk, hint, done),
            Err(why) => {
                let key = read.key().to_vec();
                self.serve_twosided(conn, id, key, want_cas, why, done);
            }
        }
    }

    /// Complete a one-sided hit and note its access hint.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn onesided_hit(
        &mut self,
        conn: ConnId,
        id: u64,
        want_cas: bool,
        ok: os::ItemOk,
        chunk: Vec<u8>,
        hint: (u64, u32),
        done: &mut Vec<Completion>,
    ) {
        self.counters.onesided_hits += 1;
        // A header that already shows the access (fetched, active, recent) needs no hint.
        let c = self
            .conns
            .get_mut(&conn)
            .filter(|_| self.access_hints && !ok.access_noted);
        if let Some(rma) = c.and_then(|c| c.rma.as_mut()) {
            let slot = ((hint.0 >> 3) ^ u64::from(hint.1)) as usize % HINTED_SLOTS;
            if rma.hinted[slot] != hint {
                rma.hinted[slot] = hint;
                rma.hints.push(hint);
                self.pending_hints += 1;
                if rma.hints.len() >= HINT_BATCH {
                    self.send_hints(conn);
                }
            }
        }
        let data = Bytes::from(chunk).slice(ok.value);
        done.push(Completion {
            id,
            result: Ok(Reply::Value(Some(Value {
                data,
                flags: ok.flags,
                cas: if want_cas { ok.cas } else { 0 },
            }))),
        });
    }

    pub(super) fn onesided_read_done(
        &mut self,
        opaque: u64,
        part: u8,
        data: Option<Vec<u8>>,
        done: &mut Vec<Completion>,
    ) {
        let Some(g) = self.onesided.get_mut(&opaque) else {
            return; // its connection failed meanwhile
        };
        let Some(rma) = self.conns.get(&g.conn).and_then(|c| c.rma.as_ref()) else {
            return;
        };
        let step = g.read.on_read(&rma.remote, part, data);
        self.onesided_step(opaque, step, done);
    }

    /// Serve a one-sided GET two-sided after all.
    pub(super) fn onesided_fallback(
        &mut self,
        opaque: u64,
        why: Fallback,
        done: &mut Vec<Completion>,
    ) {
        let Some(g) = self.onesided.remove(&opaque) else {
            return;
        };
        self.counters.retries += g.read.retries as u64;
        let key = g.read.key().to_vec();
        self.serve_twosided(g.conn, g.id, key, g.want_cas, why, done);
    }

    /// Send a GET that one-sided reads could not serve as an active message.
    pub(super) fn serve_twosided(
        &mut self,
        conn: ConnId,
        id: u64,
        key: Vec<u8>,
        cas: bool,
        why: Fallback,
        done: &mut Vec<Completion>,
    ) {
        *self.counters.fallbacks.entry(why).or_default() += 1;
        if let Err(e) = self.send_am(conn, id, Op::Get { key, cas }) {
            done.push(Completion { id, result: Err(e) });
        }
    }

    /// Send the pending access hints of `conn` (fire and forget).
    pub(super) fn send_hints(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let (Some(ep), Some(rma)) = (c.ep.as_ref(), c.rma.as_mut()) else {
            return;
        };
        // A new batch: every item may be hinted again.
        rma.hinted.fill(NOT_HINTED);
        while !rma.hints.is_empty() {
            let n = rma.hints.len().min(os::HINTS_MAX);
            self.pending_hints = self.pending_hints.saturating_sub(n);
            let mut data = Vec::with_capacity(n * os::HINT_BYTES);
            for (off, seq) in rma.hints.drain(..n) {
                os::encode_hint(&mut data, off, seq);
            }
            let header = os::encode_hints_header(c.session, n as u32);
            let how = mf::SendHow {
                proto: mf::Proto::Eager,
                reply: false,
            };
            let data = Box::new(BytesBuf(Bytes::from(data))) as Box<dyn mf::SendBuf>;
            // Hints are advisory: one that cannot be sent is dropped.
            if self
                .w
                .am_send(ep, fp::AM_HINTS, header, Some(data), how, SEND_TOKEN)
                .is_ok()
            {
                self.counters.hints_sent += n as u64;
                self.counters.hint_messages += 1;
            }
        }
    }

    pub(super) fn send_all_hints(&mut self) {
        self.last_hint_flush = Instant::now();
        let conns: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.rma.as_ref().is_some_and(|r| !r.hints.is_empty()))
            .map(|(&id, _)| id)
            .collect();
        for id in conns {
            self.send_hints(id);
        }
    }
}

/// Whether UCX gave `ep` a lane that reads natively, without the server's CPU (RDMA
/// verbs, cma, knem, xpmem). Over TCP UCX only emulates RMA with active messages that the
/// server's worker must progress, which is slower than asking it.
fn has_native_get_lane(ep: &mf::Endpoint) -> bool {
    ep.describe()
        .lines()
        .any(|l| l.trim_start_matches(['#', ' ']).starts_with("get["))
}
