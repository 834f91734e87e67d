"""Loss spikes (issue 68), the pure parts: the rule of :mod:`procsv.trainer.nonfinite.spike` on plain
losses, its history between checks, the kept losses' values handed to it in one read, and what
``--on-spike`` does with a spike (the record, ``warn``, ``stop``, a rollback it cannot do), with no
process started.

``tests/spike_clean_losses.npz`` holds two long clean runs of real per-step losses: the digits MLP of
``procsv.examples.digits`` trained for 5000 steps without procsv, at batch 64 (seed 0) and batch 16
(seed 1: its late losses are small and spread over a factor of ten from batch to batch), made by
``scripts/spike_losses.py``.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procsv.common.errors import LossSpiked, NonFiniteState, TrainingDiverged, UsageError
from procsv.trainer.nonfinite import spike
from procsv.trainer.nonfinite.policy import SkipBudget
from procsv.trainer.nonfinite.spike import OnSpike, Spike, SpikeHistory, SpikeThresholds, Verdict, judge
from procsv.trainer.nonfinite.spike_response import SpikeResponse
from procsv.trainer.nonfinite.watch import NonfiniteWatch

HERE = os.path.dirname(os.path.abspath(__file__))
RULE = SpikeThresholds()  # the defaults: window 200, min_history 100, z 8, min_ratio 1.5


def _spikes(losses: Any, rule: SpikeThresholds = RULE, first: int = 1) -> list[tuple[int, int]]:
    """(onset, step) of each spike in ``losses``, the loss of steps ``first``, ``first`` + 1, ..."""
    losses = list(map(float, losses))
    return [(s.onset, s.step) for s in judge([], [], range(first, first + len(losses)), losses, rule).spikes]


def _noisy(n: int, seed: int = 0, level: float = 2.0, noise: float = 0.05) -> np.ndarray:
    """A run's losses: a slow decay to ``level``, each batch's loss off by a lognormal factor."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, n + 1)
    return (level + 6.0 / np.sqrt(t)) * np.exp(rng.normal(0.0, noise, n))


# ---------------------------------------------------------------------------------- never a spike
def test_an_ordinary_noisy_run_is_never_flagged() -> None:
    for seed in range(5):
        assert _spikes(_noisy(3000, seed)) == []
        assert _spikes(_noisy(3000, seed, noise=0.3)) == []  # a small batch's noisier losses


def test_long_clean_runs_of_real_losses_are_never_flagged() -> None:
    with np.load(os.path.join(HERE, "spike_clean_losses.npz")) as runs:
        for name in runs.files:
            losses = runs[name]
            assert len(losses) == 5000 and np.isfinite(losses).all()
            assert _spikes(losses) == [], name
            # (as a trainer meets them: a check every 37 steps, the history carried between checks)
            history = SpikeHistory(RULE)
            for at in range(0, len(losses), 37):
                history.feed(range(at + 1, at + 38), losses[at:at + 37])
                assert history.judge() == (), (name, at)


def test_the_start_of_training_is_never_flagged() -> None:
    # its first losses jump about (a fresh model's), its fall is fast, and no step is judged before
    # min_history losses came before it: even a 100x step among the first 99 is not
    rng = np.random.default_rng(1)
    start = np.concatenate([rng.uniform(1.0, 50.0, 20), np.geomspace(20.0, 1.0, 200), _noisy(500, 2, level=1.0)])
    assert _spikes(start) == []
    early = _noisy(300, 3)
    early[98] *= 100  # step 99: 98 losses before it
    assert _spikes(early) == []
    early[98] /= 100
    early[100] *= 100  # step 101: 100 before it
    assert _spikes(early) == [(101, 101)]


def test_a_warm_up_whose_loss_rises_is_never_flagged() -> None:
    # a learning-rate warm-up that raises the loss from 2 to 6 over 500 steps, then its decay
    rng = np.random.default_rng(4)
    rise = np.linspace(2.0, 6.0, 500) * np.exp(rng.normal(0, 0.03, 500))
    decay = (1.0 + 5.0 * np.exp(-np.arange(3000) / 800)) * np.exp(rng.normal(0, 0.03, 3000))
    assert _spikes(np.concatenate([_noisy(300, 5), rise, decay])) == []
    # a steeper one: doubling over 50 steps, from a quiet plateau
    steep = np.concatenate([np.full(300, 1.0), np.linspace(1.0, 2.0, 50), np.full(300, 2.0)])
    assert _spikes(steep * np.exp(rng.normal(0, 0.02, steep.size))) == []


def test_a_learning_rate_schedules_drop_is_never_a_spike_nor_what_comes_after_it() -> None:
    rng = np.random.default_rng(6)
    drops = np.concatenate([np.full(1000, 1.0), np.full(1000, 0.3), np.full(1000, 0.05)])
    assert _spikes(drops * np.exp(rng.normal(0, 0.05, drops.size))) == []


