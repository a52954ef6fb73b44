"""CQL statements parsed into plain values: the subset the cluster store speaks.

Anything outside it raises UnsupportedStatement naming what was not
understood, so a statement new to the store is never misread in silence.
Values are ``?`` / ``%s`` markers (bound in order) or literals (a quoted
string, an integer, null).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class UnsupportedStatement(ValueError):
    """A statement outside the subset the in-memory tables interpret."""


@dataclass(frozen=True, slots=True)
class Marker:
    index: int


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


Term = Marker | Literal


@dataclass(frozen=True, slots=True)
class Relation:
    """``column op term`` of a WHERE or an IF; for IN, ``terms`` holds the list."""

    column: str
    op: str  # = < <= > >= != IN
    term: Term | None
    terms: tuple[Term, ...] = ()


@dataclass(frozen=True, slots=True)
class Assignment:
    """``column = term``; ``column = column + term`` (a counter, ``add``);
    ``column[key] = term`` (a map element)."""

    column: str
    term: Term
    add: bool = False
    key: Term | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """USING TTL / TIMESTAMP of a write."""

    ttl: Term | None = None
    timestamp: Term | None = None


@dataclass(frozen=True, slots=True)
class Select:
    table: str
    columns: tuple[str, ...] | None  # None: *
    where: tuple[Relation, ...]
    order_by: tuple[str, bool] | None  # ORDER BY (column, descending)
    limit: Term | None


@dataclass(frozen=True, slots=True)
class Insert:
    table: str
    columns: tuple[str, ...]
    values: tuple[Term, ...]
    if_not_exists: bool
    using: Write


@dataclass(frozen=True, slots=True)
class Update:
    table: str
    assignments: tuple[Assignment, ...]
    where: tuple[Relation, ...]
    conditions: tuple[Relation, ...]
    if_exists: bool
    using: Write


@dataclass(frozen=True, slots=True)
class Delete:
    table: str
    where: tuple[Relation, ...]
    conditions: tuple[Relation, ...]
    if_exists: bool
    using: Write


@dataclass(frozen=True, slots=True)
class CreateKeyspace:
    name: str


@dataclass(frozen=True, slots=True)
class CreateTable:
    table: str
    columns: tuple[tuple[str, str], ...]
    partition_key: tuple[str, ...]
    clustering: tuple[str, ...]
    descending: frozenset[str]
    default_ttl: int | None


@dataclass(frozen=True, slots=True)
class AlterAdd:
    table: str
    columns: tuple[tuple[str, str], ...]


Statement = Select | Insert | Update | Delete | CreateKeyspace | CreateTable | AlterAdd

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<mark>\?|%s)|(?P<op><=|>=|!=|[=<>(),.*;\[\]{}:+]))"
)


class _Tokens:
    def __init__(self, cql: str) -> None:
        self.cql = cql
        self.items: list[tuple[str, str]] = []
        pos = 0
        text = cql.rstrip().rstrip(";")
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise UnsupportedStatement(f"cannot read {text[pos : pos + 20]!r} in: {cql}")
            kind = m.lastgroup or ""
            self.items.append((kind, m.group(kind)))
            pos = m.end()
        self.pos = 0
        self.markers = 0

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        if i >= len(self.items):
            return ""
        kind, value = self.items[i]
        return value.upper() if kind == "name" else value

    def take(self) -> tuple[str, str]:
        if self.pos >= len(self.items):
            raise UnsupportedStatement(f"unexpected end of: {self.cql}")
        item = self.items[self.pos]
        self.pos += 1
        return item

    def accept(self, *words: str) -> bool:
        if all(self.peek(k) == w for k, w in enumerate(words)):
            self.pos += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            raise UnsupportedStatement(f"expected {' '.join(words)} at {self.peek()!r} in: {self.cql}")

    def name(self) -> str:
        kind, value = self.take()
        if kind != "name":
            raise UnsupportedStatement(f"expected a name, not {value!r} in: {self.cql}")
        return value.lower()

    def table(self) -> str:
        first = self.name()
        return f"{first}.{self.name()}" if self.accept(".") else first

    def term(self) -> Term:
        kind, value = self.take()
        if kind == "mark":
            self.markers += 1
            return Marker(self.markers - 1)
        if kind == "num":
            return Literal(int(value))
        if kind == "str":
            return Literal(value[1:-1].replace("''", "'"))
        if kind == "name" and value.upper() == "NULL":
            return Literal(None)
        raise UnsupportedStatement(f"expected a value, not {value!r} in: {self.cql}")

    def done(self) -> None:
        if self.pos != len(self.items):
            raise UnsupportedStatement(f"cannot read {self.peek()!r} onwards in: {self.cql}")


def parse(cql: str) -> Statement:
    return parse_counted(cql)[0]


def parse_counted(cql: str) -> tuple[Statement, int]:
    """The statement and how many values it binds."""
    t = _Tokens(cql)
    head = t.peek()
    out: Statement
    if head == "SELECT":
        out = _select(t)
    elif head == "INSERT":
        out = _insert(t)
    elif head == "UPDATE":
        out = _update(t)
    elif head == "DELETE":
        out = _delete(t)
    elif t.accept("CREATE", "KEYSPACE"):
        out = _create_keyspace(t)
    elif t.accept("CREATE", "TABLE"):
        out = _create_table(t)
    elif t.accept("ALTER", "TABLE"):
        table = t.table()
        t.expect("ADD", "IF", "NOT", "EXISTS")
        t.expect("(")
        out = AlterAdd(table, _column_defs(t))
    else:
        raise UnsupportedStatement(f"not a statement the in-memory tables know: {cql}")
    t.done()
    return out, t.markers


def _relations(t: _Tokens) -> tuple[Relation, ...]:
    out = [_relation(t)]
    while t.accept("AND"):
        out.append(_relation(t))
    return tuple(out)


def _relation(t: _Tokens) -> Relation:
    column = t.name()
    if t.accept("IN"):
        t.expect("(")
        terms = [t.term()]
        while t.accept(","):
            terms.append(t.term())
        t.expect(")")
        return Relation(column, "IN", None, tuple(terms))
    op = t.take()[1]
    if op not in ("=", "<", "<=", ">", ">=", "!="):
        raise UnsupportedStatement(f"unknown comparison {op!r} in: {t.cql}")
    return Relation(column, op, t.term())


def _conditions(t: _Tokens) -> tuple[tuple[Relation, ...], bool]:
    """IF cond AND ... | IF EXISTS, or nothing."""
    if not t.accept("IF"):
        return (), False
    if t.accept("EXISTS"):
        return (), True
    return _relations(t), False


def _using(t: _Tokens) -> Write:
    ttl: Term | None = None
    timestamp: Term | None = None
    if t.accept("USING"):
        while True:
            if t.accept("TTL"):
                ttl = t.term()
            elif t.accept("TIMESTAMP"):
                timestamp = t.term()
            else:
                raise UnsupportedStatement(f"USING what, in: {t.cql}")
            if not t.accept("AND"):
                break
    return Write(ttl, timestamp)


def _select(t: _Tokens) -> Select:
    t.expect("SELECT")
    columns: tuple[str, ...] | None
    if t.accept("*"):
        columns = None
    else:
        names = [t.name()]
        while t.accept(","):
            names.append(t.name())
        columns = tuple(names)
    t.expect("FROM")
    table = t.table()
    where = _relations(t) if t.accept("WHERE") else ()
    order_by: tuple[str, bool] | None = None
    if t.accept("ORDER", "BY"):
        column = t.name()
        descending = t.accept("DESC")
        if not descending:
            t.accept("ASC")
        order_by = (column, descending)
    limit = t.term() if t.accept("LIMIT") else None
    return Select(table, columns, where, order_by, limit)


def _insert(t: _Tokens) -> Insert:
    t.expect("INSERT", "INTO")
    table = t.table()
    t.expect("(")
    columns = [t.name()]
    while t.accept(","):
        columns.append(t.name())
    t.expect(")")
    t.expect("VALUES", "(")
    values = [t.term()]
    while t.accept(","):
        values.append(t.term())
    t.expect(")")
    if len(values) != len(columns):
        raise UnsupportedStatement(f"{len(columns)} columns, {len(values)} values in: {t.cql}")
    if_not_exists = t.accept("IF", "NOT", "EXISTS")
    return Insert(table, tuple(columns), tuple(values), if_not_exists, _using(t))


def _update(t: _Tokens) -> Update:
    t.expect("UPDATE")
    table = t.table()
    using = _using(t)
    t.expect("SET")
    assignments = [_assignment(t)]
    while t.accept(","):
        assignments.append(_assignment(t))
    t.expect("WHERE")
    where = _relations(t)
    conditions, if_exists = _conditions(t)
    return Update(table, tuple(assignments), where, conditions, if_exists, using)


def _assignment(t: _Tokens) -> Assignment:
    column = t.name()
    if t.accept("["):
        key = t.term()
        t.expect("]")
        t.expect("=")
        return Assignment(column, t.term(), key=key)
    t.expect("=")
    if t.peek().lower() == column and t.peek(1) == "+":
        t.pos += 2
        return Assignment(column, t.term(), add=True)
    return Assignment(column, t.term())


def _delete(t: _Tokens) -> Delete:
    t.expect("DELETE")
    if not t.accept("FROM"):
        raise UnsupportedStatement(f"a DELETE of columns is not in the subset: {t.cql}")
    table = t.table()
    using = _using(t)
    t.expect("WHERE")
    where = _relations(t)
    conditions, if_exists = _conditions(t)
    return Delete(table, where, conditions, if_exists, using)


def _create_keyspace(t: _Tokens) -> CreateKeyspace:
    t.expect("IF", "NOT", "EXISTS")
    name = t.name()
    t.expect("WITH", "REPLICATION", "=", "{")
    while not t.accept("}"):
        t.take()  # the replication map: one node's memory has no replicas
    return CreateKeyspace(name)


def _column_defs(t: _Tokens) -> tuple[tuple[str, str], ...]:
    """``name type, ...)``; the closing parenthesis taken."""
    out = []
    while True:
        name = t.name()
        out.append((name, _type(t)))
        if t.accept(")"):
            return tuple(out)
        t.expect(",")


def _type(t: _Tokens) -> str:
    base = t.name()
    if base == "map":
        t.expect("<")
        key = t.name()
        t.expect(",")
        value = t.name()
        t.expect(">")
        return f"map<{key},{value}>"
    if base not in ("text", "int", "bigint", "counter"):
        raise UnsupportedStatement(f"column type {base!r} is not in the subset: {t.cql}")
    return base


def _create_table(t: _Tokens) -> CreateTable:
    t.expect("IF", "NOT", "EXISTS")
    table = t.table()
    t.expect("(")
    columns: list[tuple[str, str]] = []
    partition_key: tuple[str, ...] = ()
    clustering: tuple[str, ...] = ()
    while True:
        if t.accept("PRIMARY", "KEY"):
            t.expect("(")
            if t.accept("("):
                keys = [t.name()]
                while t.accept(","):
                    keys.append(t.name())
                t.expect(")")
                partition_key = tuple(keys)
            else:
                partition_key = (t.name(),)
            rest = []
            while t.accept(","):
                rest.append(t.name())
            t.expect(")")
            clustering = tuple(rest)
        else:
            name = t.name()
            columns.append((name, _type(t)))
            if t.accept("PRIMARY", "KEY"):
                partition_key = (name,)
        if t.accept(")"):
            break
        t.expect(",")
    descending: set[str] = set()
    default_ttl: int | None = None
    if t.accept("WITH"):
        while True:
            if t.accept("CLUSTERING", "ORDER", "BY", "("):
                while True:
                    name = t.name()
                    if t.accept("DESC"):
                        descending.add(name)
                    else:
                        t.expect("ASC")
                    if t.accept(")"):
                        break
                    t.expect(",")
            elif t.accept("DEFAULT_TIME_TO_LIVE", "="):
                term = t.term()
                assert isinstance(term, Literal)
                default_ttl = int(term.value)
            else:
                raise UnsupportedStatement(f"table option {t.peek()!r} is not in the subset: {t.cql}")
            if not t.accept("AND"):
                break
    if not partition_key:
        raise UnsupportedStatement(f"no primary key in: {t.cql}")
    return CreateTable(table, tuple(columns), partition_key, clustering, frozenset(descending), default_ttl)
