//! udp wire format.