def test_losses_that_can_be_zero_or_negative_are_judged_on_a_linear_scale_and_only_upward() -> None:
    rng = np.random.default_rng(7)
    elbo = -100.0 + rng.normal(0, 1.0, 1000)  # a negative loss, noisy
    assert _spikes(elbo) == []
    elbo[600] = -150.0  # a drop: never
    assert _spikes(elbo) == []
    elbo[700] = -60.0  # 40 above a median of -100 whose spread is 1: less than half its size (min_ratio 1.5)
    assert _spikes(elbo) == []
    elbo[700] = -30.0  # 70 above
    assert _spikes(elbo) == [(701, 701)]
    assert _spikes(np.zeros(300)) == [] and _spikes(np.concatenate([np.zeros(300), [5.0]])) == []  # nothing to compare


def test_a_loss_that_is_zero_on_most_batches_is_never_flagged() -> None:
    # a hinge or margin loss, 0 on most batches: the window's median and MAD are 0, so the rule had no
    # margin and flagged any loss above its last few (460 flags in 20,000 steps of such a real run)
    rng = np.random.default_rng(3)
    hinge = np.where(rng.random(20_000) < 0.6, 0.0, rng.exponential(0.05, 20_000))
    assert _spikes(hinge) == []


# ---------------------------------------------------------------------------------- spikes
def test_an_injected_50x_spike_is_flagged_at_its_step_with_its_statistics() -> None:
    losses = _noisy(1000, 8)
    losses[499] *= 50  # step 500
    found = judge([], [], range(1, 1001), losses, RULE).spikes
    assert [(s.onset, s.step) for s in found] == [(500, 500)]
    one = found[0]
    assert one.loss == pytest.approx(losses[499]) and one.history == 200
    assert one.median == pytest.approx(np.median(losses[299:499]), rel=0.01)
    assert one.median * 1.5 <= one.threshold < one.loss
    assert one.steps == range(500, 501)
    assert one.describe().startswith(f"the loss of step 500 spiked: {one.loss:.6g} against a threshold of ")


def test_a_spike_that_rises_over_a_few_steps_has_its_onset_where_the_rise_began() -> None:
    losses = _noisy(600, 9)
    base = float(np.median(losses[300:400]))
    losses[400:404] = base * np.array([3.0, 8.0, 30.0, 50.0])  # steps 401..404; the threshold is ~1.5-2x
    found = judge([], [], range(1, 601), losses, RULE).spikes
    assert len(found) == 1 and found[0].onset == 401 and found[0].step in (401, 402)
    losses[400] = base * 1.1  # a step barely above: not part of the rise
    found = judge([], [], range(1, 601), losses, RULE).spikes
    assert (found[0].onset, found[0].step) == (402, 402)


def test_a_run_of_flagged_steps_is_one_spike_and_a_later_one_is_another() -> None:
    losses = _noisy(1000, 10)
    losses[399:405] *= 40  # steps 400..405: one spike
    losses[699] *= 40  # step 700: another
    assert _spikes(losses) == [(400, 400), (700, 700)]


def test_the_thresholds_are_honoured() -> None:
    losses = _noisy(400, 11, noise=0.05)
    losses[300] *= 2.0  # step 301: twice the median, ~14 MADs of this run's spread above it
    assert _spikes(losses) == [(301, 301)]
    assert _spikes(losses, SpikeThresholds(z=20)) == []  # more MADs asked for
    assert _spikes(losses, SpikeThresholds(min_ratio=2.5)) == []  # more than twice the median asked for
    flat = np.ones(300)  # no spread at all (MAD 0): min_ratio alone decides
    assert _spikes(np.append(flat, 1.4)) == [] and _spikes(np.append(flat, 1.6)) == [(301, 301)]
    assert _spikes(np.append(flat, 1.6), SpikeThresholds(min_ratio=2.0)) == []
    short = SpikeThresholds(window=20, min_history=10)
    spiky = np.append(np.ones(10), 3.0)
    assert _spikes(spiky, short) == [(11, 11)] and _spikes(spiky[1:], short) == []  # 10 before it, then 9
    for bad in ({"window": 1}, {"min_history": 1}, {"min_history": 300}, {"z": 0.0}, {"z": math.inf},
                {"min_ratio": 0.5}):
        with pytest.raises(ValueError, match="spike"):
            SpikeThresholds(**bad)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(min_value=-50, max_value=50), min_size=0, max_size=400),
       st.lists(st.integers(min_value=1, max_value=90), min_size=1, max_size=12),
       st.floats(min_value=1e-3, max_value=1e3))
def test_judging_in_any_chunks_finds_what_judging_at_once_finds_at_any_scale(noise: list[float], cuts: list[int],
                                                                               scale: float) -> None:
    base = _noisy(400, 12)
    losses = base * np.exp(np.resize(np.asarray(noise or [0.0]), 400) / 25)  # up to e**2 either way
    at_once = _spikes(losses)
    history = SpikeHistory(SpikeThresholds())
    found: list[tuple[int, int]] = []
    at = 0
    for cut in cuts * 40:
        if at >= len(losses):
            break
        history.feed(range(at + 1, at + cut + 1), losses[at:at + cut])
        found += [(s.onset, s.step) for s in history.judge()]
        at += cut
    history.feed(range(at + 1, len(losses) + 1), losses[at:])
    found += [(s.onset, s.step) for s in history.judge()]
    assert found == at_once
    assert _spikes(losses * scale) == at_once  # positive losses: a multiplicative rule
    for onset, step in at_once:  # only upward: a flagged loss is above its window's median
        assert losses[step - 1] > np.median(losses[max(0, step - 1 - 200):step - 1])


