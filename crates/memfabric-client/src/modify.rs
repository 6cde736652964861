//! `append` and `prepend` in a pool that codes values. Sent as they are, they would reach
//! the key's first servers, which hold fragments of a coded value: each one appended to
//! would be damaged (its checksum fails), and with more than m of them (a 4+2 pool keeps
//! small values on 3 servers, so an append reaches 3) the value was lost; with fewer, the
//! append was acknowledged and then read past, as if it had not happened.
//!
//! So the pool reads the key first (as any read: late binding, failover, repair). A miss
//! is `NotStored`, as memcached answers. A plain value gets the operation as a replicated
//! pool sends it (the leader, then the others). A coded value is rebuilt, joined with the
//! data, and written whole (a `set`: coded again when it is at or above the threshold)
//! with its flags and the expiry time it has left, asked of a server holding one of its
//! fragments. That write is not atomic with the read: a write by another client between
//! the two is overwritten, as concurrent increments of replicated counters can race
//! (docs/resilience.md).
//!
//! The caller's handle stays the same through the steps; each step is an ordinary request
//! or task, linked to the caller's handle by [`Client::modifies`].

use bytes::{Bytes, BytesMut};

use crate::client::{Client, Done, Handle};
use crate::op::{Op, Reply, StoreMode, StoreStatus, Ttl, Value};
use crate::replicate::exptime_in;
use crate::tasks::{Kind, Modify, ModifyStep, Task};

impl Client {
    /// Whether `op` is an append or prepend to make as a read and then a write: in a pool
    /// that codes values, where the key may hold fragments.
    pub(crate) fn modifies_by_reading(&self, op: &Op) -> bool {
        self.ec_code.is_some()
            && matches!(
                op,
                Op::Store {
                    mode: StoreMode::Append | StoreMode::Prepend,
                    ..
                }
            )
    }

    /// Starts `op` (an append or prepend) under a new handle: the read comes first.
    pub(crate) fn submit_modify(&mut self, op: Op) -> Handle {
        let user = self.new_handle();
        let key = op.key().unwrap_or_default().to_vec();
        let read = self.submit_resilient(Op::Get { key, cas: false });
        self.modify_then(
            read,
            Modify {
                user: user.0,
                op,
                step: ModifyStep::Read { coded_at: None },
            },
        );
        user
    }

    /// Links request `inner` to the modification `m`: its result is `m`'s next step. It
    /// may have finished already (failed at once).
    fn modify_then(&mut self, inner: Handle, m: Modify) {
        if let Some(done) = self.finished.remove(&inner.0) {
            self.modify_step(m, done);
            return;
        }
        self.modify_users.insert(m.user, inner.0);
        self.modifies.insert(inner.0, m);
    }

    /// The write `inner` is modification `user`'s last step: its outcome is the caller's.
    fn modify_outcome(&mut self, user: u64, inner: Handle) {
        let m = Modify {
            user,
            op: Op::Noop,
            step: ModifyStep::Write,
        };
        self.modify_then(inner, m);
    }

    /// A read task of a modification delivers: note where its value's fragments are, if
    /// it was coded (a server to ask for the expiry time).
    pub(crate) fn note_coded_source(&mut self, id: u64, t: &Task) {
        let Some(m) = self.modifies.get_mut(&id) else {
            return;
        };
        let Kind::Read { ec: Some(read), .. } = &t.kind else {
            return;
        };
        let Some((write, _)) = &read.decoded else {
            return;
        };
        let at = read
            .frags
            .iter()
            .find(|f| f.1.write() == *write)
            .and_then(|f| read.servers.get(f.0).copied());
        if let ModifyStep::Read { coded_at } = &mut m.step {
            *coded_at = at;
        }
    }

    /// Where a finished request or task goes: to the caller, or to the modification
    /// whose step it was.
    pub(crate) fn finish(&mut self, id: u64, done: Done) {
        match self.modifies.remove(&id) {
            Some(m) => {
                self.modify_users.remove(&m.user);
                self.modify_step(m, done);
            }
            None => {
                self.finished.insert(id, done);
            }
        }
    }

    /// The next step of `m`, whose last step finished with `done`.
    fn modify_step(&mut self, m: Modify, done: Done) {
        let Modify { user, op, step } = m;
        let Op::Store {
            mode, key, value, ..
        } = &op
        else {
            return self.finish(user, done);
        };
        let (mode, key, data) = (*mode, key.clone(), value.clone());
        let not_stored = |done: &Done| Done {
            result: Ok(Reply::Stored(StoreStatus::NotStored)),
            acks: done.acks,
        };
        match (step, &done.result) {
            (ModifyStep::Read { .. }, Ok(Reply::Value(None))) => {
                self.finish(user, not_stored(&done));
            }
            (ModifyStep::Read { coded_at: None }, Ok(Reply::Value(Some(_)))) => {
                // A plain value: the operation itself, leader first.
                let inner = self.submit_task(op);
                self.modify_outcome(user, inner);
            }
            (ModifyStep::Read { coded_at: Some(s) }, Ok(Reply::Value(Some(v)))) => {
                let v = v.clone();
                let inner = self.issue(s, Op::Ttl { key }, None);
                self.modify_then(
                    inner,
                    Modify {
                        user,
                        op,
                        step: ModifyStep::Ttl { value: v },
                    },
                );
            }
            (ModifyStep::Ttl { value }, Ok(Reply::Ttl(left))) => {
                let exptime = match left {
                    Some(Ttl::Never) => 0,
                    Some(Ttl::Seconds(n)) if *n > 0 => exptime_in(*n),
                    // Gone (or going) since it was read.
                    _ => return self.finish(user, not_stored(&done)),
                };
                let set = Op::Store {
                    mode: StoreMode::Set,
                    key,
                    value: joined(mode, &value, &data),
                    flags: value.flags,
                    exptime,
                    cas: 0,
                };
                let inner = self.submit_resilient(set);
                self.modify_outcome(user, inner);
            }
            // The write's outcome, or a failure before anything was written.
            _ => self.finish(user, done),
        }
    }

    /// The caller stopped waiting for modification `user`: its current step is abandoned
    /// and no later one is made. `None` when `user` is not one.
    pub(crate) fn abandon_modify(&mut self, user: u64) -> Option<u64> {
        let inner = self.modify_users.remove(&user)?;
        self.modifies.remove(&inner);
        Some(inner)
    }
}

/// The value an append (`data` after `value`) or prepend (before) leaves.
fn joined(mode: StoreMode, value: &Value, data: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(value.data.len() + data.len());
    if mode == StoreMode::Prepend {
        out.extend_from_slice(data);
        out.extend_from_slice(&value.data);
    } else {
        out.extend_from_slice(&value.data);
        out.extend_from_slice(data);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_append_goes_after_and_a_prepend_before() {
        let v = Value {
            data: Bytes::from_static(b"middle"),
            flags: 7,
            cas: 0,
        };
        let d = Bytes::from_static(b"++");
        assert_eq!(&joined(StoreMode::Append, &v, &d)[..], b"middle++");
        assert_eq!(&joined(StoreMode::Prepend, &v, &d)[..], b"++middle");
    }
}
