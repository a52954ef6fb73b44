//! Deterministic jitter offsets, one id or many.

use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

fn check_window(window_ms: i64) -> PyResult<u64> {
    u64::try_from(window_ms)
        .ok()
        .filter(|w| *w > 0)
        .ok_or_else(|| {
            PyValueError::new_err(format!("window_ms must be positive, got {window_ms}"))
        })
}

/// `int(sha256(job_id).hexdigest(), 16) % window_ms`.
#[pyfunction]
pub fn jitter_offset(job_id: &str, window_ms: i64) -> PyResult<i64> {
    let window = check_window(window_ms)?;
    Ok(pysched_core::jitter_offset_ms(job_id, window) as i64)
}

/// The offsets of many job ids in one window, as an int64 array.
#[pyfunction]
pub fn jitter_offsets<'py>(
    py: Python<'py>,
    job_ids: Vec<Bound<'py, PyString>>,
    window_ms: i64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let window = check_window(window_ms)?;
    let mut out = Vec::with_capacity(job_ids.len());
    for id in &job_ids {
        out.push(pysched_core::jitter_offset_ms(id.to_str()?, window) as i64);
    }
    Ok(out.into_pyarray(py))
}
