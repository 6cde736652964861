//! ascii wire format.
