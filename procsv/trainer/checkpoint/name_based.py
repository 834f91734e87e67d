"""What the checkpoint agent needs of a checkpoint keyed by TF1 variable names (no object graph).

Runs in the trainer's main thread. An eager program hands the agent a ``tf.train.Checkpoint``:
:mod:`procsv.trainer.checkpoint.snapshot` walks its object graph, and a restore matches objects.
A TF1 graph program's state is a flat list of variables saved under their graph names (``w1``,
``w1/Momentum``, ``global_step``: what ``tf.compat.v1.train.Saver`` writes and reads), read and
assigned through a session; :class:`procsv.trainer.graph.state.GraphCheckpoint` is such a
checkpoint. This interface is what the snapshot, the restore at start and the in-memory tier ask of
it, so that none of them imports the graph-mode code.
"""

from __future__ import annotations

import abc
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np


class RestoreStatus:
    """What a name-based restore returns: it has already happened, and matched, when returned (a
    mismatch raises in ``restore`` itself), so the checks ``tf.train.Checkpoint``'s status offers
    pass."""

    def assert_existing_objects_matched(self) -> "RestoreStatus":
        return self

    def assert_consumed(self) -> "RestoreStatus":
        return self

    def expect_partial(self) -> "RestoreStatus":
        return self


class NameBasedCheckpoint(abc.ABC):
    """A checkpoint of named variables, snapshotted with one read and restored by name (an interface:
    :class:`procsv.trainer.graph.state.GraphCheckpoint` implements it).

    ``step_key``: the key the program's global step is saved under (None: it saves none); a
    snapshot is named by that variable's value in it, and a restore leaves the step it restores.
    """

    step_key: str | None = None

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """The checkpoint keys of the variables, in a fixed order."""

    @abc.abstractmethod
    def gather(self) -> list[tuple[str, np.ndarray]]:
        """Every variable's current value, keyed as in :meth:`keys`."""

    @abc.abstractmethod
    def restore(self, path: str) -> RestoreStatus:
        """Restore every variable (but those left out: :meth:`leaving_out`) from ``path``, by name;
        raise ``ValueError`` naming the variable when one is missing or of another shape or dtype."""

    @abc.abstractmethod
    def key_of(self, variable: Any) -> str | None:
        """The key ``variable`` is saved under (None: it is not in this checkpoint)."""

    @contextmanager
    def leaving_out(self, keys: set[str]) -> Iterator[None]:
        """Restores within the block leave the variables of ``keys`` untouched (a checkpoint procsv
        did not write, with no step variable: the step is set from what was read instead)."""
        self._left_out = frozenset(keys)
        try:
            yield
        finally:
            self._left_out = frozenset()

    @property
    def left_out(self) -> frozenset[str]:
        return getattr(self, "_left_out", frozenset())
