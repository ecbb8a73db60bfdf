"""The host curve of an offload plan: the bytes the offload instances hold in host memory after
each projected event (NOTE [ Host curve ]), a pure function over key arrays.

NOTE [ Host curve ]
    An offloaded tensor (NOTE [ Offloaded instances ]) arrives on the host when it leaves the
    device: at its original's FREE in the projection (the instance's end, or earlier where its
    local dies, NOTE [ Locals die with their frame ]); an output, which stays on the device,
    at the instance's end. It leaves the host at its baseline free, when autograd lets go of
    the saved tensor (the copy brought back is freed there too); never, if the baseline never
    freed it. The curve is the host's bytes after each projected event, on the device
    curve's states (``Projection.host``: one value per state of ``Projection.timeline``); it
    is zero-length when no active instance offloads. ``host_peak_bytes`` is its maximum.

    Against the projection with the offload instances left out (the *un-offloaded* one), after
    the events of each key:

        device + host = un-offloaded + held twice

    where *held twice* is the bytes of offloaded tensors on both sides at once: the outputs
    (on the device and the host from the instance's end to their free) and the copies brought
    back (from the recompute moment to their free). So in forward, before any output leaves
    its instance, the device and the host together hold exactly what the un-offloaded plan
    holds on the device. This holds where no other active instance moves an offloaded storage
    (only kept inputs are moved by two instances, NOTE [ Incremental peak ]).
"""

from __future__ import annotations

import numpy as np

__all__ = ["host_curve"]


def host_curve(
    state_key: np.ndarray, arrive_key: np.ndarray, leave_key: np.ndarray, nbytes: np.ndarray
) -> np.ndarray:
    """(c,) int64: bytes on the host at each state (NOTE [ Host curve ]).

    ``state_key`` (c,) is the key of the last event before each state (-1: before any), in
    order; per offloaded tensor, ``arrive_key`` and ``leave_key`` are the keys it arrives and
    leaves at (``NEVER``: it never leaves) and ``nbytes`` its size. A tensor counts at the
    states whose key is at least its arrival and below its departure.
    """
    nbytes = np.asarray(nbytes, dtype=np.int64)
    arrived = _bytes_by(state_key, np.asarray(arrive_key, dtype=np.int64), nbytes)
    left = _bytes_by(state_key, np.asarray(leave_key, dtype=np.int64), nbytes)
    return arrived - left


def _bytes_by(state_key: np.ndarray, key: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Per state: the summed ``nbytes`` of the entries whose ``key`` is at most the state's."""
    order = np.argsort(key, kind="stable")
    running = np.concatenate(([0], np.cumsum(nbytes[order])))
    return running[np.searchsorted(key[order], state_key, side="right")]
