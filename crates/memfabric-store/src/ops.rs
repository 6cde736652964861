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
