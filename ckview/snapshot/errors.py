"""The one error a snapshot that cannot be read or converted raises."""

from __future__ import annotations


class SnapshotError(Exception):
    """A file or dict that is not a usable PyTorch memory snapshot. The message is one line that
    names the file and says what to do."""
