"""A group member of another host than node 0 and its peer copies (issue 54, point 2).

Runs in each trainer of host 1..M-1 of a ``procsv launch --nnodes M`` group (``PROCSV_GROUP_REMOTE``,
which node 0's watchdog sets in their ``StartMembers``). Such a member has no checkpoint service on
its host: its in-memory snapshots go to node 0's, over TCP and CURVE
(:mod:`procsv.services.checkpoint.peers`), where they are its *peer copy*, held off its own host so
that the host's loss (its agent and members SIGKILLed) loses none of them.

:func:`procsv.common.curve.connect_member` makes the member's own key pair (the secret stays in this
process), files its public key for the launch (``.procsv/curve/member.<job>.<key>``) and connects to
the endpoint ``peer.json`` names.
:func:`inline` turns a snapshot whose tensors lie in the member's snapshot memory (which node 0
cannot map) into one frame per tensor, copied at once: the slot may be reused before TCP has
carried it.
"""

from __future__ import annotations

from typing import Any, Sequence

from procsv.common.snapshot_memory import itemsize
from procsv.ipc.messages import TensorSpec


def inline(specs: Sequence[TensorSpec], frames: Sequence[Any], memory: Any) -> tuple[list[TensorSpec], list[Any]]:
    """``specs`` and ``frames`` of a snapshot with every tensor as a frame of its own, in order (a
    tensor in ``memory``, the snapshot memory as bytes, copied out now); frames beyond the tensors
    (graph mode's MetaGraphDef) follow as they were."""
    rest = iter(frames)
    out_specs, out = [], []
    for spec in specs:
        if spec.offset is None:
            out.append(next(rest))
        else:
            n = itemsize(spec.dtype)
            for dim in spec.shape:
                n *= int(dim)
            out.append(bytes(memory[spec.offset:spec.offset + n]))
        out_specs.append(TensorSpec(spec.key, spec.dtype, spec.shape, spec.lengths, None))
    out.extend(rest)
    return out_specs, out
