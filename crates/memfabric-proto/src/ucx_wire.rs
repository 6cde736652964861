//! The fabric protocol: the TCP bootstrap frames (HELLO / WELCOME) and the active-message
//! headers that carry memcached operations over UCX. `docs/fabric-protocol.md` is the
//! normative description; this module encodes and decodes it.
//!
//! All integers are little-endian. Decoders never panic and never trust a length field:
//! every malformed or truncated input is a [`DecodeError`].

/// First bytes of both bootstrap frames.
pub const MAGIC: [u8; 4] = *b"MFAB";
/// Protocol version spoken by this build.
pub const VERSION: u16 = 1;

/// AM id of requests (client → server).
pub const AM_REQUEST: u16 = 1;
/// AM id of responses (server → client).
pub const AM_RESPONSE: u16 = 2;
/// AM id of READY (server → client): the first message on an endpoint the server made to
/// the client (at HELLO, or on another worker for a move), with a [`Ready`] header. A
/// WELCOME (or move) with [`Welcome::ready`] set promises it: the client creates its own
/// endpoint only once it has come, so that UCX pairs the client's endpoint with the
/// connection the server already made instead of both ends connecting at once
/// (docs/fabric-protocol.md 1.3). Earlier servers sent this id empty, as a reachability
/// probe; every client registers it, and one that does not know READY ignores it.
pub const AM_READY: u16 = 3;
/// AM id of access hints (client → server, no reply): items the client read with
/// one-sided RMA reads, so that eviction counts them as used (`onesided::decode_hints`).
pub const AM_HINTS: u16 = 4;

/// AM id of a move (server → client): the server wants the session on another of its
/// UCX workers (another transport tier, docs/scaling.md). The header is a WELCOME frame
/// (status OK) naming that worker, with the same session id and server instance.
pub const AM_MOVE: u16 = 5;
/// AM id of the client's answers to a move (client → server, no reply): a
/// [`MoveAnswer`] header, nothing else.
pub const AM_MOVE_ANSWER: u16 = 6;

/// Size of the fixed part of a request header (the key follows).
pub const REQUEST_FIXED: usize = 40;
/// Size of a response header.
pub const RESPONSE_LEN: usize = 32;
/// Largest worker address or rkey accepted in a bootstrap frame.
pub const BLOB_MAX: usize = 64 * 1024;
/// Default eager/rendezvous boundary (value bytes).
pub const DEFAULT_EAGER_MAX: usize = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated")]
    Truncated,
    #[error("bad magic")]
    BadMagic,
    #[error("unknown opcode {0}")]
    UnknownOpcode(u8),
    #[error("unknown status {0}")]
    UnknownStatus(u8),
    #[error("bad key length {0}")]
    BadKeyLength(usize),
    #[error("field too large")]
    TooLarge,
    #[error("trailing bytes")]
    Trailing,
    #[error("a different bootstrap frame")]
    WrongFrame,
}

macro_rules! byte_enum {
    ($(#[$m:meta])* $name:ident, $err:ident { $($(#[$vm:meta])* $v:ident = $n:expr,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name { $($(#[$vm])* $v = $n,)* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            pub fn from_u8(b: u8) -> Result<$name, DecodeError> {
                match b { $($n => Ok($name::$v),)* _ => Err(DecodeError::$err(b)) }
            }
        }
    };
}

byte_enum!(
    /// What a request asks for.
    Opcode, UnknownOpcode {
        /// Value, flags and CAS of a key (get and gets are the same: CAS always comes back).
        Get = 1,
        /// Get and touch: `exptime` is the new expiry.
        Gat = 2,
        Set = 3,
        Add = 4,
        Replace = 5,
        Append = 6,
        Prepend = 7,
        /// Set if the item's CAS still equals `cas`.
        Cas = 8,
        Delete = 9,
        /// `cas` field carries the delta.
        Incr = 10,
        Decr = 11,
        Touch = 12,
        /// `exptime` carries the delay in seconds (0 = now).
        FlushAll = 13,
        /// The key field names the group ("" = general stats).
        Stats = 14,
        Version = 15,
        Noop = 16,
        /// How long the item still lives, its value left where it is: `value` in the
        /// response is the seconds left, or [`TTL_NEVER`] for an item without expiry.
        Ttl = 17,
    }
);

