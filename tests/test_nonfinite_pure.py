"""The pure parts of non-finite training (issue 41): the skip bound, the policy's parsing, the bulk
loss check and the scan of a snapshot's copy, with plain values (no TensorFlow process runs: the
launch's refusals of bad flags are `procsv launch` processes that end before anything starts)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import quiet_env
from procsv.ipc.messages import TensorSpec
from procsv.trainer.nonfinite.losses import LossWatch
from procsv.common.errors import NonFiniteState, TrainingDiverged
from procsv.trainer.nonfinite.policy import (OnNonfinite, RestoreBound, SkipBudget, in_place_refusal,
                                             member_checks_at_end, parse)
from procsv.trainer.nonfinite.watch import NonfiniteWatch
from procsv.trainer.nonfinite.scan import Rules, nonfinite_keys


def test_the_skip_bound_counts_skips_within_the_window_ending_at_the_step():
    budget = SkipBudget(max_skips=3, skip_window=100)
    for step in (10, 20, 30):
        assert budget.allows(step)
        budget.skip(step)
    assert not budget.allows(50)  # a 4th within 100 steps
    assert budget.recent(109) == [10, 20, 30] and budget.recent(110) == [20, 30]
    assert budget.allows(110)  # step 10 left the window
    assert not SkipBudget(max_skips=0).allows(1)
    with pytest.raises(ValueError, match="max_skips must be >= 0, not -1"):
        SkipBudget(max_skips=-1)
    with pytest.raises(ValueError, match="skip_window must be >= 1, not 0"):
        SkipBudget(skip_window=0)


def test_a_member_of_a_mirrored_trainer_group_cannot_roll_back_in_place_a_single_trainer_or_a_ps_task_can():
    assert in_place_refusal(1, 0) == ""  # a single trainer
    assert in_place_refusal(1, 2) == "" and in_place_refusal(3, 2) == ""  # --ps: not a mirrored group (left as it was)
    why = in_place_refusal(2, 0)
    assert why.startswith("rollback in place is not available in a trainer group (2 members under "
                          "MultiWorkerMirroredStrategy")
    assert "--on-nonfinite continue" in why and "fix the input and relaunch" in why
    assert "(8 members" in in_place_refusal(8, 0)


def test_a_group_member_checks_its_kept_losses_at_its_end_under_rollback_always_under_stop_at_an_end_of_its_own():
    # group_local_nan.py --nan-at 120 --steps 120 --on-nonfinite stop (reproduced: exit 0, no line): worker1's own
    # loss of the last step is NaN; the chief's final checkpoint checks the chief's losses only, and nothing
    # checked a member's at its end under stop. A member whose collective broke or that was signalled does not
    # check under stop: a peer that found one stopped the group already (its report would say nothing new)
    assert member_checks_at_end(OnNonfinite.ROLLBACK, True) and member_checks_at_end(OnNonfinite.ROLLBACK, False)
    assert member_checks_at_end(OnNonfinite.STOP, True) and not member_checks_at_end(OnNonfinite.STOP, False)
    assert not member_checks_at_end(OnNonfinite.CONTINUE, True) and not member_checks_at_end(OnNonfinite.CONTINUE, False)


def test_a_group_members_stop_line_names_the_step_and_claims_nothing_of_the_chiefs_checkpoints(capsys):
    # a group's member other than the chief saves no checkpoint and does not know what the chief committed:
    # before, its line said "no checkpoint was committed before it" while the chief had committed step 120
    watch = NonfiniteWatch("stop", (), ())
    with pytest.raises(TrainingDiverged) as raised:
        watch.refused(NonFiniteState(120, 120), None, final=True)
    line = capsys.readouterr().err.strip()
    assert line == f"procsv: {raised.value}" and "\n" not in line
    assert line.startswith("procsv: non-finite training at step 120: the loss of step 120 is NaN or infinite; "
                           "--on-nonfinite stop: stopping in order with exit code 4 (diverging)"), line
    assert "this member saves no checkpoint; the chief's of step 120 or later, if any, hold that step's update" in line
    assert "no checkpoint was committed" not in line and "newest finite one" not in line
    with pytest.raises(TrainingDiverged):  # the chief, or a single trainer, as before
        NonfiniteWatch("stop", (), ()).refused(NonFiniteState(40, 40), 30)
    assert "the newest committed checkpoint (step 30) is the newest finite one" in capsys.readouterr().err


def test_a_snapshot_that_turns_non_finite_within_10_steps_of_each_of_3_restores_is_diverging():
    bound = RestoreBound()
    assert bound.exceeded(21) is None and bound.found == {}  # nothing restored yet: the first finding
    bound.restored(20)
    assert bound.exceeded(21) is None  # 21 was finite when retried: 1
    assert bound.exceeded(23) is None  # 2
    bound.restored(20)
    assert bound.exceeded(23) is None and bound.found == {20: [21, 23]}  # 23's retry, non-finite again: once
    bound.restored(20)  # the skip's restore
    why = bound.exceeded(30)  # 3, the 10th step after the restore
    assert why == ("the snapshot of step 20 turned non-finite within 10 steps of each of 3 restores "
                   "(at steps 21, 23, 30)")
    other = RestoreBound()
    other.restored(20)
    assert other.exceeded(31) is None and other.found == {}  # 11 steps after it: not counted
    for snapshot, bad in ((20, 21), (22, 23), (24, 25)):  # each a newer snapshot: none counts 3
        other.restored(snapshot)
        assert other.exceeded(bad) is None
    assert other.found == {20: [21], 22: [23], 24: [25]}


def test_steps_skipped_are_the_skip_budgets_and_never_make_a_snapshot_diverging():
    # issue 68: three NaN inputs within 10 steps of the snapshot of step 20 (21, 23, 25) were each retried
    # and skipped, and the third finding stopped the run on this bound while --max-skips 3 allowed it:
    # a skipped step now leaves the bound (SkipBudget counts it), so the two never judge one finding
    bound = RestoreBound()
    for bad in (21, 23, 25):
        bound.restored(20)
        assert bound.exceeded(bad) is None  # found
        bound.restored(20)
        assert bound.exceeded(bad) is None  # non-finite again when retried
        bound.skipped(bad)
    assert bound.found == {20: []}
    for bad in (26, 28):  # finite when retried: findings of the snapshot
        bound.restored(20)
        assert bound.exceeded(bad) is None
    bound.restored(20)
    assert bound.exceeded(29) == ("the snapshot of step 20 turned non-finite within 10 steps of each of 3 "
                                  "restores (at steps 26, 28, 29)")


def test_the_restore_bound_counts_a_poisoned_gradient_once_not_as_the_step_that_showed_it_too():
    # step 45's gradient was NaN, its loss finite: step 46's loss was the first to show it. The
    # bisect skips 45; 46 was not a bad step of its own: one finding of the snapshot, not two, and a
    # finding of the skip budget once 45 is skipped
    bound = RestoreBound()
    bound.restored(40)
    assert bound.exceeded(46) is None
    bound.shown_by(46, 45)
    bound.restored(40)
    assert bound.exceeded(45) is None and bound.found == {40: [45]}
    bound.skipped(45)
    bound.restored(40)
    assert bound.exceeded(48) is None  # 47's gradient, shown by 48
    bound.shown_by(48, 47)
    bound.restored(40)
    assert bound.exceeded(47) is None and bound.found == {40: [47]}  # 46 and 48 never counted
    bound.skipped(47)
    assert bound.exceeded(49) is None and bound.found == {40: [49]}  # the skips are not findings


def test_the_policy_parses_its_three_names_and_refuses_others_in_one_line():
    assert parse(None, OnNonfinite.ROLLBACK) == OnNonfinite.ROLLBACK
    assert parse("stop", OnNonfinite.ROLLBACK) == OnNonfinite.STOP
    with pytest.raises(ValueError, match="on_nonfinite must be one of rollback, stop, continue, not 'halt'"):
        parse("halt", OnNonfinite.ROLLBACK)


def test_host_losses_are_judged_at_once_and_device_losses_with_one_read_per_check(monkeypatch):
    watch = LossWatch(("loss",))
    watch.keep_step(1, 0.5)
    watch.keep_step(2, {"loss": math.nan, "acc": 1.0})
    watch.keep_step(3, np.float32(np.inf))
    assert watch.check() == 2 and watch.reads == 0  # all on the host: no read at all
    for step in range(1, 5001):
        watch.keep_step(step, tf.constant(float("nan") if step in (4321, 4999) else 1.0))
    watch.keep_step(5001, tf.constant([1.0, math.nan]))  # not a scalar: not a loss
    watch.keep_scalars(5002, {"other": tf.constant(math.nan), "loss": tf.constant(2.0)})
    assert watch.check() == 4321 and watch.reads == 2  # one read found something, one more found where
    watch.keep_step(5003, tf.constant(1.0))
    assert watch.check() is None and watch.reads == 3
    assert watch.check() is None and watch.reads == 3  # nothing kept: nothing read


def test_a_check_before_a_snapshot_stacks_only_the_losses_since_the_last_chunk_and_reads_once():
    # a check before an in-memory snapshot stacked every loss kept since the last one (~600 at the
    # tier's interval: 1.1 ms of its charge, issue 54 point 5). Every CHUNK losses are now stacked
    # and judged on the device at the step that fills the chunk (no read); the check stacks the
    # rest, fewer than CHUNK, and reads one boolean; the first bad step is still found
    from procsv.trainer.nonfinite.losses import CHUNK

    for bad in (None, 7, 300, 599):
        watch = LossWatch(("loss",))
        for step in range(1, 601):
            watch.keep_step(step, tf.constant(math.inf if step == bad else 1.0))
            assert len(watch.pending) < CHUNK
        assert watch.reads == 0  # nothing read at a step
        assert watch.check() == bad
        assert watch.reads == (1 if bad is None else 2)
        assert watch.check() is None and watch.chunks == [] and watch.pending == []


def copy_in_memory(values: dict[str, np.ndarray], size: int) -> tuple[np.ndarray, list[TensorSpec]]:
    """A snapshot's copy in ``size`` bytes of memory: ``values`` 64 bytes apart, in order; and its
    specs, one a value (at its offset), then the object graph's (a 3-byte string: one frame)."""
    memory = np.zeros(size, dtype=np.uint8)
    specs: list[TensorSpec] = []
    offset = 0
    for key, arr in values.items():
        memory[offset:offset + arr.nbytes] = arr.view(np.uint8)
        specs.append(TensorSpec(key, str(arr.dtype), list(arr.shape), offset=offset))
        offset += 64
    specs.append(TensorSpec("_CHECKPOINTABLE_OBJECT_GRAPH", "string", [], [3]))
    return memory, specs


