//! Server addresses and server lists.
//!
//! One server is `[scheme://]host[:port[:weight]]`, libmemcached's `host:port:weight` form with
//! an optional scheme: `tcp://` (the default) or `ucx://`. The port defaults to 11211 and the
//! weight to 1. An IPv6 address is written in brackets: `[::1]:11211:2`. A list separates
//! servers with commas and/or whitespace: `10.0.0.1:11211,10.0.0.2:11211:2`.

use std::fmt;

use crate::error::Error;

/// memcached's default port.
pub const DEFAULT_PORT: u16 = 11211;

/// The transport a server is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Tcp,
    Ucx,
}

/// One server of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerAddr {
    pub scheme: Scheme,
    /// Host name or address as written (IPv6 without brackets). Ketama hashes this string.
    pub host: String,
    pub port: u16,
    /// Relative weight for weighted ketama (at least 1).
    pub weight: u32,
}

impl ServerAddr {
    pub fn tcp(host: &str, port: u16) -> Self {
        ServerAddr {
            scheme: Scheme::Tcp,
            host: host.to_string(),
            port,
            weight: 1,
        }
    }

    /// `host:port` (`[host]:port` for IPv6), the name used in errors and reports.
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Parses one server; see the module documentation for the form.
    pub fn parse(s: &str) -> Result<ServerAddr, Error> {
        let bad = |why: &str| Error::Config(format!("server {s:?}: {why}"));
        let s = s.trim();
        let (scheme, rest) = if let Some(r) = s.strip_prefix("tcp://") {
            (Scheme::Tcp, r)
        } else if let Some(r) = s.strip_prefix("ucx://") {
            (Scheme::Ucx, r)
        } else if s.contains("://") {
            return Err(bad("unknown scheme (tcp:// or ucx://)"));
        } else {
            (Scheme::Tcp, s)
        };
        let (host, tail) = if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(|| bad("missing ']'"))?;
            let tail = &r[end + 1..];
            if !tail.is_empty() && !tail.starts_with(':') {
                return Err(bad("expected ':' after ']'"));
            }
            (&r[..end], tail.strip_prefix(':').unwrap_or(""))
        } else {
            match rest.split_once(':') {
                Some((h, t)) => (h, t),
                None => (rest, ""),
            }
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let mut parts = if tail.is_empty() {
            Vec::new()
        } else {
            tail.split(':').collect()
        };
        if parts.len() > 2 {
            return Err(bad("expected host:port:weight"));
        }
        let weight = match parts.len() {
            2 => parts
                .pop()
                .unwrap()
                .parse::<u32>()
                .map_err(|_| bad("bad weight"))?,
            _ => 1,
        };
        if weight == 0 {
            return Err(bad("weight must be at least 1"));
        }
        let port = match parts.pop() {
            Some(p) => p.parse::<u16>().map_err(|_| bad("bad port"))?,
            None => DEFAULT_PORT,
        };
        if port == 0 {
            return Err(bad("port 0"));
        }
        Ok(ServerAddr {
            scheme,
            host: host.to_string(),
            port,
            weight,
        })
    }

    /// Parses a list of servers separated by commas and/or whitespace. All must share one scheme.
    pub fn parse_list(s: &str) -> Result<Vec<ServerAddr>, Error> {
        let list = s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|p| !p.is_empty())
            .map(ServerAddr::parse)
            .collect::<Result<Vec<_>, _>>()?;
        check_one_scheme(&list)?;
        Ok(list)
    }
}

/// A pool must use one transport for all its servers.
pub fn check_one_scheme(list: &[ServerAddr]) -> Result<(), Error> {
    match list.first() {
        Some(first) if list.iter().any(|a| a.scheme != first.scheme) => Err(Error::Config(
            "a pool must use one scheme (all tcp:// or all ucx://)".into(),
        )),
        _ => Ok(()),
    }
}

/// Two entries of `list` that name the same server (the same port of the same host,
/// with addresses compared as addresses and `localhost` as the loopback address), if any.
/// An IPv4 address counts in every form the system's resolver connects to (`127.1`,
/// `0x7f000001`, `2130706433`, `0177.0.0.1`: inet_aton's). Host names are compared as
/// written, case aside: names that resolve to one host are not looked up here.
pub fn same_server_twice(list: &[ServerAddr]) -> Option<(usize, usize)> {
    let canonical = |a: &ServerAddr| {
        let host = if a.host.eq_ignore_ascii_case("localhost") {
            "127.0.0.1".to_string()
        } else if let Ok(ip) = a.host.parse::<std::net::IpAddr>() {
            ip.to_canonical().to_string()
        } else if let Some(ip) = inet_aton(&a.host) {
            ip.to_string()
        } else {
            a.host.to_ascii_lowercase()
        };
        (host, a.port)
    };
    let keys: Vec<(String, u16)> = list.iter().map(canonical).collect();
    (0..keys.len()).find_map(|j| (0..j).find(|&i| keys[i] == keys[j]).map(|i| (i, j)))
}

