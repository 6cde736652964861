//! libmemcached's configuration language (`memcached()`, `libmemcached_check_configuration`,
//! the `LIBMEMCACHED` environment variable): options separated by spaces, each `--NAME` or
//! `--NAME=VALUE`, e.g. `--SERVER=10.0.0.1:11211/?2 --BINARY-PROTOCOL --CONNECT-TIMEOUT=50`.
//! Parsing is pure: the result is a list of servers and behaviour settings that
//! `memcached()` applies to a new pool. Fuzzed by `fuzz_targets/c_config.rs`.

use crate::hash::Hash;

/// One server of a configuration: host, port (0: the default), weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub host: String,
    pub port: u16,
    pub weight: u32,
}

/// What a configuration string asks for, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    pub servers: Vec<ServerSpec>,
    /// `(behaviour number, value)` in the order given.
    pub behaviors: Vec<(u32, u64)>,
    pub namespace: Option<String>,
}

/// `host[:port][/?weight]`, as `--SERVER=` takes it. An IPv6 address is written in
/// brackets: `[::1]:11211`.
pub fn parse_server(s: &str) -> Result<ServerSpec, String> {
    let (addr, weight) = match s.split_once("/?") {
        Some((a, w)) => (
            a,
            w.parse::<u32>()
                .map_err(|_| format!("bad weight in server {s:?}"))?,
        ),
        None => (s, 1),
    };
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or_else(|| format!("missing ']' in server {s:?}"))?;
        match tail.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if tail.is_empty() => (h, None),
            None => return Err(format!("bad server {s:?}")),
        }
    } else {
        match addr.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (addr, None),
        }
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
    {
        return Err(format!("bad host name in server {s:?}"));
    }
    let port = match port {
        Some(p) => p
            .parse::<u32>()
            .map_err(|_| format!("bad port in server {s:?}"))? as u16,
        None => 0,
    };
    Ok(ServerSpec {
        host: host.to_string(),
        port,
        weight,
    })
}

fn number(name: &str, v: Option<&str>) -> Result<u64, String> {
    v.ok_or_else(|| format!("--{name} needs a value"))?
        .parse::<u64>()
        .map_err(|_| format!("--{name}: not a number"))
}

fn flag(name: &str, v: Option<&str>) -> Result<u64, String> {
    match v {
        None => Ok(1),
        Some(_) => Err(format!("--{name} takes no value")),
    }
}

