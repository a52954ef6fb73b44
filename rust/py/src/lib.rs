//! `pysched._native`: the pyo3 edge over `pysched-core`. Only `mod` lines and
//! the module table live here; each wrapper is a thin shim in its own file.

// pyo3 extracts arguments as owned values; borrowing them is not an option.
#![allow(clippy::needless_pass_by_value)]

mod buckets;
mod jitter;
mod wheel;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<wheel::TimingWheelRef>()?;
    m.add_function(wrap_pyfunction!(jitter::jitter_offset, m)?)?;
    m.add_function(wrap_pyfunction!(jitter::jitter_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::shard_for, m)?)?;
    m.add_function(wrap_pyfunction!(buckets::plan_buckets, m)?)?;
    m.add("TICK_MS", pysched_core::TickSource::DEFAULT_TICK_MS)?;
    Ok(())
}