byte_enum!(
    /// Outcome of a request. Values follow the binary protocol's status codes where one
    /// exists.
    Status, UnknownStatus {
        Ok = 0,
        /// Miss / NOT_FOUND.
        NotFound = 1,
        /// CAS mismatch (EXISTS).
        Exists = 2,
        /// Value larger than the item size limit.
        TooLarge = 3,
        /// Malformed request (bad key, bad lengths, value where none belongs).
        Invalid = 4,
        /// add on an existing key, replace/append/prepend on a missing one.
        NotStored = 5,
        /// incr/decr on a value that is not a number.
        NonNumeric = 6,
        /// The request names a session this worker does not know.
        UnknownSession = 0x80,
        UnknownCommand = 0x81,
        /// SERVER_ERROR out of memory.
        NoMemory = 0x82,
        /// The server gave up on the request (the value transfer failed).
        Failed = 0x84,
    }
);

/// A TTL response's `value` for an item that never expires.
pub const TTL_NEVER: u64 = u64::MAX;

/// Request flag: send no response on success (errors are still answered).
pub const FLAG_NOREPLY: u8 = 1;
/// Request flag of a SET whose value is an erasure-coded fragment
/// (`memfabric_proto::ec_fragment`): a server whose item under the key is a fragment of a
/// newer write keeps it and answers NOT_STORED. Servers that do not know the flag ignore
/// it (a plain SET).
pub const FLAG_KEEP_NEWER_WRITE: u8 = 2;

/// A request header. The value, when there is one, travels as the AM's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub opcode: Opcode,
    pub flags: u8,
    pub session: u32,
    pub opaque: u64,
    pub item_flags: u32,
    pub exptime: u32,
    /// The CAS to compare (Cas, and Delete with a CAS), or the delta (Incr/Decr).
    pub cas: u64,
    /// Declared value length; must equal the AM data length.
    pub value_len: u64,
    pub key: &'a [u8],
}

impl Request<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(REQUEST_FIXED + self.key.len());
        out.push(self.opcode as u8);
        out.push(self.flags);
        out.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.opaque.to_le_bytes());
        out.extend_from_slice(&self.item_flags.to_le_bytes());
        out.extend_from_slice(&self.exptime.to_le_bytes());
        out.extend_from_slice(&self.cas.to_le_bytes());
        out.extend_from_slice(&self.value_len.to_le_bytes());
        out.extend_from_slice(self.key);
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REQUEST_FIXED + self.key.len());
        self.encode(&mut v);
        v
    }
}

/// The fixed fields of a request that decode even when the rest is bad, so the server
/// can address its error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestIds {
    pub opcode: u8,
    pub session: u32,
    pub opaque: u64,
}

/// Peek at the routing fields of a request header (None when even those are missing).
pub fn request_ids(b: &[u8]) -> Option<RequestIds> {
    if b.len() < 16 {
        return None;
    }
    Some(RequestIds {
        opcode: b[0],
        session: u32_at(b, 4),
        opaque: u64_at(b, 8),
    })
}

/// Decode a request header; the key must end the header exactly.
pub fn decode_request(b: &[u8]) -> Result<Request<'_>, DecodeError> {
    if b.len() < REQUEST_FIXED {
        return Err(DecodeError::Truncated);
    }
    let opcode = Opcode::from_u8(b[0])?;
    let key_len = u16::from_le_bytes([b[2], b[3]]) as usize;
    if key_len > crate::KEY_MAX_LEN {
        return Err(DecodeError::BadKeyLength(key_len));
    }
    let end = REQUEST_FIXED + key_len;
    if b.len() < end {
        return Err(DecodeError::Truncated);
    }
    if b.len() > end {
        return Err(DecodeError::Trailing);
    }
    Ok(Request {
        opcode,
        flags: b[1],
        session: u32_at(b, 4),
        opaque: u64_at(b, 8),
        item_flags: u32_at(b, 16),
        exptime: u32_at(b, 20),
        cas: u64_at(b, 24),
        value_len: u64_at(b, 32),
        key: &b[REQUEST_FIXED..end],
    })
}

