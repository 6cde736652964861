//! memcached's ASCII authentication handshake (`-Y`): until a connection has
//! authenticated, its input is read only as `set <key> <flags> <exptime> <bytes>` whose
//! data is `<user> <password>` (key, flags and expiry ignored). Replies as memcached
//! 1.6's: `STORED` (from then on the connection speaks the ascii and meta protocols),
//! `CLIENT_ERROR authentication failure`, `CLIENT_ERROR bad authentication token format`,
//! `CLIENT_ERROR bad command line termination`, and `CLIENT_ERROR unauthenticated` for
//! any other line (binary packets included: as memcached, an auth-file server reads
//! every connection as text first). Counted in `auth_cmds` / `auth_errors`.
//!
//! Where memfabricd differs, on purpose: memcached, given several of these requests in
//! one read, answers only the last of them (one reply buffer is reused); memfabricd
//! answers each. A payload longer than [`PAYLOAD_MAX`] closes the connection (memcached
//! stalls on one that does not fit its read buffer, or resets the connection).
use memfabric_proto::ascii::tokenize;
use memfabric_proto::number::safe_strtoul;

use super::{ExecCtx, Session, Step};
use crate::outqueue::OutQueue;

/// A line this long without a newline is junk: the connection is closed (memcached's
/// limit).
const LINE_MAX: usize = 1024;
/// The longest `<user> <password>` payload read (memcached's entries are under 256
/// bytes); a longer one closes the connection.
pub const PAYLOAD_MAX: usize = 1024;

/// Where a connection is in the handshake.
#[derive(Default)]
pub struct AuthState {
    /// Authenticated: the handshake is over.
    pub done: bool,
    /// The `set` line was read: this many payload bytes (with `\r\n`) come next.
    payload: Option<usize>,
}

/// Runs one step of the handshake on `input`.
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut OutQueue,
) -> Step {
    let (used, want) = match sess.auth.payload {
        Some(n) => (0, n),
        None => {
            if input.len() < 2 {
                return Step::NeedMore(0);
            }
            let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                if input.len() > LINE_MAX {
                    return Step::Close;
                }
                return Step::NeedMore(0);
            };
            // A `\r` before the newline stays in the last token; the number parser stops
            // at it, as memcached's does.
            let tokens = tokenize(&input[..nl]);
            let size = if tokens.len() >= 5 && tokens.get(0) == b"set" {
                safe_strtoul(tokens.get(4))
            } else {
                None
            };
            let Some(size) = size else {
                reply(out, b"CLIENT_ERROR unauthenticated\r\n");
                return Step::Done(nl + 1);
            };
            let want = size as usize + 2;
            if want > PAYLOAD_MAX + 2 {
                return Step::Close;
            }
            sess.auth.payload = Some(want);
            (nl + 1, want)
        }
    };
    let rest = &input[used..];
    if rest.len() < want {
        return if used > 0 {
            Step::Waiting(used)
        } else {
            Step::NeedMore(want)
        };
    }
    sess.auth.payload = None;
    let payload = &rest[..want];
    if !payload.ends_with(b"\r\n") {
        reply(out, b"CLIENT_ERROR bad command line termination\r\n");
        return Step::Done(used + want);
    }
    // memcached compares C strings: a NUL ends the payload.
    let text = &payload[..want - 2];
    let text = &text[..text.iter().position(|&b| b == 0).unwrap_or(text.len())];
    let creds = tokenize(text);
    if creds.len() < 2 {
        reply(out, b"CLIENT_ERROR bad authentication token format\r\n");
        return Step::Done(used + want);
    }
    let (user, pass) = (creds.get(0), creds.get(1));
    ctx.stats.auth_cmds.incr();
    let ok = ctx
        .shared
        .settings
        .auth
        .as_ref()
        .is_some_and(|a| a.check(user, pass));
    if ok {
        sess.auth.done = true;
        // From here on the connection speaks text (memcached switches to its ascii
        // reader), whatever its first byte was.
        sess.proto = Some(super::Proto::Ascii);
        reply(out, b"STORED\r\n");
    } else {
        ctx.stats.auth_errors.incr();
        reply(out, b"CLIENT_ERROR authentication failure\r\n");
    }
    Step::Done(used + want)
}

fn reply(out: &mut OutQueue, line: &[u8]) {
    out.bytes().extend_from_slice(line);
}