/// Parses a configuration string. Errors say what was wrong, as
/// `libmemcached_check_configuration` reports it.
pub fn parse(text: &str) -> Result<Parsed, String> {
    let mut out = Parsed::default();
    let mut any = false;
    for token in text.split_ascii_whitespace() {
        any = true;
        let body = token
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected {token:?}: options start with --"))?;
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let upper = name.to_ascii_uppercase();
        let mut behave = |b: u32, v: u64| out.behaviors.push((b, v));
        match upper.as_str() {
            "SERVER" => {
                let v = value.ok_or("--SERVER needs host[:port][/?weight]")?;
                out.servers.push(parse_server(v)?);
            }
            "SERVERS" => {
                let v = value.ok_or("--SERVERS needs a list")?;
                for s in v.split(',').filter(|s| !s.is_empty()) {
                    out.servers.push(parse_server(s)?);
                }
            }
            "SOCKET" => {
                return Err("--SOCKET: Unix sockets are not supported by libmemfabric".into())
            }
            "BINARY-PROTOCOL" => behave(18, flag(name, value)?),
            "BUFFER-REQUESTS" => behave(10, flag(name, value)?),
            "HASH-WITH-NAMESPACE" => behave(25, flag(name, value)?),
            "NOREPLY" => behave(26, flag(name, value)?),
            "RANDOMIZE-REPLICA-READ" => behave(30, flag(name, value)?),
            "SORT-HOSTS" => behave(12, flag(name, value)?),
            "SUPPORT-CAS" => behave(7, flag(name, value)?),
            "TCP-NODELAY" => behave(1, flag(name, value)?),
            "TCP-KEEPALIVE" => behave(32, flag(name, value)?),
            "USE-UDP" => behave(27, flag(name, value)?),
            "VERIFY-KEY" => behave(13, flag(name, value)?),
            "CONNECT-TIMEOUT" => behave(14, number(name, value)?),
            "IO-BYTES-WATERMARK" => behave(23, number(name, value)?),
            "IO-KEY-PREFETCH" => behave(24, number(name, value)?),
            "IO-MSG-WATERMARK" => behave(22, number(name, value)?),
            "NUMBER-OF-REPLICAS" => behave(29, number(name, value)?),
            "POLL-TIMEOUT" => behave(8, number(name, value)?),
            "RCV-TIMEOUT" => behave(20, number(name, value)?),
            "REMOVE-FAILED-SERVERS" => behave(35, number(name, value)?),
            "RETRY-TIMEOUT" => behave(15, number(name, value)?),
            "SERVER-FAILURE-LIMIT" => behave(21, number(name, value)?),
            "SND-TIMEOUT" => behave(19, number(name, value)?),
            "SOCKET-RECV-SIZE" => behave(5, number(name, value)?),
            "SOCKET-SEND-SIZE" => behave(4, number(name, value)?),
            "TCP-KEEPIDLE" => behave(33, number(name, value)?),
            "HASH" => {
                let v = value.ok_or("--HASH needs a hash name")?;
                let h = Hash::from_name(v).ok_or_else(|| format!("--HASH: unknown hash {v:?}"))?;
                behave(2, h as u64);
            }
            "DISTRIBUTION" => {
                let v = value.ok_or("--DISTRIBUTION needs a name")?;
                let (d, hash) = match v.split_once(',') {
                    Some((d, h)) => (d, Some(h)),
                    None => (v, None),
                };
                let dist = match d.to_ascii_lowercase().as_str() {
                    "modula" => 0,
                    "consistent" => 1,
                    "random" => 3,
                    "vbucket" => 6,
                    _ => return Err(format!("--DISTRIBUTION: unknown distribution {d:?}")),
                };
                behave(9, dist);
                if let Some(h) = hash {
                    let h = Hash::from_name(h)
                        .ok_or_else(|| format!("--DISTRIBUTION: unknown hash {h:?}"))?;
                    behave(17, h as u64);
                }
            }
            "NAMESPACE" => {
                let v = value.ok_or("--NAMESPACE needs a prefix")?;
                out.namespace = Some(v.trim_matches('"').to_string());
            }
            // Connection pool sizes (libmemcachedutil's pools): memfabric's pool has no
            // such bound, so they are accepted and have no effect.
            "POOL-MIN" | "POOL-MAX" => {
                number(name, value)?;
            }
            "CONFIGURE-FILE" => {
                return Err("--CONFIGURE-FILE is not supported by libmemfabric".into())
            }
            _ => return Err(format!("unknown option --{name}")),
        }
    }
    if !any {
        return Err("empty configuration".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_weights_and_options() {
        let p =
            parse("--SERVER=cache1.example:1 --SERVER=10.0.0.2:2/?3 --BINARY-PROTOCOL").unwrap();
        assert_eq!(p.servers.len(), 2);
        assert_eq!(
            p.servers[1],
            ServerSpec {
                host: "10.0.0.2".into(),
                port: 2,
                weight: 3
            }
        );
        assert_eq!(p.behaviors, vec![(18, 1)]);
        assert_eq!(parse_server("[::1]:5").unwrap().host, "::1");
        assert!(parse("").is_err());
        assert!(parse("--BOGUS").is_err());
        assert!(parse("--SERVER=a.b --HASH=bogus").is_err());
        assert!(parse("--SERVER=a.b,--TCP-NODELAY").is_err());
        assert!(parse("--SERVER=a.b --DISTRIBUTION=consistent,CRC").is_ok());
    }
}
