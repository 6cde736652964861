//! Buffers owned by an operation for as long as UCX may touch them.
//!
//! Both traits are safe to implement: the runtime boxes the buffer *before* asking for its
//! slices and keeps the box until the operation completes, and the slices borrow the boxed
//! value, so they cannot dangle while UCX uses them.
use std::any::Any;

/// Memory a send reads from: one or more slices sent back to back.
pub trait SendBuf: Any {
    fn slices(&self) -> Vec<&[u8]>;
}

/// Memory a receive or an RMA read writes into: one or more slices filled in order.
pub trait RecvBuf: Any {
    fn slices_mut(&mut self) -> Vec<&mut [u8]>;
}

impl SendBuf for Vec<u8> {
    fn slices(&self) -> Vec<&[u8]> {
        vec![self.as_slice()]
    }
}

impl SendBuf for Box<[u8]> {
    fn slices(&self) -> Vec<&[u8]> {
        vec![&self[..]]
    }
}

impl RecvBuf for Vec<u8> {
    fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        vec![self.as_mut_slice()]
    }
}

impl RecvBuf for Box<[u8]> {
    fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        vec![&mut self[..]]
    }
}
