//! Request encoding: the canonical bytes of a `Request` (clients and tests send them).

use super::*;

impl Request<'_> {
    /// Which command this is.
    pub fn verb(&self) -> Verb {
        match self {
            Request::Get { cas: false, .. } => Verb::Get,
            Request::Get { cas: true, .. } => Verb::Gets,
            Request::Gat { cas: false, .. } => Verb::Gat,
            Request::Gat { cas: true, .. } => Verb::Gats,
            Request::Store(s) => Verb::Store(s.cmd),
            Request::StoreTooLarge { cmd, .. } => Verb::Store(*cmd),
            Request::Delete { .. } => Verb::Delete,
            Request::Arith { incr: true, .. } => Verb::Incr,
            Request::Arith { incr: false, .. } => Verb::Decr,
            Request::Touch { .. } => Verb::Touch,
            Request::FlushAll { .. } => Verb::FlushAll,
            Request::Stats(_) => Verb::Stats,
            Request::Version => Verb::Version,
            Request::Verbosity { .. } => Verb::Verbosity,
            Request::Quit => Verb::Quit,
            Request::Shutdown { .. } => Verb::Shutdown,
            Request::CacheMemlimit { .. } => Verb::CacheMemlimit,
            Request::SlabsReassign { .. } | Request::SlabsAutomove { .. } => Verb::Slabs,
            Request::LruCrawler(_) => Verb::LruCrawler,
            Request::LruTune { .. } | Request::LruMode { .. } | Request::LruTempTtl { .. } => {
                Verb::Lru
            }
            Request::Watch { .. } => Verb::Watch,
            Request::RefreshCerts { .. } => Verb::RefreshCerts,
            Request::Extstore { .. } => Verb::Extstore,
            Request::Meta => Verb::Meta,
            Request::Invalid { verb, .. } => *verb,
        }
    }

    /// Append the canonical wire form of this request (data block included). Requests
    /// that only a parser produces (`Invalid`, `StoreTooLarge`, `Meta`) and admin
    /// commands carrying values that do not round-trip are refused.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), NotEncodable> {
        let noreply_suffix = |out: &mut Vec<u8>, noreply: bool| {
            if noreply {
                out.extend_from_slice(b" noreply");
            }
            out.extend_from_slice(b"\r\n");
        };
        match *self {
            Request::Get { keys, cas } => {
                out.extend_from_slice(if cas { b"gets" } else { b"get" });
                push_keys(out, keys);
            }
            Request::Gat { exptime, keys, cas } => {
                out.extend_from_slice(if cas { b"gats " } else { b"gat " });
                push_i64(out, exptime.into());
                push_keys(out, keys);
            }
            Request::Store(s) => {
                out.extend_from_slice(s.cmd.name().as_bytes());
                out.push(b' ');
                out.extend_from_slice(s.key);
                out.push(b' ');
                push_u64(out, s.flags.into());
                out.push(b' ');
                push_i64(out, s.exptime.into());
                out.push(b' ');
                push_u64(out, s.value.len() as u64);
                if s.cmd == StoreCmd::Cas {
                    out.push(b' ');
                    push_u64(out, s.cas);
                }
                noreply_suffix(out, s.noreply);
                out.extend_from_slice(s.value);
                out.extend_from_slice(b"\r\n");
            }
            Request::Delete { key, noreply } => {
                out.extend_from_slice(b"delete ");
                out.extend_from_slice(key);
                noreply_suffix(out, noreply);
            }
            Request::Arith {
                incr,
                key,
                delta,
                noreply,
            } => {
                out.extend_from_slice(if incr { b"incr " } else { b"decr " });
                out.extend_from_slice(key);
                out.push(b' ');
                push_u64(out, delta);
                noreply_suffix(out, noreply);
            }
            Request::Touch {
                key,
                exptime,
                noreply,
            } => {
                out.extend_from_slice(b"touch ");
                out.extend_from_slice(key);
                out.push(b' ');
                push_i64(out, exptime.into());
                noreply_suffix(out, noreply);
            }
            Request::FlushAll { delay, noreply } => {
                out.extend_from_slice(b"flush_all");
                if delay != 0 {
                    out.push(b' ');
                    push_i64(out, delay.into());
                }
                noreply_suffix(out, noreply);
            }
            Request::Stats(s) => {
                out.extend_from_slice(b"stats");
                let sub: &[u8] = match s {
                    StatsRequest::General => b"",
                    StatsRequest::Reset => b" reset",
                    StatsRequest::Detail(DetailCmd::On) => b" detail on",
                    StatsRequest::Detail(DetailCmd::Off) => b" detail off",
                    StatsRequest::Detail(DetailCmd::Dump) => b" detail dump",
                    StatsRequest::Cachedump(None) => b" cachedump",
                    StatsRequest::Cachedump(Some((class, limit))) => {
                        out.extend_from_slice(b" cachedump ");
                        out.extend_from_slice(class);
                        out.push(b' ');
                        limit
                    }
                    StatsRequest::Group(g) => {
                        out.push(b' ');
                        g
                    }
                };
                out.extend_from_slice(sub);
                out.extend_from_slice(b"\r\n");
            }
            Request::Version => out.extend_from_slice(b"version\r\n"),
            Request::Quit => out.extend_from_slice(b"quit\r\n"),
            Request::Verbosity { level, noreply } => {
                out.extend_from_slice(b"verbosity ");
                push_u64(out, level.into());
                noreply_suffix(out, noreply);
            }
            Request::Shutdown { graceful: Some(g) } => out.extend_from_slice(if g {
                &b"shutdown graceful\r\n"[..]
            } else {
                b"shutdown\r\n"
            }),
            Request::CacheMemlimit { megabytes, noreply } => {
                out.extend_from_slice(b"cache_memlimit ");
                push_u64(out, megabytes.into());
                noreply_suffix(out, noreply);
            }
            Request::Watch { noreply } => {
                out.extend_from_slice(b"watch");
                noreply_suffix(out, noreply);
            }
            Request::RefreshCerts { noreply } => {
                out.extend_from_slice(b"refresh_certs");
                if noreply {
                    out.extend_from_slice(b" noreply");
                }
                out.extend_from_slice(b"\r\n");
            }
            Request::Extstore { setting, value } => {
                out.extend_from_slice(b"extstore ");
                out.extend_from_slice(setting);
                out.push(b' ');
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
            _ => return Err(NotEncodable),
        }
        Ok(())
    }
}

fn push_keys(out: &mut Vec<u8>, keys: Keys<'_>) {
    for k in keys.iter() {
        out.push(b' ');
        out.extend_from_slice(k);
    }
    out.extend_from_slice(b"\r\n");
}
