//! The UCX front end's replies: encoding responses and sending them eagerly (copied or
//! from item memory) or by rendezvous from a pinned item, and their completions.
use super::*;

impl FabricWorker {
    /// Send a response that carries only a status.
    pub(super) fn respond_status(&mut self, session: u32, op: Opcode, opaque: u64, status: Status) {
        self.respond(session, Response::status_only(op, opaque, status), None);
    }

    /// Send a response (with optional data) to a session.
    pub(super) fn respond(
        &mut self,
        session: u32,
        r: Response,
        data: Option<Box<dyn mf::SendBuf>>,
    ) {
        let Some((tier, ep)) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        let w = &mut self.tiers[tier];
        let header = r.to_bytes();
        // Fast path: most eager responses complete inside the call, with no copies of
        // header or value into owned buffers. (Rendezvous replies go by `send_rndv`.)
        let now = match &data {
            None => w.am_send_now(ep, fp::AM_RESPONSE, &header, &[], false),
            Some(d) => match d.slices().as_slice() {
                [one] => w.am_send_now(ep, fp::AM_RESPONSE, &header, one, false),
                _ => Ok(false),
            },
        };
        match now {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                tracing::debug!("ucx send to session {session} failed: {e}");
                return;
            }
        }
        let how = mf::SendHow {
            proto: mf::Proto::Eager,
            reply: false,
        };
        if let Err(e) = w.am_send(ep, fp::AM_RESPONSE, header.to_vec(), data, how, SEND_TOKEN) {
            tracing::debug!("ucx send to session {session} failed: {e}");
        }
    }

    /// Send an eager response whose value is borrowed: sent at once when UCX can, else
    /// copied into an owned buffer for an asynchronous send.
    pub(super) fn respond_value(&mut self, session: u32, r: Response, value: &[u8]) {
        let Some((tier, ep)) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        match self.tiers[tier].am_send_now(ep, fp::AM_RESPONSE, &r.to_bytes(), value, false) {
            Ok(true) => {}
            Ok(false) => {
                let data =
                    (!value.is_empty()).then(|| Box::new(value.to_vec()) as Box<dyn mf::SendBuf>);
                self.respond(session, r, data);
            }
            Err(e) => tracing::debug!("ucx send to session {session} failed: {e}"),
        }
    }

    /// Send a GET response straight from item memory: UCX copies the value out of the
    /// item while its buckets are locked (so it cannot change under the copy). If UCX
    /// cannot send at once, the value is copied into an owned buffer instead.
    pub(super) fn respond_in_place(
        &mut self,
        store: &memfabric_store::Store,
        session: u32,
        r: Response,
        key: &[u8],
    ) {
        let Some((tier, ep)) = session_ep(&self.by_session, &self.clients, session) else {
            return;
        };
        let w = &mut self.tiers[tier];
        let outcome = store.with_locked_value(key, |info, slices| {
            let r = Response {
                item_flags: info.flags,
                cas: info.cas,
                value: u64::from(info.value_len),
                ..r
            };
            if let [one] = slices {
                if let Ok(true) = w.am_send_now(ep, fp::AM_RESPONSE, &r.to_bytes(), one, false) {
                    return None;
                }
            }
            Some((r, slices.concat()))
        });
        match outcome {
            Some(None) => {}
            Some(Some((r, v))) => self.respond(session, r, Some(Box::new(v))),
            // Deleted between the two looks: a miss is a correct answer.
            None => {
                let miss = Response::status_only(r.opcode, r.opaque, Status::NotFound);
                self.respond(session, miss, None);
            }
        }
    }

    /// Send a text payload (stats, version), by rendezvous when it is large.
    pub(super) fn send_text(&mut self, session: u32, r: Response, text: Vec<u8>) {
        let eager_max = self
            .shared()
            .fabric
            .as_ref()
            .map_or(usize::MAX, |f| f.eager_max);
        if text.len() > eager_max {
            let len = text.len() as u64;
            self.send_rndv(session, r, Box::new(text), len, None);
            return;
        }
        let data = (!text.is_empty()).then(|| Box::new(text) as Box<dyn mf::SendBuf>);
        self.respond(session, r, data);
    }

    /// Send a response whose data goes by rendezvous, tracked until it completes: its
    /// bytes count toward the session's bytes in flight, a pinned item toward the pins,
    /// and the transfer deadline applies.
    pub(super) fn send_rndv(
        &mut self,
        session: u32,
        r: Response,
        data: Box<dyn mf::SendBuf>,
        bytes: u64,
        pin: Option<mf::Detach>,
    ) {
        let Some(&t) = self.by_session.get(&session) else {
            return;
        };
        let Some(s) = self.clients.get(&t).and_then(|c| c.session.as_ref()) else {
            return;
        };
        let (tier, ep) = (s.tier, &s.ep);
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1).max(1);
        let how = mf::SendHow {
            proto: mf::Proto::Rndv,
            reply: false,
        };
        match self.tiers[tier].am_send(
            ep,
            fp::AM_RESPONSE,
            r.to_bytes().to_vec(),
            Some(data),
            how,
            token,
        ) {
            Ok(mf::Posted::Pending) => {
                let pinned = pin.is_some();
                self.sending.insert(
                    token,
                    Sending {
                        session,
                        bytes,
                        started: Instant::now(),
                        pin,
                    },
                );
                if let Some(c) = self.clients.get_mut(&t) {
                    c.inflight += bytes;
                }
                if let Some(fs) = self.fs.0.fabric.as_ref() {
                    if pinned {
                        fs.pins.fetch_add(1, Ordering::Relaxed);
                        fs.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
                    }
                }
                self.arm_timer();
            }
            Ok(mf::Posted::Done(_)) => {}
            Err(e) => tracing::debug!("ucx send to session {session} failed: {e}"),
        }
    }

    /// A rendezvous transfer of `session` finished: serve what waited for it.
    pub(super) fn transfer_done(
        &mut self,
        registry: &Registry,
        stats: &ThreadStats,
        session: u32,
        bytes: u64,
    ) {
        let cap = self.shared().settings.ucx_session_inflight_max;
        if let Some(c) = self
            .by_session
            .get(&session)
            .and_then(|t| self.clients.get_mut(t))
        {
            c.inflight = c.inflight.saturating_sub(bytes);
        }
        while let Some(c) = self
            .by_session
            .get(&session)
            .and_then(|t| self.clients.get_mut(t))
        {
            let Some(front) = c.waiting.front() else {
                break;
            };
            let (op, rndv) = waiting_shape(&front.1);
            if must_wait(c.inflight, cap, op, rndv) || behind_a_receive(c, &front.1) {
                break;
            }
            let Some((tier, msg)) = c.waiting.pop_front() else {
                break;
            };
            c.waiting_bytes = c.waiting_bytes.saturating_sub(waiting_size(&msg));
            self.request(registry, stats, tier, msg, true);
        }
        self.arm_timer();
    }

    /// Answer a storage outcome (counted by the command), as the binary protocol does.
    /// `kept_stripe`: the stripe of a newer write a `FLAG_KEEP_NEWER_WRITE` set found and
    /// kept (0: none), sent in the NOT_STORED answer's CAS field.
    pub(super) fn answer_store(
        &mut self,
        session: u32,
        op: Opcode,
        opaque: u64,
        status: StoreStatus,
        kept_stripe: u64,
        noreply: bool,
    ) {
        if status == StoreStatus::NotStored && kept_stripe != 0 {
            let mut r = Response::status_only(op, opaque, Status::NotStored);
            r.cas = kept_stripe;
            self.respond(session, r, None);
            return;
        }
        let st = match status {
            StoreStatus::Stored { cas } => {
                if noreply {
                    return;
                }
                let mut r = Response::status_only(op, opaque, Status::Ok);
                r.cas = cas;
                self.respond(session, r, None);
                return;
            }
            StoreStatus::Exists => Status::Exists,
            StoreStatus::NotFound => Status::NotFound,
            StoreStatus::NotStored => Status::NotStored,
            StoreStatus::TooLarge => Status::TooLarge,
            StoreStatus::OutOfMemory => Status::NoMemory,
        };
        self.respond_status(session, op, opaque, st);
    }
}