def test_a_snapshot_copy_is_poisoned_by_nan_anywhere_and_inf_only_where_strict():
    values = {"w": np.array([1.0, np.inf], np.float32), "low": np.array([np.inf, -np.inf], np.float32),
              "mask": np.array([np.nan], np.float64), "n": np.array([7], np.int64)}
    memory, specs = copy_in_memory(values, 4096)
    rule = Rules(strict=frozenset({"w"}), skip=frozenset())
    assert nonfinite_keys(specs, [b"abc"], memory, rule) == ("w", "mask")
    assert nonfinite_keys(specs, [b"abc"], memory, Rules(frozenset(), frozenset({"mask"}))) == ()
    framed = [TensorSpec("w", "float32", [2]), specs[-1]]
    assert nonfinite_keys(framed, [values["w"], b"abc"], None, rule) == ("w",)


def test_a_finite_snapshot_copy_is_looked_at_in_one_pass_per_dtype_and_padding_decides_nothing(monkeypatch):
    # 14 tensors looked at one by one cost 0.05 ms of each snapshot of the digits model (issue 54):
    # a finite copy is looked at with one NumPy call per dtype, over the span its tensors lie in
    values = {f"w{i}": np.full(5 + i, 0.5 * i, np.float32) for i in range(8)}
    values.update({"low": np.array([1.0, -2.0], np.float32), "n": np.array([7], np.int64),
                   "d": np.array([1.0, 2.0], np.float64)})
    memory, specs = copy_in_memory(values, 8192)
    rule = Rules(strict=frozenset(f"w{i}" for i in range(8)), skip=frozenset())
    calls = {"isfinite": 0, "isnan": 0}
    for name in calls:
        def counted(*args: object, _inner=getattr(np, name), _name=name, **kwargs: object) -> object:
            calls[_name] += 1
            return _inner(*args, **kwargs)
        monkeypatch.setattr(np, name, counted)
    assert nonfinite_keys(specs, [b"abc"], memory, rule) == ()
    assert calls == {"isfinite": 2, "isnan": 0}  # float32 and float64: one each, not one per tensor
    # NaN in the alignment padding between two tensors, +-inf where allowed: looked at one by one, nothing found
    memory[64 + 24:64 + 28] = np.array([np.nan], np.float32).view(np.uint8)
    low = 8 * 64
    memory[low:low + 8] = np.array([np.inf, -np.inf], np.float32).view(np.uint8)
    assert nonfinite_keys(specs, [b"abc"], memory, rule) == ()
    memory[3 * 64:3 * 64 + 4] = np.array([np.inf], np.float32).view(np.uint8)  # in strict w3
    memory[low:low + 4] = np.array([np.nan], np.float32).view(np.uint8)  # NaN where inf is allowed
    assert nonfinite_keys(specs, [b"abc"], memory, rule) == ("w3", "low")


