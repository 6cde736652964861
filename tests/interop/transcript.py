"""Byte transcripts: parse, send to a server, read replies, normalise.

A transcript is a readable text file (format in ``transcripts/README.md``) made of
named steps. Each step's request bytes are sent on one connection, followed by a
*sentinel* whose reply marks the end of the step's reply, so reading never depends on
timing: ascii steps end with ``mn\\r\\n`` (reply ``MN\\r\\n``), binary steps end with a
NOOP carrying a per-step opaque. A step may instead end when the server closes the
connection, or (option ``nosentinel``) when the server has been quiet for a while; the
latter is the only timing-based read and is meant for requests that are deliberately
left incomplete.

Replies are normalised before comparison, and only in the places where two correct
servers may legitimately differ: CAS values (mapped to ``<casN>`` by order of first
appearance, so "same item, same CAS" relations are still checked), ``stats`` bodies and
version strings.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TIMEOUT = 3.0
DEFAULT_QUIET = 0.5
# After this many steps of one transcript time out, the rest are not run: a hung
# server would otherwise cost DEFAULT_TIMEOUT per remaining step.
MAX_TIMEOUTS = 3

ASCII_SENTINEL = b"mn\r\n"
ASCII_SENTINEL_REPLY = b"MN\r\n"
SENTINEL_OPAQUE_BASE = 0x5E570000

CLOSED = "<closed>"
TIMEOUT = "<timeout>"


class TranscriptError(Exception):
    """A transcript file that cannot be parsed or expanded."""


# --------------------------------------------------------------------------- binary

BIN_OPCODES = {
    "GET": 0x00, "SET": 0x01, "ADD": 0x02, "REPLACE": 0x03, "DELETE": 0x04,
    "INCREMENT": 0x05, "DECREMENT": 0x06, "QUIT": 0x07, "FLUSH": 0x08, "GETQ": 0x09,
    "NOOP": 0x0A, "VERSION": 0x0B, "GETK": 0x0C, "GETKQ": 0x0D, "APPEND": 0x0E,
    "PREPEND": 0x0F, "STAT": 0x10, "SETQ": 0x11, "ADDQ": 0x12, "REPLACEQ": 0x13,
    "DELETEQ": 0x14, "INCREMENTQ": 0x15, "DECREMENTQ": 0x16, "QUITQ": 0x17,
    "FLUSHQ": 0x18, "APPENDQ": 0x19, "PREPENDQ": 0x1A, "VERBOSITY": 0x1B,
    "TOUCH": 0x1C, "GAT": 0x1D, "GATQ": 0x1E, "SASL_LIST_MECHS": 0x20,
    "SASL_AUTH": 0x21, "SASL_STEP": 0x22, "GATK": 0x23, "GATKQ": 0x24,
}
BIN_OPNAMES = {v: k for k, v in BIN_OPCODES.items()}
BIN_STATUS = {
    0x00: "OK", 0x01: "KEY_ENOENT", 0x02: "KEY_EEXISTS", 0x03: "E2BIG", 0x04: "EINVAL",
    0x05: "NOT_STORED", 0x06: "DELTA_BADVAL", 0x07: "VBUCKET_ELSEWHERE",
    0x20: "AUTH_ERROR", 0x21: "AUTH_CONTINUE", 0x81: "UNKNOWN_COMMAND",
    0x82: "ENOMEM", 0x83: "NOT_SUPPORTED", 0x84: "EINTERNAL", 0x85: "EBUSY",
    0x86: "ETMPFAIL",
}
_STORAGE_OPS = {"SET", "ADD", "REPLACE", "SETQ", "ADDQ", "REPLACEQ"}
_ARITH_OPS = {"INCREMENT", "DECREMENT", "INCREMENTQ", "DECREMENTQ"}
_EXPTIME_OPS = {"TOUCH", "GAT", "GATQ", "GATK", "GATKQ"}
_REQ_FIELDS = {
    "key", "value", "extras", "cas", "opaque", "vbucket", "datatype", "magic",
    "keylen", "extlen", "bodylen", "flags", "exptime", "delta", "initial", "level",
}


def bin_packet(
    opcode: int,
    key: bytes = b"",
    extras: bytes = b"",
    value: bytes = b"",
    *,
    magic: int = 0x80,
    datatype: int = 0,
    vbucket: int = 0,
    opaque: int = 0,
    cas: int = 0,
    keylen: int | None = None,
    extlen: int | None = None,
    bodylen: int | None = None,
) -> bytes:
    """Encode one binary-protocol request; the length overrides make malformed ones."""
    kl = len(key) if keylen is None else keylen
    el = len(extras) if extlen is None else extlen
    bl = len(extras) + len(key) + len(value) if bodylen is None else bodylen
    header = struct.pack(
        ">BBHBBHIIQ", magic, opcode, kl, el, datatype, vbucket, bl, opaque, cas
    )
    return header + extras + key + value


@dataclass
class BinResponse:
    magic: int
    opcode: int
    datatype: int
    status: int
    opaque: int
    cas: int
    extras: bytes
    key: bytes
    value: bytes


def parse_bin_responses(buf: bytes) -> tuple[list[BinResponse], bytes]:
    """Split ``buf`` into complete response packets and the unparsed rest.

    Parsing stops at the first header that is not a response (magic 0x81) or whose
    declared lengths are inconsistent: what follows is returned raw.
    """
    out: list[BinResponse] = []
    pos = 0
    while len(buf) - pos >= 24:
        magic, opcode, kl, el, dt, status, bl, opaque, cas = struct.unpack_from(
            ">BBHBBHIIQ", buf, pos
        )
        if magic != 0x81 or kl + el > bl:
            break
        if len(buf) - pos - 24 < bl:
            break
        body = buf[pos + 24 : pos + 24 + bl]
        out.append(
            BinResponse(
                magic, opcode, dt, status, opaque, cas,
                body[:el], body[el : el + kl], body[el + kl :],
            )
        )
        pos += 24 + bl
    return out, buf[pos:]


# --------------------------------------------------------------------------- parsing

@dataclass
class Step:
    name: str
    line: int
    # Request lines as written (expanded at run time: {casN} needs earlier replies).
    lines: list[str] = field(default_factory=list)
    timeout: float = DEFAULT_TIMEOUT
    sleep: float = 0.0
    sentinel: bool = True
    quiet: float = DEFAULT_QUIET
    reconnect: bool = False
    mn: int | None = None
    # A deliberate, documented difference from memcached (a memcached bug we do not
    # copy): memfabricd must answer, but need not answer as memcached does.
    deviation: bool = False


@dataclass
class Transcript:
    path: Path
    protocol: str
    steps: list[Step]
    # Flags both servers are started with (`%args -C`), after the test's own.
    args: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name


_MACRO = re.compile(r"\{(rep:(?P<text>[^:}]*):(?P<count>\d+)|cas(?P<idx>\d+)(?P<off>[+-]\d+)?)\}")


def parse_transcript(path: Path) -> Transcript:
    protocol = "ascii"
    args: tuple[str, ...] = ()
    steps: list[Step] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{path.name}:{lineno}"
        if raw.startswith("#") or not raw.strip():
            continue
        if raw.startswith("%"):
            words = raw[1:].split()
            if steps:
                raise TranscriptError(f"{where}: %{words[:1]} must come before the first step")
            if words[:1] == ["args"] and len(words) > 1:
                args = tuple(words[1:])
                continue
            if words[:1] != ["protocol"] or len(words) != 2 or words[1] not in ("ascii", "binary"):
                raise TranscriptError(f"{where}: expected '%protocol ascii|binary' or '%args FLAG...'")
            protocol = words[1]
            continue
        if raw.startswith("=="):
            words = raw[2:].split()
            if not words:
                raise TranscriptError(f"{where}: step without a name")
            name = words[0]
            if name in seen:
                raise TranscriptError(f"{where}: duplicate step name {name!r}")
            seen.add(name)
            step = Step(name=name, line=lineno)
            for opt in words[1:]:
                key, _, val = opt.partition("=")
                try:
                    if key == "timeout":
                        step.timeout = float(val)
                    elif key == "sleep":
                        step.sleep = float(val)
                    elif key == "quiet":
                        step.quiet = float(val)
                    elif key == "nosentinel" and not val:
                        step.sentinel = False
                    elif key == "reconnect" and not val:
                        step.reconnect = True
                    elif key == "deviation" and not val:
                        step.deviation = True
                    elif key == "mn":
                        step.mn = int(val)
                    else:
                        raise TranscriptError(f"{where}: unknown step option {opt!r}")
                except ValueError as e:
                    raise TranscriptError(f"{where}: bad option {opt!r}: {e}") from e
            steps.append(step)
            continue
        if not steps:
            raise TranscriptError(f"{where}: request line before the first '== step'")
        steps[-1].lines.append(raw)
    if not steps:
        raise TranscriptError(f"{path.name}: no steps")
    t = Transcript(path=path, protocol=protocol, steps=steps, args=args)
    # Expand every line once with dummy CAS values so syntax errors show at collection.
    dummy = CasMap()
    for s in t.steps:
        for i, ln in enumerate(s.lines):
            try:
                expand_line(ln, protocol, dummy, lenient=True)
            except TranscriptError as e:
                raise TranscriptError(f"{path.name}:{s.line + i + 1}: {e}") from e
    return t


class CasMap:
    """Raw CAS value <-> token by order of first appearance within one transcript run."""

    def __init__(self) -> None:
        self.by_raw: dict[int, int] = {}
        self.by_idx: list[int] = []

    def token(self, raw: int) -> str:
        if raw == 0:
            # 0 means "no CAS" on the wire; keep it literal, it is not a value.
            return "0"
        if raw not in self.by_raw:
            self.by_idx.append(raw)
            self.by_raw[raw] = len(self.by_idx)
        return f"<cas{self.by_raw[raw]}>"

    def raw(self, idx: int, lenient: bool) -> int:
        if 1 <= idx <= len(self.by_idx):
            return self.by_idx[idx - 1]
        if lenient:
            return 1
        raise TranscriptError(f"{{cas{idx}}} used before {idx} CAS values were seen")


_ESCAPES = {"r": b"\r", "n": b"\n", "t": b"\t", "0": b"\0", "\\": b"\\", '"': b'"'}


def unescape(text: str) -> bytes:
    """Decode ``\\r \\n \\t \\0 \\\\ \\" \\xHH``; other characters are UTF-8."""
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = text[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt]
            i += 2
        elif nxt == "x":
            hh = text[i + 2 : i + 4]
            try:
                out.append(int(hh, 16))
            except ValueError as e:
                raise TranscriptError(f"bad escape \\x{hh}") from e
            i += 4
        else:
            raise TranscriptError(f"unknown escape \\{nxt}")
    return bytes(out)