/// An IPv4 address written as inet_aton(3) reads it, as glibc's resolver does for a
/// numeric host: one to four parts, each decimal, octal (leading `0`) or hex (`0x`); the
/// last part fills the bytes the others leave (`127.1` is 127.0.0.1).
fn inet_aton(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<u32> = host
        .split('.')
        .map(|p| {
            let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or(p.strip_prefix("0X")) {
                (h, 16)
            } else if p.len() > 1 && p.starts_with('0') {
                (&p[1..], 8)
            } else {
                (p, 10)
            };
            if digits.is_empty() && radix != 8 || !digits.chars().all(|c| c.is_digit(radix)) {
                return None;
            }
            u32::from_str_radix(digits, radix).ok()
        })
        .collect::<Option<_>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&p| p > 255) {
        return None;
    }
    let room = 32 - 8 * leading.len() as u32;
    if room < 32 && *last >> room != 0 {
        return None;
    }
    let high = leading
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, &p)| acc | p << (24 - 8 * i as u32));
    Some(std::net::Ipv4Addr::from(high | last))
}

impl fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scheme == Scheme::Ucx {
            f.write_str("ucx://")?;
        }
        f.write_str(&self.host_port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_weight_forms() {
        let a = ServerAddr::parse("127.0.0.1:11311:3").unwrap();
        assert_eq!(
            (a.scheme, a.host.as_str(), a.port, a.weight),
            (Scheme::Tcp, "127.0.0.1", 11311, 3)
        );
        let a = ServerAddr::parse("cache1").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.weight), ("cache1", 11211, 1));
        let a = ServerAddr::parse("ucx://[::1]:5000:2").unwrap();
        assert_eq!(
            (a.scheme, a.host.as_str(), a.port, a.weight),
            (Scheme::Ucx, "::1", 5000, 2)
        );
        assert_eq!(a.to_string(), "ucx://[::1]:5000");
        let a = ServerAddr::parse("tcp://h:1").unwrap();
        assert_eq!(a.host_port(), "h:1");
    }

    #[test]
    fn rejects_bad_servers() {
        for s in [
            "",
            ":1",
            "h:x",
            "h:1:0",
            "h:1:2:3",
            "http://h:1",
            "[::1",
            "h:0",
            "h:70000",
        ] {
            assert!(ServerAddr::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn the_same_server_listed_twice_is_found() {
        let twice = |s: &str| same_server_twice(&ServerAddr::parse_list(s).unwrap());
        assert_eq!(twice("a:1,b:1,c:1"), None);
        assert_eq!(twice("a:1,a:2"), None);
        assert_eq!(twice("a:1,b:1,a:1"), Some((0, 2)));
        assert_eq!(twice("Cache1:5,cache1:5"), Some((0, 1)));
        assert_eq!(twice("cache1,cache1:11211"), Some((0, 1)));
        assert_eq!(twice("127.0.0.1:5,localhost:5"), Some((0, 1)));
        assert_eq!(twice("[::ffff:10.0.0.1]:5,10.0.0.1:5:3"), Some((0, 1)));
        assert_eq!(twice("[::1]:5,[0:0:0:0:0:0:0:1]:5"), Some((0, 1)));
        assert_eq!(twice("ucx://h:5,ucx://h:6"), None);
        assert_eq!(twice("127.0.0.1:5,127.1:5"), Some((0, 1)));
        assert_eq!(twice("0x7f000001:5,localhost:5"), Some((0, 1)));
        assert_eq!(twice("2130706433:5,127.0.1:5"), Some((0, 1)));
        assert_eq!(twice("0177.0.0.1:5,127.0.0.1:5"), Some((0, 1)));
        assert_eq!(twice("10.1:5,10.0.0.2:5"), None);
        // Not numeric addresses: host names, compared as written.
        assert_eq!(twice("1.2.3.4.5:5,1.2.3.4:5"), None);
        assert_eq!(twice("08.1:5,8.1:5"), None);
        assert_eq!(twice("256.1:5,1.0.0.1:5"), None);
    }

    #[test]
    fn numeric_hosts_read_as_inet_aton_does() {
        let ip = |s: &str| inet_aton(s).map(|a| a.to_string());
        assert_eq!(ip("127.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(ip("0x7f.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(ip("10.0x10203").as_deref(), Some("10.1.2.3"));
        assert_eq!(ip("0").as_deref(), Some("0.0.0.0"));
        assert_eq!(ip("4294967295").as_deref(), Some("255.255.255.255"));
        for bad in [
            "4294967296",
            "1.16777216",
            "1.2.65536",
            "1.2.3.256",
            "",
            ".",
            "1.",
            "0x",
            "09",
            "a.b",
            "1.2.3.4.5",
            "-1",
        ] {
            assert_eq!(ip(bad), None, "{bad}");
        }
    }

    #[test]
    fn list_must_use_one_scheme() {
        assert_eq!(ServerAddr::parse_list("a:1, b:2,c:3:4").unwrap().len(), 3);
        assert!(ServerAddr::parse_list("tcp://a:1,ucx://b:2").is_err());
    }
}
