//! The UCX front end's requests: decoding, per-session flow control (deferral under the
//! in-flight cap), and running each request through the command layer.
use super::*;

impl FabricWorker {
    /// Pending request `ticket` is ready: run it again (it completes now) and answer it.
    pub fn complete(
        &mut self,
        stats: &ThreadStats,
        ticket: u64,
        done: Option<crate::pending::Completion>,
    ) {
        let Some(h) = self.held.remove(&ticket) else {
            return;
        };
        if !self.by_session.contains_key(&h.session) {
            // Its client is gone.
            return;
        }
        let shared = Arc::clone(&self.fs);
        let mut ctx = ExecCtx {
            shared: &shared.0,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(h.session),
            waiter: None,
            completion: done.as_ref(),
        };
        let req = Request {
            opcode: h.opcode,
            flags: h.flags,
            session: h.session,
            opaque: h.opaque,
            item_flags: 0,
            exptime: h.exptime,
            cas: 0,
            value_len: 0,
            key: &h.key,
        };
        let noreply = req.flags & fp::FLAG_NOREPLY != 0;
        self.execute(&mut ctx, &req, noreply);
    }

    pub(super) fn request(
        &mut self,
        registry: &Registry,
        stats: &ThreadStats,
        tier: usize,
        msg: mf::AmMessage,
        replayed: bool,
    ) {
        let shared = Arc::clone(&self.fs);
        let shared = &shared.0;
        let Some(ids) = fp::request_ids(&msg.header) else {
            stats.protocol_errors.incr();
            return;
        };
        let known = self.by_session.contains_key(&ids.session);
        // Request rates matter only to the tier policy (one tier: nothing to count).
        if known && !replayed && self.tiers.len() > 1 {
            self.note_request(ids.session, tier);
        }
        if !known && self.failed_sessions.contains(&ids.session) {
            let n = super::session::abandon(msg);
            if let Some(fs) = shared.fabric.as_ref() {
                fs.abandoned_offers.fetch_add(n, Ordering::Relaxed);
            }
            return;
        }
        if known && !replayed {
            let cap = shared.settings.ucx_session_inflight_max;
            let wait = self
                .by_session
                .get(&ids.session)
                .and_then(|t| self.clients.get(t))
                .is_some_and(|c| {
                    let (op, rndv) = waiting_shape(&msg);
                    !c.waiting.is_empty()
                        || must_wait(c.inflight, cap, op, rndv)
                        || behind_a_receive(c, &msg)
                });
            if wait {
                self.defer(registry, ids.session, tier, msg);
                return;
            }
        }
        let req = match fp::decode_request(&msg.header) {
            Ok(r) if known => r,
            other => {
                stats.protocol_errors.incr();
                let status = match other {
                    Ok(_) => Status::UnknownSession,
                    Err(fp::DecodeError::UnknownOpcode(_)) => Status::UnknownCommand,
                    Err(_) => Status::Invalid,
                };
                let op = Opcode::from_u8(ids.opcode).unwrap_or(Opcode::Noop);
                let r = Response::status_only(op, ids.opaque, status);
                if known {
                    self.respond(ids.session, r, None);
                } else if msg.has_reply_ep() {
                    let _ = self.tiers[tier].reply(&msg, fp::AM_RESPONSE, r.encode(), SEND_TOKEN);
                }
                return;
            }
        };
        let session = req.session;
        let (data_len, data) = match msg.data {
            mf::AmData::None => (0, None),
            mf::AmData::Eager(v) => (v.len(), Some(Ok(v))),
            // The server registers copying handlers; a held buffer is copied here.
            mf::AmData::Held(h) => (h.as_ref().len(), Some(Ok(h.as_ref().to_vec()))),
            mf::AmData::Rndv(d) => (d.len(), Some(Err(d))),
        };
        let noreply = req.flags & fp::FLAG_NOREPLY != 0;
        let keyed = !matches!(
            req.opcode,
            Opcode::FlushAll | Opcode::Stats | Opcode::Version | Opcode::Noop
        );
        if keyed && req.key.is_empty() {
            stats.protocol_errors.incr();
            self.respond_status(session, req.opcode, req.opaque, Status::Invalid);
            return;
        }
        let carries_value = matches!(
            req.opcode,
            Opcode::Set
                | Opcode::Add
                | Opcode::Replace
                | Opcode::Append
                | Opcode::Prepend
                | Opcode::Cas
        );
        if req.value_len != data_len as u64 || (!carries_value && data_len != 0) {
            stats.protocol_errors.incr();
            self.respond_status(session, req.opcode, req.opaque, Status::Invalid);
            return;
        }
        // A session may have as many requests waiting as a connection may; past that
        // they complete at once.
        let held = self.held.values().filter(|h| h.session == session).count();
        let inbox = self.inbox.clone();
        let waiter = inbox
            .as_ref()
            .filter(|_| held < crate::exec::MAX_PARKED)
            .map(|inbox| Waiter {
                inbox,
                target: Target::Ucx,
            });
        let mut ctx = ExecCtx {
            shared,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(session),
            waiter,
            completion: None,
        };
        if carries_value {
            match data {
                None => self.store_value(&mut ctx, &req, &[], noreply),
                Some(Ok(v)) => self.store_value(&mut ctx, &req, &v, noreply),
                Some(Err(d)) => self.receive_value(&mut ctx, tier, &req, d, noreply),
            }
            return;
        }
        self.execute(&mut ctx, &req, noreply);
    }

