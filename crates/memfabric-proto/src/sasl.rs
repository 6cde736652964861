//! SASL on memcached's binary protocol (`-S`): the mechanism name memfabricd offers and
//! the PLAIN message (RFC 4616) as Cyrus SASL's PLAIN server, which memcached uses,
//! reads it.
//!
//! A PLAIN message is `authzid NUL authcid NUL password`. Cyrus refuses one without both
//! separators or with an empty authcid, and one whose authzid is neither empty nor the
//! authcid (memcached has no proxy authorization). The password is every byte after the
//! second NUL, NULs included.

/// The one mechanism memfabricd offers, as `SASL_LIST_MECHS` answers it.
pub const MECHANISMS: &[u8] = b"PLAIN";

/// The longest mechanism name memcached reads (`MAX_SASL_MECH_LEN`): a longer one is
/// "Invalid arguments".
pub const MECH_MAX_LEN: usize = 32;

/// A PLAIN message, split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plain<'a> {
    /// Who logs in.
    pub user: &'a [u8],
    pub password: &'a [u8],
}

/// Whether `mech` (the request's key) names PLAIN. memcached hands the key to Cyrus as a
/// C string, so it ends at a NUL; Cyrus compares names without regard to case.
pub fn is_plain(mech: &[u8]) -> bool {
    let name = &mech[..mech.iter().position(|&b| b == 0).unwrap_or(mech.len())];
    name.eq_ignore_ascii_case(b"PLAIN")
}

/// Splits a PLAIN message; `None` for one Cyrus's PLAIN server refuses before looking
/// the user up.
pub fn parse_plain(message: &[u8]) -> Option<Plain<'_>> {
    let first = message.iter().position(|&b| b == 0)?;
    let (authzid, rest) = (&message[..first], &message[first + 1..]);
    let second = rest.iter().position(|&b| b == 0)?;
    let (user, password) = (&rest[..second], &rest[second + 1..]);
    if user.is_empty() || !(authzid.is_empty() || authzid == user) {
        return None;
    }
    Some(Plain { user, password })
}

/// A PLAIN message for `user` and `password` (a client's side; tests).
pub fn plain_message(user: &[u8], password: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(user.len() + password.len() + 2);
    m.push(0);
    m.extend_from_slice(user);
    m.push(0);
    m.extend_from_slice(password);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_message_is_authzid_user_password() {
        let p = parse_plain(b"\0alice\0secret").unwrap();
        assert_eq!((p.user, p.password), (&b"alice"[..], &b"secret"[..]));
        // The authzid may repeat the user.
        assert!(parse_plain(b"alice\0alice\0secret").is_some());
        // The password is everything after the second NUL.
        assert_eq!(parse_plain(b"\0a\0p\0q").unwrap().password, b"p\0q");
        assert_eq!(parse_plain(b"\0a\0").unwrap().password, b"");
        assert_eq!(
            parse_plain(&plain_message(b"u", b"p w")).unwrap().password,
            b"p w"
        );
    }

    #[test]
    fn cyrus_refuses_these() {
        assert!(parse_plain(b"").is_none());
        assert!(parse_plain(b"alice\0secret").is_none(), "one separator");
        assert!(parse_plain(b"\0\0secret").is_none(), "no user");
        assert!(
            parse_plain(b"bob\0alice\0secret").is_none(),
            "another authzid"
        );
    }

    #[test]
    fn mechanism_names_as_cyrus_compares_them() {
        assert!(is_plain(b"PLAIN"));
        assert!(is_plain(b"plain"));
        assert!(is_plain(b"PLAIN\0junk"));
        assert!(!is_plain(b"PLAIN "));
        assert!(!is_plain(b"CRAM-MD5"));
        assert!(!is_plain(b""));
    }
}