/// A response header. The value (get), stats text or version string is the AM's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub opcode: Opcode,
    pub status: Status,
    pub item_flags: u32,
    pub opaque: u64,
    pub cas: u64,
    /// Value length for Get/Gat; the counter's new value for Incr/Decr.
    pub value: u64,
}

impl Response {
    pub fn encode(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }

    /// The header as a fixed array (no allocation).
    pub fn to_bytes(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[0] = self.opcode as u8;
        b[1] = self.status as u8;
        b[4..8].copy_from_slice(&self.item_flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.opaque.to_le_bytes());
        b[16..24].copy_from_slice(&self.cas.to_le_bytes());
        b[24..32].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// A response with only a status (errors, and successes that carry nothing).
    pub fn status_only(opcode: Opcode, opaque: u64, status: Status) -> Response {
        Response {
            opcode,
            status,
            item_flags: 0,
            opaque,
            cas: 0,
            value: 0,
        }
    }
}

pub fn decode_response(b: &[u8]) -> Result<Response, DecodeError> {
    if b.len() < RESPONSE_LEN {
        return Err(DecodeError::Truncated);
    }
    if b.len() > RESPONSE_LEN {
        return Err(DecodeError::Trailing);
    }
    Ok(Response {
        opcode: Opcode::from_u8(b[0])?,
        status: Status::from_u8(b[1])?,
        item_flags: u32_at(b, 4),
        opaque: u64_at(b, 8),
        cas: u64_at(b, 16),
        value: u64_at(b, 24),
    })
}

/// The client's bootstrap frame: who it is and where its UCX worker listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    /// The UCX library the client runs, as [`ucx_version_code`] packs it; 0 = not said
    /// (clients before it was sent). UCX's own wire format changes between releases (a
    /// 1.13 peer aborts on a 1.22 peer's wireup), so the server refuses a client whose UCX
    /// differs from its own before UCX ever sees the client's address.
    pub ucx_version: u16,
    pub worker_address: Vec<u8>,
}

/// A UCX version (major, minor) as HELLO and a [`WELCOME_UCX_MISMATCH`] refusal carry it:
/// `major << 8 | minor` (releases within one minor version speak the same wire format).
pub fn ucx_version_code(major: u32, minor: u32) -> u16 {
    ((major.min(255) as u16) << 8) | minor.min(255) as u16
}

/// "1.13" for a [`ucx_version_code`].
pub fn ucx_version_text(code: u16) -> String {
    format!("{}.{}", code >> 8, code & 0xff)
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + self.worker_address.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.ucx_version.to_le_bytes());
        put_blob(&mut out, &self.worker_address);
        out
    }
}

/// Decode a HELLO from the start of `b`: `Ok(None)` when more bytes are needed,
/// otherwise the frame and its length.
pub fn decode_hello(b: &[u8]) -> Result<Option<(Hello, usize)>, DecodeError> {
    decode_frame(b, |r| {
        r.take(4)?;
        let version = r.u16()?;
        let ucx_version = r.u16()?;
        let worker_address = r.blob()?;
        Ok(Hello {
            version,
            ucx_version,
            worker_address,
        })
    })
}