def test_the_history_forgets_what_a_restore_undid_and_judges_the_replay_again() -> None:
    losses = _noisy(300, 13)
    losses[249] *= 50  # step 250
    history = SpikeHistory(RULE)
    history.feed(range(1, 261), losses[:260])
    assert [(s.onset, s.step) for s in history.judge()] == [(250, 250)]
    history.rewind(240)  # the state of step 240 restored
    assert history.kept == 180  # (the window's 200, of steps 61..260: 241..260 are undone)
    history.feed(range(241, 261), losses[240:260])  # the same steps again: the same spike
    assert [s.step for s in history.judge()] == [250]
    history.rewind(240)
    history.feed([241, 242], [1.0, 1.0])
    history.rewind(241)  # fed, not judged yet: what came after the restore is dropped
    history.feed(range(242, 261), np.delete(losses[241:260], 249 - 241))  # step 250's batch skipped
    assert history.judge() == ()


# ---------------------------------------------------------------------------------- the prefilter is exact
def _brute(history_steps: Sequence[int], history: Sequence[float], steps: Sequence[int], losses: Sequence[float],
           rule: SpikeThresholds, flagged_last: bool = False) -> Verdict:
    """:func:`judge` with every judged step's full window statistics: no step left out beforehand."""
    with mock.patch.object(spike, "_candidates", lambda values, idx, rule: idx):
        return judge(history_steps, history, steps, losses, rule, flagged_last)


def _stream(kind: str, n: int, seed: int, noise: float) -> np.ndarray:
    """``n`` losses of a kind: noisy or clean positive ones, with spikes, rounded (ties, a MAD of 0),
    zero on many batches, shifted below zero, of either sign at any scale, or tiny."""
    rng = np.random.default_rng(seed)
    losses = np.linspace(3.0, 0.5, n) * np.exp(rng.normal(0.0, noise, n))
    if kind == "clean":
        losses = np.linspace(3.0, 0.5, n) * np.exp(rng.normal(0.0, 0.01, n))
    elif kind == "rounded":
        losses = np.round(losses, 1)
    elif kind == "zeros":
        losses = np.where(rng.random(n) < rng.uniform(0.2, 0.9), 0.0, losses)
    elif kind == "shifted":
        losses = losses - rng.uniform(0.0, 3.0)
    elif kind == "signed":
        losses = rng.normal(0.0, 1.0, n) * 10.0 ** rng.integers(-12, 13)
    elif kind == "tiny":  # down among the subnormal floats, in logarithms and not
        losses = losses * 10.0 ** rng.integers(-320, -300) * rng.choice([1.0, -1.0])
    jumps = rng.random(n) < 0.03
    losses[jumps] = np.where(losses[jumps] > 0, losses[jumps] * rng.uniform(1.0, 100.0, jumps.sum()),
                             losses[jumps] + rng.uniform(0.0, 50.0, jumps.sum()))
    return losses


def _threshold(losses: np.ndarray, j: int, rule: SpikeThresholds) -> float:
    """The threshold a positive loss at index ``j`` of ``losses`` is judged against (its window's own
    statistics: logarithms when the window is positive, else linear; inf: nothing is flagged)."""
    window = losses[max(0, j - rule.window):j]
    if (window > 0).all():
        _, threshold = spike._stats(np.log(window)[None, :], True, rule)
        return float(np.exp(threshold[0]))
    median, threshold = spike._stats(window[None, :], False, rule)
    return float(threshold[0]) if threshold[0] > median[0] else math.inf


def _on_the_edge(losses: np.ndarray, rule: SpikeThresholds, seed: int) -> list[int]:
    """Put a few losses (at least a window apart) just above their threshold, the next float up:
    flagged by a hair. Returns their indices."""
    rng = np.random.default_rng(seed)
    edges = []
    j = rule.min_history + int(rng.integers(0, rule.window))
    while j < losses.size:
        threshold = _threshold(losses, j, rule)
        if math.isfinite(threshold) and threshold > 0:
            losses[j] = np.nextafter(threshold, math.inf)
            edges.append(j)
        j += rule.window + 1 + int(rng.integers(0, rule.window))
    return edges


@st.composite
def _rules(draw: Any) -> SpikeThresholds:
    window = draw(st.integers(min_value=2, max_value=60))
    min_history = draw(st.integers(min_value=2, max_value=window))
    return SpikeThresholds(window, min_history, draw(st.sampled_from([0.3, 1.0, 3.0, 8.0, 20.0])),
                           draw(st.sampled_from([1.0, 1.1, 1.5, 4.0])),
                           draw(st.integers(min_value=1, max_value=min_history)))