def expand_macros(text: str, cas: CasMap, lenient: bool) -> str:
    def sub(m: re.Match) -> str:
        if m.group("text") is not None:
            return m.group("text") * int(m.group("count"))
        value = cas.raw(int(m.group("idx")), lenient) + int(m.group("off") or 0)
        return str(value)

    return _MACRO.sub(sub, text)


def _bin_value(text: str) -> bytes:
    """A binary field: ``"quoted text"`` with escapes, ``hex:00ff..`` or a bare word."""
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        return unescape(text[1:-1])
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:].replace("_", ""))
        except ValueError as e:
            raise TranscriptError(f"bad hex {text!r}") from e
    return unescape(text)


def _split_fields(text: str) -> list[str]:
    """Split on spaces outside double quotes."""
    out, cur, inq, i = [], "", False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and inq and i + 1 < len(text):
            cur += text[i : i + 2]
            i += 2
            continue
        if ch == '"':
            inq = not inq
        if ch == " " and not inq:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    if inq:
        raise TranscriptError("unterminated quote")
    if cur:
        out.append(cur)
    return out


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError as e:
        raise TranscriptError(f"not a number: {text!r}") from e


def build_bin_request(text: str) -> bytes:
    words = _split_fields(text)
    if not words:
        raise TranscriptError("empty req")
    op = words[0].upper()
    if op in BIN_OPCODES:
        opcode = BIN_OPCODES[op]
    else:
        opcode = _int(words[0])
    f: dict[str, str] = {}
    for w in words[1:]:
        k, eq, v = w.partition("=")
        if not eq or k not in _REQ_FIELDS:
            raise TranscriptError(f"bad req field {w!r}")
        f[k] = v
    if "extras" in f:
        extras = _bin_value(f["extras"])
    elif op in _STORAGE_OPS:
        extras = struct.pack(">II", _int(f.get("flags", "0")), _int(f.get("exptime", "0")))
    elif op in _ARITH_OPS:
        extras = struct.pack(
            ">QQI",
            _int(f.get("delta", "1")),
            _int(f.get("initial", "0")),
            _int(f.get("exptime", "0")),
        )
    elif op in _EXPTIME_OPS or (op in ("FLUSH", "FLUSHQ") and "exptime" in f):
        extras = struct.pack(">I", _int(f.get("exptime", "0")))
    elif op == "VERBOSITY":
        extras = struct.pack(">I", _int(f.get("level", "0")))
    else:
        extras = b""
    return bin_packet(
        opcode,
        _bin_value(f.get("key", '""')),
        extras,
        _bin_value(f.get("value", '""')),
        magic=_int(f.get("magic", "0x80")),
        datatype=_int(f.get("datatype", "0")),
        vbucket=_int(f.get("vbucket", "0")),
        opaque=_int(f.get("opaque", "0")),
        cas=_int(f.get("cas", "0")),
        keylen=_int(f["keylen"]) if "keylen" in f else None,
        extlen=_int(f["extlen"]) if "extlen" in f else None,
        bodylen=_int(f["bodylen"]) if "bodylen" in f else None,
    )