/// A bootstrap frame at the start of `b`, read by `body` from its first byte (magic
/// included): `Ok(None)` while it is incomplete, else the frame and its length. Bytes
/// that cannot start a frame (wrong magic) are refused as soon as four have come.
fn decode_frame<T>(
    b: &[u8],
    body: impl FnOnce(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<Option<(T, usize)>, DecodeError> {
    if b.len() >= 4 && b[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let mut r = Reader { b, at: 0 };
    let res = body(&mut r);
    need_more(res, r.at)
}

/// The server's bootstrap answer. With `status` Ok, everything a client needs to talk to
/// the worker that took it, and (for one-sided reads) the registered memory's keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// 0 = accepted; 1 = unsupported version; 2 = refused (no UCX worker available).
    pub status: u8,
    /// The server's endpoint to the client uses UCX peer-failure handling; the client's
    /// endpoint must use the same mode (UCX pairs endpoints of one mode only).
    pub peer_errors: bool,
    /// The server sends [`AM_READY`] on its endpoint to the client: wait for it before
    /// creating the client's endpoint (flags bit 1).
    pub ready: bool,
    pub session: u32,
    /// Values up to this many bytes travel eagerly; larger ones by rendezvous.
    pub eager_max: u32,
    pub item_size_max: u64,
    /// The server's clock (memcached "current time": seconds since it started) and the
    /// unix time it started at.
    pub clock: u32,
    /// With `started_unix`, names this run of the server: a restarted server (empty) has a
    /// new pair. The same as `stats fabric`'s `instance_id`, `{started_unix:08x}{instance:08x}`.
    pub instance: u32,
    pub started_unix: u64,
    pub arena_base: u64,
    pub arena_len: u64,
    pub index_base: u64,
    pub index_len: u64,
    pub worker_address: Vec<u8>,
    pub arena_rkey: Vec<u8>,
    pub index_rkey: Vec<u8>,
}

pub const WELCOME_OK: u8 = 0;
pub const WELCOME_BAD_VERSION: u8 = 1;
pub const WELCOME_REFUSED: u8 = 2;
/// Not a WELCOME but a [`Challenge`]: the server has credentials (`-Y`) and wants a
/// [`Proof`] before it hands the HELLO's worker address to UCX.
pub const WELCOME_CHALLENGE: u8 = 3;
/// The proof did not match any credential: the server closes the connection.
pub const WELCOME_AUTH_FAILED: u8 = 4;
/// The server already serves as many UCX sessions as it takes (`--max-clients`): the
/// client may try again later or another server.
pub const WELCOME_FULL: u8 = 5;
/// The client's UCX (its HELLO's `ucx_version`) is not the server's: UCX peers of
/// different releases cannot be trusted to understand each other's wireup (an older one
/// aborts the process). The refusal's `session` field carries the server's
/// [`ucx_version_code`].
pub const WELCOME_UCX_MISMATCH: u8 = 6;

/// Bytes of a challenge's nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof's MAC (HMAC-SHA-256).
pub const MAC_LEN: usize = 32;
/// Longest user name a proof carries.
pub const USER_MAX: usize = 255;
/// What a proof's MAC covers besides the nonce and the worker address.
const PROOF_CONTEXT: &[u8] = b"memfabric ucx bootstrap proof v1\0";

/// The server's answer to a HELLO when it has credentials: a fresh random nonce, so that
/// a recorded proof is worth nothing on another connection. Laid out as a WELCOME's first
/// 8 bytes (status [`WELCOME_CHALLENGE`]), then the nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub version: u16,
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + NONCE_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&[WELCOME_CHALLENGE, 0]);
        out.extend_from_slice(&self.nonce);
        out
    }
}

/// The status byte of the server frame at the start of `b` (a WELCOME or a challenge),
/// once 8 bytes have come.
pub fn server_frame_status(b: &[u8]) -> Option<u8> {
    b.get(6).copied().filter(|_| b.len() >= 8)
}

