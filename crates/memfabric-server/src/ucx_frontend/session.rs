//! The UCX front end's sessions: bootstrap connections (HELLO, WELCOME), the endpoint
//! each session gets, their deadlines, and ending a session with what it has in flight.
use super::*;

impl FabricWorker {
    /// Take a new bootstrap connection from the listener.
    pub fn add_client(&mut self, registry: &Registry, mut stream: mio::net::TcpStream) {
        let token = Token(TOKEN_BASE + self.next_client);
        self.next_client = (self.next_client + 1) % (1 << 30);
        if let Err(e) =
            registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!("cannot register a UCX bootstrap connection: {e}");
            // The listener counted it toward `-c`.
            self.shared()
                .curr_connections
                .fetch_sub(1, Ordering::SeqCst);
            return;
        }
        self.clients.insert(
            token,
            Client {
                stream,
                inbuf: Vec::new(),
                outbuf: Vec::new(),
                refused: false,
                challenged: None,
                session: None,
                accepted: Instant::now(),
                inflight: 0,
                waiting: VecDeque::new(),
                waiting_bytes: 0,
                receiving_keys: HashMap::new(),
            },
        );
        self.arm_timer();
    }

    /// Keep the deadline timer ticking while there is a deadline to watch.
    pub(super) fn arm_timer(&mut self) {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        let settings = &self.shared().settings;
        let watch_hello =
            settings.ucx_hello_timeout > 0 && self.clients.values().any(|c| c.session.is_none());
        // Orphaned receives (their session ended) have no session left to end.
        let watch_transfers = settings.ucx_transfer_timeout > 0
            && (!self.sending.is_empty() || self.has_live_receives());
        let tiered = self.tiers.len() > 1 && !self.by_session.is_empty();
        let want = watch_hello || watch_transfers || self.ended_since_trim > 0 || tiered;
        if want == self.timer_armed {
            return;
        }
        let r = if want {
            self.timer.set(
                Expiration::Interval(TimeSpec::from_duration(TICK)),
                TimerSetTimeFlags::empty(),
            )
        } else {
            self.timer.unset()
        };
        match r {
            Ok(()) => self.timer_armed = want,
            Err(e) => tracing::warn!("UCX deadline timer: {e}"),
        }
    }

    /// The deadline timer fired: close bootstrap connections that did not say HELLO in
    /// time, and end sessions whose transfers outlived the transfer deadline (UCX 1.13
    /// cannot cancel one request: closing the endpoint cancels them all).
    pub(super) fn on_timer(&mut self, registry: &Registry) {
        let _ = self.timer.wait();
        let fs = Arc::clone(&self.fs);
        let settings = &fs.0.settings;
        let now = Instant::now();
        if self.ended_since_trim > 0 && now.duration_since(self.last_trim) >= super::TRIM_EVERY {
            let waiting = self.recycle(registry);
            // What the ended sessions' endpoints held goes back to the system, so that the
            // process shrinks back when many clients leave (or are killed) at once.
            mf::release_free_heap();
            // A worker waiting to be renewed (closes still running) is looked at again
            // on the next trims, a bounded number of times.
            self.recycle_tries = if waiting { self.recycle_tries + 1 } else { 0 };
            self.ended_since_trim = u64::from(waiting && self.recycle_tries < 10);
            self.last_trim = now;
        }
        if self.tiers.len() > 1 {
            self.tier_policy(now);
        }
        let hello = Duration::from_secs(u64::from(settings.ucx_hello_timeout));
        let transfer = Duration::from_secs(u64::from(settings.ucx_transfer_timeout));
        if !hello.is_zero() {
            let late: Vec<Token> = self
                .clients
                .iter()
                .filter(|(_, c)| c.session.is_none() && now.duration_since(c.accepted) > hello)
                .map(|(t, _)| *t)
                .collect();
            for t in late {
                if let Some(fs) = self.shared().fabric.as_ref() {
                    fs.hello_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                self.drop_client(registry, t);
            }
        }
        if !transfer.is_zero() {
            let mut late: Vec<u32> = self
                .sending
                .values()
                .filter(|x| now.duration_since(x.started) > transfer)
                .map(|x| x.session)
                .chain(
                    self.receiving
                        .values()
                        .filter(|x| now.duration_since(x.started) > transfer)
                        .map(|x| x.session),
                )
                .collect();
            late.sort_unstable();
            late.dedup();
            for id in late {
                let Some(&t) = self.by_session.get(&id) else {
                    continue;
                };
                if let Some(fs) = self.shared().fabric.as_ref() {
                    fs.transfer_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(
                    "ucx session {id}: a transfer took longer than {}s; closing the session",
                    transfer.as_secs()
                );
                self.drop_client(registry, t);
            }
        }
        self.arm_timer();
    }

    /// A bootstrap/lifeline socket is ready.
    pub fn drive_stream(&mut self, registry: &Registry, stats: &ThreadStats, token: Token) {
        if token == TIMER_TOKEN {
            self.on_timer(registry);
            return;
        }
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        let mut closed = false;
        // Closed for what the peer sent (counted), not because it went away.
        let mut rejected = false;
        let mut buf = [0u8; 4096];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    if c.session.is_some() || c.inbuf.len() + n > HELLO_MAX {
                        // Nothing may follow HELLO: a confused or hostile peer.
                        rejected = true;
                        break;
                    }
                    c.inbuf.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        if !closed && !rejected && c.session.is_none() && !c.refused && !c.inbuf.is_empty() {
            if c.challenged.is_some() {
                match fp::decode_proof(&c.inbuf) {
                    Ok(None) => {}
                    Ok(Some((proof, used))) if used == c.inbuf.len() => {
                        self.check_proof(stats, token, &proof);
                    }
                    // Bytes after the proof, or not a proof at all.
                    Ok(Some(_)) | Err(_) => rejected = true,
                }
            } else {
                match fp::decode_hello(&c.inbuf) {
                    Ok(None) => {}
                    Ok(Some((hello, used))) if used == c.inbuf.len() => {
                        if self.shared().settings.authenticates() {
                            self.challenge(token, hello);
                        } else {
                            self.welcome(token, hello);
                        }
                    }
                    // Bytes after HELLO, or not a HELLO at all.
                    Ok(Some(_)) | Err(_) => rejected = true,
                }
            }
        }
        if rejected {
            if let Some(fs) = self.shared().fabric.as_ref() {
                fs.bootstrap_rejects.fetch_add(1, Ordering::Relaxed);
            }
            closed = true;
        }
        if !closed {
            closed = !self.flush_out(token);
        }
        if closed {
            self.drop_client(registry, token);
        }
    }

    /// With `-Y`, a HELLO is answered with a challenge: nothing the client sent goes to
    /// UCX until its proof is checked (docs/fabric-protocol.md 1.4).
    fn challenge(&mut self, token: Token, hello: fp::Hello) {
        let Some(nonce) = random_nonce() else {
            // Without randomness a challenge would be guessable: refuse instead.
            tracing::warn!("cannot read /dev/urandom for a UCX challenge; refusing the client");
            self.refuse(token, fp::WELCOME_REFUSED);
            return;
        };
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        c.inbuf.clear();
        let frame = fp::Challenge {
            version: fp::VERSION,
            nonce,
        };
        c.outbuf.extend_from_slice(&frame.encode());
        c.challenged = Some(Box::new((hello, nonce)));
    }

    /// The client's answer to its challenge: a MAC of the nonce and its HELLO's worker
    /// address with the password of one of the `-Y` file's users. Counted as memcached
    /// counts its ascii handshake (`auth_cmds`, `auth_errors`).
    fn check_proof(&mut self, stats: &ThreadStats, token: Token, proof: &fp::Proof) {
        let Some((hello, nonce)) = self
            .clients
            .get_mut(&token)
            .and_then(|c| c.challenged.take())
            .map(|b| *b)
        else {
            return;
        };
        let ok = self.shared().settings.users().is_some_and(|a| {
            a.verify(&proof.user, |password| {
                let want = fp::proof_mac(password, &nonce, &hello.worker_address);
                fp::macs_equal(&proof.mac, &want)
            })
        });
        stats.auth_cmds.incr();
        if ok {
            self.welcome(token, hello);
        } else {
            stats.auth_errors.incr();
            tracing::info!(
                "ucx bootstrap: proof for user {:?} did not match; closing",
                String::from_utf8_lossy(&proof.user)
            );
            self.refuse(token, fp::WELCOME_AUTH_FAILED);
        }
    }

    /// Queue a WELCOME that says no (`flush_out` then drops the client).
    fn refuse(&mut self, token: Token, status: u8) {
        let reply = fp::Welcome {
            version: fp::VERSION,
            status,
            ..Default::default()
        };
        if let Some(c) = self.clients.get_mut(&token) {
            c.inbuf.clear();
            c.outbuf.extend_from_slice(&reply.encode());
            c.refused = true;
        }
    }

    /// Answer a HELLO: connect to the client's worker and queue WELCOME (a refusal is
    /// sent too; `flush_out` then drops the client). With two tiers a new session goes
    /// to the hot one while it has room, else to the cold one (or, when the cold tier
    /// cannot reach the client, to the hot one over its cap: `ucx_tier_fallbacks`).
    pub(super) fn welcome(&mut self, token: Token, hello: fp::Hello) {
        let shared = Arc::clone(&self.fs);
        let shared = &shared.0;
        let fs = shared
            .fabric
            .as_ref()
            .expect("fabric worker without fabric");
        let mut reply = fp::Welcome {
            version: fp::VERSION,
            ..Default::default()
        };
        // A slot among `--max-clients`, taken before UCX hears of the client (so that
        // workers racing for the last one cannot both win it) and given back if no
        // session comes of it.
        let slot = fs.curr_sessions.fetch_add(1, Ordering::Relaxed) < fs.max_clients;
        if !slot {
            fs.curr_sessions.fetch_sub(1, Ordering::Relaxed);
        }
        let (major, minor, _) = mf::version_numbers();
        let ours = fp::ucx_version_code(major, minor);
        if hello.version != fp::VERSION {
            reply.status = fp::WELCOME_BAD_VERSION;
        } else if hello.ucx_version != 0 && hello.ucx_version != ours {
            // Refused before UCX sees the address: a peer of another UCX release can make
            // UCX abort (1.13 on a 1.22 peer's wireup).
            fs.version_mismatches.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                "ucx bootstrap: a client runs UCX {}, we run {}; refusing it",
                fp::ucx_version_text(hello.ucx_version),
                fp::ucx_version_text(ours)
            );
            reply.status = fp::WELCOME_UCX_MISMATCH;
            reply.session = u32::from(ours);
        } else if !slot {
            fs.sessions_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                "ucx bootstrap: {} sessions served (--max-clients); refusing a client",
                fs.max_clients
            );
            reply.status = fp::WELCOME_FULL;
        } else {
            let placed = self.place(fs, &hello.worker_address);
            let id = fs.next_session.fetch_add(1, Ordering::Relaxed);
            let welcomed = match placed {
                Ok((tier, ep)) => match self.welcome_for(tier, id) {
                    Ok(w) => Ok((w, tier, ep)),
                    Err(e) => {
                        self.tiers[tier].close(ep, true);
                        fs.release(tier);
                        Err(e)
                    }
                },
                Err(e) => Err(e),
            };
            match welcomed {
                Ok((w, tier, ep)) => {
                    reply = w;
                    reply.peer_errors = ep.peer_errors();
                    reply.ready = self.send_ready(tier, &ep, &reply);
                    if ep.peer_errors() {
                        fs.peer_error_sessions.fetch_add(1, Ordering::Relaxed);
                    }
                    fs.total_sessions.fetch_add(1, Ordering::Relaxed);
                    let now = Instant::now();
                    let session = Session {
                        id,
                        tier,
                        ep,
                        moving: None,
                        address: hello.worker_address.as_slice().into(),
                        requests: 0,
                        busy_ticks: 0,
                        last_busy: now,
                        settle_until: now,
                    };
                    fs.session_bytes
                        .fetch_add(session.bytes(), Ordering::Relaxed);
                    self.served[tier] += 1;
                    self.by_session.insert(id, token);
                    if let Some(c) = self.clients.get_mut(&token) {
                        c.session = Some(session);
                    }
                    tracing::debug!(
                        "ucx session {id} on worker {}, {} tier (client address {} bytes)",
                        self.worker_index,
                        if tier == HOT { "hot" } else { "cold" },
                        hello.worker_address.len()
                    );
                }
                Err(e) => {
                    tracing::debug!("cannot connect to a UCX client: {e}");
                    reply.status = fp::WELCOME_REFUSED;
                }
            }
        }
        if slot && reply.status != fp::WELCOME_OK {
            fs.curr_sessions.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(c) = self.clients.get_mut(&token) {
            c.inbuf = Vec::new();
            c.outbuf.extend_from_slice(&reply.encode());
            c.refused = reply.status != fp::WELCOME_OK;
        }
        self.arm_timer();
    }

    /// The tier and endpoint of a new session (its place on the tier reserved).
    fn place(
        &mut self,
        fs: &crate::ucx_context::FabricShared,
        address: &[u8],
    ) -> mf::Result<(usize, mf::Endpoint)> {
        if self.tiers.len() > 1 && !fs.reserve(HOT) {
            fs.reserve(COLD);
            match self.connect_client(COLD, address) {
                Ok(ep) => return Ok((COLD, ep)),
                Err(e) => {
                    // No transport in common with the client: it can only be served hot.
                    tracing::debug!("cold tier cannot reach a client ({e}); serving it hot");
                    fs.release(COLD);
                    fs.tier_sessions[HOT].fetch_add(1, Ordering::Relaxed);
                    fs.tier_fallbacks.fetch_add(1, Ordering::Relaxed);
                }
            }
        } else if self.tiers.len() == 1 {
            fs.reserve(HOT);
        }
        self.connect_client(HOT, address)
            .map(|ep| (HOT, ep))
            .inspect_err(|_| fs.release(HOT))
    }

    /// The WELCOME (or, for a move, the AM_MOVE header) that sends session `id` to
    /// `tier`'s worker: the store's rkeys only on the hot tier (the cold tier is served
    /// two-sided).
    pub(super) fn welcome_for(&self, tier: usize, id: u32) -> mf::Result<fp::Welcome> {
        let shared = &self.fs.0;
        let fs = shared
            .fabric
            .as_ref()
            .expect("fabric worker without fabric");
        let store = &shared.store;
        let mut w = fp::Welcome {
            version: fp::VERSION,
            session: id,
            eager_max: fs.eager_max as u32,
            item_size_max: store.config().item_size_max as u64,
            clock: store.clock().now(),
            started_unix: u64::from(store.clock().started()),
            instance: shared.instance,
            worker_address: self.tiers[tier].address()?,
            ..Default::default()
        };
        if tier == HOT {
            w.arena_base = fs.arena.base;
            w.arena_len = fs.arena.len;
            w.index_base = fs.index.base;
            w.index_len = fs.index.len;
            w.arena_rkey = fs.arena.rkey.clone();
            w.index_rkey = fs.index.rkey.clone();
        }
        Ok(w)
    }

    /// Send READY (`fp::AM_READY`) for `w` (the WELCOME or move frame about to go out) on
    /// `ep`, the endpoint just made to the client on `tier`'s worker. Making it already
    /// started UCX's connection to the client; a client that created its own endpoint now
    /// would connect too, and with both ends connecting at once UCX 1.13 over TCP
    /// sometimes lost a reply (several clients in one process, docs/fabric-protocol.md
    /// 1.3). READY tells the client that our connection is up, so its endpoint is paired
    /// with it. Only in peer-failure mode (TCP, RDMA), where a connection that fails is
    /// reported on the endpoint: shared memory connects no socket and never raced. `true`
    /// if it is sent or queued (then the frame says so: `ready`).
    pub(super) fn send_ready(&mut self, tier: usize, ep: &mf::Endpoint, w: &fp::Welcome) -> bool {
        if !ep.peer_errors() {
            return false;
        }
        let how = mf::SendHow {
            proto: mf::Proto::Eager,
            reply: false,
        };
        let header = fp::Ready::for_welcome(w).encode();
        self.tiers[tier]
            .am_send(ep, fp::AM_READY, header, None, how, SEND_TOKEN)
            .is_ok()
    }

    /// An endpoint to a client on `tier`'s worker: with UCX peer-failure handling when the
    /// tier's transports support it (then a client that dies mid-transfer has its
    /// transfers cancelled and their items freed at once), otherwise without (UCX 1.13's
    /// shared-memory transports; the lifeline still ends the session). Which of the two
    /// is known per tier (`FabricWorker::new` probes it): a refused attempt in the other
    /// mode would still use up one of UCX's connection sequence numbers towards that
    /// client, so that our endpoints and the client's stop pairing up — and a later
    /// endpoint of the client's was then paired with an old one of ours, whose close
    /// left the client's requests nowhere to go.
    ///
    /// Creating the endpoint starts UCX's wire-up: over TCP it connects to the client's
    /// worker at once (see `send_ready`).
    pub(super) fn connect_client(
        &mut self,
        tier: usize,
        address: &[u8],
    ) -> mf::Result<mf::Endpoint> {
        let peer_errors = self.peer_errors[tier];
        let w = &mut self.tiers[tier];
        w.set_peer_errors(peer_errors);
        let ep = w.connect_address(address).or_else(|e| {
            if !peer_errors {
                return Err(e);
            }
            // A client that shares only transports without it (rare: the probe found
            // one with it among the tier's transports).
            w.set_peer_errors(false);
            w.connect_address(address)
        });
        w.set_peer_errors(false);
        ep
    }

    /// Write queued WELCOME bytes. `false` if the socket failed.
    pub(super) fn flush_out(&mut self, token: Token) -> bool {
        let Some(c) = self.clients.get_mut(&token) else {
            return false;
        };
        while !c.outbuf.is_empty() {
            match c.stream.write(&c.outbuf) {
                Ok(0) => return false,
                Ok(n) => {
                    c.outbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        // Sent: nothing more is written on a lifeline, so its buffer goes (a session
        // lives on with what it holds, thousands of them).
        c.outbuf = Vec::new();
        // A refused client has been told; now let it go.
        !c.refused
    }

    /// A pinned send is over (done, or given up with its session): count the pin gone.
    pub(super) fn unpinned(&self, x: &Sending) {
        if let (Some(fs), Some(_)) = (self.shared().fabric.as_ref(), x.pin.as_ref()) {
            fs.pins.fetch_sub(1, Ordering::Relaxed);
            fs.pinned_bytes.fetch_sub(x.bytes, Ordering::Relaxed);
        }
    }

    /// A transfer of `session` failed. Over an endpoint with peer error handling UCX
    /// reports the endpoint itself (`EpFailed`). Without it, UCX 1.13 has failed and
    /// destroyed the endpoint the session's messages come through (a copy from a client
    /// that died, seen as an I/O error, then "endpoint timeout" for the rest): the session
    /// ends now, and its rendezvous offers still waiting, or still to arrive, are
    /// abandoned — receiving or giving back one looks the destroyed endpoint up, and UCX
    /// aborts the process (a client killed mid-burst of large SETs took memfabricd down).
    pub(super) fn transfer_failed(&mut self, registry: &Registry, session: u32) {
        let Some(&t) = self.by_session.get(&session) else {
            return;
        };
        let Some(c) = self.clients.get_mut(&t) else {
            return;
        };
        if c.session.as_ref().is_some_and(|s| s.ep.peer_errors()) {
            return;
        }
        let abandoned: u64 = c.waiting.drain(..).map(|(_, m)| abandon(m)).sum();
        c.waiting_bytes = 0;
        if self.failed_sessions.len() >= super::FAILED_SESSIONS_KEPT {
            self.failed_sessions.pop_front();
        }
        self.failed_sessions.push_back(session);
        if let Some(fs) = self.shared().fabric.as_ref() {
            fs.failed_sessions.fetch_add(1, Ordering::Relaxed);
            fs.abandoned_offers.fetch_add(abandoned, Ordering::Relaxed);
        }
        self.drop_client(registry, t);
    }

    pub(super) fn drop_client(&mut self, registry: &Registry, token: Token) {
        let Some(mut c) = self.clients.remove(&token) else {
            return;
        };
        let _ = registry.deregister(&mut c.stream);
        // Closed first: a client still alive (stalled) sees its session end before any
        // pinned memory below is let go, and does not trust a value it pulls after that.
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        // The bootstrap connection (and the session it became) held a `-c` slot.
        self.shared()
            .curr_connections
            .fetch_sub(1, Ordering::SeqCst);
        // Requests still waiting are dropped unanswered (the client is gone, or is told
        // by the lifeline closing); their rendezvous descriptors go back to UCX.
        c.waiting.clear();
        if let Some(session) = c.session.take() {
            if let Some(fs) = self.shared().fabric.as_ref() {
                fs.release(session.assigned());
                fs.session_bytes
                    .fetch_sub(session.bytes(), Ordering::Relaxed);
            }
            let Session {
                id,
                tier,
                ep,
                moving,
                ..
            } = session;
            self.by_session.remove(&id);
            self.ended_since_trim += 1;
            // After a crowd has gone, the tables shrink with it (their capacity is memory
            // held per session at the peak).
            if self.clients.capacity() > 64 && self.clients.len() * 4 < self.clients.capacity() {
                self.clients.shrink_to_fit();
                self.by_session.shrink_to_fit();
            }
            if let Some(m) = moving {
                let (t, e) = *m;
                self.tiers[t].close(e, true);
            }
            let receiving = self.receiving.values().filter(|r| r.session == id).count();
            let sending = self.sending.values().filter(|r| r.session == id).count();
            if let Some(fs) = self.shared().fabric.as_ref() {
                fs.curr_sessions.fetch_sub(1, Ordering::Relaxed);
                // Without peer-failure handling UCX can neither cancel nor fail a receive
                // from a gone peer: it is orphaned (counted until UCX completes it).
                if receiving > 0 && !ep.peer_errors() {
                    fs.orphaned_receives
                        .fetch_add(receiving as u64, Ordering::Relaxed);
                }
                fs.receives_cancelled
                    .fetch_add(receiving as u64, Ordering::Relaxed);
                fs.sends_cancelled
                    .fetch_add(sending as u64, Ordering::Relaxed);
            }
            // The peer is gone (or given up on): a forced close completes every transfer
            // in flight to it with an error, which frees pending items and unpins items.
            // Without peer-failure handling UCX completes none of them; sends then let go
            // of their items' pins here (UCX keeps reading, if ever, from mapped memory).
            self.tiers[tier].close(ep, true);
            let gone: Vec<mf::Token> = self
                .sending
                .iter()
                .filter(|(_, x)| x.session == id)
                .map(|(t, _)| *t)
                .collect();
            for t in gone {
                if let Some(x) = self.sending.remove(&t) {
                    if let Some(d) = x.pin.as_ref() {
                        d.detach();
                    }
                    self.unpinned(&x);
                }
            }
            tracing::debug!(
                "ucx session {id} closed ({receiving} receives, {sending} sends in flight)"
            );
            self.arm_timer();
        }
    }
}

/// The endpoint of a live session. A free function over the two maps, so that callers
/// can hold it while they use the UCX worker (another field of `FabricWorker`).
pub(super) fn session_ep<'a>(
    by_session: &HashMap<u32, Token>,
    clients: &'a HashMap<Token, Client>,
    session: u32,
) -> Option<(usize, &'a mf::Endpoint)> {
    let t = by_session.get(&session)?;
    clients.get(t)?.session.as_ref().map(|s| (s.tier, &s.ep))
}

/// Lets go of a request from a session whose endpoint failed: rendezvous data is
/// abandoned (`mf::RndvData::abandon`), anything else is dropped as usual. Returns the
/// offers abandoned (0 or 1).
pub(super) fn abandon(msg: mf::AmMessage) -> u64 {
    match msg.data {
        mf::AmData::Rndv(d) => {
            d.abandon();
            1
        }
        _ => 0,
    }
}

/// A challenge's nonce, from the kernel's random source.
fn random_nonce() -> Option<[u8; fp::NONCE_LEN]> {
    let mut nonce = [0u8; fp::NONCE_LEN];
    let mut f = std::fs::File::open("/dev/urandom").ok()?;
    f.read_exact(&mut nonce).ok()?;
    Some(nonce)
}
