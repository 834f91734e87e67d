"""procsv.trainer.summaries.scalar_columns: the trainer's waiting scalars as four parallel lists."""

from __future__ import annotations

import gc

import pytest

from procsv.trainer.summaries.buffer import BUFFER_MAX, TRIM_SLACK, SummaryBuffer
from procsv.trainer.summaries.scalar_columns import ScalarColumns

def columns(rows: list[tuple[str, int, float, float]]) -> ScalarColumns:
    """ScalarColumns holding ``rows`` (tag, step, value, wall time)."""
    return ScalarColumns(*(list(c) for c in zip(*rows))) if rows else ScalarColumns()


ROWS = [("a", 1, 0.5, 10.0), ("b", 1, 1.5, 10.0), ("a", 3, 2.5, 11.0), ("b", 2, 3.5, 12.0)]


def test_rows_round_trip_and_slices_copy():
    cols = columns(ROWS)
    assert len(cols) == 4 and cols.rows == ROWS
    assert cols.span() == (1, 3)
    head, rest = cols.head(1), cols.tail_from(1)
    assert head.rows == ROWS[:1] and rest.rows == ROWS[1:]
    head.tags[0] = "changed"
    assert cols.rows == ROWS  # a slice is a copy
    assert ScalarColumns().span() is None and columns([]).rows == []


def test_since_keeps_the_rows_at_or_after_a_step_in_order():
    cols = columns(ROWS)
    assert cols.since(2).rows == [ROWS[2], ROWS[3]]
    assert cols.since(0).rows == ROWS and cols.since(4).rows == []


def test_extend_prepend_drop_and_take_all():
    cols = columns(ROWS[1:3])
    cols.prepend(columns(ROWS[:1]))
    cols.extend(columns(ROWS[3:]))
    assert cols.rows == ROWS
    cols.drop_front(2)
    assert cols.rows == ROWS[2:]
    taken = cols.take_all()
    assert taken.rows == ROWS[2:] and len(cols) == 0
    cols.extend(columns(ROWS[:1]))
    assert taken.rows == ROWS[2:]  # the taken lists are no longer the buffer's


def test_waiting_scalars_give_the_garbage_collector_nothing_to_track():
    """Thousands of logged rows wait as lists of floats, ints and strings: none is a tracked object."""
    buf = SummaryBuffer()
    for step in range(2000):
        buf.scalars({"loss": 0.5 * step, "acc": float(step)}, step, 1.0)
    cols = buf._cols
    assert len(cols) == 4000
    assert not any(gc.is_tracked(x) for column in (cols.tags, cols.steps, cols.values, cols.walls)
                   for x in column)


@pytest.mark.slow
def test_drops_beyond_the_bound_are_counted_at_once_and_removed_in_slack_sized_runs():
    buf = SummaryBuffer()
    extra = TRIM_SLACK + 5
    for i in range(BUFFER_MAX + extra):
        buf.scalar("loss", float(i), step=i, wall=1.0)
        if i == BUFFER_MAX + 3:  # dropped and counted, not yet removed from the lists
            assert buf.dropped_total == 4 and len(buf) == BUFFER_MAX and len(buf._cols) == BUFFER_MAX + 4
    assert buf.dropped_total == extra and len(buf) == BUFFER_MAX and buf.room() == 0
    assert len(buf._cols) == BUFFER_MAX + 5  # TRIM_SLACK rows were removed in one run, 5 wait
    chunk = buf.take(limit=BUFFER_MAX)
    assert len(chunk.rows) == BUFFER_MAX and chunk.dropped == extra
    assert chunk.rows[0][1] == extra and chunk.rows[-1][1] == BUFFER_MAX + extra - 1
    assert buf.oldest_step() is None and len(buf) == 0
