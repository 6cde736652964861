//! The UCX front end's transport tiers (docs/scaling.md): a hot tier of at most
//! `--hot-clients` sessions on the transports chosen for latency, a cold tier for the rest
//! on those chosen for scale, and the policy that moves sessions between them by how busy
//! they are — with the move as a protocol step (docs/fabric-protocol.md 1.6): the server
//! opens an endpoint on the other tier and tells the client (`AM_MOVE`); the client
//! finishes what it sent on the old endpoint, closes it and says it arrived on the new
//! one before sending anything there, so no request is lost, answered twice or reordered.
use super::*;

/// Policy ticks in a row at or above `--promote-rate` before a cold session is promoted
/// (with `TICK` at 250 ms: half a second of steady traffic).
const BUSY_TICKS_TO_PROMOTE: u8 = 2;
/// After a move starts, the session stays where it goes at least this long (no
/// ping-pong between tiers).
const SETTLE: Duration = Duration::from_secs(1);
/// After a move the client refused or we could not start, no other is tried this long.
const SETTLE_REFUSED: Duration = Duration::from_secs(30);

impl FabricWorker {
    fn session_mut(&mut self, session: u32) -> Option<&mut Session> {
        let t = self.by_session.get(&session)?;
        self.clients.get_mut(t)?.session.as_mut()
    }

    /// End `session`'s move: the session, the tier it was moving to and our endpoint there.
    fn take_move(&mut self, session: u32) -> Option<(&mut Session, usize, mf::Endpoint)> {
        let s = self.session_mut(session)?;
        let (to, ep) = *s.moving.take()?;
        Some((s, to, ep))
    }

    /// A request of `session` came through `tier`: counted for the policy. One that
    /// comes through the tier the session is moving to means the client is there.
    pub(super) fn note_request(&mut self, session: u32, tier: usize) {
        let Some(s) = self.session_mut(session) else {
            return;
        };
        s.requests = s.requests.saturating_add(1);
        if s.moving.as_ref().is_some_and(|m| m.0 == tier) {
            self.arrived(session);
        }
    }

    /// A client's answer to a move: it arrived on the new endpoint, or cannot reach it.
    pub(super) fn move_answer(&mut self, stats: &ThreadStats, tier: usize, msg: mf::AmMessage) {
        let Ok(a) = fp::decode_move_answer(&msg.header) else {
            stats.protocol_errors.incr();
            return;
        };
        let Some(s) = self.session_mut(a.session) else {
            stats.protocol_errors.incr();
            return;
        };
        let to = s.moving.as_ref().map(|m| m.0);
        match a.step {
            fp::MoveStep::Arrived if to == Some(tier) => self.arrived(a.session),
            fp::MoveStep::Refused if to.is_some() && s.tier == tier => self.move_refused(a.session),
            // Not a move this session is making (a replay, or a confused client).
            _ => stats.protocol_errors.incr(),
        }
    }

    /// The client of `session` arrived on its new tier: replies go there from now on, and
    /// the old endpoint (which the client has closed, with every request it sent there
    /// answered) is closed.
    fn arrived(&mut self, session: u32) {
        let Some((s, to, ep)) = self.take_move(session) else {
            return;
        };
        let from = s.tier;
        let old = std::mem::replace(&mut s.ep, ep);
        s.tier = to;
        self.served[to] += 1;
        // Forced: the client has closed its end already, with every request it sent there
        // answered; there is nothing left to flush.
        self.tiers[from].close(old, true);
        if let Some(fs) = self.shared().fabric.as_ref() {
            let moves = if to == HOT {
                &fs.promotions
            } else {
                &fs.demotions
            };
            moves.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            "ucx session {session} moved to the {} tier",
            if to == HOT { "hot" } else { "cold" }
        );
    }

