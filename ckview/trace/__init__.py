"""The ckview trace format: write a trace (TraceWriter), read it (open_trace), check it.

``ckview.trace.schema`` lists the tables and columns; docs/trace-format.md is the spec.
"""

from ._layout import TraceMeta
from .errors import (
    CorruptTraceError,
    NewerVersionError,
    NotATraceError,
    TraceError,
    TraceKeyError,
    TraceNotFoundError,
)
from .reader import Run, StringTable, Table, Trace, open_trace
from .validate import ValidationReport, validate_trace
from .writer import RunWriter, TraceWriter

__all__ = [
    "CorruptTraceError",
    "NewerVersionError",
    "NotATraceError",
    "Run",
    "RunWriter",
    "StringTable",
    "Table",
    "Trace",
    "TraceError",
    "TraceKeyError",
    "TraceMeta",
    "TraceNotFoundError",
    "TraceWriter",
    "ValidationReport",
    "open_trace",
    "validate_trace",
]