/// Decode a challenge from the start of `b` (`Ok(None)`: need more bytes).
pub fn decode_challenge(b: &[u8]) -> Result<Option<(Challenge, usize)>, DecodeError> {
    decode_frame(b, |r| {
        r.take(4)?;
        let version = r.u16()?;
        let sf = r.take(2)?;
        if sf[0] != WELCOME_CHALLENGE {
            return Err(DecodeError::WrongFrame);
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(r.take(NONCE_LEN)?);
        Ok(Challenge { version, nonce })
    })
}

/// The client's answer to a challenge: who it is, and the MAC of the challenge and its
/// HELLO's worker address keyed with its password ([`proof_mac`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    pub user: Vec<u8>,
    pub mac: [u8; MAC_LEN],
}

impl Proof {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + self.user.len() + MAC_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        put_blob(&mut out, &self.user);
        out.extend_from_slice(&self.mac);
        out
    }
}

/// Decode a proof from the start of `b` (`Ok(None)`: need more bytes).
pub fn decode_proof(b: &[u8]) -> Result<Option<(Proof, usize)>, DecodeError> {
    decode_frame(b, |r| {
        r.take(8)?;
        let n = r.u32()? as usize;
        if n > USER_MAX {
            return Err(DecodeError::TooLarge);
        }
        let user = r.take(n)?.to_vec();
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(r.take(MAC_LEN)?);
        Ok(Proof { user, mac })
    })
}

/// HMAC-SHA-256 keyed with `password` over a fixed context, the challenge's nonce and the
/// HELLO's worker address: proves the password without sending it, for this connection
/// only, and binds the address (a peer in the middle cannot swap in its own).
pub fn proof_mac(password: &[u8], nonce: &[u8; NONCE_LEN], worker_address: &[u8]) -> [u8; MAC_LEN] {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length.
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(password) else {
        return [0; MAC_LEN];
    };
    mac.update(PROOF_CONTEXT);
    mac.update(nonce);
    mac.update(&(worker_address.len() as u64).to_le_bytes());
    mac.update(worker_address);
    mac.finalize().into_bytes().into()
}

/// Whether `got` is `want`, looking at every byte ([`crate::same_secret`]).
pub fn macs_equal(got: &[u8; MAC_LEN], want: &[u8; MAC_LEN]) -> bool {
    crate::same_secret(got, want)
}

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.worker_address.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.push(self.status);
        out.push(u8::from(self.peer_errors) | u8::from(self.ready) << 1);
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.eager_max.to_le_bytes());
        out.extend_from_slice(&self.item_size_max.to_le_bytes());
        out.extend_from_slice(&self.clock.to_le_bytes());
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.started_unix.to_le_bytes());
        out.extend_from_slice(&self.arena_base.to_le_bytes());
        out.extend_from_slice(&self.arena_len.to_le_bytes());
        out.extend_from_slice(&self.index_base.to_le_bytes());
        out.extend_from_slice(&self.index_len.to_le_bytes());
        put_blob(&mut out, &self.worker_address);
        put_blob(&mut out, &self.arena_rkey);
        put_blob(&mut out, &self.index_rkey);
        out
    }
}

/// Decode a WELCOME from the start of `b` (`Ok(None)`: need more bytes).
pub fn decode_welcome(b: &[u8]) -> Result<Option<(Welcome, usize)>, DecodeError> {
    decode_frame(b, |r| {
        r.take(4)?;
        let version = r.u16()?;
        let sf = r.take(2)?;
        let (status, peer_errors, ready) = (sf[0], sf[1] & 1 != 0, sf[1] & 2 != 0);
        let session = r.u32()?;
        let eager_max = r.u32()?;
        let item_size_max = r.u64()?;
        let clock = r.u32()?;
        let instance = r.u32()?;
        Ok(Welcome {
            version,
            status,
            peer_errors,
            ready,
            session,
            eager_max,
            item_size_max,
            clock,
            instance,
            started_unix: r.u64()?,
            arena_base: r.u64()?,
            arena_len: r.u64()?,
            index_base: r.u64()?,
            index_len: r.u64()?,
            worker_address: r.blob()?,
            arena_rkey: r.blob()?,
            index_rkey: r.blob()?,
        })
    })
}

