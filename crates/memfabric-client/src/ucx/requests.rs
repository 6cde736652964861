//! Two-sided requests over active messages: encoding an operation into a request header
//! (and its value, eager or by rendezvous), tracking it by its opaque id until its
//! response, and turning responses (and UCX completions) into the client's replies.
use bytes::Bytes;
use memfabric_proto::ucx_wire::{self as fp, Opcode, Status};
use memfabric_ucx as mf;

use super::connect::lifeline_open;
use super::{BytesBuf, InFlight, UcxTransport, RMA_TOKEN, SEND_TOKEN};
use crate::error::Error;
use crate::op::{Op, Reply, StoreMode, StoreStatus, Ttl, Value};
use crate::transport::{Completion, ConnId};

impl UcxTransport {
    /// Send `op` as an active message (the two-sided path of every operation).
    pub(super) fn send_am(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error> {
        let Some(c) = self.conns.get(&conn) else {
            return Err(Error::Closed);
        };
        let want_cas = !matches!(op, Op::Get { cas: false, .. });
        let flags = match op {
            Op::Store {
                mode: StoreMode::SetFragment,
                ..
            } => fp::FLAG_KEEP_NEWER_WRITE,
            _ => 0,
        };
        let (opcode, item_flags, exptime, cas, key, value) = request_of(op);
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        let value_len = value.as_ref().map_or(0, |v| v.len());
        let header = fp::Request {
            opcode,
            flags,
            session: c.session,
            opaque,
            item_flags,
            exptime,
            cas,
            value_len: value_len as u64,
            key: &key,
        }
        .to_vec();
        let how = mf::SendHow {
            proto: if value_len > c.eager_max {
                mf::Proto::Rndv
            } else {
                mf::Proto::Eager
            },
            reply: true,
        };
        let Some(ep) = c.ep.as_ref() else {
            return Err(Error::Closed);
        };
        // Fast path for eager requests: sent inside the call, nothing to keep alive.
        let sent_now = if how.proto == mf::Proto::Eager {
            let v = value.as_deref().unwrap_or(&[]);
            self.w.am_send_now(ep, fp::AM_REQUEST, &header, v, true)
        } else {
            Ok(false)
        };
        let sent = match sent_now {
            Ok(true) => Ok(()),
            Ok(false) => {
                let data = value
                    .filter(|v| !v.is_empty())
                    .map(|v| Box::new(BytesBuf(v)) as Box<dyn mf::SendBuf>);
                self.w
                    .am_send(ep, fp::AM_REQUEST, header, data, how, SEND_TOKEN)
                    .map(|_| ())
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok(()) => {
                let f = InFlight {
                    conn,
                    id,
                    opcode,
                    want_cas,
                };
                self.inflight.insert(opaque, f);
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.am_inflight += 1;
                }
                Ok(())
            }
            Err(e) => Err(Error::Io {
                server: c.server.clone(),
                msg: format!("UCX send: {e}"),
            }),
        }
    }

    pub(super) fn handle(&mut self, e: mf::Event, done: &mut Vec<Completion>) {
        match e {
            mf::Event::Am(msg) if msg.id == fp::AM_MOVE => self.on_move(msg, done),
            mf::Event::Am(msg) if msg.id == fp::AM_READY => self.on_ready(msg, done),
            mf::Event::Am(msg) if msg.id != fp::AM_RESPONSE => {}
            mf::Event::Am(msg) => {
                let Ok(r) = fp::decode_response(&msg.header) else {
                    return; // not ours to answer; the request will time out
                };
                if !self.inflight.contains_key(&r.opaque) {
                    return;
                }
                match msg.data {
                    mf::AmData::None => self.finish(r, Bytes::new(), done),
                    mf::AmData::Eager(v) => self.finish(r, Bytes::from(v), done),
                    mf::AmData::Held(h) => self.finish(r, Bytes::from_owner(h), done),
                    mf::AmData::Rndv(d) => {
                        let len = d.len();
                        match self.w.recv_rndv(d, Box::new(vec![0u8; len]), r.opaque) {
                            Ok(mf::Posted::Pending) => {
                                self.receiving.insert(r.opaque, r);
                            }
                            Ok(mf::Posted::Done(buf)) => {
                                let v = buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b);
                                self.finish_pulled(r, v.unwrap_or_default(), done);
                            }
                            Err(e) => self.fail_request(r.opaque, e, done),
                        }
                    }
                }
            }
            mf::Event::Done { token, result, buf } => {
                if token == SEND_TOKEN {
                    return;
                }
                if token & RMA_TOKEN != 0 {
                    let data = match result {
                        Ok(()) => buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b),
                        Err(_) => None,
                    };
                    self.onesided_read_done(
                        (token & !RMA_TOKEN) >> 2,
                        (token & 3) as u8,
                        data,
                        done,
                    );
                    return;
                }
                let Some(r) = self.receiving.remove(&token) else {
                    return;
                };
                match result {
                    Ok(()) => {
                        let v = buf.and_then(|b| b.downcast::<Vec<u8>>().ok()).map(|b| *b);
                        self.finish_pulled(r, v.unwrap_or_default(), done);
                    }
                    Err(e) => self.fail_request(token, e, done),
                }
            }
            mf::Event::EpFailed { ep, error } => {
                let dead = self.conns.iter().find_map(|(&id, c)| {
                    let moving = c.moving.as_ref().map(|m| m.ep.id());
                    (c.ep.as_ref().map(|e| e.id()) == Some(ep) || moving == Some(ep)).then_some(id)
                });
                if let Some(id) = dead {
                    self.fail_conn(id, &format!("UCX endpoint failed: {error}"), done);
                    self.failed_conns.push(id);
                }
            }
            mf::Event::ConnRequest(_) => {}
        }
    }

    /// A value pulled by rendezvous from the server's memory. The server lets go of that
    /// memory when it ends a session it gave up on (a stalled client), after closing the
    /// lifeline; a value pulled after that may be torn, so it counts only while the
    /// lifeline is still open.
    fn finish_pulled(&mut self, r: fp::Response, v: Vec<u8>, done: &mut Vec<Completion>) {
        let open = self
            .inflight
            .get(&r.opaque)
            .and_then(|f| self.conns.get(&f.conn))
            .is_some_and(|c| lifeline_open(&c.lifeline));
        if open {
            self.finish(r, Bytes::from(v), done);
            return;
        }
        let msg = "server ended the session during the transfer".to_string();
        self.fail_inflight(r.opaque, msg, done);
    }

    /// Remove a request from the in-flight table (and its connection's count).
    pub(super) fn take_inflight(&mut self, opaque: u64) -> Option<InFlight> {
        let f = self.inflight.remove(&opaque)?;
        if let Some(c) = self.conns.get_mut(&f.conn) {
            c.am_inflight = c.am_inflight.saturating_sub(1);
        }
        Some(f)
    }

    fn fail_request(&mut self, opaque: u64, e: mf::Error, done: &mut Vec<Completion>) {
        self.fail_inflight(opaque, format!("UCX transfer failed: {e}"), done);
    }

    /// Complete an in-flight request with an I/O error naming its server.
    pub(super) fn fail_inflight(&mut self, opaque: u64, msg: String, done: &mut Vec<Completion>) {
        if let Some(f) = self.take_inflight(opaque) {
            let server = self
                .conns
                .get(&f.conn)
                .map(|c| c.server.clone())
                .unwrap_or_default();
            done.push(Completion {
                id: f.id,
                result: Err(Error::Io { server, msg }),
            });
        }
    }

    fn finish(&mut self, r: fp::Response, data: Bytes, done: &mut Vec<Completion>) {
        let Some(f) = self.take_inflight(r.opaque) else {
            return;
        };
        let mut r = r;
        if !f.want_cas {
            r.cas = 0;
        }
        done.push(Completion {
            id: f.id,
            result: reply_of(f.opcode, &r, data),
        });
    }
}

