//! memcached's binary protocol: framing, request parsing and response encoding.
//!
//! Every packet starts with a 24-byte big-endian header:
//!
//! ```text
//!  0: magic (0x80 request, 0x81 response)   1: opcode
//!  2: key length (u16)                      4: extras length (u8)   5: data type
//!  6: vbucket (request) / status (response) 8: total body length (u32)
//! 12: opaque (echoed)                      16: CAS (u64)
//! ```
//!
//! followed by the body: extras, then key, then value.
//!
//! [`parse_request`] frames one request exactly as memcached 1.6.18 does, including its
//! quirks, because clients see them on the wire:
//! - it looks at nothing before 24 bytes are buffered, and then waits for the extras and
//!   the key before judging the request (never for a value it will reject);
//! - a key plus extras longer than the body is "Unknown command" and the connection is
//!   closed; a key longer than 250 bytes, or lengths wrong for the opcode, is "Invalid
//!   arguments" and the connection is closed;
//! - TOUCH, GAT* and STAT use only the header, extras and key: any further body bytes are
//!   read as the next request;
//! - an unknown opcode (VERBOSITY and SASL included: memcached 1.6.18 runs without SASL
//!   and has no binary VERBOSITY) is answered "Unknown command" and its body discarded.
//!
//! One deliberate difference: memcached discards an unknown command's body length
//! again *after* extras and key, eating the start of the next packet (and holding its
//! reply until more input comes). We discard exactly the body; see
//! `tests/interop/transcripts/binary_misc.txt` ("deviation").
//!
//! Nothing here does I/O or touches storage.

/// Length of every request and response header.
pub const HEADER_LEN: usize = 24;
/// First byte of a request.
pub const REQUEST_MAGIC: u8 = 0x80;
/// First byte of a response.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Incr/decr exptime meaning "do not create the item on a miss".
pub const ARITH_NO_CREATE: u32 = 0xffff_ffff;

/// Opcodes of the binary protocol (memcached's `protocol_binary.h`).
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
    pub const RGET: u8 = 0x30;
    pub const RSET: u8 = 0x31;
    pub const RSETQ: u8 = 0x32;
    pub const RAPPEND: u8 = 0x33;
    pub const RAPPENDQ: u8 = 0x34;
    pub const RPREPEND: u8 = 0x35;
    pub const RPREPENDQ: u8 = 0x36;
    pub const RDELETE: u8 = 0x37;
    pub const RDELETEQ: u8 = 0x38;
    pub const RINCR: u8 = 0x39;
    pub const RINCRQ: u8 = 0x3a;
    pub const RDECR: u8 = 0x3b;
    pub const RDECRQ: u8 = 0x3c;
    pub const SET_VBUCKET: u8 = 0x3d;
    pub const GET_VBUCKET: u8 = 0x3e;
    pub const DEL_VBUCKET: u8 = 0x3f;
    pub const TAP_CONNECT: u8 = 0x40;
    pub const TAP_MUTATION: u8 = 0x41;
    pub const TAP_DELETE: u8 = 0x42;
    pub const TAP_FLUSH: u8 = 0x43;
    pub const TAP_OPAQUE: u8 = 0x44;
    pub const TAP_VBUCKET_SET: u8 = 0x45;
    pub const TAP_CHECKPOINT_START: u8 = 0x46;
    pub const TAP_CHECKPOINT_END: u8 = 0x47;

    /// Whether `op` is a quiet variant: no reply on success (gets: no reply on a miss).
    pub fn is_quiet(op: u8) -> bool {
        matches!(
            op,
            GETQ | GETKQ
                | SETQ
                | ADDQ
                | REPLACEQ
                | DELETEQ
                | INCREMENTQ
                | DECREMENTQ
                | QUITQ
                | FLUSHQ
                | APPENDQ
                | PREPENDQ
                | GATQ
                | GATKQ
        )
    }
}

/// Response status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Success = 0x00,
    KeyNotFound = 0x01,
    KeyExists = 0x02,
    TooLarge = 0x03,
    InvalidArguments = 0x04,
    NotStored = 0x05,
    DeltaBadValue = 0x06,
    AuthError = 0x20,
    AuthContinue = 0x21,
    UnknownCommand = 0x81,
    OutOfMemory = 0x82,
}

impl Status {
    pub fn code(self) -> u16 {
        self as u16
    }