def test_max_skips_out_of_range_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "procsv", "launch", "x.py", "--logdir", str(tmp_path / "r"),
                           "--max-skips", "-1"], capture_output=True, text=True, env=quiet_env(), timeout=60)
    assert done.returncode == 2
    assert "--max-skips must be >= 0, not -1" in done.stderr


def test_losses_of_several_dtypes_are_checked_together_and_a_large_float64_is_finite():
    watch = LossWatch(("loss",))
    watch.keep_step(1, tf.constant(1e300, tf.float64))  # inf in float32: must not be taken for one
    watch.keep_step(2, tf.constant(1.0, tf.float16))
    watch.keep_step(3, tf.constant(2.0, tf.bfloat16))
    assert watch.check() is None
    for step in range(1, 1100):  # a chunk of float32, then float64
        watch.keep_step(step, tf.constant(1.0))
    for step in range(1100, 1200):
        watch.keep_step(step, tf.constant(float("inf") if step == 1150 else 1.0, tf.float64))
    assert watch.check() == 1150


def test_the_losses_checked_before_a_snapshot_are_summed_in_one_size_whose_kernel_tf_reuses(monkeypatch):
    # TF builds a kernel for each number of inputs a stack (or sum) op is given: a check of a number
    # of losses never seen before cost 8-13 ms at load (the snapshot's copy: 0.3 ms; issue 54). The
    # kept losses are added to the running sum (and stacked, to find a bad one) every CHUNK (64)
    # steps, and the rest padded to CHUNK with zeros, the bad step still the one found: only the
    # sizes warm() builds are ever summed and stacked
    sizes, stacked = set(), set()
    add_n, pack = tf.raw_ops.AddN, tf.raw_ops.Pack
    monkeypatch.setattr(tf.raw_ops, "AddN", lambda inputs: sizes.add(len(inputs)) or add_n(inputs=inputs))
    monkeypatch.setattr(tf.raw_ops, "Pack", lambda values, axis: stacked.add(len(values)) or pack(values=values, axis=axis))
    for n, bad in ((3, None), (5, 5), (300, 300), (301, 297), (77, None), (64, 1), (65, 65)):
        watch = LossWatch(("loss",))
        for step in range(1, n + 1):
            watch.keep_step(step, tf.constant(math.nan if step == bad else 1.0))
        watch._compact()
        assert watch.check() == bad
    assert sizes == {65} and stacked == {64}


