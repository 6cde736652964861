//! Refilling a server that restarted empty from the other servers of the pool, in a
//! thread of its own, bounded in bandwidth (docs/resilience.md, "Restarted servers").
//!
//! Servers do not talk to each other, so the client walks their key lists: it reads each
//! other server's `lru_crawler metadump` (memfabricd and memcached write the same lines),
//! and for every key whose copies include the empty server — taken from the first live
//! other copy only, so a key is handled once — it reads the value there and writes it
//! back with `add` (a value a client wrote meanwhile is never replaced) and the expiry
//! time the dump gave. An erasure-coded key's missing fragment is rebuilt from `k`
//! fragments of the newest write that has them, exactly as the write made it. A key
//! deleted at its source while it was being copied is deleted again on the refilled
//! server (the `add` may have brought it back).
//!
//! The keys are handled a batch at a time ([`BATCH_KEYS`], [`BATCH_BYTES`]): the batch's
//! reads at the source go out together, then its writes at the target, then the reads
//! that check the source still holds them, each pipelined on its connection, so a key
//! costs a fraction of a round trip instead of three.
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use memfabric_proto::ec_fragment::{FragmentHeader, WriteId};
use memfabric_proto::metadump::{parse_line, DumpEntry, DumpLine, LINE_MAX};

use crate::addr::{Scheme, ServerAddr};
use crate::client::Handle;
use crate::client::{Client, Config};
use crate::ec::{Code, EcGeometry};
use crate::ketama::Continuum;
use crate::op::{Op, Reply, StoreMode, StoreStatus, Value};
use crate::repair::{RepairJob, RepairTally};
use crate::transport::{Credentials, GetMode};

/// What a repair needs to know about its pool.
pub(crate) struct Plan {
    pub(crate) servers: Vec<ServerAddr>,
    pub(crate) ring: Continuum,
    /// The server to refill.
    pub(crate) target: usize,
    /// Take the claim on the target even if another client holds it.
    pub(crate) force: bool,
    /// Copies of a value that is not coded.
    pub(crate) plain_copies: usize,
    pub(crate) ec: Option<EcGeometry>,
    /// Bytes per second read and written together; 0 = unbounded.
    pub(crate) bandwidth: u64,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// The pool's credentials, for servers with `-Y`.
    pub(crate) credentials: Option<Credentials>,
    /// The pool's TLS, for servers with `-Z`.
    pub(crate) tls: Option<crate::tls::TlsConfig>,
    /// Each server's hints, as the pool records and sends them: a server that owes a
    /// delete of a key (it missed a write or a delete while paused or cut off, and the
    /// pool has not reached it since) still holds what the key no longer is, and is no
    /// source for it.
    pub(crate) hints: Vec<crate::tasks::SharedHints>,
}

/// The keys a repair claims on the server it refills (with `add`, so that of many clients
/// that see the same restart one repairs), keeps while it runs, and leaves behind as
/// "done" for a while once finished: this prefix, then the pool's placement (copies of a
/// plain value, and the code), since pools with different settings repair different
/// keys. Never copied between servers. Reserved: a pool's own data must not use it.
pub const CLAIM_PREFIX: &[u8] = b"memfabric.repair.claim";
/// How long a claim lasts unless renewed (a client that died mid-repair gives way to
/// another after this), how often it is renewed, and how long a finished repair's mark
/// stays.
const CLAIM_TTL: u32 = 30;
const CLAIM_RENEW: Duration = Duration::from_secs(10);
const DONE_TTL: u32 = 600;

/// A batch of keys to refill is handled once it holds this many keys, or this many
/// bytes of items by the dump's sizes (what the batch holds in memory at once).
pub(crate) const BATCH_KEYS: usize = 32;
pub(crate) const BATCH_BYTES: u64 = 4 << 20;

/// A key the walk found the target should hold, `source` being its first live copy.
#[derive(Clone)]
struct Candidate {
    key: Vec<u8>,
    exptime: u32,
    copies: Vec<usize>,
}

