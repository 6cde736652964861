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

/// A send source whose owner can be let go before UCX is done with the memory, for sends
/// to a peer that may never finish them (UCX 1.13 can neither cancel an active-message
/// send nor, without peer-failure handling, fail it when its endpoint is closed).
///
/// The slices are taken from the owner once, when the value is made; [`Detach::detach`]
/// drops the owner at once (say, an item pin, so that the item's memory may be reused)
/// while UCX keeps the send and its pointers. The memory must stay mapped for as long as
/// UCX may read it (see [`Detachable::new`]); after a detach its bytes may change under a
/// late reader, who must be told not to trust them.
pub struct Detachable {
    owner: std::rc::Rc<std::cell::RefCell<Option<Box<dyn SendBuf>>>>,
    raw: Vec<(*const u8, usize)>,
    _mapped: Box<dyn Any>,
}

/// The handle that lets go of a [`Detachable`]'s owner.
pub struct Detach(std::rc::Weak<std::cell::RefCell<Option<Box<dyn SendBuf>>>>);

impl Detachable {
    /// Wrap `owner`; `mapped` is kept (never dropped early) and keeps the memory mapped.
    ///
    /// # Safety
    ///
    /// Every slice of `owner` must lie in memory that stays mapped and readable for as long
    /// as `mapped` lives, whether or not `owner` is alive (for example ranges of a mapping
    /// that `mapped` owns and never unmaps), so that UCX reading it after a detach reads
    /// mapped memory.
    pub unsafe fn new(owner: Box<dyn SendBuf>, mapped: Box<dyn Any>) -> (Detachable, Detach) {
        let raw = owner
            .slices()
            .iter()
            .map(|s| (s.as_ptr(), s.len()))
            .collect();
        let owner = std::rc::Rc::new(std::cell::RefCell::new(Some(owner)));
        let detach = Detach(std::rc::Rc::downgrade(&owner));
        (
            Detachable {
                owner,
                raw,
                _mapped: mapped,
            },
            detach,
        )
    }

    /// Whether the owner is still held (not detached).
    pub fn attached(&self) -> bool {
        self.owner.borrow().is_some()
    }
}

impl SendBuf for Detachable {
    fn slices(&self) -> Vec<&[u8]> {
        self.raw
            .iter()
            // SAFETY: the ranges were slices of the owner when this value was made, and
            // `new`'s contract keeps them mapped for as long as `_mapped` (a field of self)
            // lives, detached or not; they are only read.
            .map(|&(p, n)| unsafe { std::slice::from_raw_parts(p, n) })
            .collect()
    }
}

impl Detach {
    /// Drop the owner now. `true` if it was still held.
    pub fn detach(&self) -> bool {
        match self.0.upgrade() {
            Some(o) => o.borrow_mut().take().is_some(),
            None => false,
        }
    }
}

/// A pinned store item's value as a send source.
#[cfg(feature = "store-memory")]
struct PinnedValue(memfabric_store::PinnedItem);

#[cfg(feature = "store-memory")]
impl SendBuf for PinnedValue {
    fn slices(&self) -> Vec<&[u8]> {
        self.0.value_slices()
    }
}

#[cfg(feature = "store-memory")]
impl Detachable {
    /// Send a pinned item's value straight from the store's arena. `store` keeps the store
    /// (and so its arena mapping, which a store never unmaps while it lives) alive for as
    /// long as UCX may read, whether or not the pin is detached first.
    ///
    /// Panics if the value does not lie in `store`'s arena (the pin came from another
    /// store): sending it could then read memory nothing keeps mapped.
    pub fn from_pinned_item<S>(
        pin: memfabric_store::PinnedItem,
        store: std::sync::Arc<S>,
    ) -> (Detachable, Detach)
    where
        S: AsRef<memfabric_store::Store> + 'static,
    {
        let (base, len) = store.as_ref().as_ref().arena_region();
        let (base, end) = (base as usize, base as usize + len);
        let inside = pin.value_slices().iter().all(|s| {
            let at = s.as_ptr() as usize;
            at >= base && at + s.len() <= end
        });
        assert!(inside, "a pinned value outside its store's arena");
        // SAFETY: every slice of the value lies in the arena of the store that `store`
        // owns (checked above); the store keeps that mapping until it is dropped, and the
        // Detachable keeps `store` until UCX is done with the send.
        unsafe { Detachable::new(Box::new(PinnedValue(pin)), Box::new(store)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::Arc;

    /// Sends `bytes`, a shared allocation; records when it is dropped.
    struct View {
        bytes: Arc<Vec<u8>>,
        dropped: Rc<Cell<bool>>,
    }

    impl SendBuf for View {
        fn slices(&self) -> Vec<&[u8]> {
            vec![&self.bytes[..]]
        }
    }

    impl Drop for View {
        fn drop(&mut self) {
            self.dropped.set(true);
        }
    }

    #[test]
    fn detach_drops_the_owner_and_keeps_the_slices_readable() {
        let dropped = Rc::new(Cell::new(false));
        let backing = Arc::new(vec![7u8; 16]);
        let owner = View {
            bytes: Arc::clone(&backing),
            dropped: Rc::clone(&dropped),
        };
        // SAFETY: the slices are `backing`'s allocation, which `mapped` keeps alive.
        let (d, h) = unsafe { Detachable::new(Box::new(owner), Box::new(backing)) };
        assert!(d.attached());
        assert!(h.detach());
        assert!(dropped.get());
        assert!(!d.attached());
        assert!(!h.detach());
        assert_eq!(d.slices()[0], &[7u8; 16][..]);
    }
}
