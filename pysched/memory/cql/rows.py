"""Answers as the driver gives them: attribute rows, ``one()``, the columns."""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterator
from functools import lru_cache
from typing import Any


class MemoryRows:
    """An answer, as the driver's: attribute rows, ``one()``, the columns."""

    __slots__ = ("column_names", "current_rows", "from_batch")

    def __init__(self, column_names: list[str] | None, rows: list[Any], from_batch: bool = False) -> None:
        self.column_names = column_names
        self.current_rows = rows
        self.from_batch = from_batch

    def one(self) -> Any:
        return self.current_rows[0] if self.current_rows else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self.current_rows)


_NOT_NAME = re.compile(r"[^a-zA-Z0-9]")


@lru_cache(maxsize=1024)
def _row_type(columns: tuple[str, ...]) -> Any:
    # As the driver cleans a column name: "[applied]" reads as .applied.
    return namedtuple("Row", [_NOT_NAME.sub("_", c.strip("[]")) for c in columns], rename=True)


def answer(columns: list[str], values: list[tuple[Any, ...]], from_batch: bool = False) -> MemoryRows:
    make = _row_type(tuple(columns))._make
    return MemoryRows(columns, [make(v) for v in values], from_batch)


NO_ROWS = MemoryRows(None, [])