def expand_line(line: str, protocol: str, cas: CasMap, lenient: bool = False) -> bytes:
    text = expand_macros(line, cas, lenient)
    if protocol == "ascii":
        if text.endswith("\\c") and not text.endswith("\\\\c"):
            return unescape(text[:-2])
        return unescape(text) + b"\r\n"
    kind, _, rest = text.partition(" ")
    if kind == "req":
        return build_bin_request(rest)
    if kind == "hex":
        try:
            return bytes.fromhex(rest)
        except ValueError as e:
            raise TranscriptError(f"bad hex line {rest!r}") from e
    if kind == "text":
        return unescape(rest)
    raise TranscriptError(f"binary transcript lines start with req, hex or text: {line!r}")


def count_mn_commands(request: bytes) -> int:
    """How many ``mn`` commands an ascii request holds (each answers ``MN\\r\\n``)."""
    return len(re.findall(rb"(?:^|(?<=\n))mn(?:[ \t][^\r\n]*)?\r?\n", request))


# --------------------------------------------------------------------------- normalising

_VALUE_CAS = re.compile(rb"^(VALUE \S+ \d+ \d+ )(\d+)(\r\n)$")
_META_LINE = re.compile(rb"^(HD|VA|EN|NF|NS|EX|MN)((?: [^\r\n]*)?)(\r\n)$")
_ME_CAS = re.compile(rb"^(ME .*cas=)(\d+)(.*\r\n)$")
_VERSION = re.compile(rb"^VERSION .*\r\n$")
_STAT = re.compile(rb"^STAT .*\r\n$")
_METADUMP = re.compile(rb"^(key=\S+ exp=)(-1|\d+)( la=)(\d+)( cas=)(\d+)( fetch=.*\n)$")


