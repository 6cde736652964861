//! meta wire format.
