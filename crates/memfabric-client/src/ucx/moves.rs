//! Moves: a server serving its clients on two transport tiers asks a session to go to its
//! other UCX worker (docs/scaling.md, docs/fabric-protocol.md 1.6). We open an endpoint
//! there at once; requests submitted from then on wait (in order) until every request
//! sent on the old endpoint is answered; then the old endpoint closes, we say we arrived
//! on the new one, and the waiting requests go out there. So no request fails, is
//! answered twice, or overtakes one sent before it. A server we cannot reach on the
//! other worker (no transport in common) is told so, and we stay.
use std::time::{Duration, Instant};

use memfabric_proto::ucx_wire as fp;
use memfabric_ucx as mf;

use super::{Moving, UcxTransport, SEND_TOKEN};
use crate::transport::{Completion, ConnId, Transport};

/// How long a move waits for the READY of the server's endpoint on the new worker.
const READY_WAIT: Duration = Duration::from_secs(1);
/// READYs kept that came before their move (each names its session and worker).
const READIES_KEPT: usize = 16;

/// How long the one-sided set-up on the new endpoint may take (one RMA read).
const RMA_SETUP: Duration = Duration::from_secs(1);

impl UcxTransport {
    /// The server asks for a move: its AM_MOVE carries a WELCOME frame naming the worker,
    /// our session and the server's instance.
    pub(super) fn on_move(&mut self, msg: mf::AmMessage, done: &mut Vec<Completion>) {
        let frame: &[u8] = match &msg.data {
            mf::AmData::Eager(v) => v,
            mf::AmData::Held(h) => h.as_ref(),
            // The server sends it eagerly; anything else is not a move of ours.
            mf::AmData::None | mf::AmData::Rndv(_) => return,
        };
        let Ok(Some((w, used))) = fp::decode_welcome(frame) else {
            return;
        };
        if used != frame.len() || w.status != fp::WELCOME_OK {
            return;
        }
        let instance = format!("{:08x}{:08x}", w.started_unix as u32, w.instance);
        let Some(conn) = self.conns.iter().find_map(|(&id, c)| {
            (c.session == w.session && c.instance == instance && c.moving.is_none()).then_some(id)
        }) else {
            return;
        };
        if w.ready && !self.take_ready(&fp::Ready::for_welcome(&w)) {
            // The server's endpoint there is still connecting: ours is made once its
            // READY comes (as at connect), or after READY_WAIT without it.
            self.moves_awaiting_ready
                .insert(conn, (w, Instant::now() + READY_WAIT));
            self.moves_pending += 1;
            return;
        }
        self.start_move(conn, w, done);
    }

    /// A READY from a server: the move waiting for it goes ahead; one nobody waits for
    /// yet (it came before its move) is kept for a while.
    pub(super) fn on_ready(&mut self, msg: mf::AmMessage, done: &mut Vec<Completion>) {
        let Ok(r) = fp::decode_ready(&msg.header) else {
            return;
        };
        let waiting = self
            .moves_awaiting_ready
            .iter()
            .find_map(|(&conn, (w, _))| (fp::Ready::for_welcome(w) == r).then_some(conn));
        if let Some(conn) = waiting {
            if let Some((w, _)) = self.moves_awaiting_ready.remove(&conn) {
                self.start_move(conn, w, done);
            }
            return;
        }
        if self.readies_seen.len() >= READIES_KEPT {
            self.readies_seen.pop_front();
        }
        self.readies_seen.push_back(r);
    }

    /// Open our endpoint to the worker a move sends `conn` to (its frame `w`).
    fn start_move(&mut self, conn: ConnId, w: fp::Welcome, done: &mut Vec<Completion>) {
        if self.conns.get(&conn).is_none_or(|c| c.moving.is_some()) {
            return;
        }
        // Same error-handling mode as the server's endpoint to us there.
        self.w.set_peer_errors(w.peer_errors);
        match self.w.connect_address(&w.worker_address) {
            Ok(ep) => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.moving = Some(Moving {
                        ep,
                        welcome: w,
                        queued: Default::default(),
                    });
                    self.moves_pending += 1;
                }
                self.finish_moves(done);
            }
            Err(_) => {
                // No transport in common with that worker: stay.
                self.counters.moves_refused += 1;
                self.answer_move(conn, fp::MoveStep::Refused);
            }
        }
    }

    /// Tell the server about a move: `Refused` on the old endpoint, `Arrived` on the new.
    fn answer_move(&mut self, conn: ConnId, step: fp::MoveStep) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let ep = match step {
            fp::MoveStep::Refused => c.ep.as_ref(),
            fp::MoveStep::Arrived => c.moving.as_ref().map(|m| &m.ep),
        };
        let Some(ep) = ep else {
            return;
        };
        let header = fp::MoveAnswer {
            step,
            session: c.session,
        }
        .encode();
        if let Ok(true) = self
            .w
            .am_send_now(ep, fp::AM_MOVE_ANSWER, &header, &[], false)
        {
            return;
        }
        let how = mf::SendHow {
            proto: mf::Proto::Eager,
            reply: false,
        };
        // A failure here is the endpoint's: its requests fail through the usual path.
        let _ = self
            .w
            .am_send(ep, fp::AM_MOVE_ANSWER, header, None, how, SEND_TOKEN);
    }

    /// Complete the moves whose old endpoint has drained (no request in flight there).
    pub(super) fn finish_moves(&mut self, done: &mut Vec<Completion>) {
        if !self.moves_awaiting_ready.is_empty() {
            let now = Instant::now();
            let late: Vec<ConnId> = self
                .moves_awaiting_ready
                .iter()
                .filter(|(c, (_, until))| now >= *until || !self.conns.contains_key(c))
                .map(|(c, _)| *c)
                .collect();
            for conn in late {
                if let Some((w, _)) = self.moves_awaiting_ready.remove(&conn) {
                    self.start_move(conn, w, done);
                }
            }
        }
        let ready: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(id, c)| {
                c.moving.is_some()
                    && c.am_inflight == 0
                    && !self.onesided.values().any(|g| g.conn == **id)
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in ready {
            self.complete_move(conn, done);
        }
        self.moves_pending = self.conns.values().filter(|c| c.moving.is_some()).count()
            + self.moves_awaiting_ready.len();
    }

    /// Switch `conn` to its new endpoint: arrive there (before anything else is sent on
    /// it), close the old one, set one-sided reads up again for the new worker, and send
    /// the requests that waited.
    fn complete_move(&mut self, conn: ConnId, done: &mut Vec<Completion>) {
        // Access hints gathered through the old endpoint go out on it first.
        self.send_hints(conn);
        self.answer_move(conn, fp::MoveStep::Arrived);
        let Some(mut m) = self.conns.get_mut(&conn).and_then(|c| c.moving.take()) else {
            return;
        };
        let rma = self.setup_rma(&mut m.ep, &m.welcome, RMA_SETUP);
        let Some(c) = self.conns.get_mut(&conn) else {
            self.w.close(m.ep, false);
            return;
        };
        let old = c.ep.replace(m.ep);
        c.rma = rma;
        c.eager_max = m.welcome.eager_max as usize;
        if let Some(old) = old {
            self.w.close(old, false);
        }
        self.counters.moves += 1;
        for (id, op) in m.queued {
            if let Err(e) = self.submit(conn, id, op) {
                done.push(Completion { id, result: Err(e) });
            }
        }
    }
}
