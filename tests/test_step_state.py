"""StepState's bounds: what each step reads to decide whether the step boundary has work.

Pure: no process, no TensorFlow step. The rule under test: ``at`` is always the earlier of the
two halves' times, however their bounds are set or opened, so a boundary never skips a half
whose time has come."""

from __future__ import annotations

import itertools

from procsv.trainer.step_boundary import NEVER, StepState


def _state() -> StepState:
    return StepState(clock=lambda: 0.0, coord=None, counter=None,  # type: ignore[arg-type]
                     boundary=lambda step: None, after_step=lambda: None)


def test_at_is_always_the_earlier_of_the_two_halves_times() -> None:
    times = (float("-inf"), 1.0, 5.0, NEVER)
    for ckpt_at, end_at in itertools.product(times, times):
        state = _state()
        state.set_checkpoint(10, ckpt_at)
        state.set_end(NEVER, end_at)
        assert state.at == min(ckpt_at, end_at)
        state.set_checkpoint(20, 3.0)  # one half moves: the minimum follows
        assert state.at == min(3.0, end_at)


def test_opening_a_half_brings_its_work_to_the_next_boundary_and_keeps_the_other_halfs_bounds() -> None:
    state = _state()
    state.set_checkpoint(100, 50.0)
    state.set_end(NEVER, 40.0)
    state.open_end()  # a summary batch is waiting
    assert (state.end_step, state.end_at, state.at) == (NEVER, float("-inf"), float("-inf"))
    assert (state.ckpt_step, state.ckpt_at) == (100, 50.0)
    state.set_end(NEVER, 45.0)  # the half did its work
    assert state.at == 45.0
    state.open_checkpoint()  # a save was requested
    assert (state.ckpt_step, state.ckpt_at, state.at) == (0, float("-inf"), float("-inf"))
    assert (state.end_step, state.end_at) == (NEVER, 45.0)
