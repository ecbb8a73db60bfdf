"""PyTorch memory snapshots in and out, without torch (numpy only).

``load_snapshot`` reads a ``torch.cuda.memory._dump_snapshot`` pickle safely (NOTE [ A pickle is
code ]); ``snapshot_to_trace`` converts the snapshot dict into a ckview trace, and
``write_snapshot`` adds it to a trace being written (the recorder can pass
``torch.cuda.memory._snapshot()`` straight to either); ``trace_to_snapshot`` turns a run of a
trace back into a snapshot dict that pytorch.org/memory_viz reads; ``replay_allocated`` is the
snapshot's own account of allocated bytes, the oracle of the tests. For a file,
``read_snapshot`` feeds a ``SnapshotConverter`` as it reads, streaming big files in bounded memory
(NOTE [ Streaming a snapshot ] in stream.py); the converter then writes the trace.
"""

from .convert import SnapshotConverter, run_name, snapshot_to_trace, write_snapshot
from .errors import SnapshotError
from .reading import check_snapshot, load_snapshot, loads_plain
from .replay import replay_allocated, replay_peak
from .stream import read_snapshot

__all__ = [
    "SnapshotConverter",
    "SnapshotError",
    "check_snapshot",
    "load_snapshot",
    "loads_plain",
    "read_snapshot",
    "replay_allocated",
    "replay_peak",
    "run_name",
    "snapshot_to_trace",
    "write_snapshot",
]