/// A candidate read at its source, and what to write to the target.
struct Copy {
    key: Vec<u8>,
    exptime: u32,
    flags: u32,
    write: Bytes,
}

/// How often a `BUSY` server (another dump or crawl running) is asked again, and how
/// long apart.
const BUSY_RETRIES: u32 = 30;
const BUSY_PAUSE: Duration = Duration::from_secs(1);

/// Starts refilling `plan.target` in a thread; counted in `tally`.
pub(crate) fn spawn(plan: Plan, tally: Arc<RepairTally>) -> std::io::Result<RepairJob> {
    let stop = Arc::new(AtomicBool::new(false));
    let target = plan.target;
    let flag = Arc::clone(&stop);
    RepairTally::add(&tally.started, 1);
    // What kept an earlier repair of this server from finishing is no longer news.
    tally.clear_problems(target);
    let counts = Arc::clone(&tally);
    let thread = std::thread::Builder::new()
        .name(format!("memfabric-repair-{target}"))
        .spawn(move || {
            let name = plan.servers[target].host_port();
            let ended = Refill::new(plan, flag, &counts).run_claimed();
            match ended {
                Ok(true) => RepairTally::add(&counts.finished, 1),
                Ok(false) => RepairTally::add(&counts.left_to_others, 1),
                Err(halt) => {
                    match halt {
                        Halt::Stopped => counts.problem(
                            target,
                            format!(
                                "the repair of {name} was stopped (the pool was dropped, or the \
                             server restarted again)"
                            ),
                        ),
                        Halt::TargetFailed => counts.problem(
                            target,
                            format!("{name}, the server being repaired, did not answer"),
                        ),
                        // Said where it happened.
                        Halt::Source(_) | Halt::Incomplete => {}
                    }
                    RepairTally::add(&counts.abandoned, 1);
                }
            }
        });
    match thread {
        Ok(t) => Ok(RepairJob {
            target,
            stop,
            thread: Some(t),
        }),
        Err(e) => {
            RepairTally::add(&tally.abandoned, 1);
            Err(e)
        }
    }
}

/// Why a repair, or its walk of one server, ended early.
#[derive(Debug)]
enum Halt {
    /// Asked to stop.
    Stopped,
    /// The server being refilled does not answer.
    TargetFailed,
    /// This source's key list could not be read (the others are still walked).
    Source(String),
    /// Some other server's key list could not be read (said in the tally's problem):
    /// what it alone held was not refilled, so the repair is not marked done.
    Incomplete,
}

struct Refill<'a> {
    plan: Plan,
    stop: Arc<AtomicBool>,
    tally: &'a RepairTally,
    /// A one-server client per server of the pool (none where it could not be made).
    direct: Vec<Option<Client>>,
    /// Other servers that answered when the repair started: the sources.
    alive: Vec<bool>,
    code: Option<Code>,
    budget: Budget,
    /// When the claim on the target was last renewed.
    claimed: Instant,
    /// Keys of the source being walked waiting to be refilled, and their dump sizes.
    batch: Vec<Candidate>,
    batch_bytes: u64,
    /// A coded key's fragments were found away from the positions this server list
    /// gives them (the list changed since they were written): a server not heard from
    /// may then hold any fragment.
    placement_moved: bool,
    /// Coded keys skipped because which fragment the target lacks could not be told.
    skipped_unheard: u64,
    /// Coded keys with a server not heard from, whose fragment is written once the walk
    /// has shown the list unchanged (`placement_moved` still false), with their source.
    deferred: Vec<(usize, Candidate)>,
    /// Writing the deferred keys: their fragment is decided, not deferred again.
    resolving: bool,
}

/// Coded keys a repair defers at most (`Refill::deferred`); more are skipped.
const MAX_DEFERRED: usize = 100_000;