    /// The client of `session` cannot reach the tier it was sent to: it stays.
    fn move_refused(&mut self, session: u32) {
        let Some((s, to, ep)) = self.take_move(session) else {
            return;
        };
        let from = s.tier;
        s.settle_until = Instant::now() + SETTLE_REFUSED;
        self.tiers[to].close(ep, true);
        if let Some(fs) = self.shared().fabric.as_ref() {
            fs.release(to);
            fs.tier_sessions[from].fetch_add(1, Ordering::Relaxed);
            fs.moves_refused.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!("ucx session {session}: the client cannot reach the other tier");
    }

    /// Start moving client `token`'s session to tier `to`, where the caller reserved its
    /// place (given back if the move cannot start). From here the session counts on `to`.
    fn start_move(&mut self, token: Token, to: usize, now: Instant) -> bool {
        let shared = Arc::clone(&self.fs);
        let Some(fs) = shared.0.fabric.as_ref() else {
            return false;
        };
        let Some((id, address)) = self
            .clients
            .get(&token)
            .and_then(|c| c.session.as_ref())
            .map(|s| (s.id, s.address.clone()))
        else {
            fs.release(to);
            return false;
        };
        let refused = |me: &mut Self| {
            fs.release(to);
            fs.moves_refused.fetch_add(1, Ordering::Relaxed);
            if let Some(s) = me.clients.get_mut(&token).and_then(|c| c.session.as_mut()) {
                s.settle_until = now + SETTLE_REFUSED;
            }
        };
        let ep = match self.connect_client(to, &address) {
            Ok(ep) => ep,
            Err(e) => {
                // No transport in common with the client on that tier.
                tracing::debug!("ucx session {id}: no endpoint on the other tier ({e})");
                refused(self);
                return false;
            }
        };
        let frame = match self.welcome_for(to, id) {
            Ok(mut w) => {
                w.peer_errors = ep.peer_errors();
                w.ready = self.send_ready(to, &ep, &w);
                w.encode()
            }
            Err(e) => {
                tracing::debug!("ucx session {id}: cannot describe the other tier ({e})");
                self.tiers[to].close(ep, true);
                refused(self);
                return false;
            }
        };
        let Some(s) = self
            .clients
            .get_mut(&token)
            .and_then(|c| c.session.as_mut())
        else {
            return false;
        };
        let how = mf::SendHow {
            proto: mf::Proto::Eager,
            reply: false,
        };
        let sent = self.tiers[s.tier].am_send(
            &s.ep,
            fp::AM_MOVE,
            Vec::new(),
            Some(Box::new(frame)),
            how,
            SEND_TOKEN,
        );
        if let Err(e) = sent {
            tracing::debug!("ucx session {id}: cannot send the move ({e})");
            self.tiers[to].close(ep, true);
            refused(self);
            return false;
        }
        fs.release(s.tier);
        s.moving = Some(Box::new((to, ep)));
        s.settle_until = now + SETTLE;
        true
    }

    /// Every tick, with two tiers: take each session's request rate since the last tick;
    /// promote cold sessions that stayed at or above `--promote-rate`, making room at the
    /// cap by demoting this worker's least recently busy hot session that is not busy
    /// now; demote hot sessions idle for `--hot-idle` seconds.
    pub(super) fn tier_policy(&mut self, now: Instant) {
        let elapsed = now.duration_since(self.last_policy);
        if elapsed < TICK / 2 {
            return;
        }
        self.last_policy = now;
        let shared = Arc::clone(&self.fs);
        let Some(fs) = shared.0.fabric.as_ref() else {
            return;
        };
        let per_tick = (f64::from(fs.promote_rate) * elapsed.as_secs_f64()).ceil() as u32;
        let idle = Duration::from_secs(u64::from(fs.hot_idle));
        let mut promote = Vec::new();
        let mut demote = Vec::new();
        for (t, c) in self.clients.iter_mut() {
            let Some(s) = c.session.as_mut() else {
                continue;
            };
            if s.requests >= per_tick.max(1) {
                s.busy_ticks = s.busy_ticks.saturating_add(1);
                s.last_busy = now;
            } else {
                s.busy_ticks = 0;
            }
            s.requests = 0;
            if s.moving.is_some() || now < s.settle_until {
                continue;
            }
            if s.tier == COLD && s.busy_ticks >= BUSY_TICKS_TO_PROMOTE {
                promote.push((std::cmp::Reverse(s.busy_ticks), *t));
            } else if s.tier == HOT && !idle.is_zero() && now.duration_since(s.last_busy) >= idle {
                demote.push(*t);
            }
        }
        for t in demote {
            if fs.reserve(COLD) {
                self.start_move(t, COLD, now);
            }
        }
        // Places other workers asked for: ours to give while we have quiet hot sessions
        // (and the tier is full: with a place free, the asker takes it on its next tick).
        if fs.tier_sessions[HOT].load(Ordering::Relaxed) < fs.hot_clients {
            fs.hot_wanted.store(0, Ordering::Relaxed);
        }
        while fs.hot_wanted.load(Ordering::Relaxed) > 0 {
            let Some(victim) = self.quiet_hot_session(now) else {
                break;
            };
            let taken = fs
                .hot_wanted
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if !(taken && fs.reserve(COLD) && self.start_move(victim, COLD, now)) {
                break;
            }
        }
        promote.sort_unstable();
        let mut unserved = 0;
        for (_, t) in promote {
            if !fs.reserve(HOT) {
                // Full: this worker's least recently busy hot session that is quiet now
                // makes room; without one, other workers are asked for a place.
                let made_room = match self.quiet_hot_session(now) {
                    Some(victim) => {
                        fs.reserve(COLD) && self.start_move(victim, COLD, now) && fs.reserve(HOT)
                    }
                    None => false,
                };
                if !made_room {
                    unserved += 1;
                    continue;
                }
            }
            self.start_move(t, HOT, now);
        }
        if unserved > 0 {
            fs.hot_wanted.fetch_max(unserved, Ordering::Relaxed);
        }
    }

    /// This worker's hot session that was busy least recently, among those not busy now,
    /// not moving and not settling: the one to demote when a busier session needs its
    /// place.
    fn quiet_hot_session(&self, now: Instant) -> Option<Token> {
        self.clients
            .iter()
            .filter_map(|(t, c)| {
                let s = c.session.as_ref()?;
                let quiet = s.tier == HOT
                    && s.moving.is_none()
                    && s.busy_ticks == 0
                    && now >= s.settle_until;
                quiet.then_some((s.last_busy, *t))
            })
            .min()
            .map(|(_, t)| t)
    }
}
