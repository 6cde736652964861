//! Who may connect: memcached's ASCII authentication file (`-Y FILE`, `--auth-file`):
//! `user:password` lines, read at start (a file memcached would refuse stops memfabricd
//! too, with memcached's message) and again on SIGHUP (a reload that fails keeps the
//! table in use, as memcached's does); the handshake that uses it is `exec/auth.rs`. And
//! the SASL password file (`-S` with `MEMCACHED_SASL_PWDB`, [`SaslPwdb`]) that binary
//! SASL PLAIN (`exec/sasl.rs`) checks against. The UCX bootstrap proves either
//! ([`Users`]).
use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, RwLock};

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

/// memcached's SASL password database (`MEMCACHED_SASL_PWDB`, memcached built with
/// `--enable-sasl-pwdb`): `user:password` lines, read again at every attempt (so an edit
/// takes effect at once, as in memcached). Matching is memcached's: the first line that
/// starts with `user:` decides (lines are read in memcached's 255-byte buffer: longer
/// ones as several), and [`SaslPwdb::check`] says when a password matches it.
#[derive(Debug)]
pub struct SaslPwdb {
    path: String,
}

/// memcached's buffer for one line of the SASL password file, terminator included.
const PWDB_ENTRY_MAX: usize = 256;
/// The most of the file read per attempt: a user further down is not found.
const PWDB_READ_MAX: u64 = 1 << 20;

impl SaslPwdb {
    /// The file named by `MEMCACHED_SASL_PWDB`; an error when it cannot be read now.
    pub fn open(path: &str) -> Result<SaslPwdb, String> {
        std::fs::File::open(path).map_err(|e| {
            format!("-S: cannot read the SASL password file MEMCACHED_SASL_PWDB={path}: {e}")
        })?;
        Ok(SaslPwdb {
            path: path.to_string(),
        })
    }

    /// What follows `user:` in `user`'s entry (to the end of its line), if the file has
    /// one.
    fn entry_of(&self, user: &[u8]) -> Option<Vec<u8>> {
        let file = std::fs::File::open(&self.path).ok()?;
        entry_in(BufReader::new(file.take(PWDB_READ_MAX)), user)
    }

    /// Whether `user` has an entry whose password satisfies `proves` (the UCX
    /// bootstrap's MAC). The password is the entry up to its first `:`, `\r` or newline.
    pub fn verify(&self, user: &[u8], proves: impl Fn(&[u8]) -> bool) -> bool {
        match self.entry_of(user) {
            Some(rest) => {
                let end = rest
                    .iter()
                    .position(|&b| matches!(b, b':' | b'\r' | b'\n'))
                    .unwrap_or(rest.len());
                proves(&rest[..end])
            }
            None => {
                let _ = proves(b"");
                false
            }
        }
    }

    /// Whether `user` and `pass` are an entry, by memcached's rule
    /// (`sasl_server_userdb_checkpass`): the entry's text starts with `pass`, and what
    /// follows it is `:`, `\r`, a newline or the end. So `bob:pw:extra` accepts `pw`
    /// and `pw:extra`.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> bool {
        // memcached gives up on a user and password together longer than its buffer.
        if user.len() + pass.len() > PWDB_ENTRY_MAX - 4 {
            return false;
        }
        let Some(rest) = self.entry_of(user) else {
            // As much comparing for an unknown name as for a known one.
            let _ = same(pass, pass);
            return false;
        };
        let Some(head) = rest.get(..pass.len()) else {
            return false;
        };
        same(head, pass) & matches!(rest.get(pass.len()), None | Some(b':' | b'\r' | b'\n'))
    }
}

/// memcached's search of the SASL password file (`fgets` into a 256-byte buffer, each
/// read a C string): the first line that starts with `user:` decides; what follows the
/// colon in it.
fn entry_in(mut file: impl BufRead, user: &[u8]) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(PWDB_ENTRY_MAX);
    loop {
        line.clear();
        // One `fgets`: up to the newline, at most 255 bytes.
        let n = (&mut file)
            .take(PWDB_ENTRY_MAX as u64 - 1)
            .read_until(b'\n', &mut line)
            .ok()?;
        if n == 0 {
            return None;
        }
        // A C string: a NUL ends it.
        let text = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
        if text.len() > user.len() && text.starts_with(user) && text[user.len()] == b':' {
            return Some(text[user.len() + 1..].to_vec());
        }
    }
}

