"""The host curve of an offload plan: the bytes the offload instances hold in host memory after
each projected event (NOTE [ Host curve ]), a pure function over key arrays.

NOTE [ Host curve ]
    An offloaded tensor (NOTE [ Offloaded instances ]) arrives on the host when its instance
    takes it off the device: at the instance's end, or earlier where its local dies (NOTE
    [ Locals die with their frame ]); an output, which stays on the device, at the instance's
    end. It leaves the host at its baseline free, when autograd lets go of the saved tensor
    (the copy brought back is freed there too); never, if the baseline never freed it. The
    curve is the host's bytes after each projected event, on the device curve's states
    (``Projection.host``: one value per state of ``Projection.timeline``); it is zero-length
    when no active instance offloads. ``host_peak_bytes`` is its maximum. ``project`` and
    ``ProjectionModel.curve`` (``ProjectedCurve.host``) take the moves from ``host_moves`` and
    agree on every state the model draws (NOTE [ Projected curve ]; a recompute's highest
    point holds what the state before it held).

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

from dataclasses import dataclass

import numpy as np

from ckview.analysis.projection.effects import Baseline, InstanceEffects

__all__ = ["HostMoves", "host_curve", "host_moves"]


@dataclass(frozen=True)
class HostMoves:
    """Every tensor the offload instances can move to the host (NOTE [ Host curve ]): one per
    copy pair of an offloading instance (``InstanceEffects.copy_*``)."""

    instance: np.ndarray
    arrive_key: np.ndarray
    leave_key: np.ndarray
    """``NEVER`` where the baseline never frees it."""
    nbytes: np.ndarray

    def of(self, active: np.ndarray) -> HostMoves:
        """The moves of the ``active`` instances."""
        pick = active[self.instance]
        return HostMoves(
            self.instance[pick], self.arrive_key[pick], self.leave_key[pick], self.nbytes[pick]
        )


def host_moves(eff: InstanceEffects, base: Baseline) -> HostMoves:
    """When each tensor of each offloading instance arrives on the host and leaves it: at the
    key its instance drops it from the device (``drop_key``), else (an output) at the
    instance's end; gone at its baseline free."""
    pick = eff.offload[eff.copy_instance]
    inst, storage = eff.copy_instance[pick], eff.copy_storage[pick]
    scale = int(max(storage.max(initial=0), eff.drop_storage.max(initial=0))) + 1
    drops = eff.drop_instance * scale + eff.drop_storage
    order = np.argsort(drops, kind="stable")
    wanted = inst * scale + storage
    at = np.searchsorted(drops[order], wanted).clip(0, max(len(drops) - 1, 0))
    found = drops[order][at] == wanted if drops.size else np.zeros(len(wanted), dtype=bool)
    dropped = eff.drop_key[order][at] if drops.size else eff.end_key[inst]
    return HostMoves(
        instance=inst,
        arrive_key=np.where(found, dropped, eff.end_key[inst]),
        leave_key=base.event_key(base.free_row[storage]),
        nbytes=base.nbytes[storage],
    )


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