def _show(b: bytes, limit: int = 160) -> str:
    """Printable form of reply bytes: escapes for control bytes, long runs shortened."""
    s = repr(b)[2:-1]
    if len(s) > limit:
        s = f"{s[: limit // 2]}...({len(b)} bytes)...{s[-limit // 4 :]}"
    return s


def normalise_ascii(reply: bytes, cas: CasMap) -> list[str]:
    """Reply bytes -> list of printable lines with CAS/version/stats normalised."""
    out: list[str] = []
    in_stats = False
    for line in reply.splitlines(keepends=True):
        if _STAT.match(line):
            if not in_stats:
                out.append("STAT <stats>\\r\\n")
            in_stats = True
            continue
        in_stats = False
        m = _VALUE_CAS.match(line)
        if m:
            line = m.group(1) + cas.token(int(m.group(2))).encode() + m.group(3)
        elif (m := _METADUMP.match(line)) is not None:
            exp = m.group(2) if m.group(2) == b"-1" else b"<time>"
            line = (m.group(1) + exp + m.group(3) + b"<time>" + m.group(5)
                    + cas.token(int(m.group(6))).encode() + m.group(7))
        elif _VERSION.match(line):
            line = b"VERSION <version>\r\n"
        elif (m := _ME_CAS.match(line)) is not None:
            line = m.group(1) + cas.token(int(m.group(2))).encode() + m.group(3)
        elif (m := _META_LINE.match(line)) is not None:
            toks = m.group(2).split(b" ")
            for i, t in enumerate(toks):
                if re.fullmatch(rb"c\d+", t):
                    toks[i] = b"c" + cas.token(int(t[1:])).encode()
            line = m.group(1) + b" ".join(toks) + m.group(3)
        out.append(_show(line))
    return out


def normalise_binary(reply: bytes, cas: CasMap) -> list[str]:
    packets, rest = parse_bin_responses(reply)
    out: list[str] = []
    in_stats = False
    for p in packets:
        if p.opcode == BIN_OPCODES["STAT"] and p.key and p.status == 0:
            if not in_stats:
                out.append("RES STAT <stats>")
            in_stats = True
            continue
        in_stats = False
        value = p.value
        if p.opcode == BIN_OPCODES["VERSION"] and p.status == 0:
            value = b"<version>"
        op = BIN_OPNAMES.get(p.opcode, f"0x{p.opcode:02x}")
        status = BIN_STATUS.get(p.status, f"0x{p.status:04x}")
        parts = [f"RES {op} status={status} opaque=0x{p.opaque:x} cas={cas.token(p.cas)}"]
        if p.datatype:
            parts.append(f"datatype=0x{p.datatype:02x}")
        if p.extras:
            parts.append(f"extras=hex:{p.extras.hex()}")
        if p.key:
            parts.append(f'key="{_show(p.key)}"')
        if value:
            parts.append(f'value="{_show(value)}"')
        out.append(" ".join(parts))
    if rest:
        out.append(f"<unparsed {len(rest)} bytes: {_show(rest)}>")
    return out


