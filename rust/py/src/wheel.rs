//! The Python handle on a [`Wheel`]: arrays in, arrays out.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pysched_core::{InsertError, Wheel};

/// A hierarchical timing wheel (10 ms ticks; 5.12 s / 43.7 min / 15.5 days).
#[pyclass(name = "TimingWheel", module = "pysched._native")]
pub struct TimingWheelRef {
    inner: Wheel,
    due: Vec<i64>,
}

#[pymethods]
impl TimingWheelRef {
    #[new]
    fn new(now_ms: i64) -> Self {
        Self {
            inner: Wheel::new(now_ms),
            due: Vec::new(),
        }
    }

    /// Schedules `handle` at `due_ms`; False when that time has already
    /// passed (the caller fires it now).
    fn insert(&mut self, handle: i64, due_ms: i64) -> bool {
        self.inner.insert(handle, due_ms).is_ok()
    }

    /// Schedules many runs at once; returns the handles that were already
    /// due, in input order, for the caller to fire now.
    fn insert_batch<'py>(
        &mut self,
        py: Python<'py>,
        handles: PyReadonlyArray1<'py, i64>,
        due_ms: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let handles = handles.as_array();
        let due_ms = due_ms.as_array();
        if handles.len() != due_ms.len() {
            return Err(PyValueError::new_err(format!(
                "handles ({}) and due_ms ({}) differ in length",
                handles.len(),
                due_ms.len()
            )));
        }
        let mut expired = Vec::new();
        for (&handle, &due) in handles.iter().zip(due_ms.iter()) {
            if let Err(InsertError::Expired) = self.inner.insert(handle, due) {
                expired.push(handle);
            }
        }
        Ok(expired.into_pyarray(py))
    }

    /// Removes a handle; False when it was not in the wheel.
    fn cancel(&mut self, handle: i64) -> bool {
        self.inner.cancel(handle)
    }

    /// Moves to `now_ms`; returns the due handles in (due, handle) order.
    fn advance<'py>(&mut self, py: Python<'py>, now_ms: i64) -> Bound<'py, PyArray1<i64>> {
        self.due.clear();
        self.inner.advance(now_ms, &mut self.due);
        PyArray1::from_slice(py, &self.due)
    }

    /// Bytes held by the wheel's native storage.
    fn memory_bytes(&self) -> usize {
        self.inner.memory_bytes()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __contains__(&self, handle: i64) -> bool {
        self.inner.contains(handle)
    }
}