@settings(max_examples=150, deadline=None)
@given(_rules(), st.sampled_from(["noisy", "clean", "rounded", "zeros", "shifted", "signed", "tiny"]),
       st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=2**32 - 1),
       st.sampled_from([0.05, 0.3, 0.7, 1.5]), st.floats(min_value=0.0, max_value=1.0),
       st.lists(st.integers(min_value=1, max_value=90), min_size=1, max_size=8), st.booleans())
def test_the_prefilter_leaves_out_only_steps_the_full_statistics_do_not_flag(
        rule: SpikeThresholds, kind: str, n: int, seed: int, noise: float, cut: float, chunks: list[int],
        flagged_last: bool) -> None:
    # each verdict (its spikes with their statistics, its flagged_last) is the one of every step's own
    # window statistics, judged at once, from a history, or in chunks as a trainer feeds them
    with np.errstate(over="ignore"):  # (a wild window's threshold: exp(> 709) is inf, with or without the prefilter)
        losses = _stream(kind, n, seed, noise)
        steps = list(range(1, n + 1))
        for j in _on_the_edge(losses, rule, seed):  # flagged by a hair: the prefilter must keep them
            assert _brute([], [], steps[:j + 1], losses[:j + 1], rule).flagged_last
        brute = _brute([], [], steps, losses, rule)
        assert judge([], [], steps, losses, rule) == brute
        h = int(cut * n)
        assert (judge(steps[:h], losses[:h], steps[h:], losses[h:], rule, flagged_last)
                == _brute(steps[:h], losses[:h], steps[h:], losses[h:], rule, flagged_last))
        history = SpikeHistory(rule)
        found: list[Spike] = []
        at = 0
        for size in chunks * (n // max(1, sum(chunks)) + 1):
            history.feed(steps[at:at + size], losses[at:at + size])
            found += history.judge()
            at += size
        assert tuple(found) == brute.spikes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=-1e3, max_value=1e3), min_size=2, max_size=80), st.data())
def test_no_window_within_a_union_has_a_threshold_below_its_bound(union: list[float], data: Any) -> None:
    # the bound of spike._least_thresholds, against each window of the union (any run of it as long as
    # the shortest or longer), in the space of each: linear, and in logarithms for positive values
    values = np.asarray(union)
    rule = data.draw(_rules())
    shortest = data.draw(st.integers(min_value=2, max_value=values.size))
    for space, logs in ((values, False), (np.log(np.abs(values) + 1e-3), True)):
        bound, slack = spike._least_thresholds(space[None, :], shortest, rule, logs)
        for n in range(shortest, space.size + 1):
            windows = np.lib.stride_tricks.sliding_window_view(space, n)
            _, threshold = spike._stats(windows, logs, rule)
            assert (threshold >= bound[0] - slack[0]).all(), (n, threshold.min(), bound[0])


def test_on_real_losses_the_fast_path_judges_as_every_windows_statistics_do_and_few_steps_need_them() -> None:
    # the digits losses a trainer judges before each snapshot (every 37, 64 or 600 steps): the same
    # verdicts as every step's own statistics, with and without spikes, and with nearly no step left
    # for them (the former prefilter, a median's bound times min_ratio, let 922 and 1603 of the
    # 5000 through: each then took a window's median and MAD)
    filled: list[int] = []
    fill = spike._Stats.fill

    def counted(self: Any, values: np.ndarray, idx: np.ndarray, windows: np.ndarray, rule: SpikeThresholds) -> None:
        filled.append(idx.size)
        fill(self, values, idx, windows, rule)

    with np.load(os.path.join(HERE, "spike_clean_losses.npz")) as runs:
        for name in runs.files:
            clean = runs[name].astype(np.float64)
            spiked = clean.copy()
            spiked[1499::500] *= 1e5  # steps 1500, 2000, ..: far above any batch's noise (batch 16's: 8 MADs ~ 3000x)
            for losses in (clean, spiked):
                steps = range(1, losses.size + 1)
                brute = _brute([], [], steps, losses, RULE)
                assert [s.step for s in brute.spikes] == ([] if losses is clean else list(range(1500, 5001, 500)))
                for chunk in (37, 64, 600):
                    history = SpikeHistory(RULE)
                    found: list[Spike] = []
                    filled.clear()
                    with mock.patch.object(spike._Stats, "fill", counted):
                        for at in range(0, losses.size, chunk):
                            history.feed(steps[at:at + chunk], losses[at:at + chunk])
                            found += history.judge()
                    assert tuple(found) == brute.spikes, (name, chunk)
                    assert sum(filled) <= len(brute.spikes) + 10, (name, chunk, sum(filled))