fn need_more<T>(res: Result<T, DecodeError>, at: usize) -> Result<Option<(T, usize)>, DecodeError> {
    match res {
        Ok(v) => Ok(Some((v, at))),
        Err(DecodeError::Truncated) => Ok(None),
        Err(e) => Err(e),
    }
}

fn put_blob(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::TooLarge)?;
        let s = self.b.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32_at(self.take(4)?, 0))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64_at(self.take(8)?, 0))
    }
    fn blob(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        if n > BLOB_MAX {
            return Err(DecodeError::TooLarge);
        }
        Ok(self.take(n)?.to_vec())
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_roundtrip_and_exact_length() {
        let r = Request {
            opcode: Opcode::Cas,
            flags: FLAG_NOREPLY,
            session: 7,
            opaque: u64::MAX - 3,
            item_flags: 0xdead_beef,
            exptime: 30,
            cas: 99,
            value_len: 1 << 33,
            key: b"some:key",
        };
        let b = r.to_vec();
        assert_eq!(b.len(), REQUEST_FIXED + 8);
        assert_eq!(decode_request(&b).unwrap(), r);
        assert_eq!(
            decode_request(&b[..b.len() - 1]),
            Err(DecodeError::Truncated)
        );
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_request(&long), Err(DecodeError::Trailing));
        let ids = request_ids(&b).unwrap();
        assert_eq!((ids.session, ids.opaque), (7, u64::MAX - 3));
    }

    #[test]
    fn request_rejects_bad_opcode_and_key_length() {
        let mut b = Request {
            opcode: Opcode::Get,
            flags: 0,
            session: 1,
            opaque: 1,
            item_flags: 0,
            exptime: 0,
            cas: 0,
            value_len: 0,
            key: b"k",
        }
        .to_vec();
        b[0] = 200;
        assert_eq!(decode_request(&b), Err(DecodeError::UnknownOpcode(200)));
        b[0] = Opcode::Get as u8;
        b[2..4].copy_from_slice(&251u16.to_le_bytes());
        assert_eq!(decode_request(&b), Err(DecodeError::BadKeyLength(251)));
    }

    #[test]
    fn response_roundtrip() {
        for &status in Status::ALL {
            let r = Response {
                opcode: Opcode::Incr,
                status,
                item_flags: 3,
                opaque: 12,
                cas: 5,
                value: 77,
            };
            assert_eq!(decode_response(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn bootstrap_frames_roundtrip_and_report_short_input() {
        let h = Hello {
            version: VERSION,
            ucx_version: ucx_version_code(1, 13),
            worker_address: vec![1, 2, 3, 4, 5],
        };
        let b = h.encode();
        // Where the UCX version sits (docs/fabric-protocol.md 1.1): offset 6, little endian.
        assert_eq!(&b[6..8], &[13, 1]);
        assert_eq!(ucx_version_text(h.ucx_version), "1.13");
        for cut in 0..b.len() {
            assert_eq!(decode_hello(&b[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(decode_hello(&b).unwrap(), Some((h, b.len())));
        let w = Welcome {
            version: VERSION,
            status: WELCOME_OK,
            peer_errors: true,
            ready: true,
            session: 9,
            eager_max: 8192,
            item_size_max: 1 << 20,
            clock: 5,
            instance: 0xdead_beef,
            started_unix: 1_700_000_000,
            arena_base: 0x7f00_0000_0000,
            arena_len: 64 << 20,
            index_base: 0x7e00_0000_0000,
            index_len: 1 << 20,
            worker_address: vec![9; 300],
            arena_rkey: vec![1; 40],
            index_rkey: vec![2; 41],
        };
        let b = w.encode();
        for cut in 0..b.len() {
            assert_eq!(decode_welcome(&b[..cut]).unwrap(), None, "cut {cut}");
        }
        assert_eq!(decode_welcome(&b).unwrap(), Some((w, b.len())));
        assert_eq!(decode_hello(b"XXXX\x01\x00"), Err(DecodeError::BadMagic));
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[1, 0, 0, 0]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_hello(&huge), Err(DecodeError::TooLarge));
    }

    proptest! {
        #[test]
        fn proofs_and_challenges_round_trip(
            user in proptest::collection::vec(any::<u8>(), 0..=USER_MAX),
            nonce in any::<[u8; NONCE_LEN]>(),
            address in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let c = Challenge { version: VERSION, nonce };
            let bytes = c.encode();
            prop_assert_eq!(server_frame_status(&bytes), Some(WELCOME_CHALLENGE));
            prop_assert_eq!(decode_challenge(&bytes).unwrap(), Some((c, bytes.len())));
            prop_assert_eq!(decode_challenge(&bytes[..bytes.len() - 1]).unwrap(), None);
            let p = Proof { user, mac: proof_mac(b"pw", &nonce, &address) };
            let bytes = p.encode();
            prop_assert_eq!(decode_proof(&bytes).unwrap(), Some((p.clone(), bytes.len())));
            prop_assert_eq!(decode_proof(&bytes[..bytes.len() - 1]).unwrap(), None);
            // The MAC depends on the password, the nonce and the address.
            prop_assert!(macs_equal(&p.mac, &proof_mac(b"pw", &nonce, &address)));
            prop_assert!(!macs_equal(&p.mac, &proof_mac(b"pW", &nonce, &address)));
            let mut other = nonce;
            other[0] ^= 1;
            prop_assert!(!macs_equal(&p.mac, &proof_mac(b"pw", &other, &address)));
            let mut moved = address.clone();
            moved.push(0);
            prop_assert!(!macs_equal(&p.mac, &proof_mac(b"pw", &nonce, &moved)));
        }

        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_request(&b);
            let _ = decode_response(&b);
            let _ = decode_hello(&b);
            let _ = decode_welcome(&b);
            let _ = decode_challenge(&b);
            let _ = decode_proof(&b);
            let _ = request_ids(&b);
        }
    }
}

/// What a client says about a move (docs/fabric-protocol.md 1.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MoveStep {
    /// Sent on the new endpoint, once every request the client sent on the old one is
    /// answered and before any request on the new one: the client has closed the old
    /// endpoint and uses the new one from now on (so the server may close its old one).
    Arrived = 1,
    /// Sent on the old endpoint: the client cannot reach the worker it was sent to and
    /// stays where it is.
    Refused = 2,
}

/// The header of an [`AM_MOVE_ANSWER`] message: `b"MV"`, the step, a reserved byte, the
/// session id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveAnswer {
    pub step: MoveStep,
    pub session: u32,
}

/// Bytes of a [`MoveAnswer`].
pub const MOVE_ANSWER_LEN: usize = 8;

impl MoveAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MOVE_ANSWER_LEN);
        out.extend_from_slice(b"MV");
        out.push(self.step as u8);
        out.push(0);
        out.extend_from_slice(&self.session.to_le_bytes());
        out
    }
}

