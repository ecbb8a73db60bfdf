"""The shapes of the data ``ckview.analysis`` takes: declared once, imported everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Table = Mapping[str, np.ndarray]
"""One table of a trace: its columns by name (``Table.read()`` of ``ckview.trace``)."""

RunTables = Mapping[str, Any]
"""One run as ``Trace.read_run`` gives it: each run table and root table (``Table``) by name,
the ``strings`` (a list) and ``checkpoint_call_ns``; on one device, ``timeline_device`` and
``left_out`` where the run held storages on several (NOTE [ One device per timeline ] in
ckview/trace/devices.py)."""
