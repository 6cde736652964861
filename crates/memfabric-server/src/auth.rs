//! memcached's ASCII authentication file (`-Y FILE`, `--auth-file`): `user:password`
//! lines, read at start (a file memcached would refuse stops memfabricd too, with
//! memcached's message) and again on SIGHUP (a reload that fails keeps the table in
//! use, as memcached's does). The handshake that uses it is `exec/auth.rs`.
use std::sync::RwLock;

use memfabric_proto::same_secret as same;

/// memcached keeps at most this many entries (later lines are ignored; memfabricd says
/// so at start).
pub const MAX_ENTRIES: usize = 8;
/// memcached reads an entry with a 256-byte buffer: a longer line is not one entry.
pub const MAX_LINE: usize = 255;

struct Credential {
    user: Vec<u8>,
    pass: Vec<u8>,
}

/// The loaded table.
pub struct AuthFile {
    path: String,
    users: RwLock<Vec<Credential>>,
}

/// The path and the number of entries; never the credentials.
impl std::fmt::Debug for AuthFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.users.read().map_or(0, |u| u.len());
        f.debug_struct("AuthFile")
            .field("path", &self.path)
            .field("entries", &entries)
            .finish()
    }
}

/// A table read from a file, and whether lines past `MAX_ENTRIES` were left out.
struct Parsed {
    users: Vec<Credential>,
    truncated: bool,
}

impl AuthFile {
    /// Reads `path`; the error is the message memcached prints for the same file.
    pub fn load(path: &str) -> Result<(AuthFile, Option<String>), String> {
        let parsed = read(path)?;
        let warning = parsed.truncated.then(|| {
            format!(
                "authfile [{path}] has more than {MAX_ENTRIES} entries: only the first \
                 {MAX_ENTRIES} are used (as memcached does)"
            )
        });
        Ok((
            AuthFile {
                path: path.to_string(),
                users: RwLock::new(parsed.users),
            },
            warning,
        ))
    }

    /// A table from `text` (a file's contents) named `name`; `None` when memcached
    /// would call it malformed. For tests and fuzzing.
    pub fn from_text(name: &str, text: &[u8]) -> Option<AuthFile> {
        parse(text).map(|p| AuthFile {
            path: name.to_string(),
            users: RwLock::new(p.users),
        })
    }

    /// The file, as given to `-Y`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Reads the file again (SIGHUP). On failure the old table stays.
    pub fn reload(&self) -> Result<usize, String> {
        let parsed = read(&self.path)?;
        let n = parsed.users.len();
        if let Ok(mut users) = self.users.write() {
            *users = parsed.users;
        }
        Ok(n)
    }

    /// Whether `user` is an entry whose password satisfies `proves` (the UCX bootstrap's
    /// proof: a MAC computed with it). Every entry of that name is tried.
    pub fn verify(&self, user: &[u8], proves: impl Fn(&[u8]) -> bool) -> bool {
        let Ok(users) = self.users.read() else {
            return false;
        };
        let mut found = false;
        let mut tried = false;
        for c in users.iter() {
            if same(&c.user, user) {
                tried = true;
                found |= proves(&c.pass);
            }
        }
        if !tried {
            // As much work for an unknown name as for a known one: the time taken does
            // not say which names exist.
            let _ = proves(b"");
        }
        found
    }

    /// Whether `user` and `pass` are an entry.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> bool {
        self.verify(user, |p| same(p, pass))
    }
}

fn read(path: &str) -> Result<Parsed, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("Could not open authfile [{path}] for reading, error {e}"))?;
    parse(&bytes).ok_or_else(|| {
        format!("Authfile [{path}] has a malformed entry. Should be 'user:password'")
    })
}

/// memcached's reading: each line is `user:password`, the user up to the first `:`, the
/// password up to the line's end (`\r`, `\n` or a NUL); a line without `:` (an empty
/// one too) makes the whole file malformed. `None` when malformed, and for a line
/// longer than memcached's buffer.
fn parse(bytes: &[u8]) -> Option<Parsed> {
    let mut users = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let end = rest.iter().position(|&b| b == b'\n');
        let line = &rest[..end.unwrap_or(rest.len())];
        rest = end.map_or(&[][..], |e| &rest[e + 1..]);
        if line.len() > MAX_LINE {
            return None;
        }
        let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
        let colon = line.iter().position(|&b| b == b':')?;
        let pass = &line[colon + 1..];
        let pass = &pass[..pass.iter().position(|&b| b == b'\r').unwrap_or(pass.len())];
        if users.len() == MAX_ENTRIES {
            return Some(Parsed {
                users,
                truncated: true,
            });
        }
        users.push(Credential {
            user: line[..colon].to_vec(),
            pass: pass.to_vec(),
        });
    }
    Some(Parsed {
        users,
        truncated: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &[u8]) -> Option<AuthFile> {
        parse(text).map(|p| AuthFile {
            path: String::new(),
            users: RwLock::new(p.users),
        })
    }

    #[test]
    fn entries_are_user_colon_password_lines() {
        let t = table(b"alice:secret\nbob:pw:with:colons\r\ncarol:\n").unwrap();
        assert!(t.check(b"alice", b"secret"));
        assert!(t.check(b"bob", b"pw:with:colons"));
        assert!(t.check(b"carol", b""));
        assert!(!t.check(b"alice", b"secre"));
        assert!(!t.check(b"alice", b"secrets"));
        assert!(!t.check(b"bob", b"secret"));
        // No final newline: the last entry is whole.
        assert!(table(b"dave:pw").unwrap().check(b"dave", b"pw"));
    }

    #[test]
    fn memcached_refuses_what_we_refuse() {
        assert!(table(b"nocolon\n").is_none());
        assert!(
            table(b"alice:secret\n\nbob:pw\n").is_none(),
            "an empty line"
        );
        let long = [b"u:".as_slice(), &[b'p'; 300]].concat();
        assert!(table(&long).is_none());
        assert!(table(b"").unwrap().users.read().unwrap().is_empty());
    }

    #[test]
    fn only_eight_entries_count() {
        let text: String = (0..10).map(|i| format!("u{i}:p{i}\n")).collect();
        let p = parse(text.as_bytes()).unwrap();
        assert!(p.truncated);
        assert_eq!(p.users.len(), MAX_ENTRIES);
    }
}