# ---------------------------------------------------------------------------------- the policy
def test_the_policy_parses_and_refuses_rollback_where_it_is_not_built() -> None:
    assert spike.parse(None) == OnSpike.WARN == spike.DEFAULT and spike.parse("rollback") == OnSpike.ROLLBACK
    with pytest.raises(ValueError, match="on_spike must be one of rollback, stop, warn, off, not 'skip'"):
        spike.parse("skip")
    # a single trainer, a trainer group, a TF1 graph program whose input is fed or a function of its step (issue 68)
    assert spike.refusal(OnSpike.ROLLBACK) == ""
    assert spike.refusal(OnSpike.WARN, ps=True, graph_input="x") == "" and spike.refusal(OnSpike.STOP, True, "x") == ""
    ps = spike.refusal(OnSpike.ROLLBACK, ps=True)
    assert ps.startswith("--on-spike rollback is not supported in a parameter-server job (--ps) yet (its variables "
                         "live on the parameter servers, shared by every worker") and "\n" not in ps
    inside = spike.refusal(OnSpike.ROLLBACK, graph_input="its input is dequeued from a queue inside the graph (op 'q')")
    assert inside.startswith("--on-spike rollback is not supported in a TF1 graph program whose input is read inside "
                             "its graph yet (its input is dequeued from a queue inside the graph (op 'q'), which no "
                             "checkpoint restores: a replay would train other batches") and "\n" not in inside
    old_keras = spike.unsupported("Keras fit with Keras 3.0.0 (...)")  # (Keras fit itself rolls spikes back)
    assert old_keras.startswith("--on-spike rollback is not supported in Keras fit with Keras 3.0.0 (...) yet (only "
                                "in a custom loop or MonitoredTrainingSession, eager or TF1 graph, or Keras fit, of a "
                                "single trainer or a trainer group)")


def test_a_spikes_steps_count_against_max_skips_together() -> None:
    budget = SkipBudget(max_skips=3, skip_window=1000, skipped=[100])
    assert budget.first_refused(range(500, 502)) is None  # 3 in all
    assert budget.first_refused(range(500, 503)) == 502  # a 4th
    assert budget.first_refused([100, 500, 501]) is None  # skipped already: no more
    assert budget.skipped == [100]  # (asking changes nothing)