    pub fn from_code(code: u16) -> Option<Status> {
        Some(match code {
            0x00 => Status::Success,
            0x01 => Status::KeyNotFound,
            0x02 => Status::KeyExists,
            0x03 => Status::TooLarge,
            0x04 => Status::InvalidArguments,
            0x05 => Status::NotStored,
            0x06 => Status::DeltaBadValue,
            0x20 => Status::AuthError,
            0x21 => Status::AuthContinue,
            0x81 => Status::UnknownCommand,
            0x82 => Status::OutOfMemory,
            _ => return None,
        })
    }

    /// The body memcached sends with this status when it has no more specific text.
    pub fn message(self) -> &'static str {
        match self {
            Status::Success | Status::AuthContinue => "",
            Status::KeyNotFound => "Not found",
            Status::KeyExists => "Data exists for key.",
            Status::TooLarge => "Too large.",
            Status::InvalidArguments => "Invalid arguments",
            Status::NotStored => "Not stored.",
            Status::DeltaBadValue => "Non-numeric server-side value for incr or decr",
            Status::AuthError => "Auth failure.",
            Status::UnknownCommand => "Unknown command",
            Status::OutOfMemory => "Out of memory",
        }
    }
}

/// A request header, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestHeader {
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    pub vbucket: u16,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

/// Why input cannot be framed as a request. The connection is closed after either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first byte is not 0x80: memcached closes without a reply.
    #[error("invalid magic byte 0x{0:02x}")]
    BadMagic(u8),
    /// memcached answers `status` (with its standard message) and then closes.
    #[error("malformed request (opcode 0x{:02x}): {}", .header.opcode, .status.message())]
    Rejected {
        header: RequestHeader,
        status: Status,
    },
}

impl RequestHeader {
    /// Decode the header at the start of `buf`: `Ok(None)` when fewer than 24 bytes are
    /// there, `BadMagic` when the first byte is not a request magic.
    pub fn parse(buf: &[u8]) -> Result<Option<RequestHeader>, FrameError> {
        let Some(b) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        if b[0] != REQUEST_MAGIC {
            return Err(FrameError::BadMagic(b[0]));
        }
        Ok(Some(RequestHeader {
            opcode: b[1],
            key_len: be16(&b[2..4]),
            extras_len: b[4],
            data_type: b[5],
            vbucket: be16(&b[6..8]),
            body_len: be32(&b[8..12]),
            opaque: be32(&b[12..16]),
            cas: be64(&b[16..24]),
        }))
    }

    /// Append the 24 header bytes (with the request magic) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(REQUEST_MAGIC);
        out.push(self.opcode);
        out.extend_from_slice(&self.key_len.to_be_bytes());
        out.push(self.extras_len);
        out.push(self.data_type);
        out.extend_from_slice(&self.vbucket.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }

    /// Header, extras and key: what memcached waits for before it judges a request.
    pub fn head_len(&self) -> usize {
        HEADER_LEN + self.extras_len as usize + self.key_len as usize
    }

    /// Header plus the declared body.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.body_len)
    }

    pub fn quiet(&self) -> bool {
        opcode::is_quiet(self.opcode)
    }
}

/// The storage commands that carry a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

/// A storage request without its value: enough to decide whether the value can ever be
/// stored before buffering it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreHead<'a> {
    pub op: StoreOp,
    pub key: &'a [u8],
    /// Client flags (append/prepend carry none: 0).
    pub flags: u32,
    /// Protocol exptime (append/prepend carry none: 0).
    pub exptime: u32,
    pub value_len: usize,
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// GET GETQ GETK GETKQ.
    Get {
        key: &'a [u8],
        return_key: bool,
    },
    /// TOUCH: new exptime, reply carries flags but no value.
    Touch {
        key: &'a [u8],
        exptime: u32,
    },
    /// GAT GATQ GATK GATKQ.
    GetAndTouch {
        key: &'a [u8],
        exptime: u32,
        return_key: bool,
    },
    /// SET ADD REPLACE APPEND PREPEND (and their quiet forms) with the whole value.
    Store {
        head: StoreHead<'a>,
        value: &'a [u8],
    },
    /// DELETE DELETEQ.
    Delete {
        key: &'a [u8],
    },
    /// INCREMENT DECREMENT (and quiet forms). `exptime` [`ARITH_NO_CREATE`] = no create.
    Arith {
        incr: bool,
        key: &'a [u8],
        delta: u64,
        initial: u64,
        exptime: u32,
    },
    /// QUIT QUITQ.
    Quit,
    /// FLUSH FLUSHQ; `exptime` when the 4-byte extras are present.
    Flush {
        exptime: Option<u32>,
    },
    Noop,
    Version,
    /// STAT; `group` is the key (empty for the general stats).
    Stat {
        group: &'a [u8],
    },
    /// Anything memcached answers with "Unknown command" (unknown opcodes, VERBOSITY,
    /// SASL when authentication is off).
    Unknown,
}

