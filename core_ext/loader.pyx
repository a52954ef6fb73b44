# cython: language_level=3, boundscheck=False, wraparound=False
"""Batch bucket loading: rows of a store page -> the arrays the wheel takes.

A page arrives from the store as a sequence of ``pysched.protocols.Run``
rows: run_id in column 0, due_ms in column 3. Rows due at or after
``horizon_ms`` belong to a later load and are left out. ``pysched._reference.loader`` is the twin.
"""

import numpy as np

from libc.stdint cimport int64_t


def load_page(rows, int64_t horizon_ms):
    """Return (handles, due_ms) as int64 arrays for the rows due before
    ``horizon_ms``, in page order."""
    cdef Py_ssize_t n = len(rows)
    handles = np.empty(n, dtype=np.int64)
    due = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] h = handles
    cdef int64_t[::1] d = due
    cdef Py_ssize_t kept = 0
    cdef int64_t due_ms
    cdef object row
    for row in rows:
        due_ms = row[3]
        if due_ms < horizon_ms:
            h[kept] = row[0]
            d[kept] = due_ms
            kept += 1
    return handles[:kept], due[:kept]
