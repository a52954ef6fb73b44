//! The native core of pysched, free of Python: the hierarchical timing wheel
//! that holds the near-term runs, deterministic jitter, and bucket planning.
//!
//! Everything here is plain Rust so that `cargo test` runs without an
//! interpreter; the pyo3 crate in `rust/py` is a thin edge over it.

pub mod buckets;
pub mod jitter;
pub mod source;
pub mod wheel;

pub use buckets::{shard_for, time_bucket};
pub use jitter::jitter_offset_ms;
pub use source::TickSource;
pub use wheel::{InsertError, Inserted, Wheel};
