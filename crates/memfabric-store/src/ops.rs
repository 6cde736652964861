//! memcached's storage commands on top of `Store`/`Txn`.

/// Which storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// `cas`: store only if the item's CAS equals the given value.
    Cas,
}

/// Result of a storage command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStatus {
    Stored {
        cas: u64,
    },
    NotStored,
    /// CAS mismatch.
    Exists,
    /// `cas` on a missing key.
    NotFound,
    TooLarge,
    OutOfMemory,
}

/// Result of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteStatus {
    Deleted,
    NotFound,
    /// CAS given and it did not match.
    Exists,
}

/// Result of incr/decr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithStatus {
    /// New value and new CAS (or the initial value when the item was created).
    Value {
        value: u64,
        cas: u64,
    },
    NotFound,
    /// The stored value is not a decimal number memcached can increment.
    NonNumeric,
    /// CAS given and it did not match.
    Exists,
    OutOfMemory,
}

/// A command's result and the slab class of the live item it found under its key (None
/// when there was none). memcached counts its per-class hits (`stats slabs`: `get_hits`,
/// `delete_hits`, `incr_hits`, `cas_hits`, `cas_badval`, `touch_hits`, ...) against the
/// class of that item, so the executors need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<S> {
    pub status: S,
    pub class_id: Option<u8>,
}

impl<S> Found<S> {
    /// An outcome decided before any item was looked at (refused, or nothing there).
    pub fn unfound(status: S) -> Found<S> {
        Found {
            status,
            class_id: None,
        }
    }
}

use crate::store::{AllocError, ArithOptions, ItemInfo, LinkOptions, NewItem, Store, Txn};

impl From<AllocError> for StoreStatus {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::TooLarge => StoreStatus::TooLarge,
            AllocError::OutOfMemory => StoreStatus::OutOfMemory,
        }
    }
}

/// How a supplied CAS compares with the item's (memcached's `cas_res`).
#[derive(PartialEq, Eq)]
enum CasCheck {
    None,
    Match,
    BadVal,
}

fn cas_check(given: u64, item_cas: u64) -> CasCheck {
    if given == 0 {
        CasCheck::None
    } else if given == item_cas {
        CasCheck::Match
    } else {
        CasCheck::BadVal
    }
}

impl Store {
    /// set/add/replace/append/prepend/cas with memcached's semantics. `cas` is the value
    /// to compare (0 = none): binary set/add/replace with a CAS behave as `Cas`.
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> StoreStatus {
        self.store_found(mode, key, value, flags, exptime, cas)
            .status
    }

    /// `store`, also telling the class of the item that was under the key.
    pub fn store_found(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> Found<StoreStatus> {
        if matches!(mode, SetMode::Append | SetMode::Prepend) {
            return self.concat(mode, key, value, flags, cas);
        }
        // memcached allocates before it looks at the key: a too-large or out-of-memory
        // item fails that way even when `add` would not have stored it.
        let mut item = match self.alloc(key, value.len(), flags, exptime) {
            Ok(it) => it,
            Err(e) => return Found::unfound(e.into()),
        };
        item.write(0, value);
        self.store_item_found(mode, item, cas)
    }

    /// Store a prefilled `NewItem` (large values received straight into item memory).
    /// Append and prepend copy the old value and the item's into a new item.
    pub fn store_item<'s>(&'s self, mode: SetMode, item: NewItem<'s>, cas: u64) -> StoreStatus {
        self.store_item_found(mode, item, cas).status
    }

