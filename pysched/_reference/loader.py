"""Pure-Python twin of ``pysched._loader``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def load_page(rows: Sequence[Sequence[Any]], horizon_ms: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Return (handles, due_ms) as int64 arrays for the rows due before
    ``horizon_ms``, in page order."""
    kept = [(row[0], row[3]) for row in rows if row[3] < horizon_ms]
    handles = np.array([h for h, _ in kept], dtype=np.int64)
    due = np.array([d for _, d in kept], dtype=np.int64)
    return handles, due