/// Check an AM header of a fixed `len` that starts with a two-byte `magic`.
fn fixed_header(b: &[u8], len: usize, magic: &[u8; 2]) -> Result<(), DecodeError> {
    if b.len() < len {
        return Err(DecodeError::Truncated);
    }
    if b.len() > len {
        return Err(DecodeError::Trailing);
    }
    if &b[..2] != magic {
        return Err(DecodeError::BadMagic);
    }
    Ok(())
}

pub fn decode_move_answer(b: &[u8]) -> Result<MoveAnswer, DecodeError> {
    fixed_header(b, MOVE_ANSWER_LEN, b"MV")?;
    let step = match b[2] {
        1 => MoveStep::Arrived,
        2 => MoveStep::Refused,
        _ => return Err(DecodeError::WrongFrame),
    };
    let session = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    Ok(MoveAnswer { step, session })
}

/// The header of an [`AM_READY`] message: `b"RD"`, two reserved bytes, the session id,
/// the server's instance (`instance`, `started_unix`, as in WELCOME) and
/// [`address_tag`] of the server worker's address that the WELCOME (or move) named — so a
/// client tells the READY of each of its connections, and of each move, apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub session: u32,
    pub instance: u32,
    pub started_unix: u64,
    pub address_tag: u32,
}

