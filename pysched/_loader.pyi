from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

def load_page(
    rows: Sequence[Sequence[Any]], horizon_ms: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