def test_a_snapshot_check_reads_its_rules_from_the_snapshots_own_walk_and_reuses_them_for_the_same_graph(monkeypatch):
    # the non-finite check of a snapshot needs the rules (which keys are trainable or an optimizer's
    # slots). Before: each new walk of the object graph (every snapshot's first, and the re-walk every
    # few seconds) was followed by a second walk for the rules (27 ms of the trainer's loop per walk,
    # measured on bench_keras's MLP): 4 walks here. Now the rules come from the walk the snapshot made,
    # and a later walk of the same objects keeps them: 2 walks. A changed graph still reads new rules
    import keras

    from procsv.common.errors import NonFiniteState
    from procsv.trainer.checkpoint import snapshot
    from procsv.trainer.nonfinite.watch import NonfiniteWatch

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    model.train_on_batch(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32))
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    walks = []
    serialize = snapshot.serialize_object_graph
    monkeypatch.setattr(snapshot, "serialize_object_graph", lambda c: walks.append(c) or serialize(c))
    watch = NonfiniteWatch("rollback", (), ())

    def check(plan: snapshot.Plan) -> None:
        snap = snapshot.take(ckpt, lambda n: None, plan)  # no snapshot memory: every tensor as a frame
        watch.verify(1, ckpt, plan, snap.specs, snap.frames, None)

    check(snapshot.plan(ckpt))
    check(snapshot.plan(ckpt))  # the re-walk of an unchanged graph
    assert len(walks) == 2
    ckpt.extra = tf.Variable([1.0, float("inf")])  # a new trainable variable, +inf: poison only if strict
    with pytest.raises(NonFiniteState):
        check(snapshot.plan(ckpt))
    model.layers[0].kernel.assign(np.full((4, 3), np.nan, np.float32))
    del ckpt.extra
    with pytest.raises(NonFiniteState):
        check(snapshot.plan(ckpt))


