"""A restarted trainer group's restore from its in-memory snapshots (issue 54, point 1).

Runs in each member's main thread (the chief and every worker of ``procsv launch --nproc N`` on
one host), at a session's start, called by :class:`~procsv.trainer.checkpoint.keeper.CheckpointKeeper`.
Every member handed the checkpoint service a copy of its state every K steps (the same steps on
every member: :mod:`procsv.services.checkpoint.group` holds them). A restarted group's chief asks
the service for the newest step held for every member and verified against its checksums
(:func:`whole_step`); if there is one, newer than every committed checkpoint, it restores its own
copy of it and pins that step (:class:`~procsv.trainer.replica.GroupPin`); every worker restores
its own copy of the same step (:func:`restore_copy`): the variables are the same on every
replica, each member's input position (a ``tf.data`` iterator in the checkpoint) its own. Otherwise
(no such step, a copy missing or damaged, no answer) the chief says why in one line and the
group restores from disk as before.

A copy is verified before anything is assigned: its frames against the CRC-32C the service took
when it copied them, then its object graph against the program's (the same variables under the
same keys and dtypes); the assignment is :func:`procsv.trainer.checkpoint.memory_restore.assign`'s.
A group started to roll back step B restores only a state before B (``ChildConfig.resume.rollback_before``,
the watchdog's).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import numpy as np

from procsv.common import crc32c
from procsv.common.errors import CorruptCheckpoint
from procsv.common.layout import Layout
from procsv.common.manifests import Manifest, list_committed
from procsv.trainer.checkpoint import restore_at_start
from procsv.ipc.messages import GroupCopy, GroupFetch, GroupHeld, GroupQuery, TensorSpec
from procsv.ipc.transport import NoReply
from procsv.trainer.channels import TrainerChannels
from procsv.trainer.checkpoint import memory_restore
from procsv.trainer.checkpoint.agent import CheckpointAgent
from procsv.trainer.checkpoint.snapshot import GRAPH_KEY

ASK_WAIT = 15.0  # seconds a member waits for the checkpoint service's answer about the group's copies


def newest_committed(agent: CheckpointAgent, before: Optional[int] = None) -> int:
    """The step of the newest committed checkpoint (-1: none); ``before``: of a step below it (a group's
    rollback of step ``before`` restores a state before it)."""
    committed = [m for m in list_committed(agent.layout) if before is None or m.step < before]
    return committed[-1].step if committed else -1


def passed_over(layout: Layout, before: Optional[int]) -> list[Manifest]:
    """The committed checkpoints a group's rollback of step ``before`` passes over: those of ``before``
    or later hold its update (the chief checks only its own losses: a worker's NaN may be found after
    the chief committed past it, or at the group's end, after the chief's final checkpoint). The
    group's commit of such a step is their next revision, rewritten in place (empty: no rollback)."""
    return restore_at_start.rolled_back_over(list_committed(layout), before)


def whole_step(ch: TrainerChannels, nproc: int, after: int,
               before: Optional[int] = None, say: bool = True) -> Optional[tuple[int, int, bool]]:
    """The chief: ``(step, attempt, peer)`` of the newest in-memory snapshot the service holds for all
    ``nproc`` members, verified, newer than ``after`` and, for a rollback of step ``before``, older than
    it (``peer``: a member's copy is a peer copy, held here for another host); None (said in one line,
    unless not ``say``: a launch's first group over hosts asks in case node 1's holder handed copies back
    to a relaunched node 0, and says nothing when none is held: node 0's service says why, if it held any)
    if there is none."""
    try:
        held = ch.ask_group(GroupQuery(os.getpid(), nproc, after, before), ch.clock() + ASK_WAIT)[0]
    except NoReply as exc:
        if say:
            print(f"procsv: the group restores from disk: no answer about its in-memory snapshots ({exc})",
                  file=sys.stderr, flush=True)
        return None
    if not isinstance(held, GroupHeld) or held.step < 0:
        if say:
            print(f"procsv: the group restores from disk: {getattr(held, 'note', '')}", file=sys.stderr, flush=True)
        return None
    return held.step, held.attempt, held.peer


def fetch(ch: TrainerChannels, rank: int, step: int, attempt: int) -> tuple[GroupCopy, list[Any]]:
    """This member's copy of ``step`` (of ``attempt``) from the service, its checksum verified;
    raises :class:`CorruptCheckpoint` for a copy missing or damaged, or no answer."""
    try:
        copy, frames = ch.ask_group(GroupFetch(os.getpid(), rank, step, attempt), ch.clock() + ASK_WAIT)
    except NoReply as exc:
        raise CorruptCheckpoint(f"member {rank}'s in-memory copy of step {step}: no answer ({exc})") from None
    if not isinstance(copy, GroupCopy) or copy.step != step:
        raise CorruptCheckpoint(f"member {rank}'s in-memory copy of step {step}: {getattr(copy, 'note', '')}")
    crc = 0
    for frame in frames:
        crc = crc32c.extend(crc, bytes(frame))
    if crc != copy.crc or len(frames) != len(copy.tensors):
        raise CorruptCheckpoint(f"member {rank}'s in-memory copy of step {step} does not match its checksum "
                                f"({crc:08x}, not {copy.crc:08x})")
    return copy, frames


def values(specs: list[TensorSpec], frames: list[Any]) -> dict[str, Any]:
    """Each tensor of a fetched copy as a NumPy array (a variant: its serialized bytes)."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for spec, frame in zip(specs, frames):
        data = bytes(frame)
        if spec.dtype == "variant":
            out[spec.key] = data
        elif spec.dtype == "string":
            items, pos = [], 0
            for n in spec.lengths or []:
                items.append(data[pos:pos + n])
                pos += n
            out[spec.key] = np.array(items, dtype=object).reshape(spec.shape)
        else:
            dtype = np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype)
            out[spec.key] = np.frombuffer(data, dtype=dtype).reshape(spec.shape).copy()
    return out


def restore_copy(ch: TrainerChannels, agent: CheckpointAgent, rank: int, step: int, attempt: int) -> None:
    """Restore this member's in-memory copy of ``step`` into the program's state (verified first:
    :func:`fetch`, then :func:`memory_restore.mismatch`); raises :class:`CorruptCheckpoint` if it
    cannot be used, before anything is assigned."""
    copy, frames = fetch(ch, rank, step, attempt)
    graph = next((bytes(f) for s, f in zip(copy.tensors, frames) if s.key == GRAPH_KEY), None)
    wrong = memory_restore.mismatch(agent.checkpoint, copy.tensors, graph)
    if wrong:
        raise CorruptCheckpoint(f"member {rank}'s in-memory copy of step {step}: {wrong}")
    memory_restore.assign(agent.checkpoint, values(copy.tensors, frames))
    if int(agent.global_step.numpy()) != step:
        agent.global_step.assign(step)