    /// `store_item`, also telling the class of the item that was under the key.
    pub fn store_item_found<'s>(
        &'s self,
        mode: SetMode,
        item: NewItem<'s>,
        cas: u64,
    ) -> Found<StoreStatus> {
        let mode = match mode {
            SetMode::Set | SetMode::Add | SetMode::Replace if cas != 0 => SetMode::Cas,
            m => m,
        };
        let key = item.key();
        let body = |t: &mut Txn<'s>| {
            let cur = t.item();
            let class_id = cur.map(|i| i.class_id);
            let status = match (mode, cur) {
                (SetMode::Add, Some(_)) => {
                    // memcached bumps the existing item's recency.
                    t.mark_referenced();
                    StoreStatus::NotStored
                }
                // On flash, and no memory to bring it back: it exists all the same.
                (SetMode::Add, None) if t.held_on_flash() => StoreStatus::NotStored,
                (SetMode::Replace | SetMode::Append | SetMode::Prepend, None) => {
                    StoreStatus::NotStored
                }
                (SetMode::Cas, None) => StoreStatus::NotFound,
                (SetMode::Append | SetMode::Prepend, Some(old)) => {
                    let mut added = Vec::with_capacity(item.value_len());
                    item.read_value(&mut added);
                    drop(item);
                    concat_locked(t, mode, &old, &added, cas)
                }
                (SetMode::Cas, Some(old)) => {
                    if cas_check(cas, old.cas) == CasCheck::Match && old.cas != 0 {
                        StoreStatus::Stored {
                            cas: t.link(item, LinkOptions::default()),
                        }
                    } else {
                        StoreStatus::Exists
                    }
                }
                _ => StoreStatus::Stored {
                    cas: t.link(item, LinkOptions::default()),
                },
            };
            Found { status, class_id }
        };
        // A plain SET needs nothing of what it replaces: a flash copy is not read back.
        if mode == SetMode::Set {
            self.transact_replacing(&key, body)
        } else {
            self.transact(&key, body)
        }
    }

    /// A plain set of `value`, unless `keep_old` (run under the key's locks, given the
    /// live item's value as slices of item memory) says that what the key holds stays:
    /// then nothing is stored (`NotStored`) and the old item counts as referenced, as
    /// `add` leaves it. A copy of the key on flash is brought back to RAM to be judged.
    pub fn store_found_unless(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        keep_old: impl FnOnce(&[&[u8]]) -> bool,
    ) -> Found<StoreStatus> {
        let mut item = match self.alloc(key, value.len(), flags, exptime) {
            Ok(it) => it,
            Err(e) => return Found::unfound(e.into()),
        };
        item.write(0, value);
        self.store_item_unless(item, keep_old)
    }

    /// `store_found_unless` of an item already filled.
    pub(crate) fn store_item_unless<'s>(
        &'s self,
        item: NewItem<'s>,
        keep_old: impl FnOnce(&[&[u8]]) -> bool,
    ) -> Found<StoreStatus> {
        let key = item.key();
        self.transact(&key, |t| {
            let class_id = t.item().map(|i| i.class_id);
            if t.with_value_slices(keep_old) == Some(true) {
                t.mark_referenced();
                return Found {
                    status: StoreStatus::NotStored,
                    class_id,
                };
            }
            Found {
                status: StoreStatus::Stored {
                    cas: t.link(item, LinkOptions::default()),
                },
                class_id,
            }
        })
    }

    /// append/prepend: keep the old item's flags and exptime.
    fn concat(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        cas: u64,
    ) -> Found<StoreStatus> {
        // The new data alone must fit, as memcached allocates it first.
        match self.alloc(key, value.len(), flags, 0) {
            Ok(probe) => drop(probe),
            Err(e) => return Found::unfound(e.into()),
        }
        self.transact(key, |t| match t.item() {
            Some(old) => Found {
                status: concat_locked(t, mode, &old, value, cas),
                class_id: Some(old.class_id),
            },
            None => Found::unfound(StoreStatus::NotStored),
        })
    }

    /// delete; `cas` 0 = unconditional.
    pub fn delete(&self, key: &[u8], cas: u64) -> DeleteStatus {
        self.delete_found(key, cas).status
    }

    /// `delete`, also telling the class of the item that was under the key.
    pub fn delete_found(&self, key: &[u8], cas: u64) -> Found<DeleteStatus> {
        self.transact(key, |t| {
            let cur = t.item();
            let status = match cur {
                // On flash, and no memory to bring it back: removed where it is.
                None => match t.held_on_flash_cas() {
                    Some(held) if cas_check(cas, held) == CasCheck::BadVal => DeleteStatus::Exists,
                    Some(_) => {
                        t.drop_held_on_flash();
                        DeleteStatus::Deleted
                    }
                    None => DeleteStatus::NotFound,
                },
                Some(old) if cas_check(cas, old.cas) == CasCheck::BadVal => DeleteStatus::Exists,
                Some(_) => {
                    t.unlink();
                    DeleteStatus::Deleted
                }
            };
            Found {
                status,
                class_id: cur.map(|i| i.class_id),
            }
        })
    }

    /// incr (`incr = true`, wraps at 2^64) or decr (floors at 0). A shorter result is
    /// padded with spaces to the old length, as memcached does in place.
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64, opts: &ArithOptions) -> ArithStatus {
        self.arith_found(key, incr, delta, opts).status
    }

    /// `arith`, also telling the class of the item that was under the key (the one
    /// memcached counts `incr_hits`/`decr_hits` against, not the rewritten one).
    pub fn arith_found(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        opts: &ArithOptions,
    ) -> Found<ArithStatus> {
        self.transact(key, |t| {
            let class_id = t.item().map(|i| i.class_id);
            let status = arith_locked(t, incr, delta, opts);
            Found { status, class_id }
        })
    }

    /// Set a new absolute exptime. Returns false on a miss.
    pub fn touch(&self, key: &[u8], exptime: u32) -> bool {
        self.touch_found(key, exptime).is_some()
    }

    /// `touch`, returning the class of the touched item (None on a miss).
    pub fn touch_found(&self, key: &[u8], exptime: u32) -> Option<u8> {
        self.transact(key, |t| {
            let info = t.item()?;
            t.set_exptime(exptime);
            t.mark_fetched();
            Some(info.class_id)
        })
    }
}