/// Bytes of a [`Ready`].
pub const READY_LEN: usize = 24;

impl Ready {
    /// The READY that goes with `w` (a WELCOME, or a move's frame).
    pub fn for_welcome(w: &Welcome) -> Ready {
        Ready {
            session: w.session,
            instance: w.instance,
            started_unix: w.started_unix,
            address_tag: address_tag(&w.worker_address),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(READY_LEN);
        out.extend_from_slice(b"RD\0\0");
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.started_unix.to_le_bytes());
        out.extend_from_slice(&self.address_tag.to_le_bytes());
        out
    }
}

pub fn decode_ready(b: &[u8]) -> Result<Ready, DecodeError> {
    fixed_header(b, READY_LEN, b"RD")?;
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut started = [0u8; 8];
    started.copy_from_slice(&b[12..20]);
    Ok(Ready {
        session: u32_at(4),
        instance: u32_at(8),
        started_unix: u64::from_le_bytes(started),
        address_tag: u32_at(20),
    })
}

/// A short tag of a UCX worker address (CRC-32C): which of a server's workers a READY
/// comes from.
pub fn address_tag(worker_address: &[u8]) -> u32 {
    memfabric_checksum::crc32c(worker_address)
}

#[cfg(test)]
mod ready_tests {
    use super::*;

    #[test]
    fn ready_round_trips_and_refuses_junk() {
        let w = Welcome {
            session: 7,
            instance: 0xabcd_0123,
            started_unix: 1_790_000_000,
            worker_address: b"some worker".to_vec(),
            ready: true,
            ..Default::default()
        };
        let r = Ready::for_welcome(&w);
        let e = r.encode();
        assert_eq!(e.len(), READY_LEN);
        assert_eq!(decode_ready(&e), Ok(r));
        assert_eq!(r.address_tag, address_tag(b"some worker"));
        assert_ne!(r.address_tag, address_tag(b"other worker"));
        assert_eq!(
            decode_ready(&e[..READY_LEN - 1]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(decode_ready(&[]), Err(DecodeError::Truncated));
        let mut long = e.clone();
        long.push(0);
        assert_eq!(decode_ready(&long), Err(DecodeError::Trailing));
        let mut bad = e.clone();
        bad[0] = b'X';
        assert_eq!(decode_ready(&bad), Err(DecodeError::BadMagic));
        // The flag travels in WELCOME's flags byte next to peer_errors, each on its own.
        for (peer_errors, ready) in [(false, false), (true, false), (false, true), (true, true)] {
            let w = Welcome {
                peer_errors,
                ready,
                ..w.clone()
            };
            let (d, _) = decode_welcome(&w.encode()).unwrap().unwrap();
            assert_eq!((d.peer_errors, d.ready), (peer_errors, ready));
        }
    }
}

#[cfg(test)]
mod move_tests {
    use super::*;

    #[test]
    fn move_answers_round_trip_and_refuse_junk() {
        for step in [MoveStep::Arrived, MoveStep::Refused] {
            let a = MoveAnswer {
                step,
                session: 0xdead_beef,
            };
            let e = a.encode();
            assert_eq!(e.len(), MOVE_ANSWER_LEN);
            assert_eq!(decode_move_answer(&e), Ok(a));
            assert_eq!(decode_move_answer(&e[..7]), Err(DecodeError::Truncated));
            let mut long = e.clone();
            long.push(0);
            assert_eq!(decode_move_answer(&long), Err(DecodeError::Trailing));
        }
        assert_eq!(
            decode_move_answer(b"MX\x01\0\0\0\0\0"),
            Err(DecodeError::BadMagic)
        );
        assert_eq!(
            decode_move_answer(b"MV\x03\0\0\0\0\0"),
            Err(DecodeError::WrongFrame)
        );
    }
}
