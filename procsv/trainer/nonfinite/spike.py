"""Loss spikes: a finite loss far above its recent distribution, found by a pure rule (issue 68).

Pure: no process runs it on its own, no TensorFlow, no clock, no I/O (NumPy only). The trainer's main
thread (:class:`~procsv.trainer.nonfinite.watch.NonfiniteWatch`, before each snapshot, where the kept
losses are read anyway) feeds it the finite losses of the steps since the last check and asks it for
the spikes among them; what happens then (``--on-spike``) is the rollback's
(:mod:`procsv.trainer.nonfinite.rollback`).

The rule (:func:`judge`), for each new step ``s`` in step order: its window is the last
``window`` losses kept before it (earlier checks' and this one's); with fewer than ``min_history``
of them nothing is judged (the start of training, or of a restarted trainer, is never flagged).
When every loss of the window and the step's own are positive (a cross-entropy, a squared error),
the statistics are taken over their logarithms: a per-batch loss is noisy in proportion to its size
(late in training, a batch's loss of 0.003 and its neighbour's of 0.03 are the same run, a tenfold
ratio a linear rule would flag), and a spike is a multiplicative jump. Else (a loss that can be zero
or negative) over the losses themselves. ``median`` and ``MAD`` (the median of the absolute
deviations from it, times 1.4826: the standard deviation of a normal distribution, robust to the
outliers the rule looks for) of the window give the threshold

    median + max(z * MAD, log(min_ratio))          (logarithms; linear: max(z * MAD, (min_ratio - 1) * |median|))

and ``s`` is flagged when its loss is above it and above the median of the last ``recent`` losses
before it by as much (the same offset from that median). Only upward: a learning-rate schedule's
drop, or the fast fall of the first steps, is never a spike; a rise spread over many steps (a
warm-up's) is never far above its last few losses, and its spread widens the window's MAD, so only
an abrupt jump passes. A run of flagged steps is one spike: a step flagged right after a flagged one
continues it (no second finding).

A spike's *detection* step is its first flagged step; its *onset* the first step of the rise that
led to it: walking back from the detection over the steps (at most ``window``) whose loss is above
the midpoint of the median and the threshold (in the same space), with the detection's statistics.
An abrupt jump (a bad batch) has its onset at its detection; a rise over a few steps starts earlier.
:class:`SpikeHistory` is the trainer's state between checks: the trailing losses, the steps fed and
not judged yet, whether the last judged step was flagged; a restore forgets what came after it.
Most steps are shown to be below their threshold without their window's statistics, by a bound on
every window of a block of steps at once (:func:`_candidates`): the same verdicts, for less.

One concern: the spike rule, from its settings to its verdicts and its history between checks.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution times this is its standard deviation
_LOG_TINY = math.log(np.finfo(np.float64).tiny) + 1.0  # below it, exp() loses precision (subnormal floats)


class OnSpike(str, enum.Enum):
    """What the trainer does when it finds a loss spike (``--on-spike``, ``Supervisor(on_spike=...)``)."""

    ROLLBACK = "rollback"  # restore the newest snapshot before the onset, skip the onset .. the detection
    STOP = "stop"  # stop in order with exit code 4 (diverging), without a checkpoint of the spiked state
    WARN = "warn"  # a lifecycle record and one line; training goes on (the default)
    OFF = "off"  # no spike detection (no value read for it)


DEFAULT = OnSpike.WARN  # a false flag under rollback would drop the user's batches: rollback is asked for


PS_WHY = ("its variables live on the parameter servers, shared by every worker, which go on updating them "
          "asynchronously: one worker's restore would undo the others' steps, and its replay could not give the "
          "same losses again")


def refusal(policy: OnSpike, ps: bool = False, graph_input: str = "") -> str:
    """Why ``policy`` cannot be followed by this trainer ("" if it can): ``rollback`` is built for a
    custom loop under ``procsv.Supervisor`` or a ``MonitoredTrainingSession``, eager or TF1 graph, and
    Keras ``fit``, of a single trainer or of a trainer group's members (the group rolls back as a group:
    :mod:`.spike_response`); not for a task of a parameter-server job (``ps``, :data:`PS_WHY`), nor for a
    graph program whose input is read inside its graph from state no checkpoint restores (``graph_input``
    says how: :func:`procsv.trainer.graph.replayable.input_inside`), whose replay would train other
    batches. Keras ``fit`` with a Keras version its replay is not tested with refuses it as it starts
    (:func:`unsupported`)."""
    if policy != OnSpike.ROLLBACK:
        return ""
    if ps:
        return unsupported("a parameter-server job (--ps)", PS_WHY)
    if graph_input:
        return unsupported("a TF1 graph program whose input is read inside its graph",
                           f"{graph_input}, which no checkpoint restores: a replay would train other batches; feed "
                           "the batch or compute it from the global step")
    return ""


def unsupported(where: str, why: str = "") -> str:
    """The one line that refuses ``--on-spike rollback`` in ``where`` (``why``: and why)."""
    return (f"--on-spike rollback is not supported in {where} yet ({why + '; ' if why else ''}only in a custom loop "
            "or MonitoredTrainingSession, eager or TF1 graph, or Keras fit, of a single trainer or a trainer group): "
            "use --on-spike warn or stop (or on_spike=...)")


def parse(value: Optional[str], default: OnSpike = DEFAULT) -> OnSpike:
    """``value`` (None: ``default``) as a policy; anything else raises ValueError with one clear line."""
    if value is None or value == "":
        return default
    try:
        return OnSpike(value)
    except ValueError:
        raise ValueError(f"on_spike must be one of rollback, stop, warn, off, not {value!r}") from None


@dataclass(frozen=True)
class SpikeThresholds:
    """The rule's settings (``Supervisor(spike_thresholds=...)``; see the module for the rule):

    * ``window``: the losses kept before a step that its statistics are taken over (default 200);
    * ``min_history``: the fewest of them for a step to be judged at all (default 100);
    * ``z``: how many MADs (normal-scaled) above the median a spike is (default 8);
    * ``min_ratio``: and at least this many times the median (positive losses; else this much above it
      relative to its size), so that a window of nearly equal losses (a MAD near 0) does not flag a
      small wobble (default 1.5);
    * ``recent``: the last losses whose median the step must be as far above too, so that a rise over
      many steps (a warm-up) is not one (default 10)."""

    window: int = 200
    min_history: int = 100
    z: float = 8.0
    min_ratio: float = 1.5
    recent: int = 10

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError(f"the spike window must be >= 2 losses, not {self.window}")
        if not 2 <= self.min_history <= self.window:
            raise ValueError(f"the spike rule's min_history must be within 2 .. window ({self.window}), "
                             f"not {self.min_history}")
        if not self.z > 0 or not math.isfinite(self.z):
            raise ValueError(f"the spike rule's z must be a positive number, not {self.z}")
        if not self.min_ratio >= 1 or not math.isfinite(self.min_ratio):
            raise ValueError(f"the spike rule's min_ratio must be >= 1, not {self.min_ratio}")
        if not 1 <= self.recent <= self.min_history:
            raise ValueError(f"the spike rule's recent must be within 1 .. min_history ({self.min_history}), "
                             f"not {self.recent}")


@dataclass(frozen=True)
class Spike:
    """A loss spike: its ``onset`` (the first step of the rise), its detection ``step`` (the first
    flagged one), that step's ``loss``, the ``threshold`` it passed and the ``median`` of its window
    (in the loss's own units), how many losses the window held (``history``), and the losses of the
    onset .. the detection (``losses``: what a replay of those steps must give again, bit for bit)."""

    onset: int
    step: int
    loss: float
    threshold: float
    median: float
    history: int
    losses: tuple[float, ...] = ()

    @property
    def steps(self) -> range:
        """The steps from the onset to the detection (what ``rollback`` skips)."""
        return range(self.onset, self.step + 1)

    def describe(self) -> str:
        """One line: what was found."""
        began = f" (onset at step {self.onset})" if self.onset != self.step else ""
        return (f"the loss of step {self.step} spiked{began}: {self.loss:.6g} against a threshold of "
                f"{self.threshold:.6g} (median {self.median:.6g} of the {self.history} losses before it)")


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found: the spikes in step order, and whether the last step judged was
    flagged (a flagged step right after it continues that spike)."""

    spikes: tuple[Spike, ...]
    flagged_last: bool


def _stats(windows: np.ndarray, logs: bool, rule: SpikeThresholds) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``windows`` (already logarithms if ``logs``): the median and the threshold (the
    offset above the higher of the window's median and its last ``recent`` values' median). A window
    that gives no offset at all (linear, its median 0 and half its losses or more equal to it: a hinge
    or margin loss that is 0 on most batches) judges nothing: its threshold is infinite (with none, any
    loss above its last few was flagged: 460 flags in 20,000 steps of a hinge loss)."""
    median = np.median(windows, axis=1)
    mad = MAD_TO_SIGMA * np.median(np.abs(windows - median[:, None]), axis=1)
    floor = math.log(rule.min_ratio) if logs else (rule.min_ratio - 1.0) * np.abs(median)
    recent = np.median(windows[:, -rule.recent:], axis=1)
    margin = np.maximum(rule.z * mad, floor)
    return median, np.where(margin > 0, np.maximum(median, recent) + margin, np.inf)


def judge(history_steps: Sequence[int], history: Sequence[float], steps: Sequence[int], losses: Sequence[float],
          rule: SpikeThresholds, flagged_last: bool = False) -> Verdict:
    """The spikes among the new ``losses`` of ``steps`` (ascending, finite, after every step of the
    history), each judged against the ``window`` losses kept before it: those of the trailing
    ``history`` (of ``history_steps``) and the new ones before it. ``flagged_last``: the step before
    the first new one was flagged (a spike still going on)."""
    if len(history_steps) != len(history) or len(steps) != len(losses):
        raise ValueError("each loss needs its step")
    keep = min(len(history), rule.window)
    values = np.concatenate([np.asarray(history[len(history) - keep:], dtype=np.float64),
                             np.asarray(losses, dtype=np.float64)])
    at = np.concatenate([np.asarray(history_steps, dtype=np.int64)[len(history_steps) - keep:],
                         np.asarray(steps, dtype=np.int64)])
    stats = _Stats(len(values))
    judged = _candidates(values, np.arange(max(keep, rule.min_history), len(values)), rule)  # j: on values[j - W:j]
    full = judged[judged >= rule.window]
    if full.size:
        stats.fill(values, full, sliding_window_view(values, rule.window)[full - rule.window], rule)
    for j in judged[judged < rule.window]:  # the first steps of a run: windows shorter than `window`
        stats.fill(values, np.array([j]), values[None, :j], rule)
    flagged = (values > stats.threshold)[keep:]
    if not flagged.size:
        return Verdict((), flagged_last)
    starts = flagged & ~np.concatenate([[flagged_last], flagged[:-1]])  # a flagged step after one continues it
    spikes = []
    for j in (np.flatnonzero(starts) + keep).tolist():
        onset = _onset(values, at, j, rule, stats)
        spikes.append(Spike(int(at[onset]), int(at[j]), float(values[j]), float(stats.threshold[j]),
                            float(stats.median[j]), min(j, rule.window), tuple(values[onset:j + 1].tolist())))
    return Verdict(tuple(spikes), bool(flagged[-1]))


def _candidates(values: np.ndarray, idx: np.ndarray, rule: SpikeThresholds, block: int = 32) -> np.ndarray:
    """The indices of ``idx`` (consecutive) that can be flagged at all, found without a median per
    window: by block of consecutive indices, the lowest threshold any of their windows can have
    (:func:`_least_thresholds`, over the union of the block's windows); a loss not above it is not
    flagged, whatever its window's statistics. A block's survivors are sifted again in halves (a
    narrower union, a higher bound) while that drops some; what remains (a spike, or a loss within a
    few MADs of its threshold) gets its window's statistics. The blocks of whole windows over
    positive losses (the common case) are bounded all at once. The digits losses of
    tests/spike_clean_losses.npz, 600 at a check (the digits benchmark's tier takes a snapshot every
    ~500 steps): 1.4 ms (batch 64) and 2.2 ms (batch 16) per judgement with the former prefilter (a
    median's bound times ``min_ratio``: on noisy losses most passed it, 922 and 1603 of the 5000 at
    64 a check, each then given its window's median and MAD), 0.31-0.32 ms like this, with none left
    for them; 64 at a check: 0.23-0.29 ms, 0.11 ms (scripts/bench_spike_judge.py, the same process,
    alternated, medians of 9, load 3). In the digits trainer (scripts/bench_snapshot_charge.py, 30 s,
    3 runs each, load 1-4): 1.6 ms (1.5-4.0) per snapshot, 0.51 ms (0.48-0.54). A trainer's first
    window, whose blocks are bounded one by one (200 losses): 0.04 ms, 0.13 ms."""
    if not idx.size:
        return idx
    positive = values > 0
    logs = np.log(np.where(positive, values, 1.0))
    start, end = int(idx[0]), int(idx[-1]) + 1
    starts = list(range(start, end, block))
    if end - start >= block:
        starts[-1] = min(starts[-1], end - block)  # a last block as long as the others, over the one before
    nonpositive = None if positive.all() else np.concatenate([[0], np.cumsum(~positive)]).tolist()
    pending: list[tuple[np.ndarray, Optional[np.ndarray]]] = []
    whole: list[int] = []  # the blocks of whole windows whose union is positive
    own = start  # the first index of a block not in the one before
    for first in starts:
        last = min(first + block, end)
        if (last - first == block and first >= rule.window
                and (nonpositive is None or nonpositive[last - 1] == nonpositive[first - rule.window])):
            whole.append(first)
        else:
            pending.append((np.arange(own, last), None))
        over, own = own - first, last
    if whole:
        firsts = np.array(whole)
        rows = firsts[:, None] + np.arange(block)
        unions = sliding_window_view(logs, rule.window + block - 1)[firsts - rule.window]
        bound, slack = _least_thresholds(unions, rule.window, rule, True)
        above = positive[rows] & (logs[rows] > (bound - slack)[:, None])
        if whole[-1] == starts[-1]:
            above[-1, :over] = False  # judged with the block before
        hit = above.any(axis=1)  # (on noisy losses, hardly a block)
        pending += zip(rows[hit], above[hit])
    kept = []
    while pending:
        rows, maybe = pending.pop()
        survivors = rows[maybe if maybe is not None else _may_flag(values, logs, positive, rows, rule)]
        if 0 < survivors.size < rows.size:  # a narrower union gives a higher bound: again, while it helps
            half = (survivors.size + 1) // 2
            pending += [(part, None) for part in (survivors[:half], survivors[half:]) if part.size]
        elif survivors.size:
            kept.append(survivors)
    return np.sort(np.concatenate(kept)) if kept else idx[:0]


def _may_flag(values: np.ndarray, logs: np.ndarray, positive: np.ndarray, rows: np.ndarray,
              rule: SpikeThresholds) -> np.ndarray:
    """Whether each of ``rows`` (ascending indices of ``values``; ``logs`` their logarithms where
    ``positive``) may be above its window's threshold: above the lowest threshold any window within
    the union of theirs can have (:func:`_least_thresholds`), in the space its own statistics use. A
    positive loss is judged in logarithms when its window is positive: a union of positive losses
    has only such windows; one with a loss <= 0 in it may have both, and lets through what either
    bound does."""
    first, last = int(rows[0]), int(rows[-1])
    span = slice(max(0, first - rule.window), last)
    shortest = min(first, rule.window)  # the first index's window is the shortest
    up = positive[rows]
    some = positive[span]
    maybe = np.zeros(rows.size, dtype=bool)
    if np.count_nonzero(some) >= shortest:  # a window may be positive: logarithms for its positive losses
        bound, slack = _least_thresholds(logs[span][some][None, :], shortest, rule, True)
        maybe[up] = logs[rows[up]] > bound[0] - slack[0]
    if not some.all():  # a window may hold a loss <= 0: the linear rule
        bound, slack = _least_thresholds(values[span][None, :], shortest, rule, False)
        maybe |= values[rows] > bound[0] - slack[0]
    return maybe  # (a loss <= 0 is below a positive window's median)


def _least_thresholds(unions: np.ndarray, shortest: int, rule: SpikeThresholds,
                      logs: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``unions``: the lowest threshold (:func:`_stats`, in logarithms if ``logs``) that a
    window of ``shortest`` values or more drawn from it can have, and a slack for rounding (the
    bound minus it is below the threshold as computed). A window of ``n`` values within a union of
    ``N`` has its ``k``-th smallest between the union's ``k``-th and ``(k + N - n)``-th: its median
    lies in ``[lower, upper]``, the union's values of ranks ``(n - 1) // 2`` and ``N - ceil(n / 2)``
    (both widest at the shortest ``n``). Each of its deviations ``|x - median|`` is at least ``x``'s
    distance to that interval, so its MAD is at least the union's distance of rank ``(n - 1) // 2``;
    the threshold is at least ``lower`` plus the margin of that MAD (and of the smallest ``|median|``
    in the interval, linear), the ``recent`` median only raising it."""
    low, high = (shortest - 1) // 2, unions.shape[1] - (shortest + 1) // 2
    part = np.partition(unions, (low, high), axis=1)
    lower, upper = part[:, low], part[:, high]
    distance = np.maximum(np.maximum(lower[:, None] - unions, unions - upper[:, None]), 0.0)
    mad = MAD_TO_SIGMA * np.partition(distance, low, axis=1)[:, low]
    if logs:
        floor = np.full(lower.shape, math.log(rule.min_ratio))
    else:
        least = np.where((lower <= 0) & (upper >= 0), 0.0, np.minimum(np.abs(lower), np.abs(upper)))
        floor = (rule.min_ratio - 1.0) * least
    margin = np.maximum(rule.z * mad, floor)
    bound = lower + margin
    slack = 1e-9 * (np.abs(unions).max(axis=1) + margin) + 1e-300  # rounding: relative, and a subnormal's
    if logs:  # a threshold whose exponential is not a normal float is kept to be computed
        slack[bound < _LOG_TINY] = np.inf
    return bound, slack


class _Stats:
    """Per index of the values judged: the window's median and the threshold, in the loss's units,
    and, where they were taken over logarithms (``logs``), in that space too (``lmedian``, ``lthreshold``)."""

    def __init__(self, n: int) -> None:
        self.median = np.full(n, np.nan)
        self.threshold = np.full(n, np.inf)  # not judged: nothing is above it
        self.lmedian = np.full(n, np.nan)
        self.lthreshold = np.full(n, np.inf)
        self.logs = np.zeros(n, dtype=bool)

    def fill(self, values: np.ndarray, idx: np.ndarray, windows: np.ndarray, rule: SpikeThresholds) -> None:
        """The statistics of the indices ``idx``, whose windows are the rows of ``windows``."""
        positive = (windows.min(axis=1) > 0) & (values[idx] > 0)
        if positive.any():
            rows = idx[positive]
            med, thr = _stats(np.log(windows[positive]), True, rule)
            self.lmedian[rows], self.lthreshold[rows], self.logs[rows] = med, thr, True
            self.median[rows], self.threshold[rows] = np.exp(med), np.exp(thr)
        if not positive.all():
            rows = idx[~positive]
            med, thr = _stats(windows[~positive], False, rule)
            self.median[rows] = med
            self.threshold[rows] = np.where(thr > med, thr, np.inf)  # a window of zeros: nothing to compare with

    def level(self, j: int) -> tuple[float, float, bool]:
        """Index ``j``'s median and threshold in the space its statistics were taken in, and whether logarithms."""
        if self.logs[j]:
            return float(self.lmedian[j]), float(self.lthreshold[j]), True
        return float(self.median[j]), float(self.threshold[j]), False


def _onset(values: np.ndarray, steps: np.ndarray, j: int, rule: SpikeThresholds, stats: _Stats) -> int:
    """The index of the first step of the rise to the flagged index ``j``: back over the consecutive
    losses above the midpoint of its median and threshold (in the space of its statistics), at most
    ``window``, and over consecutive steps only (a step skipped before ends the rise)."""
    median, threshold, logs = stats.level(j)
    level = (median + threshold) / 2
    first = j
    for i in range(j - 1, max(-1, j - 1 - rule.window), -1):
        v = float(values[i])
        x = (math.log(v) if v > 0 else -math.inf) if logs else v
        if not x > level or steps[i] != steps[i + 1] - 1:
            break
        first = i
    return first


class SpikeHistory:
    """The trainer's spike rule between checks: the last ``window`` losses judged (and their steps),
    the losses fed since (not judged yet: a check that only looked for NaN, during a rollback's
    replay, read them), and whether the last judged step was flagged. Plain data: the trainer's main
    thread feeds it, asks :meth:`judge` before each snapshot, and :meth:`rewind` s it on a restore."""

    def __init__(self, rule: SpikeThresholds) -> None:
        self.rule = rule
        self._steps: list[int] = []
        self._losses: list[float] = []
        self._fed: dict[int, float] = {}
        self._batch: dict[int, float] = {}  # the losses the last judgement judged (the window may not hold them all)
        self._flagged_last = False

    def feed(self, steps: Sequence[int] | np.ndarray, losses: Sequence[float] | np.ndarray) -> None:
        """Finite losses of ``steps`` read by a check (a step's later value replaces an earlier one)."""
        self._fed.update(zip(np.asarray(steps, dtype=np.int64).tolist(),
                             np.asarray(losses, dtype=np.float64).tolist()))

    def judge(self) -> tuple[Spike, ...]:
        """Judge what was fed since the last judgement (:func:`judge`), in step order, and keep it."""
        if not self._fed:
            return ()
        last = self._steps[-1] if self._steps else None
        fed = sorted((s, v) for s, v in self._fed.items() if last is None or s > last)
        self._fed = {}
        if not fed:
            return ()
        steps = [s for s, _ in fed]
        losses = [v for _, v in fed]
        self._batch = dict(fed)
        verdict = judge(self._steps, self._losses, steps, losses, self.rule, self._flagged_last)
        keep = self.rule.window
        self._steps = (self._steps + steps)[-keep:]
        self._losses = (self._losses + losses)[-keep:]
        self._flagged_last = verdict.flagged_last
        return verdict.spikes

    def rewind(self, step: int) -> None:
        """The state of ``step`` was restored: what came after it is undone (its losses will come again,
        or not at all, as the replay goes)."""
        while self._steps and self._steps[-1] > step:
            self._steps.pop()
            self._losses.pop()
        self._fed = {s: v for s, v in self._fed.items() if s <= step}
        self._batch = {s: v for s, v in self._batch.items() if s <= step}
        self._flagged_last = False

    @property
    def kept(self) -> int:
        """How many judged losses the history holds."""
        return len(self._losses)

    @property
    def last(self) -> Optional[int]:
        """The last step judged (None: none since the start or the last restore before every one)."""
        return self._steps[-1] if self._steps else None

    def losses_at(self, steps: range) -> dict[int, float]:
        """The losses of those of ``steps`` the window, the last judgement or the losses fed since hold."""
        at = {**dict(zip(self._steps, self._losses)), **self._batch, **self._fed}
        return {s: at[s] for s in steps if s in at}

    def losses_of(self, steps: range) -> Optional[tuple[float, ...]]:
        """The judged losses of ``steps`` (None unless every one is in the window or the last judgement's)."""
        at = {**dict(zip(self._steps, self._losses)), **self._batch}
        found = tuple(at[s] for s in steps if s in at)
        return found if len(found) == len(steps) else None
