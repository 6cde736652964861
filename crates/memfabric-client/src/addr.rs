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
/// Host names are compared as written, case aside: names that resolve to one host are not
/// looked up here.
pub fn same_server_twice(list: &[ServerAddr]) -> Option<(usize, usize)> {
    let canonical = |a: &ServerAddr| {
        let host = if a.host.eq_ignore_ascii_case("localhost") {
            "127.0.0.1".to_string()
        } else if let Ok(ip) = a.host.parse::<std::net::IpAddr>() {
            ip.to_canonical().to_string()
        } else {
            a.host.to_ascii_lowercase()
        };
        (host, a.port)
    };
    let keys: Vec<(String, u16)> = list.iter().map(canonical).collect();
    (0..keys.len()).find_map(|j| (0..j).find(|&i| keys[i] == keys[j]).map(|i| (i, j)))
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
    }

    #[test]
    fn list_must_use_one_scheme() {
        assert_eq!(ServerAddr::parse_list("a:1, b:2,c:3:4").unwrap().len(), 3);
        assert!(ServerAddr::parse_list("tcp://a:1,ucx://b:2").is_err());
    }
}