/// A framed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: RequestHeader,
    pub command: Command<'a>,
}

impl Request<'_> {
    pub fn quiet(&self) -> bool {
        self.header.quiet()
    }
}

/// Outcome of [`parse_request`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Nothing can be decided yet: at least this many bytes are needed in total.
    NeedMore(usize),
    /// A storage request whose value is not all buffered yet; `total` bytes make the
    /// whole request. Lets the caller reject a value that can never be stored (and
    /// discard it as it arrives) instead of buffering it.
    ValuePending {
        header: RequestHeader,
        head: StoreHead<'a>,
        total: usize,
    },
    /// A complete request. `len` is how many bytes of input it occupies, as memcached
    /// counts them; it exceeds the input only for an unknown command, whose remaining
    /// bytes are to be discarded as they arrive.
    Request { request: Request<'a>, len: u64 },
}

/// Frame the request at the start of `input` the way memcached 1.6.18 does.
pub fn parse_request(input: &[u8]) -> Result<Frame<'_>, FrameError> {
    let Some(h) = RequestHeader::parse(input)? else {
        return Ok(Frame::NeedMore(HEADER_LEN));
    };
    let head_len = h.head_len();
    let Some(head) = input.get(HEADER_LEN..head_len) else {
        return Ok(Frame::NeedMore(head_len));
    };
    let el = h.extras_len as usize;
    let kl = h.key_len as usize;
    let bl = h.body_len as usize;
    let (extras, key) = head.split_at(el);
    let reject = |status| FrameError::Rejected { header: h, status };
    if (kl + el) as u64 > u64::from(h.body_len) {
        return Err(reject(Status::UnknownCommand));
    }
    // The header could carry 65535 bytes of key; memcached takes its usual limit.
    if kl > crate::KEY_MAX_LEN {
        return Err(reject(Status::InvalidArguments));
    }
    let einval = || Err(reject(Status::InvalidArguments));
    let empty = el == 0 && kl == 0 && bl == 0;
    // Requests that occupy exactly their header, extras and key.
    let done = |command| {
        Ok(Frame::Request {
            request: Request { header: h, command },
            len: head_len as u64,
        })
    };
    use opcode::*;
    match h.opcode {
        VERSION | NOOP | QUIT | QUITQ => {
            if !empty {
                return einval();
            }
            done(match h.opcode {
                VERSION => Command::Version,
                NOOP => Command::Noop,
                _ => Command::Quit,
            })
        }
        FLUSH | FLUSHQ => {
            if kl != 0 || bl != el || (el != 0 && el != 4) {
                return einval();
            }
            let exptime = (el == 4).then(|| be32(extras));
            done(Command::Flush { exptime })
        }
        GET | GETQ | GETK | GETKQ => {
            if el != 0 || bl != kl || kl == 0 {
                return einval();
            }
            done(Command::Get {
                key,
                return_key: matches!(h.opcode, GETK | GETKQ),
            })
        }
        DELETE | DELETEQ => {
            if kl == 0 || el != 0 || bl != kl {
                return einval();
            }
            done(Command::Delete { key })
        }
        INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => {
            if kl == 0 || el != 20 || bl != kl + 20 {
                return einval();
            }
            done(Command::Arith {
                incr: matches!(h.opcode, INCREMENT | INCREMENTQ),
                key,
                delta: be64(&extras[0..8]),
                initial: be64(&extras[8..16]),
                exptime: be32(&extras[16..20]),
            })
        }
        STAT => {
            if el != 0 {
                return einval();
            }
            done(Command::Stat { group: key })
        }
        TOUCH | GAT | GATQ | GATK | GATKQ => {
            if el != 4 || kl == 0 {
                return einval();
            }
            let exptime = be32(extras);
            done(if h.opcode == TOUCH {
                Command::Touch { key, exptime }
            } else {
                Command::GetAndTouch {
                    key,
                    exptime,
                    return_key: matches!(h.opcode, GATK | GATKQ),
                }
            })
        }
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ | APPEND | APPENDQ | PREPEND | PREPENDQ => {
            let (op, flags, exptime) = match h.opcode {
                APPEND | APPENDQ | PREPEND | PREPENDQ => {
                    if kl == 0 || el != 0 {
                        return einval();
                    }
                    let op = if matches!(h.opcode, APPEND | APPENDQ) {
                        StoreOp::Append
                    } else {
                        StoreOp::Prepend
                    };
                    (op, 0, 0)
                }
                _ => {
                    // The body-length check above already guarantees bl >= kl + 8.
                    if el != 8 || kl == 0 {
                        return einval();
                    }
                    let op = match h.opcode {
                        SET | SETQ => StoreOp::Set,
                        ADD | ADDQ => StoreOp::Add,
                        _ => StoreOp::Replace,
                    };
                    (op, be32(&extras[0..4]), be32(&extras[4..8]))
                }
            };
            let head = StoreHead {
                op,
                key,
                flags,
                exptime,
                value_len: bl - kl - el,
            };
            let total = HEADER_LEN + bl;
            match input.get(head_len..total) {
                Some(value) => Ok(Frame::Request {
                    request: Request {
                        header: h,
                        command: Command::Store { head, value },
                    },
                    len: total as u64,
                }),
                None => Ok(Frame::ValuePending {
                    header: h,
                    head,
                    total,
                }),
            }
        }
        SASL_LIST_MECHS => {
            if !empty {
                return einval();
            }
            done(Command::Unknown)
        }
        SASL_AUTH | SASL_STEP => {
            if el != 0 || kl == 0 {
                return einval();
            }
            // memcached without SASL discards the data after the mechanism name.
            Ok(Frame::Request {
                request: Request {
                    header: h,
                    command: Command::Unknown,
                },
                len: h.frame_len(),
            })
        }
        // Deliberately not memcached's over-swallow (see the module comment).
        _ => Ok(Frame::Request {
            request: Request {
                header: h,
                command: Command::Unknown,
            },
            len: h.frame_len(),
        }),
    }
}

