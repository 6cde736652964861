//! memfabric-bench: the project's benchmark suite.
//!
//! Where a request goes: [`workload`] picks the op, key and value; [`load`] runs the closed
//! loop over a [`transport::Transport`] (TCP text protocol, encoded by [`textproto`], or
//! memfabricd's UCX data path through memfabric-client, [`ucx`]); [`metrics`] records latencies in HDR histograms and reads server CPU
//! from /proc; [`report`] and [`plot`] present them; [`compare`] runs memcached and
//! memfabricd ([`server`]) side by side; [`latency`] is the ohb_memlat-style sweep;
//! [`hybrid`] measures RAM + flash tiers under a working set larger than both.

pub mod bursty;
pub mod compare;
pub mod compare_report;
pub mod hybrid;
pub mod latency;
pub mod load;
pub mod metrics;
pub mod plot;
pub mod report;
pub mod resilience;
pub mod responder;
pub mod rng;
pub mod scale;
pub mod server;
pub mod textproto;
pub mod transport;
pub mod ucx;
pub mod workload;
pub mod ycsb;
