//! binary wire format.