/// The credentials a server checks: the `-Y` table or the `-S` password file. The UCX
/// bootstrap proves either.
#[derive(Clone, Debug)]
pub enum Users {
    AuthFile(Arc<AuthFile>),
    SaslPwdb(Arc<SaslPwdb>),
}

impl Users {
    /// Whether `user` has an entry whose password satisfies `proves`.
    pub fn verify(&self, user: &[u8], proves: impl Fn(&[u8]) -> bool) -> bool {
        match self {
            Users::AuthFile(t) => t.verify(user, proves),
            Users::SaslPwdb(t) => t.verify(user, proves),
        }
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

    fn pwdb(text: &[u8], user: &[u8]) -> Option<Vec<u8>> {
        entry_in(text, user)
    }

    #[test]
    fn the_sasl_password_file_is_searched_as_memcached_does() {
        let f = b"alice:secret\nbob:pw:extra\r\ncarol:\nalice:second\ndave:pw";
        assert_eq!(
            pwdb(f, b"alice").unwrap(),
            b"secret\n",
            "the first entry decides"
        );
        assert_eq!(pwdb(f, b"bob").unwrap(), b"pw:extra\r\n");
        assert_eq!(pwdb(f, b"carol").unwrap(), b"\n");
        assert_eq!(pwdb(f, b"dave").unwrap(), b"pw", "no final newline");
        assert_eq!(pwdb(f, b"ali"), None, "a prefix of a user is not the user");
        assert_eq!(pwdb(f, b"eve"), None);
        // A line past the buffer is read as two: its second part can be an entry.
        let long = [&[b'x'; 255][..], b"zed:pw\n"].concat();
        assert_eq!(pwdb(&long, b"zed").unwrap(), b"pw\n");
    }

    #[test]
    fn a_password_matches_as_memcached_matches_it() {
        let path = std::env::temp_dir().join(format!("memfabric-pwdb-rule-{}", std::process::id()));
        std::fs::write(&path, b"bob:pw:extra\ncarol:\ndave:pw").unwrap();
        let db = SaslPwdb::open(path.to_str().unwrap()).unwrap();
        assert!(db.check(b"bob", b"pw"));
        assert!(db.check(b"bob", b"pw:extra"), "memcached's prefix rule");
        assert!(!db.check(b"bob", b"pw:ex"));
        assert!(!db.check(b"bob", b"p"));
        assert!(!db.check(b"bob", b"pw:extra:more"));
        assert!(db.check(b"carol", b""));
        assert!(db.check(b"dave", b"pw"), "the end of the file ends it");
        assert!(!db.check(b"dave", b"pwx"));
        // The UCX proof uses the password up to the first colon.
        assert!(db.verify(b"bob", |p| p == b"pw"));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_sasl_password_file_is_read_at_every_attempt() {
        let dir = std::env::temp_dir().join(format!("memfabric-pwdb-{}", std::process::id()));
        std::fs::write(&dir, b"alice:one\n").unwrap();
        let db = SaslPwdb::open(dir.to_str().unwrap()).unwrap();
        assert!(db.check(b"alice", b"one"));
        assert!(!db.check(b"alice", b"on"));
        assert!(!db.check(b"alice", b"one\0"));
        std::fs::write(&dir, b"alice:two\n").unwrap();
        assert!(db.check(b"alice", b"two"));
        assert!(!db.check(b"alice", b"one"));
        std::fs::remove_file(&dir).unwrap();
        assert!(
            !db.check(b"alice", b"two"),
            "a file that is gone refuses everyone"
        );
        assert!(SaslPwdb::open(dir.to_str().unwrap()).is_err());
    }

    #[test]
    fn only_eight_entries_count() {
        let text: String = (0..10).map(|i| format!("u{i}:p{i}\n")).collect();
        let p = parse(text.as_bytes()).unwrap();
        assert!(p.truncated);
        assert_eq!(p.users.len(), MAX_ENTRIES);
    }
}
