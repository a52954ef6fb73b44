"""Copying the backends' frozen rows with some columns changed: the memory
backends do it for nearly every write, and ``dataclasses.replace`` looks the
class's fields up again at each call."""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")

# Per row class: its fields' values in order, and each field's position.
_LAYOUT: dict[type, tuple[attrgetter[Any], dict[str, int]]] = {}


def replace_row(row: T, **changes: Any) -> T:
    """``dataclasses.replace`` for a dataclass whose fields are all set by
    its ``__init__`` (the rows here): the same row, the named columns
    changed; an unknown name is a KeyError."""
    cls = type(row)
    layout = _LAYOUT.get(cls)
    if layout is None:
        names = [f.name for f in dataclasses.fields(row)]  # type: ignore[arg-type]
        layout = _LAYOUT[cls] = (attrgetter(*names), {name: i for i, name in enumerate(names)})
    values, index = layout
    out = list(values(row)) if len(index) > 1 else [values(row)]
    for name, value in changes.items():
        out[index[name]] = value
    return cls(*out)
