"""A group member of another host than node 0 and its peer copies (issue 54, point 2).

Runs in each trainer of host 1..M-1 of a ``procsv launch --nnodes M`` group (``PROCSV_GROUP_REMOTE``,
which node 0's watchdog sets in their ``StartMembers``). Such a member has no checkpoint service on
its host: its in-memory snapshots go to node 0's, over TCP and CURVE
(:mod:`procsv.services.checkpoint.peers`), where they are its *peer copy*, held off its own host so
that the host's loss (its agent and members SIGKILLed) loses none of them.

:func:`connect` makes the member's own key pair (the secret stays in this process), files its public
key for the launch (``.procsv/curve/member.<job>.<key>``, removed by :func:`unfile` at the end; the
master removes the folder when the launch ends) and connects to the endpoint ``peer.json`` names.
:func:`inline` turns a snapshot whose tensors lie in the member's snapshot memory (which node 0
cannot map) into one frame per tensor, copied at once: the slot may be reused before TCP has
carried it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from procsv.common import env
from procsv.common.layout import Layout
from procsv.common.snapshot_memory import itemsize
from procsv.ipc.messages import TensorSpec


def remote() -> bool:
    """This member runs on another host than node 0 (its copies go to node 0's peer link)."""
    return os.environ.get(env.GROUP_REMOTE) == "1"


def connect(sock: Any) -> Optional[str]:
    """Connect ``sock`` (a DEALER) to node 0's checkpoint service as a CURVE client with a key pair
    of this process's own, filed for the launch; the key file's path, or None (said in one line)
    when node 0's service names no endpoint (the member then hands over no copies)."""
    from procsv.watchdog.multihost import curve

    layout = Layout(os.environ.get(env.LOGDIR, "."))
    peer = curve.load_peer(layout)
    if peer is None:
        print("procsv: this member's in-memory snapshots have nowhere to go: node 0's checkpoint service "
              f"names no endpoint in {curve.keys_dir(layout)}", file=sys.stderr, flush=True)
        return None
    keys = curve.AgentKeys.new()
    path = curve.file_member_key(layout, peer.job, keys, int(os.environ.get(env.RANK, "0") or 0))
    curve.connect_as_member(sock, keys, peer)
    sock.connect(peer.endpoint)
    return path


def unfile(path: Optional[str]) -> None:
    """Remove the key file :func:`connect` filed (gone already: the launch ended)."""
    from procsv.watchdog.multihost import curve

    curve.unfile_agent_key(path)


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
