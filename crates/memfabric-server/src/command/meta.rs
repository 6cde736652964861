//! Commands only meta has: a store whose CAS is compared up front (with the invalidation
//! mode that keeps an older value as stale), a delete that compares or invalidates, and
//! the counting and unlinking around them that memcached's meta path does.
use memfabric_store::{AllocError, DeleteStatus, LinkOptions, NewItem, SetMode, StoreStatus, Txn};

use crate::counters::ClassStat;
use crate::shared::ExecCtx;

/// An `ms`: the value travels separately.
pub struct MetaStore<'k> {
    pub key: &'k [u8],
    pub mode: SetMode,
    pub flags: u32,
    /// Absolute exptime (0 = never).
    pub exptime: u32,
    /// `C`: compare with this CAS first.
    pub cas: Option<u64>,
    /// `I`: with a CAS older than the item's, store the value but mark it stale.
    pub invalidate: bool,
    /// `b`: the key came base64-encoded (echoed that way on later hits).
    pub base64_key: bool,
    /// `K` (memfabricd's): a plain set of an erasure-coded fragment keeps a fragment of
    /// a newer write that the key holds (as the UCX path's `FLAG_KEEP_NEWER_WRITE`).
    pub keep_newer_write: bool,
}

/// memcached's meta path counts `cmd_set` once the data block has been read, before it is
/// checked or stored.
pub fn count_set(ctx: &ExecCtx<'_>, key_len: usize, data_len: usize) {
    let class = ctx.shared.store.item_class(key_len, data_len);
    ctx.stats.count(ClassStat::SetCmds, class);
}

impl MetaStore<'_> {
    /// A plain set under `K`: its refusal leaves the key's item alone (it may be a
    /// fragment of a newer write, which this set was not to replace; before its data is
    /// read nobody knows whether the value is a fragment at all).
    fn keeps_newer(&self) -> bool {
        self.keep_newer_write && self.mode == SetMode::Set && self.cas.is_none()
    }
}

/// An `ms` refused before its data was read (larger than any item can be), or at store
/// time. memcached unlinks the old value, so that a client cannot go on reading data it
/// meant to replace; not under `K`.
pub fn refuse_too_large(ctx: &ExecCtx<'_>, a: &MetaStore<'_>) {
    ctx.stats.store_too_large.incr();
    if !a.keeps_newer() {
        unlink(ctx, a.key);
    }
}

/// An `ms` whose item could not be allocated; as [`refuse_too_large`].
pub fn refuse_no_memory(ctx: &ExecCtx<'_>, a: &MetaStore<'_>) {
    ctx.stats.store_no_memory.incr();
    if !a.keeps_newer() {
        unlink(ctx, a.key);
    }
}

/// `ms`: store `data` as `a` says. Counts CAS outcomes and refusals as memcached does.
/// Also gives the stripe of the newer write a `K` set found and kept (0 when none was:
/// the status, `NotStored` then, says what happened).
pub fn store(ctx: &ExecCtx<'_>, a: &MetaStore<'_>, data: &[u8]) -> (StoreStatus, u64) {
    let store = &ctx.shared.store;
    // `K` applies to a plain set of a value that is a fragment; anything else is stored
    // as its flags say.
    let fragment = if a.keeps_newer() {
        super::fragment_write(data)
    } else {
        None
    };
    let (status, kept) = match (a.cas, fragment) {
        (Some(cas), _) => (store_compared(ctx, a, cas, data), 0),
        (None, Some(new)) => {
            let (found, kept) = super::set_unless_newer(ctx, a.key, data, a.flags, a.exptime, new);
            (found.status, kept)
        }
        (None, None) => (store.store(a.mode, a.key, data, a.flags, a.exptime, 0), 0),
    };
    match status {
        StoreStatus::Stored { cas } if a.base64_key => {
            // The CAS identifies the item this command stored.
            store.transact(a.key, |t| {
                if t.item().is_some_and(|i| i.cas == cas) {
                    t.set_key_binary(true);
                }
            });
        }
        StoreStatus::TooLarge => refuse_too_large(ctx, a),
        StoreStatus::OutOfMemory => refuse_no_memory(ctx, a),
        _ => {}
    }
    (status, kept)
}

/// An `md`.
pub struct MetaDelete {
    /// `C`: only if the item's CAS is this (unlike the classic delete, `C0` compares too).
    pub cas: Option<u64>,
    /// `I`: keep the item but mark it stale under a new CAS (the next reader wins the
    /// recache), with `exptime` (absolute) if given.
    pub invalidate: bool,
    pub exptime: Option<u32>,
}

/// `md`: delete, compare-and-delete or invalidate. `Deleted` also reports an
/// invalidation. Counts as memcached does (a CAS mismatch is a miss).
pub fn delete(ctx: &ExecCtx<'_>, key: &[u8], a: &MetaDelete) -> DeleteStatus {
    if a.cas.is_none() && !a.invalidate {
        return match super::delete(ctx, key, 0) {
            DeleteStatus::Exists => DeleteStatus::NotFound,
            other => other,
        };
    }
    let stats = ctx.stats;
    ctx.shared.store.transact(key, |t| {
        let Some(item) = t.item() else {
            stats.delete_misses.incr();
            return DeleteStatus::NotFound;
        };
        if a.cas.is_some_and(|c| c != item.cas) {
            stats.delete_misses.incr();
            return DeleteStatus::Exists;
        }
        if a.invalidate {
            if let Some(exptime) = a.exptime {
                t.set_exptime(exptime);
            }
            t.set_marks(Some(true), Some(false));
            t.bump_cas(None);
        } else {
            t.unlink();
            stats.count(ClassStat::DeleteHits, Some(item.class_id));
        }
        DeleteStatus::Deleted
    })
}