impl<'a> Refill<'a> {
    fn new(plan: Plan, stop: Arc<AtomicBool>, tally: &'a RepairTally) -> Self {
        let config = Config {
            timeout: plan.timeout,
            connect_timeout: plan.connect_timeout,
            retry_timeout: plan.timeout,
            get_mode: GetMode::TwoSided,
            access_hints: false,
            // Fragments are copied as stored, never read whole.
            raw_fragments: true,
            background_repair: false,
            credentials: plan.credentials.clone(),
            tls: plan.tls.clone(),
            ..Config::default()
        };
        let direct = plan
            .servers
            .iter()
            .map(|a| Client::new(vec![a.clone()], config.clone()).ok())
            .collect();
        let code = plan.ec.and_then(|g| Code::new(g.k, g.m).ok());
        let budget = Budget::new(plan.bandwidth);
        let alive = vec![false; plan.servers.len()];
        Refill {
            plan,
            stop,
            tally,
            direct,
            alive,
            code,
            budget,
            claimed: Instant::now(),
            batch: Vec::new(),
            batch_bytes: 0,
            placement_moved: false,
            skipped_unheard: 0,
            deferred: Vec::new(),
            resolving: false,
        }
    }

    /// Claims the target, refills it, and marks it done (or lets the claim go when the
    /// repair ends early). `Ok(false)`: another client holds the claim or finished a
    /// repair of this run of the server.
    fn run_claimed(&mut self) -> Result<bool, Halt> {
        let target = self.plan.target;
        let claim = self.claim_key();
        let Some(t) = self.direct[target].as_mut() else {
            return Err(Halt::TargetFailed);
        };
        let taken = if self.plan.force {
            t.set(&claim, b"running", 0, CLAIM_TTL).map(|()| true)
        } else {
            t.add(&claim, b"running", 0, CLAIM_TTL)
        };
        match taken {
            Ok(true) => self.claimed = Instant::now(),
            Ok(false) => return Ok(false),
            Err(_) => return Err(Halt::TargetFailed),
        }
        let ended = self.run().and_then(|every_source| {
            if every_source {
                Ok(())
            } else {
                Err(Halt::Incomplete)
            }
        });
        if let Some(t) = self.direct[target].as_mut() {
            let _ = match ended {
                Ok(()) => t.set(&claim, b"done", 0, DONE_TTL),
                Err(_) => t.delete(&claim).map(drop),
            };
        }
        ended.map(|()| true)
    }

    /// This pool's claim key: the prefix, the copies of a plain value and the code.
    fn claim_key(&self) -> Vec<u8> {
        let mut k = CLAIM_PREFIX.to_vec();
        k.extend_from_slice(format!(".c{}", self.plan.plain_copies).as_bytes());
        if let Some(g) = self.plan.ec {
            k.extend_from_slice(format!(".rs{}+{}", g.k, g.m).as_bytes());
        }
        k
    }

    /// Keeps the claim while the walk goes on.
    fn renew_claim(&mut self) {
        if self.claimed.elapsed() < CLAIM_RENEW {
            return;
        }
        self.claimed = Instant::now();
        let claim = self.claim_key();
        if let Some(t) = self.direct[self.plan.target].as_mut() {
            let _ = t.touch(&claim, CLAIM_TTL);
        }
    }

    /// Walks every other server that answers; `Ok(false)` if so many could not be walked
    /// that some key may have had no other copy listed (each said in the tally's problem
    /// and counted in `sources_failed`).
    fn run(&mut self) -> Result<bool, Halt> {
        let target = self.plan.target;
        if !self.answers(target) {
            return Err(Halt::TargetFailed);
        }
        let mut unlisted = 0;
        for s in 0..self.plan.servers.len() {
            self.alive[s] = s != target && self.answers(s);
            if s != target && !self.alive[s] {
                let name = self.plan.servers[s].host_port();
                self.tally.problem(
                    target,
                    format!("{name} did not answer: its keys were not listed"),
                );
                RepairTally::add(&self.tally.sources_failed, 1);
                unlisted += 1;
            }
        }
        for s in 0..self.plan.servers.len() {
            if !self.alive[s] {
                continue;
            }
            match self.walk(s) {
                Ok(()) => {}
                Err(Halt::Source(why)) => {
                    let name = self.plan.servers[s].host_port();
                    self.tally
                        .problem(target, format!("key list of {name}: {why}"));
                    RepairTally::add(&self.tally.sources_failed, 1);
                    unlisted += 1;
                }
                Err(h) => return Err(h),
            }
        }
        // Complete unless the servers not listed could hold every other copy of some
        // key: a value kept whole has `plain_copies - 1` others (a coded one more, each
        // listing it).
        self.resolve_deferred()?;
        if self.skipped_unheard > 0 {
            self.tally.problem(
                target,
                format!(
                    "{} coded key(s) skipped: their fragments are not where this server list \
                     puts them, and a server of theirs did not answer (repair again once it does)",
                    self.skipped_unheard
                ),
            );
        }
        Ok(unlisted < self.plan.plain_copies.saturating_sub(1).max(1) && self.skipped_unheard == 0)
    }