# --------------------------------------------------------------------------- running

@dataclass
class StepResult:
    name: str
    request: bytes
    reply: bytes
    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines) if self.lines else "<no reply>"


class _Conn:
    def __init__(self, addr: tuple[str, int]):
        self.sock = socket.create_connection(addr, timeout=DEFAULT_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def recv_some(self, deadline: float) -> bytes | None:
        """Bytes, b"" on close, None on deadline."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        self.sock.settimeout(left)
        try:
            return self.sock.recv(1 << 20)
        except socket.timeout:
            return None
        except (ConnectionResetError, BrokenPipeError):
            return b""


def _ascii_done(buf: bytes, want_mn: int) -> bool:
    if not buf.endswith(ASCII_SENTINEL_REPLY):
        return False
    n = len(re.findall(rb"(?:^|(?<=\n))MN\r\n", buf))
    return n >= want_mn


def _bin_done(buf: bytes, opaque: int) -> int | None:
    """Offset where the sentinel NOOP reply starts, if it has arrived."""
    packets, _ = parse_bin_responses(buf)
    pos = 0
    for p in packets:
        size = 24 + len(p.extras) + len(p.key) + len(p.value)
        if p.opcode == BIN_OPCODES["NOOP"] and p.opaque == opaque:
            return pos
        pos += size
    return None


def run_transcript(t: Transcript, addr: tuple[str, int]) -> list[StepResult]:
    """Run every step of ``t`` against the server at ``addr``; never raises on replies."""
    cas = CasMap()
    results: list[StepResult] = []
    conn: _Conn | None = None
    timeouts = 0
    try:
        for idx, step in enumerate(t.steps):
            if timeouts >= MAX_TIMEOUTS:
                results.append(StepResult(step.name, b"", b"", ["<not run: earlier steps timed out>"]))
                continue
            if step.sleep:
                time.sleep(step.sleep)
            if step.reconnect and conn is not None:
                conn.close()
                conn = None
            if conn is None:
                try:
                    conn = _Conn(addr)
                except OSError as e:
                    results.append(StepResult(step.name, b"", b"", [f"<connect failed: {e}>"]))
                    continue
            try:
                request = b"".join(expand_line(ln, t.protocol, cas) for ln in step.lines)
            except TranscriptError as e:
                # E.g. {cas2} when the server returned fewer CAS values than memcached.
                results.append(StepResult(step.name, b"", b"", [f"<not sent: {e}>"]))
                continue
            opaque = SENTINEL_OPAQUE_BASE + idx
            wire = request
            if step.sentinel:
                if t.protocol == "ascii":
                    wire += ASCII_SENTINEL
                else:
                    wire += bin_packet(BIN_OPCODES["NOOP"], opaque=opaque)
            want_mn = (step.mn if step.mn is not None else count_mn_commands(request)) + 1
            try:
                conn.sock.sendall(wire)
            except OSError:
                # The server may have closed already; what it sent is still readable.
                pass
            buf = b""
            marker = None
            deadline = time.monotonic() + step.timeout
            while True:
                if step.sentinel:
                    if t.protocol == "ascii" and _ascii_done(buf, want_mn):
                        buf = buf[: -len(ASCII_SENTINEL_REPLY)]
                        break
                    if t.protocol == "binary":
                        cut = _bin_done(buf, opaque)
                        if cut is not None:
                            buf = buf[:cut]
                            break
                    chunk = conn.recv_some(deadline)
                else:
                    quiet_deadline = min(deadline, time.monotonic() + step.quiet)
                    chunk = conn.recv_some(quiet_deadline)
                    if chunk is None and time.monotonic() < deadline:
                        break  # quiet long enough: the step's reply is complete
                if chunk is None:
                    marker = TIMEOUT
                    timeouts += 1
                    break
                if chunk == b"":
                    marker = CLOSED
                    break
                buf += chunk
            if t.protocol == "ascii":
                lines = normalise_ascii(buf, cas)
            else:
                lines = normalise_binary(buf, cas)
            if marker is not None:
                lines.append(marker)
                conn.close()
                conn = None
            results.append(StepResult(step.name, request, buf, lines))
    finally:
        if conn is not None:
            conn.close()
    return results


def describe_request(request: bytes) -> str:
    return _show(request, limit=240)