/// Turn a response into the client's reply.
fn reply_of(op: Opcode, r: &fp::Response, data: Bytes) -> Result<Reply, Error> {
    use Status as S;
    match (r.status, op) {
        (S::TooLarge, _) => return Err(Error::TooLarge),
        (S::NoMemory, _) => return Err(Error::Server("out of memory storing object".into())),
        (S::Invalid, _) => return Err(Error::Client("bad command line format".into())),
        (S::UnknownCommand, _) => return Err(Error::Client("ERROR".into())),
        (S::UnknownSession, _) => {
            return Err(Error::Protocol("server does not know this session".into()))
        }
        (S::Failed, _) => return Err(Error::Server("value transfer failed".into())),
        (S::NonNumeric, _) => {
            return Err(Error::Client(
                "cannot increment or decrement non-numeric value".into(),
            ))
        }
        _ => {}
    }
    Ok(match op {
        Opcode::Get | Opcode::Gat => match r.status {
            S::Ok => Reply::Value(Some(Value {
                data,
                flags: r.item_flags,
                cas: r.cas,
            })),
            _ => Reply::Value(None),
        },
        Opcode::Set
        | Opcode::Add
        | Opcode::Replace
        | Opcode::Append
        | Opcode::Prepend
        | Opcode::Cas => Reply::Stored(match r.status {
            S::Ok => StoreStatus::Stored { cas: r.cas },
            S::Exists => StoreStatus::Exists,
            S::NotFound => StoreStatus::NotFound,
            // A set that kept a newer write's fragment says which (FLAG_KEEP_NEWER_WRITE).
            S::NotStored if op == Opcode::Set && r.cas != 0 => {
                StoreStatus::Superseded { stripe: r.cas }
            }
            _ => StoreStatus::NotStored,
        }),
        Opcode::Delete => Reply::Deleted(r.status == S::Ok),
        Opcode::Incr | Opcode::Decr => Reply::Counter((r.status == S::Ok).then_some(r.value)),
        Opcode::Touch => Reply::Touched(r.status == S::Ok),
        Opcode::Ttl => Reply::Ttl((r.status == S::Ok).then_some(match r.value {
            fp::TTL_NEVER => Ttl::Never,
            left => Ttl::Seconds(u32::try_from(left).unwrap_or(u32::MAX)),
        })),
        Opcode::FlushAll | Opcode::Noop => Reply::Ok,
        Opcode::Stats => {
            if r.status != S::Ok {
                return Err(Error::Client("ERROR".into()));
            }
            let text = String::from_utf8_lossy(&data);
            Reply::Stats(
                text.lines()
                    .filter_map(|l| l.split_once(' '))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        }
        Opcode::Version => Reply::Version(String::from_utf8_lossy(&data).into_owned()),
    })
}

/// The fabric request for an operation: opcode, flags, exptime, cas/delta, key, value.
fn request_of(op: Op) -> (Opcode, u32, u32, u64, Vec<u8>, Option<Bytes>) {
    match op {
        Op::Get { key, .. } => (Opcode::Get, 0, 0, 0, key, None),
        Op::Gat { key, exptime } => (Opcode::Gat, 0, exptime, 0, key, None),
        Op::Store {
            mode,
            key,
            value,
            flags,
            exptime,
            cas,
        } => {
            let opcode = match mode {
                StoreMode::Set | StoreMode::SetFragment => Opcode::Set,
                StoreMode::Add => Opcode::Add,
                StoreMode::Replace => Opcode::Replace,
                StoreMode::Append => Opcode::Append,
                StoreMode::Prepend => Opcode::Prepend,
                StoreMode::Cas => Opcode::Cas,
            };
            (opcode, flags, exptime, cas, key, Some(value))
        }
        Op::Delete { key } => (Opcode::Delete, 0, 0, 0, key, None),
        Op::Arith { key, delta, incr } => {
            let opcode = if incr { Opcode::Incr } else { Opcode::Decr };
            (opcode, 0, 0, delta, key, None)
        }
        Op::Touch { key, exptime } => (Opcode::Touch, 0, exptime, 0, key, None),
        Op::FlushAll { delay } => (Opcode::FlushAll, 0, delay, 0, Vec::new(), None),
        Op::Stats { group } => (
            Opcode::Stats,
            0,
            0,
            0,
            group.unwrap_or_default().into_bytes(),
            None,
        ),
        Op::Version => (Opcode::Version, 0, 0, 0, Vec::new(), None),
        Op::Noop => (Opcode::Noop, 0, 0, 0, Vec::new(), None),
        Op::Ttl { key } => (Opcode::Ttl, 0, 0, 0, key, None),
    }
}
