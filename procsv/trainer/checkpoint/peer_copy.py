"""A group member of another host than node 0 and its peer copies (issue 54, point 2).

Runs in each trainer of host 1..M-1 of a ``procsv launch --nnodes M`` group (``PROCSV_GROUP_REMOTE``,
which node 0's watchdog sets in their ``StartMembers``). Such a member has no checkpoint service on
its host: its in-memory snapshots go to node 0's, over TCP and CURVE
(:mod:`procsv.services.checkpoint.peers`), where they are its *peer copy*, held off its own host so
that the host's loss (its agent and members SIGKILLed) loses none of them.

:func:`procsv.common.curve.connect_member` makes the member's own key pair (the secret stays in this
process), files its public key for the launch (``.procsv/curve/member.<job>.<key>``) and connects to
the endpoint ``peer.json`` names.
:func:`frames` turns a snapshot whose tensors lie in the member's snapshot memory (which node 0
cannot map) into one frame per tensor, *without copying*: each frame is a tracked ZeroMQ frame over
the tensor's bytes in the slot, handed to the socket as is. The slot stays spoken for
(:meth:`procsv.trainer.checkpoint.memory_tier.Slots.sending`) until every such frame's tracker
says ZeroMQ let go of it (:class:`Sends`), whatever the acknowledgment's grace: before issue 54's
follow-up each tensor was copied into a fresh ``bytes`` at the step boundary, ~36 % of the step at
64 MiB of state.
"""

from __future__ import annotations

from typing import Any, Sequence

import zmq

from procsv.common.snapshot_memory import itemsize
from procsv.ipc.messages import TensorSpec


def frames(specs: Sequence[TensorSpec], payload: Sequence[Any], memory: Any) -> tuple[list[TensorSpec], list[Any]]:
    """``specs`` and frames of a snapshot with every tensor as a frame of its own, in order: a
    tensor in ``memory`` (the snapshot memory, a numpy byte array) as a tracked, uncopied
    :class:`zmq.Frame` over its bytes there; frames beyond the tensors (graph mode's
    MetaGraphDef) follow as they were."""
    rest = iter(payload)
    out_specs, out = [], []
    for spec in specs:
        if spec.offset is None:
            out.append(next(rest))
        else:
            n = itemsize(spec.dtype)
            for dim in spec.shape:
                n *= int(dim)
            out.append(zmq.Frame(memory[spec.offset:spec.offset + n], copy=False, track=True))
        out_specs.append(TensorSpec(spec.key, spec.dtype, spec.shape, spec.lengths, None))
    out.extend(rest)
    return out_specs, out


def trackers(sent: Sequence[Any]) -> list[Any]:
    """The trackers of the tracked frames among ``sent``."""
    return [f.tracker for f in sent if isinstance(f, zmq.Frame) and f.tracker is not None]


class Sends:
    """The slots whose frames ZeroMQ may still read, each with its frames' trackers (of a send
    handed to the socket, or of frames made but never sent: those let go at once)."""

    def __init__(self) -> None:
        self._by_slot: dict[int, list[Any]] = {}

    def started(self, slot: int, sent: Sequence[Any]) -> None:
        """``sent`` (the frames of ``slot``'s snapshot) were handed to the socket (the slot's earlier
        sends still tracked stay so: the same copy handed again to a restarted service)."""
        tracked = trackers(sent)
        if tracked:
            self._by_slot.setdefault(slot, []).extend(tracked)

    def done(self) -> list[int]:
        """The slots whose every frame ZeroMQ let go of since the last call (forgotten here)."""
        out = [slot for slot, tracked in self._by_slot.items() if all(t.done for t in tracked)]
        for slot in out:
            del self._by_slot[slot]
        return out