def test_a_keras_optimizers_slots_are_strict_like_the_trainable_variables():
    # docs/guarantees.md: +-inf in a trainable variable or an optimizer's variable poisons a snapshot.
    # A Keras 3 optimizer's variables are Keras variables holding the tf.Variable the checkpoint saves;
    # before, only the Keras variables' ids were matched, so Adam's m and v were never strict
    import keras

    from procsv.trainer.nonfinite.scan import rules

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    strict = rules(tf.train.Checkpoint(model=model, optimizer=opt), []).strict
    slots = [k for k in strict if "/_variables/" in k]
    assert len(slots) == 4, sorted(strict)  # m and v of the kernel and the bias
    assert sum("_trainable_variables" in k for k in strict) == 2, sorted(strict)


def test_a_check_before_a_snapshot_runs_one_op_before_its_one_read(monkeypatch):
    # after the stack of the losses kept since the last chunk, a check judged them with three more
    # ops (is-finite, all, and-ed with the chunks' verdict): with the stack, 0.22 ms of an in-memory
    # snapshot's charge on the digits model (issue 54 point 5). The losses are now added to a
    # running sum, NaN and Inf in it whatever else it holds: one op, then the one read
    from tensorflow.python import pywrap_tfe

    watch = LossWatch(("loss",))
    watch.warm()
    for step in range(1, 101):
        watch.keep_step(step, tf.constant(1.0 + step))
    ops: list = []
    fast = pywrap_tfe.TFE_Py_FastPathExecute
    monkeypatch.setattr(pywrap_tfe, "TFE_Py_FastPathExecute",
                        lambda ctx, op, *args: ops.append(op) or fast(ctx, op, *args))
    assert watch.check() is None and watch.reads == 1
    assert ops == ["AddN"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_finite_losses_whose_sum_overflows_are_finite_and_a_nan_among_them_is_found(dtype):
    # a sum is not finite for finite losses too large: the values, read, tell that apart (one more read)
    big = float(np.finfo(dtype).max) / 2
    watch = LossWatch(("loss",))
    for step in range(1, 101):
        watch.keep_step(step, tf.constant(big, dtype))
    assert watch.check() is None and watch.reads == 2
    for step in range(101, 201):
        watch.keep_step(step, tf.constant(math.nan if step == 170 else big, dtype))
    assert watch.check() == 170 and watch.reads == 4
    watch.keep_step(201, tf.constant(-math.inf, dtype))
    watch.keep_step(202, tf.constant(math.inf, dtype))  # -inf + inf: NaN, still not finite
    assert watch.check() == 201


def test_losses_of_mixed_dtypes_are_summed_and_checked_all_the_same():
    watch = LossWatch(("loss",))
    for step in range(1, 151):
        dtype = (tf.float32, tf.float64, tf.float16)[step % 3]
        watch.keep_step(step, tf.constant(math.inf if step == 140 else 1.0, dtype))
    assert watch.check() == 140
    for step in range(151, 301):
        watch.keep_step(step, tf.constant(1.0, (tf.float32, tf.float64)[step % 2]))
    assert watch.check() is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_one_bad_loss_is_found_at_each_place_a_chunk_or_a_check_can_put_it(dtype):
    # counts around the chunk of 64 (ragged, exact, one over, several), the bad loss at the first
    # step, the first step of a later chunk and the last step before the check; NaN, +inf and -inf
    for count in (1, 63, 64, 65, 130):
        for at in sorted({0, 64, count - 1} & set(range(count))):
            for bad in (math.nan, math.inf, -math.inf):
                watch = LossWatch(())
                for step in range(count):
                    watch.keep_step(step, tf.constant(bad if step == at else 1.0, dtype))
                assert watch.check() == at, (count, at, bad)
                for step in range(count):  # and the next window, all finite, is finite
                    watch.keep_step(step, tf.constant(1.0, dtype))
                assert watch.check() is None, (count, at, bad)


def test_float16_losses_whose_running_sum_passes_float16s_range_are_checked_with_one_read():
    # float16 tops out at 65504: 10 s of a fast loop's losses of 10 add up past it, and each check then
    # read every value again (11 ms at load 6 for 10,000 losses, against 0.25 for float32): each
    # chunk's sum is added to a float32 total instead. Still one read, and a NaN still found
    watch = LossWatch(())
    for step in range(10_000):
        watch.keep_step(step, tf.constant(10.0, tf.float16))
    assert watch.check() is None and watch.reads == 1
    for step in range(10_000, 20_000):
        watch.keep_step(step, tf.constant(math.nan if step == 15_000 else 10.0, tf.float16))
    assert watch.check() == 15_000
    for step in range(20_000, 20_100):  # one large float16 chunk overflows its own sum: finite all the same
        watch.keep_step(step, tf.constant(60_000.0, tf.float16))
    assert watch.check() is None


def test_a_loss_returned_as_a_variable_is_judged_by_its_value_at_its_step():
    # a step may return a variable holding its loss (assigned each step): kept as the variable, the
    # check read whatever it held at the check, and a NaN at step 3, overwritten at step 4, was missed
    import keras

    for var in (tf.Variable(0.0), keras.Variable(0.0)):
        watch = LossWatch(())
        for step in range(10):
            var.assign(math.nan if step == 3 else 1.0)
            watch.keep_step(step, var)
        assert watch.check() == 3, type(var)
        reads = watch.reads
        for step in range(10, 80):
            var.assign(1.0)
            watch.keep_step(step, var)
        assert watch.check() is None and watch.reads == reads + 1, type(var)  # one read: none at a step


@pytest.mark.parametrize("flags, where", [(("--ps", "1"), "a parameter-server job (--ps)")])
def test_on_spike_rollback_in_a_ps_job_is_refused_before_anything_starts(tmp_path, flags, where):
    # before: the launch started, each trainer refused it with a 47-line traceback, then the run failed
    # (a trainer group, --nproc, is no longer refused: its group rolls back past a spike, issue 68)
    logdir = tmp_path / "r"
    done = subprocess.run([sys.executable, "-m", "procsv", "launch", "procsv.examples.digits", "--logdir", str(logdir),
                           "--on-spike", "rollback", *flags], capture_output=True, text=True, env=quiet_env(), timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"procsv: error: --on-spike rollback is not supported in {where}")
    assert "use --on-spike warn or stop" in done.stderr
    assert not logdir.exists()  # nothing started, nothing written


def test_a_lone_trainers_second_rollback_restores_the_newest_snapshot_before_its_own_step():
    # the check that the group's stale bound (a second rollback restoring before the first one's step) has no
    # lone-trainer counterpart: a lone trainer rolls back in place, each time to the newest copy before the
    # step it rolls back (StateRestore.before -> memory_restore.newest_before), no bound carried over. After
    # the rollback of 70 (restored 50) the copy of 100 is the rolled-forward timeline's; the rollback of 110
    # restores it (the copies of the undone timeline are never of a step at or past the bad one: the losses are
    # checked before each snapshot; passed before as well: the check the brief asked for, not a fix)
    from procsv.common.snapshot_memory import SLOT_COMPLETE
    from procsv.trainer.checkpoint.memory_restore import Copy, newest_before
    from procsv.trainer.checkpoint.snapshot import SnapshotArena

    arena = SnapshotArena(4096, slots=3)
    try:
        copies = {}
        for slot, step in ((0, 50), (1, 100)):
            arena.mark(slot, SLOT_COMPLETE, step)
            copies[slot] = Copy(slot, step, (), ())
        assert [getattr(newest_before(copies, arena, bad), "step", None) for bad in (110, 100, 70, 50)] == \
            [100, 50, 50, None]
    finally:
        arena.close()