/// memcached unlinks the old value when a store fails for size or memory, so that a
/// client cannot go on reading data it meant to replace.
fn unlink(ctx: &ExecCtx<'_>, key: &[u8]) {
    ctx.shared.store.transact(key, |t| {
        t.unlink();
    });
}

/// A new item for the transaction's key holding `parts` back to back.
fn fill<'s>(
    t: &Txn<'s>,
    flags: u32,
    exptime: u32,
    parts: &[&[u8]],
) -> Result<NewItem<'s>, AllocError> {
    let len = parts.iter().map(|p| p.len()).sum();
    t.alloc(len, flags, exptime).map(|mut item| {
        item.write_parts(parts);
        item
    })
}

/// How a supplied CAS compares with the item's (memcached's `cas_res`).
#[derive(PartialEq, Eq)]
enum CasRes {
    None,
    Match,
    /// Older than the item's, with `I`: stored, but marked stale.
    Stale,
    BadVal,
}

/// `ms` with `C`: memcached's `do_store_item` with the CAS compared up front, including
/// the invalidation mode (`I`) that stores an older value as stale.
fn store_compared(ctx: &ExecCtx<'_>, a: &MetaStore<'_>, req_cas: u64, data: &[u8]) -> StoreStatus {
    let stats = ctx.stats;
    let (mode, exptime) = (a.mode, a.exptime);
    // A compare turns set and replace into cas; add and append/prepend keep their mode.
    let is_cas = matches!(mode, SetMode::Set | SetMode::Replace);
    let alloc_failed = |e: AllocError| match e {
        AllocError::TooLarge => StoreStatus::TooLarge,
        AllocError::OutOfMemory => StoreStatus::OutOfMemory,
    };
    ctx.shared.store.transact(a.key, |t| {
        let Some(old) = t.item() else {
            return match mode {
                SetMode::Add => match fill(t, a.flags, exptime, &[data]) {
                    Ok(item) => StoreStatus::Stored {
                        cas: t.link(item, LinkOptions::default()),
                    },
                    Err(e) => alloc_failed(e),
                },
                _ if is_cas => {
                    stats.cas_misses.incr();
                    StoreStatus::NotFound
                }
                _ => StoreStatus::NotStored,
            };
        };
        let res = if req_cas == 0 {
            CasRes::None
        } else if req_cas == old.cas {
            CasRes::Match
        } else if a.invalidate && is_cas && req_cas < old.cas {
            CasRes::Stale
        } else {
            CasRes::BadVal
        };
        match mode {
            SetMode::Add => StoreStatus::NotStored,
            SetMode::Append | SetMode::Prepend => {
                if res != CasRes::None && res != CasRes::Match {
                    return StoreStatus::Exists;
                }
                let mut old_value = Vec::with_capacity(old.value_len as usize);
                t.read_value(&mut old_value);
                // A fragment of a coded value is not appended to (`StoreConfig::sealed`).
                if t.sealed(&old_value) {
                    return StoreStatus::NotStored;
                }
                let parts: [&[u8]; 2] = if mode == SetMode::Append {
                    [&old_value, data]
                } else {
                    [data, &old_value]
                };
                // memcached answers NOT_STORED when the combined item cannot be made.
                match fill(t, old.flags, old.exptime, &parts) {
                    Ok(item) => StoreStatus::Stored {
                        cas: t.link(item, LinkOptions::default()),
                    },
                    Err(_) => StoreStatus::NotStored,
                }
            }
            _ => match res {
                CasRes::Match => match fill(t, a.flags, exptime, &[data]) {
                    Ok(item) => {
                        stats.count(ClassStat::CasHits, Some(old.class_id));
                        StoreStatus::Stored {
                            cas: t.link(item, LinkOptions::default()),
                        }
                    }
                    Err(e) => alloc_failed(e),
                },
                CasRes::Stale => {
                    // The stale value keeps the old TTL and any win token already out.
                    match fill(t, a.flags, old.exptime, &[data]) {
                        Ok(item) => {
                            stats.count(ClassStat::CasHits, Some(old.class_id));
                            let opts = LinkOptions {
                                explicit_cas: None,
                                stale: true,
                                token_sent: old.token_sent,
                                fetched: false,
                            };
                            StoreStatus::Stored {
                                cas: t.link(item, opts),
                            }
                        }
                        Err(e) => alloc_failed(e),
                    }
                }
                CasRes::None | CasRes::BadVal => {
                    stats.count(ClassStat::CasBadval, Some(old.class_id));
                    StoreStatus::Exists
                }
            },
        }
    })
}

/// Result of the arithmetic itself, before the reply.
pub enum ArithDone {
    Value { value: u64, cas: u64, created: bool },
    NotFound,
    Exists,
    NonNumeric,
    NoMemory,
    VivifyNoMemory,
}
