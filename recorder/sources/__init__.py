"""Event sources of the recorder, each behind the :class:`~recorder.sources.base.Source`
protocol (NOTE [ Sources ] in base.py)."""

NAMES = ("allocator", "base", "compiled", "device", "fsdp", "native", "oom")
"""The modules of the built-in sources."""
