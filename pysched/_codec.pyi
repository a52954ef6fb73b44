from collections.abc import Iterable, Sequence
from typing import Any

from pysched.records import DispatchRecord

VERSION: int

def encode_batch(rows: Iterable[Sequence[Any]], fence: int, dispatched_at_ms: int) -> list[bytes]: ...
def decode(payload: bytes) -> DispatchRecord: ...
