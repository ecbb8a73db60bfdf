"""Snapshot dicts shaped as torch writes them, for the importer and exporter tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
FIXTURE_DIRS = [p / "shared" / "fixtures" / "cuda_snapshots" for p in HERE.parents[1:4]]
FIXTURE_NAME = "cnn_fwd_bwd_torch2.x.pickle"


def fixture_path() -> Path | None:
    """The real snapshot of a public project (``../shared/fixtures/cuda_snapshots``), if here."""
    for folder in FIXTURE_DIRS:
        if (folder / FIXTURE_NAME).is_file():
            return folder / FIXTURE_NAME
    return None


def frames(*names: str) -> list[dict[str, Any]]:
    """Frames innermost first: a C++ allocator frame, then Python frames named ``names``."""
    cpp = [{"name": "c10::cuda::CUDACachingAllocator::malloc", "filename": "??", "line": 0}]
    return cpp + [
        {"name": n, "filename": f"/src/{n}.py", "line": 10 + i} for i, n in enumerate(names)
    ]


class _History:
    """Events of one device, 13 us apart."""

    def __init__(self, time_us: int) -> None:
        self.time_us = time_us
        self.events: list[dict[str, Any]] = []

    def add(self, action: str, addr: int, size: int, *names: str) -> None:
        self.time_us += 13
        self.events.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self.time_us,
                "frames": frames(*names),
            }
        )


def today(devices: int = 2) -> dict[str, Any]:
    """Torch's current layout: a ring-buffered history (it begins with a free of a block
    allocated before), blocks live at the end, segments reserved before and during the history,
    expandable segments mapped and unmapped, ``oom`` and ``snapshot`` marks, allocator settings."""
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    for d in range(devices):
        base = 0x7000_0000_0000 + d * 0x1_0000_0000
        history = _History(1_700_000_000_000_000 + d * 7)
        ev, add = history.events, history.add
        add("free_requested", base + 0x100000, 4096, "old")  # allocated before the history
        add("free_completed", base + 0x100000, 4096, "old")
        add("segment_alloc", base + 0x400000, 2 << 20, "train")
        add("alloc", base + 0x400000, 1 << 20, "forward", "train")
        add("alloc", base + 0x500000, 512 << 10, "forward", "train")
        add("snapshot", 0, 0)
        add("free_requested", base + 0x400000, 1 << 20, "forward", "train")
        add("free_completed", base + 0x400000, 1 << 20, "forward", "train")
        add("alloc", base + 0x400000, 256 << 10, "backward", "train")  # the address reused
        add("segment_map", base + 0x800000, 2 << 20, "train")
        add("alloc", base + 0x800000, 2 << 20, "optimizer", "train")
        ev.append(
            {
                "action": "oom",
                "size": 1 << 40,
                "device_free": 123,
                "stream": 0,
                "time_us": history.time_us + 1,
                "frames": [],
            }
        )
        add("free_requested", base + 0x800000, 2 << 20, "optimizer", "train")
        add("free_completed", base + 0x800000, 2 << 20, "optimizer", "train")
        add("segment_unmap", base + 0x800000, 2 << 20, "train")
        add("free_completed", base + 0x500000, 512 << 10, "forward", "train")
        traces.append(ev)
        segments += [
            {  # reserved before the history: one block live all along, one freed in it
                "device": d,
                "address": base + 0x100000,
                "total_size": 2 << 20,
                "allocated_size": 8192,
                "active_size": 8192,
                "requested_size": 8192,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": base + 0x100000,
                        "size": 4096,
                        "requested_size": 4000,
                        "state": "inactive",
                        "frames": [],
                    },
                    {
                        "address": base + 0x101000,
                        "size": 8192,
                        "requested_size": 8000,
                        "state": "active_allocated",
                        "frames": frames("model_init"),
                    },
                    {
                        "address": base + 0x103000,
                        "size": (2 << 20) - 12288,
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    },
                ],
            },
            {
                "device": d,
                "address": base + 0x400000,
                "total_size": 2 << 20,
                "allocated_size": 256 << 10,
                "active_size": 256 << 10,
                "requested_size": 256 << 10,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": base + 0x400000,
                        "size": 256 << 10,
                        "requested_size": 1,
                        "state": "active_awaiting_free",
                        "frames": frames("backward", "train"),
                    },
                    {
                        "address": base + 0x440000,
                        "size": (2 << 20) - (256 << 10),
                        "requested_size": 0,
                        "state": "inactive",
                        "frames": [],
                    },
                ],
            },
        ]
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    }


def torch_2_1(devices: int = 1) -> dict[str, Any]:
    """The torch 2.1 layout: no ``time_us``, no ``allocator_settings``, blocks without
    ``address`` (they tile their segment), no segment map events."""
    snap = today(devices)
    del snap["allocator_settings"]
    for events in snap["device_traces"]:
        events[:] = [e for e in events if e["action"] not in ("segment_map", "segment_unmap")]
        for e in events:
            e.pop("time_us", None)
    for seg in snap["segments"]:
        for key in ("is_expandable", "segment_pool_id", "requested_size"):
            seg.pop(key)
        for block in seg["blocks"]:
            del block["address"]
    return snap


def torch_2_0(devices: int = 1) -> dict[str, Any]:
    """Older still: frees as ``free``, block frames in ``history``, ``active_pending_free``."""
    snap = torch_2_1(devices)
    for events in snap["device_traces"]:
        events[:] = [e for e in events if e["action"] != "free_requested"]
        for e in events:
            if e["action"] == "free_completed":
                e["action"] = "free"
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            block["history"] = [
                {"addr": 0, "real_size": block["size"], "frames": block.pop("frames")}
            ]
            if block["state"] == "active_awaiting_free":
                block["state"] = "active_pending_free"
    return snap


def random_history(rng: np.random.Generator, steps: int) -> dict[str, Any]:
    """A random history over a few addresses: blocks live at its start (freed in it or not),
    allocations and frees in any order, addresses reused; and sometimes, as if the history had
    been paused, a final block at an address where the history closed its last block."""
    addresses = [0x1000 * (i + 1) for i in range(6)]
    live = {a: int(rng.integers(1, 100)) for a in addresses if rng.random() < 0.4}
    events = []
    for i in range(steps):
        a = addresses[int(rng.integers(len(addresses)))]
        if a in live:
            events.append(
                {
                    "action": "free_completed",
                    "addr": a,
                    "size": live.pop(a),
                    "stream": 0,
                    "time_us": i,
                    "frames": [],
                }
            )
        else:
            live[a] = int(rng.integers(1, 100))
            events.append(
                {
                    "action": "alloc",
                    "addr": a,
                    "size": live[a],
                    "stream": 0,
                    "time_us": i,
                    "frames": frames(f"f{i % 3}"),
                }
            )
    for a in addresses:
        if a not in live and rng.random() < 0.2:
            live[a] = int(rng.integers(1, 100))
    blocks = [
        {"address": a, "size": s, "state": "active_allocated", "frames": []}
        for a, s in sorted(live.items())
    ]
    segment = {"device": 0, "address": 0x1000, "total_size": 0x6000, "stream": 0, "blocks": blocks}
    return {"segments": [segment] if blocks else [], "device_traces": [events]}


def long_history(blocks: int, seed: int = 0) -> dict[str, Any]:
    """``blocks`` allocations, each freed (``free_requested`` + ``free_completed``) a few
    events later, shaped as torch writes a long history: 20 frame dicts shared by all events,
    30 call stacks, each allocation with its own frames list and the two events of a free
    sharing one (the pickle fetches it back)."""
    rng = np.random.default_rng(seed)
    pool = [{"name": f"f{i}", "filename": f"/src/m{i}.py", "line": i} for i in range(20)]
    stacks = [rng.integers(0, len(pool), 6).tolist() for _ in range(30)]
    events: list[dict[str, Any]] = []
    pending: list[tuple[int, int, list[dict[str, Any]]]] = []
    for b in range(blocks):
        addr, size = 0x7000_0000_0000 + (b % 64) * 0x10_0000, int(rng.integers(1, 1 << 20))
        stack = [pool[j] for j in stacks[int(rng.integers(len(stacks)))]]
        while pending and (len(pending) > 8 or pending[0][0] == addr):
            freed, freed_size, freed_stack = pending.pop(0)
            for action in ("free_requested", "free_completed"):
                common = {"addr": freed, "size": freed_size, "stream": 0, "frames": freed_stack}
                events.append({"action": action, "time_us": len(events), **common})
        common = {"addr": addr, "size": size, "stream": 0, "frames": stack}
        events.append({"action": "alloc", "time_us": len(events), **common})
        pending.append((addr, size, stack))
    return {"segments": [], "device_traces": [events]}
