//! memfabric-bench