    fn answers(&mut self, s: usize) -> bool {
        self.direct[s]
            .as_mut()
            .is_some_and(|c| c.version().first().is_some_and(|(_, r)| r.is_ok()))
    }

    fn stopped(&self) -> Result<(), Halt> {
        if self.stop.load(Ordering::Relaxed) {
            Err(Halt::Stopped)
        } else {
            Ok(())
        }
    }

    /// Where server `s` answers the text protocol: its own address, or for a `ucx://`
    /// server the TCP port its `stats settings` names.
    fn text_address(&mut self, s: usize) -> Result<SocketAddr, Halt> {
        let addr = &self.plan.servers[s];
        let port = match addr.scheme {
            Scheme::Tcp => addr.port,
            Scheme::Ucx => {
                let c = self.direct[s].as_mut().ok_or(Halt::TargetFailed)?;
                let stats = c.stats(Some("settings"));
                let found = stats.first().and_then(|(_, r)| {
                    let r = r.as_ref().ok()?;
                    r.iter()
                        .find(|(k, _)| k == "tcpport")
                        .and_then(|(_, v)| v.parse::<u16>().ok())
                });
                found.ok_or_else(|| Halt::Source("no tcpport in its stats settings".into()))?
            }
        };
        (addr.host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| Halt::Source(e.to_string()))?
            .next()
            .ok_or_else(|| Halt::Source("its name does not resolve".into()))
    }

