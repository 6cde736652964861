//! What connections hold right now, summed over the server: the gauges behind the
//! per-connection bounds of docs/connections.md (`stats bounds`, and memcached's
//! `read_buf_*` / `response_obj_*` in `stats`).
//!
//! Each connection remembers what it last reported and adds only the difference after a
//! round of work (usually none: most rounds end with empty buffers), and takes all of it
//! back when it is dropped, so the sums are exact whenever no round is in progress.
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// One connection's holdings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Bytes of its read buffer.
    pub read_buf_bytes: i64,
    /// Reply bytes copied and not yet written.
    pub copied_out_bytes: i64,
    /// Values queued for writing from pinned item memory, and their unsent bytes.
    pub pinned_values: i64,
    pub pinned_bytes: i64,
    /// A value being received into item memory (0 or 1), and the item's size.
    pub receiving_values: i64,
    pub receiving_bytes: i64,
    /// Waiting for the client to read before running more of its requests (0 or 1).
    pub paused_on_output: i64,
    /// Commands whose reply is not ready yet (at most `exec::MAX_PARKED`).
    pub pending_commands: i64,
}

macro_rules! gauges {
    ($($field:ident),* $(,)?) => {
        /// Server-wide sums of every connection's [`Holdings`].
        #[derive(Debug, Default)]
        pub struct Gauges {
            $(pub $field: AtomicI64,)*
            /// Connections reporting (each has a read buffer).
            pub connections: AtomicI64,
        }

        impl Gauges {
            fn add(&self, h: &Holdings, sign: i64) {
                $(if h.$field != 0 {
                    self.$field.fetch_add(sign * h.$field, Ordering::Relaxed);
                })*
            }

            /// The sums as `stats` prints them.
            pub fn stats(&self) -> Vec<(String, String)> {
                let mut v = vec![(
                    "connections".to_string(),
                    self.connections.load(Ordering::Relaxed).to_string(),
                )];
                $(v.push((
                    stringify!($field).to_string(),
                    self.$field.load(Ordering::Relaxed).max(0).to_string(),
                ));)*
                v
            }
        }

        impl Holdings {
            fn minus(&self, o: &Holdings) -> Holdings {
                Holdings { $($field: self.$field - o.$field,)* }
            }
        }
    };
}

gauges!(
    read_buf_bytes,
    copied_out_bytes,
    pinned_values,
    pinned_bytes,
    receiving_values,
    receiving_bytes,
    paused_on_output,
    pending_commands,
);

/// A connection's share of the gauges; gives it back when dropped.
#[derive(Debug)]
pub struct Share {
    gauges: Arc<Gauges>,
    reported: Holdings,
}

impl Share {
    pub fn new(gauges: Arc<Gauges>) -> Share {
        gauges.connections.fetch_add(1, Ordering::Relaxed);
        Share {
            gauges,
            reported: Holdings::default(),
        }
    }

    /// Report what the connection holds now.
    pub fn update(&mut self, now: Holdings) {
        if now != self.reported {
            self.gauges.add(&now.minus(&self.reported), 1);
            self.reported = now;
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.gauges.add(&self.reported, -1);
        self.gauges.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