impl Txn<'_> {
    /// incr/decr of the key's item under its bucket locks, as memcached's `do_add_delta`
    /// does it: one implementation for every protocol (`Store::arith`, and meta's `ma`,
    /// which also sets a TTL in the same transaction). On a miss with `opts.create`, the
    /// item is made with the initial value; `OutOfMemory` then means that item could not
    /// be.
    pub fn arith(&mut self, incr: bool, delta: u64, opts: &ArithOptions) -> ArithStatus {
        arith_locked(self, incr, delta, opts)
    }
}

/// incr/decr under the key's bucket locks (see `Txn::arith`).
fn arith_locked(t: &mut Txn<'_>, incr: bool, delta: u64, opts: &ArithOptions) -> ArithStatus {
    let Some(old) = t.item() else {
        let Some((initial, flags, exptime)) = opts.create else {
            return ArithStatus::NotFound;
        };
        let digits = initial.to_string();
        let mut it = match t.alloc(digits.len(), flags, exptime) {
            Ok(it) => it,
            Err(_) => return ArithStatus::OutOfMemory,
        };
        it.write(0, digits.as_bytes());
        let cas = t.link(it, LinkOptions::default());
        return ArithStatus::Value {
            value: initial,
            cas,
        };
    };
    // memcached refuses an empty or chunked value before it compares the CAS.
    if old.value_len == 0 || old.chunked {
        return ArithStatus::NonNumeric;
    }
    if opts.cas != 0 && opts.cas != old.cas {
        return ArithStatus::Exists;
    }
    let mut raw = Vec::with_capacity(old.value_len as usize);
    t.read_value(&mut raw);
    let Some(current) = parse_counter(&raw) else {
        return ArithStatus::NonNumeric;
    };
    let value = if incr {
        current.wrapping_add(delta)
    } else {
        current.saturating_sub(delta)
    };
    let mut digits = value.to_string().into_bytes();
    // memcached rewrites a number that fits in place (blanking the rest): the item stays
    // what it was (fetched, stale, its win token, its key's encoding) and no store is
    // counted. A longer one is a new item, counted in `total_items`, that knows none of
    // that. (Here both are new items, for the one-sided readers; the marks carry over.)
    let in_place = digits.len() <= raw.len();
    if digits.len() < raw.len() {
        digits.resize(raw.len(), b' ');
    }
    let mut it = match t.alloc(digits.len(), old.flags, old.exptime) {
        Ok(it) => it,
        Err(_) => return ArithStatus::OutOfMemory,
    };
    it.write(0, &digits);
    let marks = LinkOptions {
        explicit_cas: None,
        stale: in_place && old.stale,
        token_sent: in_place && old.token_sent,
        fetched: in_place && old.fetched,
    };
    let cas = t.link_counted(it, marks, !in_place);
    if in_place && old.key_binary {
        t.set_key_binary(true);
    }
    ArithStatus::Value { value, cas }
}