    /// Reads server `s`'s key list and repairs the keys it is the source of.
    fn walk(&mut self, s: usize) -> Result<(), Halt> {
        // What an earlier walk that ended early left is not this source's.
        self.batch.clear();
        self.batch_bytes = 0;
        let addr = self.text_address(s)?;
        let io = |e: std::io::Error| Halt::Source(e.to_string());
        let mut busy = 0;
        'dump: loop {
            self.stopped()?;
            let stream =
                TcpStream::connect_timeout(&addr, self.plan.connect_timeout).map_err(io)?;
            let deadline = Instant::now() + self.plan.timeout;
            let server = addr.to_string();
            let halt = |e: crate::Error| Halt::Source(e.to_string());
            let mut conn: Box<dyn crate::tcp::ReadWrite + Send> = match &self.plan.tls {
                Some(t) => {
                    let config = crate::tls::client_config(t).map_err(halt)?;
                    let host = t
                        .server_name
                        .clone()
                        // The name the pool's own connections check: the server's host.
                        .unwrap_or_else(|| self.plan.servers[s].host.clone());
                    let tls = crate::tls::handshake(&stream, &config, &host, &server, deadline)
                        .map_err(halt)?;
                    let sock = stream.try_clone().map_err(io)?;
                    Box::new(crate::tls::Blocking::new(tls, sock))
                }
                None => Box::new(stream.try_clone().map_err(io)?),
            };
            if let Some(c) = &self.plan.credentials {
                crate::tcp::authenticate(&mut conn, &stream, c, &server, deadline).map_err(halt)?;
            }
            // A dump streams as fast as it is read; a server that stops sending is given
            // up on.
            stream
                .set_read_timeout(Some(self.plan.timeout.max(Duration::from_secs(5))))
                .map_err(io)?;
            let _ = stream.set_nodelay(true);
            conn.write_all(b"lru_crawler metadump all\r\n")
                .map_err(io)?;
            let mut reader = BufReader::new(conn);
            let mut line = Vec::with_capacity(LINE_MAX);
            let mut first = true;
            loop {
                line.clear();
                let n = (&mut reader)
                    .take(LINE_MAX as u64 + 2)
                    .read_until(b'\n', &mut line)
                    .map_err(io)?;
                if n == 0 {
                    return Err(Halt::Source("closed before END".into()));
                }
                match parse_line(&line) {
                    Ok(DumpLine::End) => return self.flush(s),
                    Ok(DumpLine::Refused { busy: true, .. }) if first && busy < BUSY_RETRIES => {
                        busy += 1;
                        self.pause(BUSY_PAUSE)?;
                        continue 'dump;
                    }
                    Ok(DumpLine::Refused { text, .. }) => return Err(Halt::Source(text)),
                    Ok(DumpLine::Entry(e)) => self.consider(s, &e)?,
                    Err(e) => return Err(Halt::Source(e.to_string())),
                }
                first = false;
            }
        }
    }

    fn pause(&self, d: Duration) -> Result<(), Halt> {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.stopped()?;
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
        Ok(())
    }

    /// A key listed by `source`: repaired if the refilled server should hold it and
    /// `source` is its first live other copy.
    fn consider(&mut self, source: usize, e: &DumpEntry) -> Result<(), Halt> {
        self.stopped()?;
        self.renew_claim();
        if e.key.starts_with(CLAIM_PREFIX) {
            return Ok(());
        }
        let target = self.plan.target;
        let widest = self
            .plan
            .plain_copies
            .max(self.code.as_ref().map_or(0, Code::total_shards));
        let copies = self.plan.ring.successors(&e.key, widest);
        if !copies.contains(&target) {
            return Ok(());
        }
        if copies.iter().find(|&&s| s != target && self.alive[s]) != Some(&source) {
            return Ok(());
        }
        let exptime = match e.exp {
            None => 0,
            // Expired, or about to: not worth copying.
            Some(t) if t <= unix_now() + 1 => return self.skip(),
            // memcached takes an expiry past 30 days as a unix time.
            Some(t) => match u32::try_from(t) {
                Ok(t) => t,
                Err(_) => return self.skip(),
            },
        };
        self.batch.push(Candidate {
            key: e.key.clone(),
            exptime,
            copies,
        });
        self.batch_bytes += e.size;
        if self.batch.len() >= BATCH_KEYS || self.batch_bytes >= BATCH_BYTES {
            return self.flush(source);
        }
        Ok(())
    }

    /// Does server `s` owe a delete of `key` (the pool's hints)?
    fn owed(&self, s: usize, key: &[u8]) -> bool {
        self.plan
            .hints
            .get(s)
            .is_some_and(|h| crate::tasks::lock_hints(h).owes(key))
    }

    fn skip(&self) -> Result<(), Halt> {
        RepairTally::add(&self.tally.skipped, 1);
        Ok(())
    }

    /// Refills the batch's keys from `source`: reads them there, writes them to the
    /// target, and checks that the source still holds them, each step's requests
    /// pipelined.
    fn flush(&mut self, source: usize) -> Result<(), Halt> {
        let batch = std::mem::take(&mut self.batch);
        let listed = std::mem::take(&mut self.batch_bytes);
        if batch.is_empty() {
            return Ok(());
        }
        self.stopped()?;
        // The batch's reads are charged before they are made (by the sizes the dump
        // listed), so that no read, the first batch's included, runs ahead of the bound.
        self.budget.take(listed, &self.stop)?;
        let timeout = self.plan.timeout;
        let Some(src) = self.direct[source].as_mut() else {
            RepairTally::add(&self.tally.skipped, batch.len() as u64);
            return Ok(());
        };
        let hs: Vec<Handle> = batch
            .iter()
            .map(|c| {
                src.submit(Op::Get {
                    key: c.key.clone(),
                    cas: true,
                })
            })
            .collect();
        let originals = src.wait_all(&hs, timeout);
        let mut copies = Vec::with_capacity(batch.len());
        let mut read = 0;
        for (c, got) in batch.into_iter().zip(originals) {
            let original = match got {
                // Stale there: left to read repair, which reads past it.
                Ok(Reply::Value(Some(_))) if self.owed(source, &c.key) => {
                    self.skip()?;
                    continue;
                }
                Ok(Reply::Value(Some(v))) => v,
                // Deleted or evicted since the dump listed it, or the source failed.
                _ => {
                    self.skip()?;
                    continue;
                }
            };
            if let Some((write, bytes)) = self.what_to_write(source, &c, &original)? {
                read += bytes;
                copies.push(Copy {
                    key: c.key,
                    exptime: c.exptime,
                    flags: original.flags,
                    write,
                });
            }
        }
        if copies.is_empty() {
            return Ok(());
        }
        let written: u64 = copies.iter().map(|c| c.write.len() as u64).sum();
        RepairTally::add(&self.tally.scanned, copies.len() as u64);
        // What the reads cost beyond the listing (fragments read to rebuild one, values
        // grown since), and the writes.
        self.budget
            .take((read as u64).saturating_sub(listed) + written, &self.stop)?;
        RepairTally::add(&self.tally.bytes, read as u64 + written);
        let target = self.plan.target;
        let Some(t) = self.direct[target].as_mut() else {
            return Err(Halt::TargetFailed);
        };
        let hs: Vec<Handle> = copies
            .iter()
            .map(|c| {
                t.submit(Op::Store {
                    mode: StoreMode::Add,
                    key: c.key.clone(),
                    value: c.write.clone(),
                    flags: c.flags,
                    exptime: c.exptime,
                    cas: 0,
                })
            })
            .collect();
        let results = t.wait_all(&hs, timeout);
        let mut added = Vec::new();
        let mut failed = 0;
        for (c, r) in copies.into_iter().zip(results) {
            match r {
                Ok(Reply::Stored(StoreStatus::Stored { .. })) => added.push(c.key),
                Ok(Reply::Stored(_)) => RepairTally::add(&self.tally.present, 1),
                _ => failed += 1,
            }
        }
        RepairTally::add(&self.tally.written, added.len() as u64);
        if failed > 0 {
            if !self.answers(target) {
                return Err(Halt::TargetFailed);
            }
            RepairTally::add(&self.tally.skipped, failed);
        }
        // Deleted at the source while it was copied: a client's delete may have reached
        // the refilled server before the `add`, which then brought the value back; it
        // goes again. A source that holds a newer value is left alone: the write that
        // made it went to the refilled server too and either replaced the copy (it came
        // after the `add`, which succeeded) or failed there, and then the writing pool
        // deletes that copy itself (a hint). Deleting here could delete that newer
        // write's copy — for a coded value, one of its fragments, which can leave a
        // write acknowledged with exactly k fragments unreadable.
        let Some(src) = self.direct[source].as_mut() else {
            return Ok(());
        };
        let hs: Vec<Handle> = added
            .iter()
            .map(|k| {
                src.submit(Op::Get {
                    key: k.clone(),
                    cas: false,
                })
            })
            .collect();
        let now = src.wait_all(&hs, timeout);
        let gone: Vec<&Vec<u8>> = added
            .iter()
            .zip(now)
            .filter(|(_, r)| matches!(r, Ok(Reply::Value(None))))
            .map(|(k, _)| k)
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        if let Some(t) = self.direct[target].as_mut() {
            let hs: Vec<Handle> = gone
                .iter()
                .map(|k| t.submit(Op::Delete { key: k.to_vec() }))
                .collect();
            let _ = t.wait_all(&hs, timeout);
        }
        RepairTally::add(&self.tally.undone, gone.len() as u64);
        Ok(())
    }

    /// What the target should get of candidate `c`, read at `source` as `original`,
    /// with the bytes read for it: the value itself, or for a coded key the target's
    /// fragment rebuilt; `None` when the target is not to hold it (or it was skipped).
    fn what_to_write(
        &mut self,
        source: usize,
        c: &Candidate,
        original: &Value,
    ) -> Result<Option<(Bytes, usize)>, Halt> {
        // A fragment of another code is another pool's (pools with different settings
        // may share servers): repairing it here would put it where that pool does not
        // expect it. Plain values are copied whoever wrote them (the pool reads only
        // the copies it places).
        let coded = match FragmentHeader::decode(&original.data) {
            Ok((h, _)) => match self.code.as_ref() {
                Some(code)
                    if usize::from(h.k) == code.data_shards()
                        && usize::from(h.k) + usize::from(h.m) == code.total_shards() =>
                {
                    true
                }
                _ => return Ok(None),
            },
            // A fragment damaged where it is, or of the old format: not a value to copy
            // (copied, it would keep the right fragment out: the refill writes with add).
            Err(e) if e.is_fragment() => return Ok(None),
            Err(_) => false,
        };
        if coded {
            return match self.rebuild_fragment(source, c, original) {
                Some(Some(w)) => Ok(Some(w)),
                Some(None) => self.skip().map(|()| None),
                None => Ok(None), // not one of the target's
            };
        }
        let target = self.plan.target;
        let mine = c.copies[..self.plan.plain_copies.min(c.copies.len())].contains(&target);
        Ok(mine.then(|| (original.data.clone(), original.data.len())))
    }

    /// Writes the deferred coded keys once every source was walked: when no fragment was
    /// found away from its position, the servers not heard from hold their own; else
    /// they are skipped (the repair is then incomplete).
    fn resolve_deferred(&mut self) -> Result<(), Halt> {
        let deferred = std::mem::take(&mut self.deferred);
        if self.placement_moved {
            self.skipped_unheard += deferred.len() as u64;
            return Ok(());
        }
        // Deferred in walk order, so each source's keys are together.
        self.resolving = true;
        for one_source in deferred.chunk_by(|a, b| a.0 == b.0) {
            for batch in one_source.chunks(BATCH_KEYS) {
                self.batch = batch.iter().map(|(_, c)| c.clone()).collect();
                self.flush(one_source[0].0)?;
            }
        }
        self.resolving = false;
        Ok(())
    }

    /// The refilled server's fragment of a coded key, rebuilt from the other servers'
    /// (`original` is `source`'s): `None` when it is not one of the key's servers,
    /// `Some(None)` when no write has `k` fragments left, or when which fragment it
    /// lacks cannot be told (below). With the bytes read.
    fn rebuild_fragment(
        &mut self,
        source: usize,
        candidate: &Candidate,
        original: &Value,
    ) -> Option<Option<(Bytes, usize)>> {
        let (key, copies) = (&candidate.key[..], &candidate.copies[..]);
        let code = self.code.as_ref()?;
        let (k, n) = (code.data_shards(), code.total_shards());
        let servers = &copies[..n.min(copies.len())];
        let pos = servers.iter().position(|&s| s == self.plan.target)?;
        let mut pieces: Vec<Bytes> = vec![original.data.clone()];
        // Where each piece was read: the server's position among the key's (`None`: the
        // source is not one of them).
        let mut read_at: Vec<Option<usize>> = vec![servers.iter().position(|&s| s == source)];
        let asked: Vec<usize> = servers
            .iter()
            .copied()
            .filter(|&s| s != self.plan.target && s != source && self.alive[s])
            .collect();
        let mut handles = Vec::new();
        for &s in &asked {
            if let Some(c) = self.direct[s].as_mut() {
                handles.push((s, c.iget(key)));
            }
        }
        // The key's other servers that answered (with a fragment or without).
        let mut heard = vec![source];
        for (s, h) in handles {
            if let Some(c) = self.direct[s].as_mut() {
                match c.wait(h, self.plan.timeout) {
                    Ok(Reply::Value(Some(v))) => {
                        pieces.push(v.data);
                        read_at.push(servers.iter().position(|&x| x == s));
                        heard.push(s);
                    }
                    Ok(Reply::Value(None)) => heard.push(s),
                    _ => {}
                }
            }
        }
        let read = pieces.iter().map(Bytes::len).sum();
        let code = self.code.as_ref()?;
        let headers: Vec<FragmentHeader> = pieces
            .iter()
            .filter_map(|p| FragmentHeader::decode(p).ok().map(|(h, _)| h))
            .filter(|h| usize::from(h.k) == k && usize::from(h.k) + usize::from(h.m) == n)
            .collect();
        // The newest write with k distinct fragments (the one a reader returns).
        let mut writes: Vec<WriteId> = headers.iter().map(FragmentHeader::write).collect();
        writes.sort_unstable_by(|a, b| b.cmp(a));
        writes.dedup();
        let chosen = writes.into_iter().find(|&w| {
            let have: HashSet<u8> = headers
                .iter()
                .filter(|h| h.write() == w)
                .map(|h| h.index)
                .collect();
            have.len() >= k
        });
        let Some(write) = chosen else {
            return Some(None);
        };
        let of_it: Vec<&[u8]> = pieces
            .iter()
            .filter(|p| FragmentHeader::decode(p).is_ok_and(|(h, _)| h.write() == write))
            .map(|p| &p[..])
            .collect();
        let value = code.decode(&of_it).ok()?;
        let mut fragments = code.encode(write.stripe, &value).ok()?;
        // Its own position's fragment, unless another server holds that one (the servers
        // listed in another order or on other ports than when the write placed them: a
        // server replaced by one on a new port); then one no server holds. A server not
        // heard from is taken to hold its own position's fragment while no fragment this
        // repair has read was away from its position; after one was, the list changed and
        // it may hold any: the key is skipped rather than guessed (the refill writes with
        // `add`: a second copy of a fragment would stay) and the repair is incomplete.
        let of_write: Vec<(Option<usize>, usize)> = pieces
            .iter()
            .zip(&read_at)
            .filter_map(|(p, at)| {
                let (h, _) = FragmentHeader::decode(p).ok()?;
                (h.write() == write).then_some((*at, usize::from(h.index)))
            })
            .collect();
        let mut taken: Vec<usize> = of_write.iter().map(|&(_, i)| i).collect();
        let misplaced = of_write.iter().any(|&(at, i)| at != Some(i));
        let unheard = servers
            .iter()
            .any(|s| *s != self.plan.target && !heard.contains(s));
        self.placement_moved |= misplaced;
        if unheard && (self.placement_moved || taken.contains(&pos)) {
            self.skipped_unheard += 1;
            return Some(None);
        }
        if unheard && !self.resolving {
            // Decided once every source was walked: a later key may show the list moved.
            if self.deferred.len() < MAX_DEFERRED {
                self.deferred.push((source, candidate.clone()));
            } else {
                self.skipped_unheard += 1;
            }
            return None;
        }
        let Some(index) = crate::ec::free_index(pos, &mut taken, n) else {
            return Some(None);
        };
        let fragment = fragments.swap_remove(index);
        Some(Some((Bytes::from(fragment), read)))
    }
}

/// The bandwidth bound: bytes may be spent at `rate` per second on average, with at most
/// one second's worth saved up while the repair had nothing to copy.
struct Budget {
    rate: u64,
    since: Instant,
    spent: u64,
}

impl Budget {
    fn new(rate: u64) -> Self {
        Budget {
            rate,
            since: Instant::now(),
            spent: 0,
        }
    }

    fn take(&mut self, bytes: u64, stop: &AtomicBool) -> Result<(), Halt> {
        if self.rate == 0 {
            return Ok(());
        }
        let allowed = |elapsed: Duration| elapsed.as_secs_f64() * self.rate as f64;
        if allowed(self.since.elapsed()) > self.spent as f64 + self.rate as f64 {
            // Idle for more than a second: start the average again.
            self.since = Instant::now();
            self.spent = 0;
        }
        self.spent += bytes;
        let due = Duration::from_secs_f64(self.spent as f64 / self.rate as f64);
        loop {
            if stop.load(Ordering::Relaxed) {
                return Err(Halt::Stopped);
            }
            let elapsed = self.since.elapsed();
            if elapsed >= due {
                return Ok(());
            }
            std::thread::sleep((due - elapsed).min(Duration::from_millis(20)));
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
