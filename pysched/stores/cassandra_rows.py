"""Cassandra rows as named tuples whose class is made once per column list.

The driver's default row factory makes a new namedtuple class for every
result it reads: about 110 us of CPU each (``collections.namedtuple``
compiles a class), and a run of a recurring job reads about nine results
between its leader and its worker. This factory keeps one class per column
list, so a result costs its rows alone.

The driver's ``ResultSet.was_applied`` refuses any row factory but its own,
so the outcome of a lightweight transaction is read by ``applied``.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from pysched.stores.cql_tables import Rows

# A column name cleaned as the driver cleans it ("[applied]" is "applied",
# "count(*)" is "count"), so rows read the same either way.
_BAD_END = re.compile(r"[^a-zA-Z0-9_]*$")
_BAD_START = re.compile(r"^[^a-zA-Z0-9]*")
_NOT_ALPHANUMERIC = re.compile(r"[^a-zA-Z0-9]")


def clean_column_name(name: str) -> str:
    return _NOT_ALPHANUMERIC.sub("_", _BAD_START.sub("", _BAD_END.sub("", name)))


@lru_cache(maxsize=1024)
def _row_type(column_names: tuple[str, ...]) -> Any:
    # rename: a name that is no identifier (a keyword, two columns cleaned
    # to one name) becomes positional (_0, _1, ...), where the driver's
    # fallback names it otherwise; no query of pysched selects such a name.
    return namedtuple("Row", [clean_column_name(name) for name in column_names], rename=True)


def named_rows(column_names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """The session's row factory: each row a named tuple."""
    make = _row_type(tuple(column_names))._make
    return [make(row) for row in rows]


class NotConditional(RuntimeError):
    """``applied`` asked of a result that no lightweight transaction gave."""


def applied(result: Rows) -> bool:
    """Whether a lightweight transaction, or a conditional batch, applied:
    the ``[applied]`` column, first in the result's first row."""
    rows = result.current_rows
    if not result.column_names or result.column_names[0] != "[applied]":
        raise NotConditional("the statement was not conditional: no [applied] column")
    if not result.from_batch and len(rows) != 1:
        raise NotConditional(f"a lightweight transaction answers with one row, not {len(rows)}")
    return bool(rows[0][0])