/// append/prepend `value` to the live item `old` (bucket locks held): a new item with
/// the old one's flags and exptime replaces it.
fn concat_locked(
    t: &mut Txn<'_>,
    mode: SetMode,
    old: &ItemInfo,
    value: &[u8],
    cas: u64,
) -> StoreStatus {
    if cas_check(cas, old.cas) == CasCheck::BadVal {
        return StoreStatus::Exists;
    }
    let mut old_value = Vec::with_capacity(old.value_len as usize);
    t.read_value(&mut old_value);
    if t.sealed(&old_value) {
        return StoreStatus::NotStored;
    }
    let mut it = match t.alloc(old_value.len() + value.len(), old.flags, old.exptime) {
        Ok(it) => it,
        Err(_) => return StoreStatus::NotStored,
    };
    if mode == SetMode::Append {
        it.write_parts(&[&old_value, value]);
    } else {
        it.write_parts(&[value, &old_value]);
    }
    StoreStatus::Stored {
        cas: t.link(it, LinkOptions::default()),
    }
}

/// memcached's `safe_strtoull` on an item's data, which it hands over as a C string (it
/// ends at the first NUL): optional leading whitespace, an optional sign, digits, then
/// whitespace or the end; overflow is rejected, and so is a result that is negative as a
/// signed number when the string holds a `-` anywhere (memcached's `strchr`); an empty
/// value is not a number.
pub fn parse_counter(raw: &[u8]) -> Option<u64> {
    let raw = &raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())];
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let mut i = raw.iter().take_while(|&&b| space(b)).count();
    let mut negative = false;
    if let Some(&sign @ (b'+' | b'-')) = raw.get(i) {
        negative = sign == b'-';
        i += 1;
    }
    let digits_start = i;
    let mut v: u64 = 0;
    while let Some(&d @ b'0'..=b'9') = raw.get(i) {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        i += 1;
    }
    if i == digits_start {
        return None;
    }
    // What follows the number must be whitespace (memcached's data ends in "\r\n").
    if raw.get(i).is_some_and(|&b| !space(b)) {
        return None;
    }
    // strtoull negates a `-` number.
    let v = if negative { v.wrapping_neg() } else { v };
    if (v as i64) < 0 && raw.contains(&b'-') {
        return None;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::parse_counter;

    #[test]
    fn counters_parse_like_memcached() {
        assert_eq!(parse_counter(b"10"), Some(10));
        assert_eq!(parse_counter(b"9 "), Some(9));
        // Checked against memcached 1.6.18: the data is a C string, and a `-` anywhere
        // in it refuses a number that looks negative.
        assert_eq!(parse_counter(b"5\0x"), Some(5));
        assert_eq!(parse_counter(b"\x005"), None);
        assert_eq!(parse_counter(b"\t0"), Some(0));
        assert_eq!(parse_counter(b"-0"), Some(0));
        assert_eq!(parse_counter(b"-18446744073709551615"), Some(1));
        assert_eq!(parse_counter(b"18446744073709551615 -"), None);
        assert_eq!(parse_counter(b"9223372036854775808 x-"), None);
        assert_eq!(parse_counter(b"9223372036854775808\0-"), Some(1 << 63));
        assert_eq!(parse_counter(b" 7"), Some(7));
        assert_eq!(parse_counter(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_counter(b"18446744073709551616"), None);
        assert_eq!(parse_counter(b"12abc"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"-1"), None);
        assert_eq!(parse_counter(b"-0"), Some(0));
        assert_eq!(parse_counter(b"abc"), None);
    }
}
