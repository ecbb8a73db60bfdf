"""Errors raised when a trace cannot be read or written.

Every message is one line that names the file and says what to do next, so the CLI and the GUI
can show ``str(error)`` as is. ``detail`` holds the bare reason (without the file name and the
advice), for callers such as the validator that collect several of them.
"""

from __future__ import annotations

RECORD_HINT = "record one with 'ckview record script.py'"


class TraceError(Exception):
    """Base class of every error about a trace file."""

    def __init__(self, message: str, *, path: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.detail = detail or message

    def __str__(self) -> str:
        # KeyError would print repr() of the message; all trace errors print it as is.
        return str(self.args[0]) if self.args else ""


class TraceNotFoundError(TraceError, FileNotFoundError):
    """The path does not exist."""


class NotATraceError(TraceError):
    """The path exists but is not a ckview trace (a directory, another file type, plain HDF5)."""


class CorruptTraceError(TraceError):
    """The file is a trace but is truncated or damaged, or breaks the format."""


class NewerVersionError(TraceError):
    """The trace was written by a newer ckview than this one."""


class TraceKeyError(TraceError, KeyError):
    """A run, table or column name that the trace does not have."""


def not_found(path: str) -> TraceNotFoundError:
    return TraceNotFoundError(
        f"{path} does not exist; check the path, or {RECORD_HINT}", path=path, detail="no such file"
    )


def not_a_trace(path: str, reason: str, advice: str = RECORD_HINT) -> NotATraceError:
    return NotATraceError(
        f"{path} is not a ckview trace ({reason}); {advice}", path=path, detail=reason
    )


def corrupt(path: str, reason: str) -> CorruptTraceError:
    return CorruptTraceError(
        f"{path} is damaged or truncated ({reason}); record it again", path=path, detail=reason
    )


def newer(path: str, what: str, supported: int) -> NewerVersionError:
    reason = f"{what} but this ckview reads up to v{supported}"
    return NewerVersionError(f"{path} uses {reason}; upgrade ckview", path=path, detail=reason)


def one_line(text: object) -> str:
    """Collapse whitespace so that messages from h5py (which may span lines) stay on one line."""
    return " ".join(str(text).split())
