"""ckview's native event sources: ops, allocator blocks, module calls and saved tensors,
recorded by a small C++ extension (``ckrec.cpp``, ``ckrec_ops.cpp`` and ``ckrec_hooks.cpp``)
built against the running torch.

>>> from recorder.native import load
>>> ext, reason = load()          # builds once (under a minute), then imports the cached build
>>> if ext is None:
...     print(f"ckview: {reason}; recording with the Python recorder")

``build.py`` builds and loads it (NOTE [ Native build cache ]), ``rows.py`` reads what it
drains, ``attribute.py`` turns a step's rows into per-step facts (computed by ``ckattr.cpp``,
and written as rows of the run's tables by ``ckattr_write.cpp``), and ``source.py`` wraps it
as one recorder source. ``CKVIEW_RECORDER=native|python|auto`` picks the path: ``auto`` (the
default) records with it where it loads, else with the Python recorder (``for_recording``).
"""

from recorder.native.build import (
    Loaded,
    NativeRecorderError,
    cache_dir,
    for_recording,
    load,
    mode,
)

__all__ = ["Loaded", "NativeRecorderError", "cache_dir", "for_recording", "load", "mode"]
