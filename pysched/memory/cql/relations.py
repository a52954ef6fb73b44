"""Keys, values and conditions of a statement, as Cassandra reads them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pysched.memory.cql.parser import Delete, Insert, Literal, Relation, Statement, Term, Update
from pysched.memory.cql.table import CqlError, Table


def checked_key(table: Table, columns: tuple[str, ...], values: dict[str, Any]) -> tuple[Any, ...]:
    """The values of key ``columns``: each given, none null, each of its type."""
    out = []
    for column in columns:
        value = values.get(column)
        if value is None:
            raise CqlError(f"{table.name}: key column {column} is not given (or null)")
        table.check(column, value)
        out.append(value)
    return tuple(out)


def value_of(term: Term | None, params: tuple[Any, ...]) -> Any:
    if isinstance(term, Literal):
        return term.value
    if term is None:
        raise CqlError("a relation without a value")
    try:
        return params[term.index]
    except IndexError:
        raise CqlError(f"value {term.index} of the statement is not bound ({len(params)} given)") from None


def is_conditional(st: Statement) -> bool:
    if isinstance(st, Insert):
        return st.if_not_exists
    if isinstance(st, Update | Delete):
        return bool(st.conditions) or st.if_exists
    return False


def holds(st: Insert | Update | Delete, current: dict[str, Any] | None, params: tuple[Any, ...]) -> bool:
    if isinstance(st, Insert):
        return current is None
    if st.if_exists:
        return current is not None
    values = current or {}
    return all(compare(values.get(r.column), r.op, value_of(r.term, params)) for r in st.conditions)


def compare(have: Any, op: str, want: Any) -> bool:
    if op == "=":
        return bool(have == want)
    if op == "!=":
        return bool(have != want)
    if have is None or want is None:
        return False
    if op == "<":
        return bool(have < want)
    if op == "<=":
        return bool(have <= want)
    if op == ">":
        return bool(have > want)
    if op == ">=":
        return bool(have >= want)
    raise CqlError(f"the condition {op} is not in the subset")


def key_values(table: Table, pk: tuple[Any, ...], ck: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(table.partition_key, pk, strict=True)) | dict(zip(table.clustering, ck, strict=True))


def clustering_filter(
    table: Table, relations: Sequence[Relation], params: tuple[Any, ...]
) -> Callable[[tuple[Any, ...]], bool]:
    tests: list[tuple[int, str, Any]] = []
    for r in relations:
        if r.column not in table.clustering:
            raise CqlError(f"{r.column} is no clustering column of {table.name}")
        at = table.clustering.index(r.column)
        if r.op == "IN":
            tests.append((at, "IN", frozenset(value_of(t, params) for t in r.terms)))
        else:
            tests.append((at, r.op, value_of(r.term, params)))

    def matches(key: tuple[Any, ...]) -> bool:
        for at, op, want in tests:
            if op == "IN":
                if key[at] not in want:
                    return False
            elif not compare(key[at], op, want):
                return False
        return True

    return matches
