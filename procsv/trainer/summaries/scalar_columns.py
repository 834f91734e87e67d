"""Scalar summaries held in columns: what the trainer's summary buffer, its chunks and its sender keep.

Runs in the trainer (any thread that logs appends, under the buffer's lock; the main thread takes
and sends). Row ``i`` is ``(tags[i], steps[i], values[i], walls[i])``. Columns rather than a list
of row tuples because a tuple is an object the garbage collector tracks: the ~25,000 rows a
second that 10 scalars a step make, alive from one hand-off to their acknowledgement, triggered
a young-generation collection every ~35 steps (2.5 us a step on the digits model). Floats, ints
and strings are not tracked, so lists of them add nothing for it to visit. The columns also go into the
wire format (:func:`procsv.ipc.columns.encode_columns`) as they are.
"""

from __future__ import annotations

from itertools import compress
from typing import Optional

from procsv.ipc.columns import Row


class ScalarColumns:
    """Scalar rows in four parallel lists: tags, steps, values (floats) and wall times."""

    __slots__ = ("tags", "steps", "values", "walls")

    def __init__(self, tags: Optional[list[str]] = None, steps: Optional[list[int]] = None,
                 values: Optional[list[float]] = None, walls: Optional[list[float]] = None) -> None:
        self.tags: list[str] = tags if tags is not None else []
        self.steps: list[int] = steps if steps is not None else []
        self.values: list[float] = values if values is not None else []
        self.walls: list[float] = walls if walls is not None else []

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def rows(self) -> list[Row]:
        """The rows as tuples (tag, step, value, wall time): for readers, not for the hot path."""
        return list(zip(self.tags, self.steps, self.values, self.walls))

    def span(self) -> Optional[tuple[int, int]]:
        """The lowest and highest step (None if empty)."""
        return (min(self.steps), max(self.steps)) if self.steps else None

    def extend(self, other: ScalarColumns) -> None:
        """Append ``other``'s rows after these."""
        self.tags += other.tags
        self.steps += other.steps
        self.values += other.values
        self.walls += other.walls

    def prepend(self, other: ScalarColumns) -> None:
        """Insert ``other``'s rows before these."""
        self.tags[:0] = other.tags
        self.steps[:0] = other.steps
        self.values[:0] = other.values
        self.walls[:0] = other.walls

    def head(self, n: int) -> ScalarColumns:
        """A copy of the first ``n`` rows."""
        return ScalarColumns(self.tags[:n], self.steps[:n], self.values[:n], self.walls[:n])

    def tail_from(self, n: int) -> ScalarColumns:
        """A copy of the rows from the ``n``-th on."""
        return ScalarColumns(self.tags[n:], self.steps[n:], self.values[n:], self.walls[n:])

    def drop_front(self, n: int) -> None:
        """Remove the first ``n`` rows."""
        if n > 0:
            del self.tags[:n], self.steps[:n], self.values[:n], self.walls[:n]

    def take_all(self) -> ScalarColumns:
        """Move every row into a new object (these columns are left empty)."""
        taken = ScalarColumns(self.tags, self.steps, self.values, self.walls)
        self.tags, self.steps, self.values, self.walls = [], [], [], []
        return taken

    def since(self, step: int) -> ScalarColumns:
        """A copy of the rows at ``step`` or later."""
        keep = [s >= step for s in self.steps]
        if all(keep):
            return self.head(len(self.steps))
        return ScalarColumns(list(compress(self.tags, keep)), list(compress(self.steps, keep)),
                             list(compress(self.values, keep)), list(compress(self.walls, keep)))
