//! Bucket planning: run time -> (minute bucket, shard).

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

type Int64Array<'py> = Bound<'py, PyArray1<i64>>;

fn check_partitions(partitions: i64) -> PyResult<u32> {
    u32::try_from(partitions)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            PyValueError::new_err(format!("partitions must be in 1..2**32, got {partitions}"))
        })
}

/// `zlib.crc32(job_id.encode()) % partitions`.
#[pyfunction]
pub fn shard_for(job_id: &str, partitions: i64) -> PyResult<i64> {
    Ok(i64::from(pysched_core::shard_for(
        job_id,
        check_partitions(partitions)?,
    )))
}

/// `(run_at_ms // 60000, crc32(job_id) % partitions)` for each run, as two
/// int64 arrays.
#[pyfunction]
pub fn plan_buckets<'py>(
    py: Python<'py>,
    job_ids: Vec<Bound<'py, PyString>>,
    run_at_ms: PyReadonlyArray1<'py, i64>,
    partitions: i64,
) -> PyResult<(Int64Array<'py>, Int64Array<'py>)> {
    let parts = check_partitions(partitions)?;
    let run_at = run_at_ms.as_array();
    if job_ids.len() != run_at.len() {
        return Err(PyValueError::new_err(format!(
            "job_ids ({}) and run_at_ms ({}) differ in length",
            job_ids.len(),
            run_at.len()
        )));
    }
    let mut buckets = Vec::with_capacity(run_at.len());
    let mut shards = Vec::with_capacity(run_at.len());
    for (id, &at) in job_ids.iter().zip(run_at.iter()) {
        buckets.push(pysched_core::time_bucket(at));
        shards.push(i64::from(pysched_core::shard_for(id.to_str()?, parts)));
    }
    Ok((buckets.into_pyarray(py), shards.into_pyarray(py)))
}