/// A response header, decoded or to encode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeader {
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    pub status: u16,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl ResponseHeader {
    /// Append the 24 header bytes (with the response magic) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(RESPONSE_MAGIC);
        out.push(self.opcode);
        out.extend_from_slice(&self.key_len.to_be_bytes());
        out.push(self.extras_len);
        out.push(self.data_type);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }

    /// Decode a response header (clients and tests); `None` if short or not 0x81.
    pub fn parse(buf: &[u8]) -> Option<ResponseHeader> {
        let b = buf.get(..HEADER_LEN)?;
        if b[0] != RESPONSE_MAGIC {
            return None;
        }
        Some(ResponseHeader {
            opcode: b[1],
            key_len: be16(&b[2..4]),
            extras_len: b[4],
            data_type: b[5],
            status: be16(&b[6..8]),
            body_len: be32(&b[8..12]),
            opaque: be32(&b[12..16]),
            cas: be64(&b[16..24]),
        })
    }
}

/// Body lengths are u32 on the wire; anything memcached stores fits, so saturating only
/// keeps a corrupt length from wrapping.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Append a complete response: header, extras, key, value.
#[allow(clippy::too_many_arguments)]
pub fn write_response(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    status: Status,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    ResponseHeader {
        opcode,
        key_len: u16::try_from(key.len()).unwrap_or(u16::MAX),
        extras_len: u8::try_from(extras.len()).unwrap_or(u8::MAX),
        data_type: 0,
        status: status.code(),
        body_len: len32(extras.len() + key.len() + value.len()),
        opaque,
        cas,
    }
    .encode(out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// A success with no body (stored, deleted, flushed, noop, quit); `cas` of the item
/// where there is one.
pub fn write_ok(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64) {
    write_response(out, opcode, opaque, Status::Success, cas, &[], &[], &[]);
}

/// An error carrying the status's standard message.
pub fn write_error(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: Status) {
    write_error_text(out, opcode, opaque, status, status.message());
}

/// An error with specific text (memcached's out-of-memory errors say where).
pub fn write_error_text(out: &mut Vec<u8>, opcode: u8, opaque: u32, status: Status, text: &str) {
    write_response(out, opcode, opaque, status, 0, &[], &[], text.as_bytes());
}

/// The header, flags extras and (GETK/GATK) key of a hit; the caller appends the
/// `value_len` value bytes. TOUCH passes `value_len` 0 and appends nothing.
pub fn write_hit_header(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    flags: u32,
    key: &[u8],
    value_len: u32,
) {
    ResponseHeader {
        opcode,
        key_len: u16::try_from(key.len()).unwrap_or(u16::MAX),
        extras_len: 4,
        data_type: 0,
        status: Status::Success.code(),
        body_len: 4u32
            .saturating_add(len32(key.len()))
            .saturating_add(value_len),
        opaque,
        cas,
    }
    .encode(out);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(key);
}

/// A miss of GETK/GATK: status "not found" with the key and no message.
pub fn write_key_miss(out: &mut Vec<u8>, opcode: u8, opaque: u32, key: &[u8]) {
    write_response(out, opcode, opaque, Status::KeyNotFound, 0, &[], key, &[]);
}

/// Incr/decr success: the new value as 8 big-endian bytes.
pub fn write_counter(out: &mut Vec<u8>, opcode: u8, opaque: u32, cas: u64, value: u64) {
    write_response(
        out,
        opcode,
        opaque,
        Status::Success,
        cas,
        &[],
        &[],
        &value.to_be_bytes(),
    );
}

/// One STAT reply packet; `key` and `value` empty make the terminator.
pub fn write_stat(out: &mut Vec<u8>, opaque: u32, key: &[u8], value: &[u8]) {
    write_response(
        out,
        opcode::STAT,
        opaque,
        Status::Success,
        0,
        &[],
        key,
        value,
    );
}

/// Append a complete request (clients, tests, benchmarks).
pub fn write_request(
    out: &mut Vec<u8>,
    opcode: u8,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    RequestHeader {
        opcode,
        key_len: u16::try_from(key.len()).unwrap_or(u16::MAX),
        extras_len: u8::try_from(extras.len()).unwrap_or(u8::MAX),
        data_type: 0,
        vbucket: 0,
        body_len: len32(extras.len() + key.len() + value.len()),
        opaque,
        cas,
    }
    .encode(out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

// The slices passed below always have the exact width (taken with fixed ranges from a
// buffer already checked to be long enough); a shorter slice reads as zero-padded rather
// than panicking.
fn be16(b: &[u8]) -> u16 {
    let mut a = [0u8; 2];
    let n = b.len().min(2);
    a[..n].copy_from_slice(&b[..n]);
    u16::from_be_bytes(a)
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    let n = b.len().min(4);
    a[..n].copy_from_slice(&b[..n]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::opcode::*;
    use super::*;
    use proptest::prelude::*;

    fn req(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        write_request(&mut v, op, 0xdead_beef, 0, extras, key, value);
        v
    }

    fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
        let mut e = flags.to_be_bytes().to_vec();
        e.extend_from_slice(&exptime.to_be_bytes());
        e
    }

    fn parse_ok(input: &[u8]) -> (Request<'_>, u64) {
        match parse_request(input) {
            Ok(Frame::Request { request, len }) => (request, len),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn rejected(input: &[u8]) -> Status {
        match parse_request(input) {
            Err(FrameError::Rejected { status, .. }) => status,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn header_round_trips() {
        let h = RequestHeader {
            opcode: SET,
            key_len: 3,
            extras_len: 8,
            data_type: 1,
            vbucket: 7,
            body_len: 20,
            opaque: 0x0102_0304,
            cas: 0x1122_3344_5566_7788,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(RequestHeader::parse(&b), Ok(Some(h)));
    }

    #[test]
    fn fewer_than_24_bytes_need_more_even_with_bad_magic() {
        assert_eq!(parse_request(b""), Ok(Frame::NeedMore(24)));
        assert_eq!(parse_request(b"get foo\r\n"), Ok(Frame::NeedMore(24)));
    }

    #[test]
    fn bad_magic_is_an_error() {
        let mut r = req(NOOP, &[], &[], &[]);
        r[0] = 0x81;
        assert_eq!(parse_request(&r), Err(FrameError::BadMagic(0x81)));
    }

    #[test]
    fn waits_for_extras_and_key_before_judging() {
        let r = req(GET, &[], b"abc", &[]);
        assert_eq!(parse_request(&r[..25]), Ok(Frame::NeedMore(27)));
        // Even a key too long waits for the key bytes, as memcached does.
        let r = req(GET, &[], &[b'a'; 251], &[]);
        assert_eq!(parse_request(&r[..30]), Ok(Frame::NeedMore(24 + 251)));
    }

    #[test]
    fn key_and_extras_longer_than_body_is_unknown_command() {
        let mut r = req(GET, &[], b"abc", &[]);
        r[11] = 2; // body length 2 < key length 3
        assert_eq!(rejected(&r), Status::UnknownCommand);
    }

    #[test]
    fn key_over_250_bytes_is_invalid() {
        assert_eq!(
            rejected(&req(GET, &[], &[b'k'; 251], &[])),
            Status::InvalidArguments
        );
        let r = req(GET, &[], &[b'k'; 250], &[]);
        assert!(matches!(parse_ok(&r).0.command, Command::Get { key, .. } if key.len() == 250));
    }

    #[test]
    fn get_family_parses_key_and_return_key_flag() {
        for (op, rk, quiet) in [
            (GET, false, false),
            (GETQ, false, true),
            (GETK, true, false),
            (GETKQ, true, true),
        ] {
            let r = req(op, &[], b"foo", &[]);
            let (request, len) = parse_ok(&r);
            assert_eq!(len, 27);
            assert_eq!(request.quiet(), quiet);
            assert_eq!(
                request.command,
                Command::Get {
                    key: b"foo",
                    return_key: rk
                }
            );
        }
    }

    #[test]
    fn get_with_extras_or_no_key_or_value_is_invalid() {
        assert_eq!(
            rejected(&req(GET, b"abcd", b"k", &[])),
            Status::InvalidArguments
        );
        assert_eq!(rejected(&req(GET, &[], &[], &[])), Status::InvalidArguments);
        assert_eq!(
            rejected(&req(GETK, &[], b"k", b"v")),
            Status::InvalidArguments
        );
    }

    #[test]
    fn set_parses_flags_exptime_and_value() {
        let r = req(SETQ, &set_extras(0xabcd, 100), b"key", b"value");
        let (request, len) = parse_ok(&r);
        assert_eq!(len as usize, r.len());
        assert!(request.quiet());
        assert_eq!(
            request.command,
            Command::Store {
                head: StoreHead {
                    op: StoreOp::Set,
                    key: b"key",
                    flags: 0xabcd,
                    exptime: 100,
                    value_len: 5
                },
                value: b"value"
            }
        );
    }

    #[test]
    fn set_with_partial_value_reports_value_pending() {
        let r = req(ADD, &set_extras(1, 2), b"key", b"value");
        match parse_request(&r[..r.len() - 1]) {
            Ok(Frame::ValuePending { head, total, .. }) => {
                assert_eq!(total, r.len());
                assert_eq!(head.op, StoreOp::Add);
                assert_eq!(head.value_len, 5);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn set_needs_8_extras_and_a_key() {
        assert_eq!(
            rejected(&req(SET, &[0; 4], b"k", b"vvvv")),
            Status::InvalidArguments
        );
        assert_eq!(
            rejected(&req(SET, &[0; 8], &[], b"v")),
            Status::InvalidArguments
        );
    }

    #[test]
    fn append_takes_no_extras() {
        let r = req(PREPENDQ, &[], b"k", b"xy");
        let (request, _) = parse_ok(&r);
        assert!(matches!(
            request.command,
            Command::Store {
                head: StoreHead {
                    op: StoreOp::Prepend,
                    value_len: 2,
                    ..
                },
                value: b"xy"
            }
        ));
        assert_eq!(
            rejected(&req(APPEND, b"abcd", b"k", b"v")),
            Status::InvalidArguments
        );
        assert_eq!(
            rejected(&req(APPEND, &[], &[], b"v")),
            Status::InvalidArguments
        );
    }

    #[test]
    fn delete_needs_key_only() {
        let r = req(DELETEQ, &[], b"k", &[]);
        let (request, _) = parse_ok(&r);
        assert_eq!(request.command, Command::Delete { key: b"k" });
        assert_eq!(
            rejected(&req(DELETE, &[], b"k", b"v")),
            Status::InvalidArguments
        );
    }

    #[test]
    fn arith_parses_delta_initial_exptime() {
        let mut e = 5u64.to_be_bytes().to_vec();
        e.extend_from_slice(&10u64.to_be_bytes());
        e.extend_from_slice(&ARITH_NO_CREATE.to_be_bytes());
        let r = req(DECREMENTQ, &e, b"n", &[]);
        let (request, _) = parse_ok(&r);
        assert_eq!(
            request.command,
            Command::Arith {
                incr: false,
                key: b"n",
                delta: 5,
                initial: 10,
                exptime: ARITH_NO_CREATE
            }
        );
        assert_eq!(
            rejected(&req(INCREMENT, &e, b"n", b"zz")),
            Status::InvalidArguments
        );
        assert_eq!(
            rejected(&req(INCREMENT, &e[..8], b"n", &[])),
            Status::InvalidArguments
        );
    }

    #[test]
    fn flush_takes_optional_4_byte_exptime() {
        assert_eq!(
            parse_ok(&req(FLUSH, &[], &[], &[])).0.command,
            Command::Flush { exptime: None }
        );
        assert_eq!(
            parse_ok(&req(FLUSHQ, &7u32.to_be_bytes(), &[], &[]))
                .0
                .command,
            Command::Flush { exptime: Some(7) }
        );
        assert_eq!(
            rejected(&req(FLUSH, &[0, 0], &[], &[])),
            Status::InvalidArguments
        );
        assert_eq!(
            rejected(&req(FLUSH, &[], b"k", &[])),
            Status::InvalidArguments
        );
    }

    #[test]
    fn noop_version_quit_take_no_body() {
        for (op, cmd) in [
            (NOOP, Command::Noop),
            (VERSION, Command::Version),
            (QUIT, Command::Quit),
            (QUITQ, Command::Quit),
        ] {
            assert_eq!(parse_ok(&req(op, &[], &[], &[])).0.command, cmd);
            assert_eq!(rejected(&req(op, &[], b"k", &[])), Status::InvalidArguments);
        }
    }

    #[test]
    fn touch_and_gat_use_only_extras_and_key() {
        let mut r = req(GATK, &9u32.to_be_bytes(), b"k", b"");
        let mut noop = Vec::new();
        write_request(&mut noop, NOOP, 1, 0, &[], &[], &[]);
        // A body longer than extras + key: the rest is the next request.
        r[8..12].copy_from_slice(&(5u32 + 24).to_be_bytes());
        r.extend_from_slice(&noop);
        let (request, len) = parse_ok(&r);
        assert_eq!(len, 29);
        assert_eq!(
            request.command,
            Command::GetAndTouch {
                key: b"k",
                exptime: 9,
                return_key: true
            }
        );
        assert_eq!(
            parse_ok(&req(TOUCH, &9u32.to_be_bytes(), b"k", &[]))
                .0
                .command,
            Command::Touch {
                key: b"k",
                exptime: 9
            }
        );
        assert_eq!(
            rejected(&req(TOUCH, &[], b"k", &[])),
            Status::InvalidArguments
        );
    }

    #[test]
    fn stat_key_is_the_group_and_trailing_body_is_not_consumed() {
        let r = req(STAT, &[], b"items", b"xx");
        let (request, len) = parse_ok(&r);
        assert_eq!(request.command, Command::Stat { group: b"items" });
        assert_eq!(len, 29);
        assert_eq!(
            rejected(&req(STAT, b"e", &[], &[])),
            Status::InvalidArguments
        );
    }

    #[test]
    fn unknown_opcode_discards_exactly_its_body() {
        let r = req(0x40, b"xy", b"abc", b"v");
        let (request, len) = parse_ok(&r);
        assert_eq!(request.command, Command::Unknown);
        assert_eq!(len, 24 + 6);
        let r = req(VERBOSITY, &1u32.to_be_bytes(), &[], &[]);
        let (request, len) = parse_ok(&r);
        assert_eq!(request.command, Command::Unknown);
        assert_eq!(len, 24 + 4);
    }

    #[test]
    fn sasl_without_auth_is_unknown_or_invalid() {
        assert_eq!(
            parse_ok(&req(SASL_LIST_MECHS, &[], &[], &[])),
            (
                Request {
                    header: RequestHeader::parse(&req(SASL_LIST_MECHS, &[], &[], &[]))
                        .unwrap()
                        .unwrap(),
                    command: Command::Unknown
                },
                24
            )
        );
        assert_eq!(
            rejected(&req(SASL_LIST_MECHS, &[], b"k", &[])),
            Status::InvalidArguments
        );
        assert_eq!(
            parse_ok(&req(SASL_AUTH, &[], b"PLAIN", b"\0u\0p")).1,
            24 + 9
        );
        assert_eq!(
            rejected(&req(SASL_STEP, &[], &[], b"x")),
            Status::InvalidArguments
        );
    }

    #[test]
    fn every_quiet_opcode_is_known() {
        let quiet: Vec<u8> = (0..=255u8).filter(|&op| is_quiet(op)).collect();
        assert_eq!(
            quiet,
            vec![
                GETQ, GETKQ, SETQ, ADDQ, REPLACEQ, DELETEQ, INCREMENTQ, DECREMENTQ, QUITQ, FLUSHQ,
                APPENDQ, PREPENDQ, GATQ, GATKQ
            ]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn error_response_carries_message_and_echoes_opcode_and_opaque() {
        let mut out = Vec::new();
        write_error(&mut out, ADDQ, 0x11, Status::KeyExists);
        let h = ResponseHeader::parse(&out).unwrap();
        assert_eq!(h.opcode, ADDQ);
        assert_eq!(h.status, 0x02);
        assert_eq!(h.opaque, 0x11);
        assert_eq!(h.cas, 0);
        assert_eq!(&out[24..], b"Data exists for key.");
        assert_eq!(h.body_len as usize, out.len() - 24);
    }

    #[test]
    fn status_messages_match_memcached() {
        assert_eq!(Status::KeyNotFound.message(), "Not found");
        assert_eq!(Status::TooLarge.message(), "Too large.");
        assert_eq!(Status::InvalidArguments.message(), "Invalid arguments");
        assert_eq!(Status::NotStored.message(), "Not stored.");
        assert_eq!(
            Status::DeltaBadValue.message(),
            "Non-numeric server-side value for incr or decr"
        );
        assert_eq!(Status::UnknownCommand.message(), "Unknown command");
        assert_eq!(Status::OutOfMemory.message(), "Out of memory");
        for code in 0..=u16::MAX {
            if let Some(s) = Status::from_code(code) {
                assert_eq!(s.code(), code);
            }
        }
    }

    #[test]
    fn hit_header_counts_flags_key_and_value() {
        let mut out = Vec::new();
        write_hit_header(&mut out, GETK, 3, 99, 0xabcd, b"foo", 3);
        out.extend_from_slice(b"bar");
        let h = ResponseHeader::parse(&out).unwrap();
        assert_eq!((h.key_len, h.extras_len, h.body_len, h.cas), (3, 4, 10, 99));
        assert_eq!(&out[24..], b"\0\0\xab\xcdfoobar");
    }

    #[test]
    fn counter_and_stat_encodings() {
        let mut out = Vec::new();
        write_counter(&mut out, INCREMENT, 1, 5, 10);
        assert_eq!(&out[24..], &10u64.to_be_bytes());
        out.clear();
        write_stat(&mut out, 7, b"pid", b"42");
        let h = ResponseHeader::parse(&out).unwrap();
        assert_eq!((h.opcode, h.key_len, h.body_len, h.opaque), (STAT, 3, 5, 7));
        out.clear();
        write_stat(&mut out, 7, b"", b"");
        assert_eq!(out.len(), 24);
    }

    /// Frame a stream request by request; returns the (offset, len) of each request and
    /// what stopped it.
    fn frames(stream: &[u8]) -> Vec<(usize, u64)> {
        let mut at = 0;
        let mut v = Vec::new();
        while at < stream.len() {
            match parse_request(&stream[at..]) {
                Ok(Frame::Request { len, .. }) => {
                    v.push((at, len));
                    at = at.saturating_add(len as usize);
                }
                _ => break,
            }
        }
        v
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_request(&data);
            let mut d = data.clone();
            if !d.is_empty() { d[0] = REQUEST_MAGIC; }
            let _ = parse_request(&d);
        }

        #[test]
        fn arbitrary_headers_never_panic(
            op in any::<u8>(), kl in 0u16..300, el in any::<u8>(), bl in any::<u32>(),
            tail in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut d = Vec::new();
            RequestHeader { opcode: op, key_len: kl, extras_len: el, body_len: bl, ..Default::default() }.encode(&mut d);
            d.extend_from_slice(&tail);
            match parse_request(&d) {
                Ok(Frame::NeedMore(n)) => prop_assert!(n > d.len()),
                Ok(Frame::Request { len, .. }) => prop_assert!(len >= 24),
                Ok(Frame::ValuePending { total, .. }) => prop_assert!(total > d.len()),
                Err(_) => {}
            }
        }

        #[test]
        fn a_prefix_never_frames_differently(
            ops in proptest::collection::vec((0u8..0x26, proptest::collection::vec(any::<u8>(), 1..8)), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut stream = Vec::new();
            for (op, key) in &ops {
                let extras: &[u8] = match *op {
                    SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ => &[0; 8],
                    INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => &[0; 20],
                    TOUCH | GAT | GATQ | GATK | GATKQ => &[0; 4],
                    _ => &[],
                };
                write_request(&mut stream, *op, 1, 0, extras, key, b"val");
            }
            let whole = frames(&stream);
            let cut = cut.index(stream.len() + 1);
            let part = frames(&stream[..cut]);
            // Whatever a prefix frames, the whole stream frames the same way.
            prop_assert!(part.len() <= whole.len());
            prop_assert_eq!(&whole[..part.len()], &part[..]);
        }
    }
}
