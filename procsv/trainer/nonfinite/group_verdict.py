"""A trainer group's verdict at its K-th steps: whether the group rolls back in place, and to which step.

Runs in each member's main thread (``procsv launch --nproc N``, MultiWorkerMirroredStrategy), at the step
boundary of every K-th step (the group's in-memory snapshot steps, where every member stands at the same
step and each holds its own in-memory copies of the same earlier K-th steps), before that step's snapshot;
the checkpoint agent calls it (:meth:`~procsv.trainer.checkpoint.agent.CheckpointAgent.check_group_step`)
through the non-finite rollback (:class:`~procsv.trainer.nonfinite.rollback.NonfiniteRollback`), which
acts on the verdict.

Each member checks the losses it kept since the last check as before, and says what it found in one
row of numbers (:class:`Row`: the first step whose loss it found non-finite, the chief's loss spike,
whether it can restore in place, the chief's newest committed step and the one in flight, and the steps
of the in-memory copies it holds whole); the members exchange their rows in one collective of the
program's own strategy (:class:`Exchange`: a cross-worker all-reduce SUM of a vector in which each member
fills its own row, so that every member gets every row, exactly), and every member decides the same
:class:`Verdict` from the same rows (:func:`decide`, pure): nothing found; found and rolled back in place
(the first bad step any member found, or the chief's spike, and the newest step before it every member
holds a copy of); or found and not in place, said why (a member cannot, a copy missing on one member, a
checkpoint of a step after the bad one committed or in flight, a NaN and a spike at one check, ...): the
restart of the group, as before (:mod:`.group_ask`, exit code 5). The collective costs one small
all-reduce every K steps (see docs/replicas.md); a member that never comes to it (dead, or ended on a
finding of its own elsewhere) leaves its peers waiting in it, as in their next step before, until the
watchdog ends them. No strategy found in the program's state (its variables are not a strategy's): no
verdict, the restart as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

NONE = -1  # a row's "nothing" (no finding, no copy, nothing committed)
FIXED = 6  # a row's fields before its copies: nan, onset, detected, able, committed, in_flight


@dataclass(frozen=True)
class Row:
    """What one member says at a K-th step: ``nan``, the first step whose loss it found non-finite (-1:
    none); ``onset`` .. ``detected``, the loss spike it found (the chief alone judges spikes; -1: none);
    ``able``: it can restore in place; ``committed`` and ``in_flight``: the chief's newest committed step and
    the step of its snapshot in flight to disk (-1: none; a worker saves none); ``copies``: the steps of the
    in-memory copies it holds whole."""

    nan: int = NONE
    onset: int = NONE
    detected: int = NONE
    able: bool = True
    committed: int = NONE
    in_flight: int = NONE
    copies: tuple[int, ...] = ()

    def encode(self, slots: int) -> list[float]:
        """The row as numbers (its copies, the newest first, cut or padded to ``slots``)."""
        copies = sorted(self.copies, reverse=True)[:slots]
        copies += [NONE] * (slots - len(copies))
        return [float(v) for v in (self.nan, self.onset, self.detected, 1 if self.able else 0, self.committed,
                                   self.in_flight, *copies)]

    @staticmethod
    def decode(values: Sequence[float]) -> "Row":
        v = [int(round(x)) for x in values]
        return Row(v[0], v[1], v[2], v[3] == 1, v[4], v[5], tuple(s for s in v[FIXED:] if s >= 0))


@dataclass(frozen=True)
class Verdict:
    """The group's verdict (the same on every member): ``first`` .. ``last``, the steps skipped (-1: nothing
    found); ``spike``: a loss spike's (else a non-finite loss's); ``restore``: the step every member restores
    in place (-1: not in place); ``why``: why not in place ("" where it is, or nothing was found);
    ``finder``: the rank of the member that found ``first`` (the lowest one)."""

    first: int = NONE
    last: int = NONE
    spike: bool = False
    restore: int = NONE
    why: str = ""
    finder: int = NONE

    @property
    def found(self) -> bool:
        return self.first >= 0

    @property
    def in_place(self) -> bool:
        return self.found and self.restore >= 0

    @property
    def steps(self) -> range:
        return range(self.first, self.last + 1)


def member(rank: int) -> str:
    """A member's name as the launch says it (the chief ``trainer``, else ``worker<rank>``)."""
    return "trainer" if rank == 0 else f"worker{rank}"