    /// Park a request of `session` until its transfers in flight fall under the cap; a
    /// session that piles up more than the cap in waiting requests is closed.
    pub(super) fn defer(
        &mut self,
        registry: &Registry,
        session: u32,
        tier: usize,
        msg: mf::AmMessage,
    ) {
        let cap = self.shared().settings.ucx_session_inflight_max;
        let Some(&t) = self.by_session.get(&session) else {
            return;
        };
        let Some(c) = self.clients.get_mut(&t) else {
            return;
        };
        c.waiting_bytes += waiting_size(&msg);
        c.waiting.push_back((tier, msg));
        let over = c.waiting_bytes > cap.max(1 << 20) || c.waiting.len() > WAITING_MAX;
        if let Some(fs) = self.fs.0.fabric.as_ref() {
            fs.requests_deferred.fetch_add(1, Ordering::Relaxed);
            if over {
                fs.sessions_overflowed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if over {
            tracing::info!(
                "ucx session {session}: more requests waiting than --ucx-session-inflight-max \
                 allows; closing the session"
            );
            self.drop_client(registry, t);
        }
    }

    /// Access hints from a one-sided reader: the items it read, marked as used so that
    /// eviction does not take what is hot only remotely. Advisory and unanswered; a
    /// malformed batch or one from an unknown session is dropped and counted.
    pub(super) fn hints(&mut self, stats: &ThreadStats, msg: mf::AmMessage) {
        let data: &[u8] = match &msg.data {
            mf::AmData::None => &[],
            mf::AmData::Eager(v) => v,
            mf::AmData::Held(h) => h.as_ref(),
            // Hints are small and always eager; a rendezvous one is not worth pulling.
            mf::AmData::Rndv(_) => {
                stats.protocol_errors.incr();
                return;
            }
        };
        let Some((session, hints)) = memfabric_proto::onesided::decode_hints(&msg.header, data)
        else {
            stats.protocol_errors.incr();
            return;
        };
        if !self.by_session.contains_key(&session) {
            stats.protocol_errors.incr();
            return;
        }
        let hints: Vec<(u64, u32)> = hints.collect();
        let taken = self.fs.0.store.note_remote_accesses(&hints) as u64;
        if let Some(fs) = self.fs.0.fabric.as_ref() {
            fs.hints_taken.fetch_add(taken, Ordering::Relaxed);
            fs.hints_stale
                .fetch_add(hints.len() as u64 - taken, Ordering::Relaxed);
        }
    }

    /// Store a value that is already here.
    pub(super) fn store_value(
        &mut self,
        ctx: &mut ExecCtx<'_>,
        req: &Request<'_>,
        value: &[u8],
        noreply: bool,
    ) {
        let exptime = ctx.shared.store.clock().exptime(i64::from(req.exptime));
        let args = store_args(req, exptime);
        let (status, kept) = command::store_keeping_newer(ctx, &args, value);
        self.answer_store(req.session, req.opcode, req.opaque, status, kept, noreply);
    }

    /// A value arriving by rendezvous: allocate the item and receive into it (append and
    /// prepend, which build a new value from the old one, receive into a buffer).
    pub(super) fn receive_value(
        &mut self,
        ctx: &mut ExecCtx<'_>,
        tier: usize,
        req: &Request<'_>,
        d: mf::RndvData,
        noreply: bool,
    ) {
        let store = &ctx.shared.store;
        let exptime = store.clock().exptime(i64::from(req.exptime));
        let args = store_args(req, exptime);
        let len = d.len();
        let target: Box<dyn mf::RecvBuf> = if matches!(req.opcode, Opcode::Append | Opcode::Prepend)
        {
            if len > store.config().item_size_max {
                drop(d);
                command::refuse_too_large(ctx, &args);
                let status = StoreStatus::TooLarge;
                self.answer_store(req.session, req.opcode, req.opaque, status, 0, noreply);
                return;
            }
            Box::new(vec![0u8; len])
        } else {
            match command::alloc_pending(ctx, &args, len) {
                Ok(p) => Box::new(ItemTarget(p)),
                Err(status) => {
                    drop(d); // tells the sender to give up the transfer
                    self.answer_store(req.session, req.opcode, req.opaque, status, 0, noreply);
                    return;
                }
            }
        };
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let r = Receiving {
            session: req.session,
            bytes: len as u64,
            started: Instant::now(),
            opcode: req.opcode,
            opaque: req.opaque,
            noreply,
            keep_newer_write: req.flags & fp::FLAG_KEEP_NEWER_WRITE != 0,
            cas: req.cas,
            flags: req.item_flags,
            exptime,
            key: req.key.to_vec(),
        };
        // Received through the worker the offer came to.
        match self.tiers[tier].recv_rndv(d, target, token) {
            Ok(mf::Posted::Pending) => {
                if let Some(fs) = ctx.shared.fabric.as_ref() {
                    fs.receives.fetch_add(1, Ordering::Relaxed);
                    fs.receiving_bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                if let Some(c) = self
                    .by_session
                    .get(&req.session)
                    .and_then(|t| self.clients.get_mut(t))
                {
                    c.inflight += len as u64;
                    *c.receiving_keys.entry(req.key.into()).or_insert(0) += 1;
                }
                self.receiving.insert(token, r);
                self.arm_timer();
            }
            Ok(mf::Posted::Done(buf)) => self.received(ctx.stats, r, Ok(()), buf),
            Err(e) => self.received(ctx.stats, r, Err(e), None),
        }
    }

    /// A rendezvous receive of `session` for `key` is over: requests behind it may run.
    pub(super) fn receive_ended(&mut self, session: u32, key: &[u8]) {
        let Some(c) = self
            .by_session
            .get(&session)
            .and_then(|t| self.clients.get_mut(t))
        else {
            return;
        };
        if let Some(n) = c.receiving_keys.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                c.receiving_keys.remove(key);
            }
        }
    }

    /// A rendezvous receive finished: link the item (or give up on it).
    pub(super) fn received(
        &mut self,
        stats: &ThreadStats,
        r: Receiving,
        result: mf::Result<()>,
        buf: Option<Box<dyn std::any::Any>>,
    ) {
        let shared = Arc::clone(&self.fs);
        let ctx = ExecCtx {
            shared: &shared.0,
            stats,
            transport: Transport::Ucx,
            conn_id: u64::from(r.session),
            waiter: None,
            completion: None,
        };
        tracing::trace!("ucx receive for session {} done: {result:?}", r.session);
        if !self.by_session.contains_key(&r.session) {
            // Completed after its session ended: no longer orphaned if it was counted.
            if let Some(fs) = shared.0.fabric.as_ref() {
                let _ =
                    fs.orphaned_receives
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            }
        }
        if let Err(e) = result {
            // The item (inside buf) is dropped unlinked: nothing half-written is visible.
            drop(buf);
            tracing::debug!("ucx receive for session {} failed: {e}", r.session);
            self.respond_status(r.session, r.opcode, r.opaque, Status::Failed);
            return;
        }
        let args = StoreArgs {
            keep_newer_write: r.keep_newer_write,
            ..store_args_of(r.opcode, &r.key, r.flags, r.exptime, r.cas)
        };
        let (status, kept) = match buf {
            Some(b) => match b.downcast::<ItemTarget>() {
                Ok(item) => command::store_pending_keeping_newer(&ctx, &args, item.0),
                Err(b) => match b.downcast::<Vec<u8>>() {
                    Ok(v) => command::store_keeping_newer(&ctx, &args, &v),
                    Err(_) => (StoreStatus::NotStored, 0),
                },
            },
            None => (StoreStatus::NotStored, 0),
        };
        self.answer_store(r.session, r.opcode, r.opaque, status, kept, r.noreply);
    }

    /// Everything but storage.
    pub(super) fn execute(&mut self, ctx: &mut ExecCtx<'_>, req: &Request<'_>, noreply: bool) {
        let shared = ctx.shared;
        let store = &shared.store;
        let (session, op, opaque) = (req.session, req.opcode, req.opaque);
        let ok = Response::status_only(op, opaque, Status::Ok);
        match op {
            Opcode::Get | Opcode::Gat => {
                let eager_max = shared.fabric.as_ref().map_or(usize::MAX, |f| f.eager_max);
                let how = if op == Opcode::Gat {
                    Retrieval::Touch(store.clock().exptime(i64::from(req.exptime)))
                } else {
                    Retrieval::Get
                };
                // Small values are copied out lock-free; larger eager ones are sent in place
                // from item memory under the bucket lock (one copy fewer); larger still by
                // rendezvous from the pinned item.
                let delivery = Delivery {
                    copy_limit: eager_max.min(IN_PLACE_MIN - 1),
                    pin_large: false,
                    bump: true,
                };
                // The value lands in a buffer reused across requests; it is copied into an
                // owned one only if UCX cannot send it at once.
                let mut value = std::mem::take(&mut self.scratch);
                value.clear();
                let found = command::get(ctx, req.key, how, delivery, &mut value, |_, _| {});
                let (info, copied) = match found {
                    Lookup::Hit(info, v) => (info, matches!(v, command::Value::Copied)),
                    Lookup::Miss => {
                        self.scratch = value;
                        self.respond_status(session, op, opaque, Status::NotFound);
                        return;
                    }
                    Lookup::Pending(ticket) => {
                        self.scratch = value;
                        let held = HeldRequest {
                            opcode: op,
                            flags: req.flags,
                            session,
                            opaque,
                            exptime: req.exptime,
                            key: req.key.to_vec(),
                        };
                        self.held.insert(ticket.0, held);
                        return;
                    }
                };
                let mut r = Response {
                    opcode: op,
                    status: Status::Ok,
                    item_flags: info.flags,
                    opaque,
                    cas: info.cas,
                    value: u64::from(info.value_len),
                };
                let len = info.value_len as usize;
                // A value read from flash is in `value` whatever its size: it is not in
                // item memory, so it is sent from there.
                if len <= delivery.copy_limit || (copied && len <= eager_max) {
                    self.respond_value(session, r, &value);
                    self.scratch = value;
                    return;
                }
                if copied {
                    self.send_rndv(session, r, Box::new(value), len as u64, None);
                    return;
                }
                self.scratch = value;
                if len <= eager_max {
                    self.respond_in_place(store, session, r, req.key);
                    return;
                }
                // Large: send from the item itself, pinned until the send completes.
                let quiet = GetOptions {
                    touch: None,
                    bump: false,
                    ..GetOptions::default()
                };
                match store.get_pinned(req.key, &quiet) {
                    Some((info, pin)) => {
                        r.item_flags = info.flags;
                        r.cas = info.cas;
                        r.value = u64::from(info.value_len);
                        let len = r.value;
                        // Sent from item memory; the shared state keeps the store alive.
                        let (data, detach) =
                            mf::Detachable::from_pinned_item(pin, Arc::clone(&self.fs));
                        self.send_rndv(session, r, Box::new(data), len, Some(detach));
                    }
                    // Deleted between the two looks: a miss is a correct answer.
                    None => self.respond_status(session, op, opaque, Status::NotFound),
                }
            }
            Opcode::Delete => {
                let st = match command::delete(ctx, req.key, req.cas) {
                    DeleteStatus::Deleted => Status::Ok,
                    DeleteStatus::NotFound => Status::NotFound,
                    DeleteStatus::Exists => Status::Exists,
                };
                if !(noreply && st == Status::Ok) {
                    self.respond_status(session, op, opaque, st);
                }
            }
            Opcode::Incr | Opcode::Decr => {
                let a = Arith {
                    incr: op == Opcode::Incr,
                    delta: req.cas,
                    cas: 0,
                    create: None,
                };
                let r = match command::arith(ctx, req.key, a).status {
                    ArithStatus::Value { value, cas } => Response { cas, value, ..ok },
                    ArithStatus::NotFound => Response::status_only(op, opaque, Status::NotFound),
                    ArithStatus::NonNumeric => {
                        Response::status_only(op, opaque, Status::NonNumeric)
                    }
                    ArithStatus::Exists => Response::status_only(op, opaque, Status::Exists),
                    ArithStatus::OutOfMemory => Response::status_only(op, opaque, Status::NoMemory),
                };
                if !(noreply && r.status == Status::Ok) {
                    self.respond(session, r, None);
                }
            }
            Opcode::Touch => {
                let exptime = store.clock().exptime(i64::from(req.exptime));
                let st = match command::touch(ctx, req.key, exptime) {
                    Some(_) => Status::Ok,
                    None => Status::NotFound,
                };
                if !(noreply && st == Status::Ok) {
                    self.respond_status(session, op, opaque, st);
                }
            }
            Opcode::Ttl => match command::ttl(ctx, req.key) {
                Some(left) => {
                    let value = left.map_or(fp::TTL_NEVER, u64::from);
                    self.respond(session, Response { value, ..ok }, None);
                }
                None => self.respond_status(session, op, opaque, Status::NotFound),
            },
            Opcode::FlushAll => match command::flush_all(ctx, req.exptime, false) {
                Ok(()) => {
                    if !noreply {
                        self.respond(session, ok, None);
                    }
                }
                Err(command::FlushDisabled) => {
                    self.respond_status(session, op, opaque, Status::Invalid)
                }
            },
            Opcode::Stats => {
                let group = String::from_utf8_lossy(req.key).into_owned();
                let pairs = command::stats::collect(ctx, &group);
                match pairs {
                    Some(pairs) => {
                        let mut text = Vec::new();
                        for (k, v) in pairs {
                            text.extend_from_slice(k.as_bytes());
                            text.push(b' ');
                            text.extend_from_slice(v.as_bytes());
                            text.push(b'\n');
                        }
                        let r = Response {
                            value: text.len() as u64,
                            ..ok
                        };
                        self.send_text(session, r, text);
                    }
                    None => self.respond_status(session, op, opaque, Status::NotFound),
                }
            }
            Opcode::Version => {
                let text = command::version().as_bytes().to_vec();
                let r = Response {
                    value: text.len() as u64,
                    ..ok
                };
                self.send_text(session, r, text);
            }
            Opcode::Noop => self.respond(session, ok, None),
            Opcode::Set
            | Opcode::Add
            | Opcode::Replace
            | Opcode::Append
            | Opcode::Prepend
            | Opcode::Cas => {
                unreachable!("storage requests are handled by store_value/receive_value")
            }
        }
    }
}

/// Most requests one session may have waiting (besides the byte cap).
const WAITING_MAX: usize = 65536;
/// A waiting request's opcode and, for a value coming by rendezvous, its length.
pub(super) fn waiting_shape(msg: &mf::AmMessage) -> (Option<Opcode>, Option<usize>) {
    let op = fp::request_ids(&msg.header).and_then(|ids| Opcode::from_u8(ids.opcode).ok());
    let rndv = match &msg.data {
        mf::AmData::Rndv(d) => Some(d.len()),
        _ => None,
    };
    (op, rndv)
}
/// What a waiting request costs to keep: its header and any eager data.
pub(super) fn waiting_size(msg: &mf::AmMessage) -> u64 {
    let data = match &msg.data {
        mf::AmData::Eager(v) => v.len(),
        mf::AmData::Held(h) => h.as_ref().len(),
        mf::AmData::None | mf::AmData::Rndv(_) => 0,
    };
    (msg.header.len() + data + 64) as u64
}
/// Whether a request must wait for a value its session sent before it to arrive: one on
/// the same key (a delete behind a set must not run first), or a `flush_all` behind any.
/// memcached runs a connection's requests in order; a rendezvous value is stored only
/// when its last byte has come, after the requests sent behind it have arrived.
pub(super) fn behind_a_receive(c: &Client, msg: &mf::AmMessage) -> bool {
    if c.receiving_keys.is_empty() {
        return false;
    }
    match fp::decode_request(&msg.header) {
        Ok(req) => match req.opcode {
            Opcode::FlushAll => true,
            Opcode::Stats | Opcode::Version | Opcode::Noop => false,
            _ => c.receiving_keys.contains_key(req.key),
        },
        // Answered as malformed, in its turn.
        Err(_) => false,
    }
}
/// Whether a request must wait for the session's rendezvous bytes in flight to fall: a
/// GET while they are at the cap (its reply may be large), a value by rendezvous that
/// would take them past it. With nothing in flight everything goes (one transfer larger
/// than the cap must still be possible).
pub(super) fn must_wait(inflight: u64, cap: u64, op: Option<Opcode>, rndv: Option<usize>) -> bool {
    if inflight == 0 {
        return false;
    }
    if let Some(n) = rndv {
        return inflight.saturating_add(n as u64) > cap;
    }
    matches!(op, Some(Opcode::Get | Opcode::Gat)) && inflight >= cap
}
fn set_mode(op: Opcode) -> SetMode {
    match op {
        Opcode::Add => SetMode::Add,
        Opcode::Replace => SetMode::Replace,
        Opcode::Append => SetMode::Append,
        Opcode::Prepend => SetMode::Prepend,
        Opcode::Cas => SetMode::Cas,
        _ => SetMode::Set,
    }
}
/// A storage request's arguments (`exptime` absolute), with its flags.
fn store_args<'k>(req: &Request<'k>, exptime: u32) -> StoreArgs<'k> {
    StoreArgs {
        keep_newer_write: req.flags & fp::FLAG_KEEP_NEWER_WRITE != 0,
        ..store_args_of(req.opcode, req.key, req.item_flags, exptime, req.cas)
    }
}

/// A storage request's arguments (`exptime` absolute). As in the binary protocol, set,
/// add and replace with a CAS are compare-and-swap.
fn store_args_of(op: Opcode, key: &[u8], flags: u32, exptime: u32, cas: u64) -> StoreArgs<'_> {
    StoreArgs {
        mode: set_mode(op),
        key,
        flags,
        exptime,
        cas,
        counts_as_cas: op == Opcode::Cas
            || (cas != 0 && matches!(op, Opcode::Set | Opcode::Add | Opcode::Replace)),
        accounting: StoreAccounting::Text,
        keep_newer_write: false,
    }
}
