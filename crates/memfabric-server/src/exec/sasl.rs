//! SASL on the binary protocol (`-S`), answering as memcached 1.6.18 with Cyrus SASL
//! offering PLAIN does (observed on the wire; `tests/sasl.rs` compares the two):
//!
//! - Until a connection has authenticated, every request but `SASL_LIST_MECHS`,
//!   `SASL_AUTH`, `SASL_STEP` and `VERSION` gets "Auth failure." and the connection is
//!   closed (after the check that key and extras fit the body, before any other).
//! - `SASL_LIST_MECHS` answers `PLAIN`. `SASL_AUTH` with an empty value starts PLAIN and
//!   answers "continue" (status 0x21, no body); with a PLAIN message it answers
//!   "Authenticated" or "Auth failure."; `SASL_STEP` carries the message after a
//!   "continue". The connection stays open after a failure, and may try again.
//! - Every attempt that reaches the check sets the connection's state: authenticated
//!   after "Authenticated", not after anything else (a failed second attempt, or a
//!   "continue", undoes an earlier success).
//! - Cyrus's conversation state shows through, and is kept: after a success, the next
//!   PLAIN message fails (Cyrus "attempting server step after doneflag"); a failed
//!   `SASL_AUTH` clears that, a failed `SASL_STEP` does not; a `SASL_STEP` without a
//!   started conversation fails.
//! - `auth_cmds` counts successes and failures, `auth_errors` failures.
//!
//! Bounds: a mechanism name longer than 32 bytes is "Invalid arguments" and its data
//! discarded; data that memcached could not fit in one item chunk is "Out of memory" and
//! discarded; data longer than [`DATA_MAX`] (no password-file entry is that long) fails
//! without being buffered, discarded as it arrives.
use memfabric_proto::binary::{self as bp, opcode, RequestHeader, Status};
use memfabric_proto::sasl;

use super::{consume, ExecCtx, Session, Step};

/// The longest SASL data buffered: a PLAIN message that could match a password-file
/// entry (memcached's are under 256 bytes) is far shorter.
pub const DATA_MAX: usize = 4096;

/// memcached receives the data into an item; one larger than a slab chunk (its default
/// `slab_chunk_max`, 512 KiB, less the item header and the key) is refused "Out of
/// memory".
const ITEM_CHUNK_MAX: usize = 512 << 10;
const ITEM_OVERHEAD: usize = 48 + 1 + 2 + 8;

/// A connection's SASL state.
#[derive(Default)]
pub struct SaslState {
    /// The last attempt succeeded.
    pub authenticated: bool,
    /// memcached's `sasl_started`: the last `SASL_AUTH` started a conversation.
    started: bool,
    /// Cyrus's done flag: a conversation succeeded and no `SASL_AUTH` has failed since.
    done: bool,
}

/// What one attempt came to.
enum Outcome {
    Authenticated,
    Continue,
    Failed,
}