def decide(rows: Sequence[Row]) -> Verdict:
    """The group's verdict from every member's row (``rows[rank]``): see the module. Pure."""
    nans = [(r.nan, rank) for rank, r in enumerate(rows) if r.nan >= 0]
    spikes = sorted({(r.onset, r.detected) for r in rows if r.onset >= 0})
    if not nans and not spikes:
        return Verdict()
    if nans:
        first, finder = min(nans)
        found = Verdict(first, first, False, NONE, "", finder)
    else:
        onset, detected = spikes[0]
        found = Verdict(onset, detected, True, NONE, "", next(k for k, r in enumerate(rows) if r.onset == onset))

    def fallback(why: str) -> Verdict:
        return Verdict(found.first, found.last, found.spike, NONE, why, found.finder)

    if nans and spikes:
        return fallback(f"a non-finite loss (step {found.first}) and a loss spike (steps {spikes[0][0]}-"
                        f"{spikes[0][1]}) were found at one check")
    if len(spikes) > 1:
        return fallback(f"the members found different loss spikes ({spikes})")
    unable = [member(k) for k, r in enumerate(rows) if not r.able]
    if unable:
        return fallback(f"{', '.join(unable)} cannot restore in place")
    committed = max(max(r.committed, r.in_flight) for r in rows)
    if committed >= found.first:
        return fallback(f"the chief committed (or is committing) a checkpoint of step {committed}, which holds "
                        f"step {found.first}'s update")
    common = set(rows[0].copies)
    for r in rows[1:]:
        common &= set(r.copies)
    before = [s for s in common if s < found.first]
    if not before:
        held = "; ".join(f"{member(k)} {sorted(r.copies) or 'none'}" for k, r in enumerate(rows))
        return fallback(f"no in-memory copy of one step before step {found.first} is held by every member ({held})")
    return Verdict(found.first, found.last, found.spike, max(before), "", found.finder)


def strategy_of(checkpoint: Any) -> Optional[Any]:
    """The distribution strategy whose variables the program's saved state holds (a MultiWorkerMirroredStrategy's
    mirrored variables), or None: none found."""
    from procsv.trainer.checkpoint.name_based import NameBasedCheckpoint
    from procsv.trainer.checkpoint.snapshot import serialize_object_graph

    if checkpoint is None or isinstance(checkpoint, NameBasedCheckpoint):
        return None
    named, _ = serialize_object_graph(checkpoint)
    for saveable in named:
        for spec in saveable.specs:
            strategy = getattr(getattr(spec, "tensor", None), "distribute_strategy", None)
            if strategy is not None and strategy.num_replicas_in_sync > 1:
                return strategy
    return None


GROUP_KEY = 1 << 20  # the exchange's own collective group (a strategy numbers its groups from 1 up)


class Exchange:
    """Every member's row to every member, in one collective among the ``members`` (see the module): each
    member fills its own ``width`` numbers of a vector of ``members * width``, and an all-reduce SUM of it
    gives every member every row, exactly (float64: whole numbers below 2**53). The all-reduce is TensorFlow's
    own collective op, run eagerly on this member's host device (``device``) in a group of its own
    (:data:`GROUP_KEY`), each exchange an instance of its own, numbered 1, 2, ... alike on every member (they
    exchange at the same steps; an eager collective's instance is not run twice: tried, an exchange paired with
    another's data and hung). The program's strategy set the collectives up, but its numbering of collective
    instances is not used, so that nothing the program traces (again) can put the members' numbers out of
    step (tried: a ``tf.function`` of ``strategy.reduce`` took instance numbers a later trace of the program's
    step took too, and the group failed in a collective)."""

    def __init__(self, device: str, members: int, rank: int, width: int) -> None:
        self._device = device
        self._members, self._rank, self._width = members, rank, width
        self._instance = 0  # the last exchange's instance

    def rows(self, mine: Row) -> list[Row]:
        """Every member's row (``rows[rank]``), this member's ``mine`` among them."""
        import numpy as np
        import tensorflow as tf

        vector = np.zeros(self._members * self._width, dtype=np.float64)
        vector[self._rank * self._width:(self._rank + 1) * self._width] = mine.encode(self._width - FIXED)
        self._instance += 1
        with tf.device(self._device):
            summed = tf.raw_ops.CollectiveReduceV2(
                input=tf.constant(vector), group_size=tf.constant(self._members), group_key=tf.constant(GROUP_KEY),
                instance_key=tf.constant(self._instance), ordering_token=[], merge_op="Add", final_op="Id").numpy()
        return [Row.decode(summed[k * self._width:(k + 1) * self._width]) for k in range(self._members)]
