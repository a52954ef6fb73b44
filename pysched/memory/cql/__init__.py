"""Cassandra's tables in memory, run by the cluster store's own CQL (see engine)."""

from pysched.memory.cql.engine import CqlCluster, FaultHook, MemoryTables, RowWritten, TableCall, WriteWatch
from pysched.memory.cql.parser import UnsupportedStatement
from pysched.memory.cql.rows import MemoryRows
from pysched.memory.cql.table import CqlError

__all__ = [
    "CqlCluster",
    "CqlError",
    "FaultHook",
    "MemoryRows",
    "MemoryTables",
    "RowWritten",
    "TableCall",
    "UnsupportedStatement",
    "WriteWatch",
]