/// Runs the request at the start of `input` if SASL decides it (a SASL request, or any
/// request before authentication); `None` leaves it to the binary protocol.
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Option<Step> {
    let is_sasl = |op: u8| {
        matches!(
            op,
            opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP
        )
    };
    // An authenticated connection's ordinary request is the binary protocol's alone: not
    // parsed twice on the hot path.
    if sess.sasl.authenticated && input.get(1).is_some_and(|&op| !is_sasl(op)) {
        return None;
    }
    // A bad magic, or key and extras longer than the body: the binary protocol's own
    // replies, before memcached looks at authentication.
    let h = match RequestHeader::parse(input) {
        Ok(Some(h)) => h,
        Ok(None) => return Some(Step::NeedMore(bp::HEADER_LEN)),
        Err(_) => return None,
    };
    if input.len() < h.head_len() {
        return Some(Step::NeedMore(h.head_len()));
    }
    let (kl, el, bl) = (
        usize::from(h.key_len),
        usize::from(h.extras_len),
        h.body_len as usize,
    );
    if kl + el > bl {
        return None;
    }
    if !is_sasl(h.opcode) {
        if sess.sasl.authenticated || h.opcode == opcode::VERSION {
            return None;
        }
        bp::write_error(out, h.opcode, h.opaque, Status::AuthError);
        return Some(Step::Close);
    }
    if kl > memfabric_proto::KEY_MAX_LEN {
        // The binary protocol's "Invalid arguments" and close.
        return None;
    }
    let head_len = h.head_len();
    let invalid = |out: &mut Vec<u8>| {
        bp::write_error(out, h.opcode, h.opaque, Status::InvalidArguments);
        Some(Step::Close)
    };
    if h.opcode == opcode::SASL_LIST_MECHS {
        if kl != 0 || el != 0 || bl != 0 {
            return invalid(out);
        }
        success(out, &h, sasl::MECHANISMS);
        return Some(Step::Done(head_len));
    }
    if el != 0 || kl == 0 {
        return invalid(out);
    }
    let mech = &input[bp::HEADER_LEN..head_len];
    let data_len = bl - kl;
    let total = head_len + data_len;
    if kl > sasl::MECH_MAX_LEN {
        bp::write_error(out, h.opcode, h.opaque, Status::InvalidArguments);
        return Some(consume(sess, input, total as u64));
    }
    if ITEM_OVERHEAD + kl + data_len > ITEM_CHUNK_MAX {
        bp::write_error(out, h.opcode, h.opaque, Status::OutOfMemory);
        return Some(consume(sess, input, total as u64));
    }
    let (data, step) = if data_len > DATA_MAX {
        // Cannot match an entry: fails as a wrong password does, unread.
        (None, consume(sess, input, total as u64))
    } else if input.len() < total {
        return Some(Step::NeedMore(total));
    } else {
        (Some(&input[head_len..total]), Step::Done(total))
    };
    let outcome = if h.opcode == opcode::SASL_AUTH {
        auth(ctx, &mut sess.sasl, mech, data)
    } else {
        step_plain(ctx, &mut sess.sasl, data)
    };
    let st = &mut sess.sasl;
    st.authenticated = matches!(outcome, Outcome::Authenticated);
    match outcome {
        Outcome::Authenticated => {
            st.done = true;
            ctx.stats.auth_cmds.incr();
            success(out, &h, b"Authenticated");
        }
        Outcome::Continue => bp::write_error(out, h.opcode, h.opaque, Status::AuthContinue),
        Outcome::Failed => {
            ctx.stats.auth_cmds.incr();
            ctx.stats.auth_errors.incr();
            bp::write_error(out, h.opcode, h.opaque, Status::AuthError);
        }
    }
    Some(step)
}

/// A success carrying `body`.
fn success(out: &mut Vec<u8>, h: &RequestHeader, body: &[u8]) {
    bp::write_response(out, h.opcode, h.opaque, Status::Success, 0, &[], &[], body);
}

/// `SASL_AUTH`: starts a conversation (Cyrus's `sasl_server_start`), with the first
/// message when there is one. `data` is `None` when it was too long to read.
fn auth(ctx: &ExecCtx<'_>, st: &mut SaslState, mech: &[u8], data: Option<&[u8]>) -> Outcome {
    let outcome = if !sasl::is_plain(mech) {
        Outcome::Failed
    } else if data.is_some_and(<[u8]>::is_empty) {
        Outcome::Continue
    } else if st.done {
        Outcome::Failed
    } else {
        check(ctx, data)
    };
    st.started = !matches!(outcome, Outcome::Failed);
    if matches!(outcome, Outcome::Failed) {
        st.done = false;
    }
    outcome
}

/// `SASL_STEP`: the message of a conversation `SASL_AUTH` started (Cyrus's
/// `sasl_server_step`).
fn step_plain(ctx: &ExecCtx<'_>, st: &mut SaslState, data: Option<&[u8]>) -> Outcome {
    if !st.started || st.done {
        return Outcome::Failed;
    }
    check(ctx, data)
}

/// A PLAIN message against the password file.
fn check(ctx: &ExecCtx<'_>, data: Option<&[u8]>) -> Outcome {
    let Some(plain) = data.and_then(sasl::parse_plain) else {
        return Outcome::Failed;
    };
    match ctx.shared.settings.sasl.as_ref() {
        Some(db) if db.check(plain.user, plain.password) => Outcome::Authenticated,
        _ => Outcome::Failed,
    }
}