class _Walk:
    """What the response asks of the rollback's walk, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.abandoned = ""  # (a restore hook's giving the replay up: none here)

    def restored(self) -> None:
        self.calls.append(("restored", None))

    def drop_spike_check(self, detected: int) -> None:
        self.calls.append(("drop_check", detected))

    def skip_quietly(self, steps: Any) -> None:
        self.calls.append(("quietly", list(steps)))

    def check_spike_at(self, detected: int) -> None:
        self.calls.append(("check_at", detected))

    def plan_next(self, step: int) -> None:
        self.calls.append(("plan_next", step))


def not_a_group(bad: object) -> str:
    """A single trainer's response never asks for a group's rollback (its watch has no group_refusal)."""
    raise AssertionError(f"a single trainer asked for a group's rollback: {bad}")


def _response(policy: OnSpike, restore: Any = None, committed: int = 60) -> tuple[SpikeResponse, NonfiniteWatch,
                                                                                   list[Any], _Walk]:
    told: list[Any] = []
    walk = _Walk()
    watch = NonfiniteWatch(None, ("loss",), (), 3, 1000, spike_policy=policy, spiked=lambda found, step: None)
    history = watch.spikes
    assert history is not None

    def undone(step: int) -> None:  # (as the rollback's: the history forgets what the restore undid)
        told.append(("undone", step))
        history.rewind(step)

    response = SpikeResponse(watch, walk, told.append,  # type: ignore[arg-type]
                             restore or (lambda step: (60, "the in-memory snapshot", "memory", "/m#slot1", 0.01)),
                             undone, lambda step: committed, lambda step: f"step {step} would be skip 4 (--max-skips 3)",
                             not_a_group)
    return response, watch, told, walk


FOUND = Spike(onset=65, step=66, loss=15.0, threshold=2.6, median=0.3, history=40, losses=(8.0, 15.0))


def test_warn_records_the_spike_says_one_line_and_trains_on(capsys: pytest.CaptureFixture[str]) -> None:
    response, watch, told, walk = _response(OnSpike.WARN)
    response.judged((FOUND,), 70)
    (record,) = told
    assert (record.KIND, record.step, record.onset, record.loss, record.threshold, record.median, record.action) == \
        ("spike_detected", 66, 65, 15.0, 2.6, 0.3, "warn")
    err = capsys.readouterr().err
    assert err == f"procsv: {FOUND.describe()}; --on-spike warn: training on\n"
    assert walk.calls == [] and watch.budget.skipped == []


def test_stop_refuses_the_snapshot_and_stops_in_order_with_exit_code_4(capsys: pytest.CaptureFixture[str]) -> None:
    response, watch, told, _ = _response(OnSpike.STOP)
    with pytest.raises(LossSpiked) as refused:
        response.judged((FOUND,), 70)
    assert told[0].action == "stop" and (refused.value.onset, refused.value.detected, refused.value.step) == (65, 66, 70)
    with pytest.raises(TrainingDiverged) as stopped:
        response.refused(refused.value, final=False)
    assert stopped.value.code == 4
    line = capsys.readouterr().err.strip()
    assert line == (f"procsv: {FOUND.describe()}; --on-spike stop: stopping in order with exit code 4 (diverging), "
                    "without a checkpoint of this state (the newest committed checkpoint is of step 60)")


def test_rollback_replays_the_spike_first_and_skips_its_steps_when_the_replay_gives_its_losses_again(
        capsys: pytest.CaptureFixture[str]) -> None:
    response, watch, told, walk = _response(OnSpike.ROLLBACK)
    with pytest.raises(LossSpiked) as refused:
        response.judged((FOUND,), 70)
    response.refused(refused.value, final=False)  # restored before the onset, to replay it: no stop, no skip
    assert [getattr(m, "KIND", m) for m in told] == ["spike_detected", ("undone", 60), "rolled_back"]
    assert (told[2].step, told[2].restored_step, told[2].skip) == (65, 60, False)
    # (the walk judges the replay at the boundary after step 66, the detection: not at the next snapshot)
    assert walk.calls == [("restored", None), ("check_at", 66), ("plan_next", 60)] and watch.budget.skipped == []
    assert capsys.readouterr().err.strip().endswith("--on-spike rollback: restored step 60 from the in-memory "
                                                    "snapshot, replaying steps 65-66 to tell a transient fault of "
                                                    "the machine from the data's; training on")
    told.clear()
    walk.calls.clear()
    assert watch.spikes is not None
    watch.spikes.feed(range(61, 71), [0.3, 0.3, 0.3, 0.3, 8.0, 15.0, 0.3, 0.3, 0.3, 0.3])  # the replay: the same
    found = watch.spikes.judge()  # (too few losses for the rule: the comparison decides, not a new flag)
    with pytest.raises(LossSpiked) as again:  # the check after step 66: its losses again, bit for bit
        response.judged(found, 70)
    response.refused(again.value, final=False)
    kinds = [getattr(m, "KIND", m) for m in told]
    assert kinds == ["spike_replayed", ("undone", 60), "rolled_back", "step_skipped", "step_skipped"]
    assert (told[0].reproduced, told[0].loss, told[0].replay_loss) == (True, 15.0, 15.0)
    assert told[2].skip and [m.step for m in told[3:]] == [65, 66] and [m.skipped for m in told[3:]] == [1, 2]
    assert watch.budget.skipped == [65, 66]
    assert walk.calls == [("restored", None), ("quietly", [65, 66]), ("plan_next", 60)]
    assert capsys.readouterr().err.strip().endswith("and so again when replayed, bit for bit; --on-spike rollback: "
                                                    "restored step 60 from the in-memory snapshot, replaying to step 64, "
                                                    "then skipping steps 65-66; training on")


def test_a_spike_the_replay_does_not_give_again_was_the_machines_and_nothing_is_skipped(
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    response, watch, told, walk = _response(OnSpike.ROLLBACK)
    with pytest.raises(LossSpiked) as refused:
        response.judged((FOUND,), 70)
    response.refused(refused.value, final=False)
    told.clear()
    capsys.readouterr()
    assert watch.spikes is not None
    watch.spikes.feed(range(61, 71), [0.3] * 10)  # the replay: no spike at 65-66 this time
    assert watch.spikes.judge() == ()
    response.judged((), 70)  # no exception: the snapshot is taken
    (verdict,) = told
    assert (verdict.KIND, verdict.step, verdict.onset, verdict.reproduced, verdict.loss, verdict.replay_loss,
            verdict.host) == ("spike_replayed", 66, 65, False, 15.0, 0.3, socket.gethostname())
    assert watch.budget.skipped == [] and ("quietly", [65, 66]) not in walk.calls
    assert capsys.readouterr().err.strip() == (
        f"procsv: the loss spike at step 66 did not come again when replayed (loss 15, then 0.3): a transient fault "
        f"of this machine ({socket.gethostname()}), not the data's; its batches are kept; training on")
    response.judged((), 80)  # said once
    assert len(told) == 1
    with pytest.raises(LossSpiked) as refused:  # another spike of those steps, later: replayed again
        response.judged((FOUND,), 90)
    response.refused(refused.value, final=False)
    told.clear()
    watch.spikes.feed(range(61, 71), [0.3, 0.3, 0.3, 0.3, 9.0, 14.0, 0.3, 0.3, 0.3, 0.3])
    watch.spikes.judge()
    flagged = Spike(65, 66, 14.0, 2.6, 0.3, 40, (9.0, 14.0))  # flagged again, with other losses: the machine's
    response.judged((flagged,), 70)  # no exception: nothing refused, and no new replay of it
    assert [(m.KIND, m.reproduced, m.replay_loss) for m in told] == [("spike_replayed", False, 14.0)]


def test_a_rollback_it_cannot_do_stops_saying_why(capsys: pytest.CaptureFixture[str]) -> None:
    response, watch, _, _ = _response(OnSpike.ROLLBACK, restore=lambda step: f"nothing before step {step}")
    for final, why in ((False, "nothing before step 65"),
                       (True, "it was found by the final checkpoint's check, with no step left to replay")):
        with pytest.raises(TrainingDiverged):
            response.refused(LossSpiked(70, 65, 66, FOUND.describe()), final=final)
        assert capsys.readouterr().err.strip().endswith(f"(no rollback: {why})")
    response, watch, _, _ = _response(OnSpike.ROLLBACK)
    with pytest.raises(LossSpiked) as first:
        response.judged((FOUND,), 70)
    response.refused(first.value, final=False)  # replayed
    watch.budget.skip(10)
    watch.budget.skip(20)
    assert watch.spikes is not None
    watch.spikes.feed(range(61, 71), [0.3, 0.3, 0.3, 0.3, 8.0, 15.0, 0.3, 0.3, 0.3, 0.3])
    watch.spikes.judge()
    with pytest.raises(LossSpiked) as again:  # given again by the replay: its steps are to be skipped
        response.judged((), 70)
    with pytest.raises(TrainingDiverged):  # 65 and 66 would be skips 3 and 4
        response.refused(again.value, final=False)
    assert "(no rollback: skipping steps 65-66: step 66 would be skip 4 (--max-skips 3))" in capsys.readouterr().err
    assert watch.budget.skipped == [10, 20]


def test_a_spike_during_a_non_finite_steps_rollback_is_only_said(capsys: pytest.CaptureFixture[str]) -> None:
    response, watch, told, _ = _response(OnSpike.ROLLBACK)
    watch.retry.aim(80, skipping=False)  # step 80's retry is due
    response.judged((FOUND,), 70)  # no raise
    assert told[0].action == "warn"
    assert "(not rolled back: the rollback of non-finite step 80 is under way)" in capsys.readouterr().err


def test_off_keeps_no_history_and_judges_nothing() -> None:
    watch = NonfiniteWatch(None, ("loss",), (), spike_policy=OnSpike.OFF, spiked=lambda found, step: None)
    assert watch.spikes is None  # (no history)
    watch.judge_spikes(10)  # nothing to judge


# ---------------------------------------------------------------------------------- the kept losses
def test_a_check_reads_the_kept_losses_once_and_hands_the_finite_ones_with_their_steps_to_the_rule() -> None:
    import tensorflow as tf

    judged: list[tuple[list[int], list[float]]] = []
    watch = NonfiniteWatch(None, ("loss",), (), spike_policy=OnSpike.WARN,
                           spiked=lambda found, step: judged.extend(([s.step], [s.loss]) for s in found))
    losses = watch.losses
    assert watch.spikes is not None
    values = _noisy(150, 14).astype(np.float32)
    values[139] = 40.0  # step 140
    for s in range(1, 151):
        losses.keep(s, tf.constant(values[s - 1]) if s != 20 else float(values[s - 1]))  # one host value
    reads = losses.reads
    watch.precheck(150)
    assert losses.reads == reads + 1  # one read for the 149 device scalars (3 chunks: 64, 64, 21)
    assert judged == [([140], [40.0])]
    assert watch.spikes.kept == 150  # every step's (padding none of them)
    losses.keep(151, tf.constant(float("nan")))
    losses.keep(152, tf.constant(1.0))
    assert losses.check() == 151  # still found, in the same one read
    assert watch.spikes.kept == 150  # 152 fed, not judged yet


def test_under_warn_an_in_memory_snapshots_check_reads_only_the_sum_and_the_judgement_waits_for_a_later_boundary(
        ) -> None:
    # issue 68: the judgement (and the read of every value it needs) ran in the check before every
    # in-memory snapshot under the default warn, charged to the tier, whose snapshots got rarer (steps
    # re-done per kill 39.5 against 29 with --on-spike off). Warn never refuses a snapshot: its check
    # there reads the sum only (as off's), the values stay on the device, and the judgement runs at a
    # later boundary, with the same verdicts; rollback and stop still judge before the copy
    import tensorflow as tf

    values = _noisy(300, 14).astype(np.float32)
    values[139] = 40.0  # step 140
    values[249] = 40.0  # step 250

    def watch_of(policy: OnSpike) -> tuple[NonfiniteWatch, list[tuple[int, int]]]:
        judged: list[tuple[int, int]] = []
        watch = NonfiniteWatch(None, ("loss",), (), spike_policy=policy,
                               spiked=lambda found, step: judged.extend((s.step, step) for s in found))
        return watch, judged

    warned, judged = watch_of(OnSpike.WARN)
    losses = warned.losses
    for s in range(1, 151):
        losses.keep(s, tf.constant(values[s - 1]) if s != 20 else float(values[s - 1]))  # one host value
    warned.precheck(150, defer=True)
    assert losses.reads == 1 and losses.unread and judged == []  # the sum's read; nothing judged yet
    warned.judge_deferred(150)  # the same boundary's: not yet
    assert judged == [] and losses.reads == 1
    for s in range(151, 201):
        losses.keep(s, tf.constant(values[s - 1]))
    warned.precheck(200, defer=True)  # a second deferral before the first was judged: both wait
    warned.judge_deferred(201)  # a later boundary: the values read (one read each), judged
    assert judged == [(140, 201)] and not losses.unread and losses.reads == 4
    assert warned.spikes is not None and warned.spikes.kept == 200
    for s in range(201, 261):
        losses.keep(s, tf.constant(values[s - 1]))
    warned.precheck(260)  # a disk snapshot's (or the final) check: judged at once, as before
    assert judged == [(140, 201), (250, 260)]
    for s in range(261, 271):
        losses.keep(s, tf.constant(values[s - 1]))
    warned.precheck(270, defer=True)
    warned.losses.forget()  # a restore: what was checked goes to the rule first (its rewind drops what it undid)
    assert warned.spikes.last == 260  # (fed, not judged yet)
    warned.judge_deferred(271)
    assert warned.spikes.last == 270

    losses.keep(271, tf.constant(float("nan")))
    losses.keep(272, tf.constant(1.0))
    with pytest.raises(NonFiniteState):  # a NaN is still found before the copy, in the deferred check
        warned.precheck(272, defer=True)

    for policy in (OnSpike.ROLLBACK, OnSpike.STOP):  # a spiked state must not be snapshotted: judged before it
        refusing, found = watch_of(policy)
        for s in range(1, 151):
            refusing.losses.keep(s, tf.constant(values[s - 1]))
        refusing.precheck(150, defer=True)
        assert found == [(140, 150)] and not refusing.losses.unread


def test_without_a_sink_the_check_still_reads_only_the_sum() -> None:
    import tensorflow as tf

    watch = NonfiniteWatch(None, ("loss",), (), spike_policy=OnSpike.OFF)
    for s in range(1, 101):
        watch.losses.keep(s, tf.constant(1.0))
    watch.precheck(100)
    assert watch.losses.reads == 1


def test_the_walk_judges_a_replayed_spike_at_the_boundary_after_its_detection_step_with_no_snapshot_between(
        capsys: pytest.CaptureFixture[str]) -> None:
    # the rollback's real walk (BoundaryWork) and response over a real watch, its losses kept as a loop keeps
    # them; only the restore is a stand-in. A spike is found at the snapshot of step 70 and rolled back to 60;
    # the replay gives the same losses, and the walk judges them at the boundary after step 65 (its detection)
    # on its own: no snapshot comes before the loop's end (a monitored session's spike near its end, under
    # load, was left to the final checkpoint's check: exit 4 instead of the skip)
    from procsv.trainer.nonfinite.boundary_work import BoundaryWork
    from procsv.trainer.step_boundary import StepState

    told: list[Any] = []
    judged: list[Any] = []
    watch = NonfiniteWatch(None, ("loss",), (), 3, 1000, spike_policy=OnSpike.ROLLBACK,
                           spike_thresholds=SpikeThresholds(window=40, min_history=30),
                           spiked=lambda found, step: judged[0](found, step))
    state = StepState(clock=lambda: 0.0, coord=None, counter=None)  # type: ignore[arg-type]
    history = watch.spikes
    assert history is not None

    def undone(step: int) -> None:
        told.append(("undone", step))
        history.rewind(step)

    walk = BoundaryWork(watch, state, None, None, None, told.append, lambda bad, what: "",  # type: ignore[arg-type]
                        lambda bad, why, final: None, lambda bad, final: response.refused(bad, final))
    def restore(step: int) -> tuple[int, str, Any, str, float]:  # (as the rollback's: the step count moves back)
        state.step = 60
        return 60, "the in-memory snapshot", "memory", "/m#1", 0.01

    response = SpikeResponse(watch, walk, told.append, restore, undone, lambda step: 60, lambda step: "over",
                             not_a_group)
    judged.append(response.judged)
    losses = {s: 0.3 + 0.001 * (s % 7) for s in range(1, 71)}
    losses[65] = 15.0
    for s in range(1, 71):
        watch.losses.keep(s, losses[s])
    with pytest.raises(LossSpiked) as found:
        watch.precheck(70)  # the snapshot of step 70: refused
    assert (found.value.onset, found.value.detected) == (65, 65)
    response.refused(found.value, final=False)  # restored step 60, the replay planned
    assert [getattr(m, "KIND", m) for m in told] == ["spike_detected", ("undone", 60), "rolled_back"]
    assert state.step == 60
    told.clear()
    for s in range(61, 66):  # the replay, a step at a time, the walk asked at each boundary
        assert not walk.work(), s  # nothing due before the detection's boundary
        watch.losses.keep(s, losses[s])
        state.step = s
    assert walk.work() and state.step == 60  # the boundary after step 65: judged there, found again bit for bit:
    # restored once more, to skip it
    kinds = [getattr(m, "KIND", m) for m in told]
    assert kinds == ["spike_replayed", ("undone", 60), "rolled_back", "step_skipped"], kinds
    assert told[0].reproduced and told[2].skip and watch.budget.skipped == [65]
    assert walk.next_due(60) == 64  # the replay skips step 65 where it meets it
    assert "replaying to step 64, then skipping step 65" in capsys.readouterr().err
