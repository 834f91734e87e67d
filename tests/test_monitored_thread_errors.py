"""A thread's error reported to a MonitoredSession's coordinator ends the program as under TensorFlow's classes
(issue 67: TF's observable behaviour wins inside the program).

What TF 2.21 does (``monitored_session.py``): the coordinator a MonitoredSession hands its hooks records every
exception (``Coordinator(clean_stop_exception_types=[])``: an ``OutOfRangeError`` too); the next runs go ahead;
``should_stop()`` raises the error in a ``SingularMonitoredSession`` (``_CoordinatedSession._check_stop``) and is
True in a ``MonitoredSession`` (its ``_RecoverableSession`` turns the error into a stop); a block left without an
error (or with ``OutOfRangeError``/``StopIteration``) still calls every hook's ``end()`` (the CheckpointSaverHook
saves the last step) before the close's join raises the thread's error, over what ``end()`` raised. (A block
that failed calls no ``end()`` and gets the thread's error over its own: procsv did so already.)

Each test runs one program under TF's own class and under procsv's (graph mode: a ``tf.compat.v1`` program;
eager: procsv's eager sessions, against TF's graph outcome) and compares what the program saw: each
``should_stop()`` and ``run()`` in order, whether ``end()`` ran and at which step, what left the ``with`` block
(and what it replaced), the newest checkpoint. The services of procsv's runs are child processes of the test.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import pytest

pytestmark = [pytest.mark.usefixtures("fresh_train_api"), pytest.mark.slow]


def _failure(tf: Any, kind: str) -> BaseException:
    if kind == "OutOfRangeError":
        return tf.errors.OutOfRangeError(None, None, "the reader's input ran out")
    return ValueError("the input thread failed")


def _session(train: Any, kind: str, ckpt_dir: str, hooks: list[Any], checkpoint: Any) -> Any:
    """The program's session, as TF's tutorials make it; ``checkpoint``: the eager state (procsv's, eager only)."""
    saver = train.CheckpointSaverHook(ckpt_dir, save_steps=1000)
    scaffold = {} if checkpoint is None else {"scaffold": train.Scaffold(checkpoint=checkpoint)}
    if kind == "MonitoredTrainingSession":
        more = {} if checkpoint is None else {"checkpoint": checkpoint}
        return train.MonitoredTrainingSession(checkpoint_dir=ckpt_dir, hooks=hooks, save_checkpoint_steps=1000,
                                              save_summaries_steps=None, log_step_count_steps=None, **more)
    if kind == "MonitoredSession":
        return train.MonitoredSession(train.ChiefSessionCreator(checkpoint_dir=ckpt_dir, **scaffold),
                                      hooks=[*hooks, saver])
    return train.SingularMonitoredSession(hooks=[*hooks, saver], checkpoint_dir=ckpt_dir, **scaffold)


def _program(train: Any, kind: str, ckpt_dir: str, end_file: str, ending: str = "loop",
             thread_error: str = "ValueError", end_raises: bool = False, eager: bool = False) -> dict[str, Any]:
    """A training loop, ``while not sess.should_stop(): sess.run(train_op)``, whose helper thread (registered with
    the coordinator, under ``coord.stop_on_exception()``) fails after the second step; the loop waits for it. Then
    the block goes on (``ending="loop"``), is left (``"leave"``) or raises (``"OutOfRangeError"``,
    ``"StopIteration"``). A hook's ``end()`` writes the step to ``end_file`` (and raises, with
    ``end_raises``). What the program saw."""
    import tensorflow as tf

    calls: list[Any] = []
    seen: dict[str, Any] = {"calls": calls}

    def run_program(hook: Any, sess: Any, train_step: Callable[[Any], int], step_of: Callable[[Any], int]) -> None:
        hook.step_of = step_of

        def helper() -> None:
            go.wait(60)
            with hook.coord.stop_on_exception():
                raise _failure(tf, thread_error)

        go = threading.Event()
        t = threading.Thread(target=helper)
        hook.coord.register_thread(t)
        t.start()
        with sess:
            while True:
                try:
                    stop = sess.should_stop()
                except Exception as e:
                    calls.append(("should_stop raised", repr(e)))
                    raise
                calls.append(("should_stop", stop))
                if stop:
                    break
                step = train_step(sess)
                calls.append(("run", step))
                if step == 2:
                    go.set()
                    t.join(60)
                    if ending == "leave":
                        break
                    if ending == "OutOfRangeError":
                        raise tf.errors.OutOfRangeError(None, None, "the block's input ran out")
                    if ending == "StopIteration":
                        raise StopIteration("the block's input ran out")

    class EndHook(train.SessionRunHook):  # type: ignore[misc, name-defined]
        coord: Any = None
        step_of: Callable[[Any], int]

        def after_create_session(self, session: Any, coord: Any) -> None:
            self.coord = coord

        def end(self, session: Any) -> None:
            step = self.step_of(session)
            calls.append(("end", step))
            with open(end_file, "w") as fh:
                fh.write(f"ended at step {step}\n")
            if end_raises:
                raise KeyError("end failed")

    hook = EndHook()
    try:
        if eager:
            w = tf.Variable(0)
            sess = _session(train, kind, ckpt_dir, [hook], {"w": w})
            run_program(hook, sess, lambda s: int(s.run(lambda: w.assign_add(1))), lambda session: int(w.numpy()))
        else:
            with tf.Graph().as_default():
                gs = tf.compat.v1.train.get_or_create_global_step()
                train_op = tf.compat.v1.assign_add(gs, 1)
                sess = _session(train, kind, ckpt_dir, [hook], None)
                run_program(hook, sess, lambda s: int(s.run(train_op)), lambda session: int(session.run(gs)))
    except BaseException as e:
        seen["raised"] = repr(e)
        seen["over"] = repr(e.__context__) if e.__context__ is not None else None
    latest = tf.train.latest_checkpoint(ckpt_dir)
    seen["checkpoint"] = os.path.basename(latest) if latest else None
    seen["end_file"] = open(end_file).read() if os.path.exists(end_file) else None
    return seen


def _both(tmp_path: Any, logdir: str, kind: str, **how: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The program under TF's class (graph mode) and under procsv's (eager with ``eager=True``)."""
    import tensorflow as tf

    from procsv import train

    theirs = _program(tf.compat.v1.train, kind, str(tmp_path / "tf"), str(tmp_path / "tf-end.txt"),
                      **{k: v for k, v in how.items() if k != "eager"})
    ours = _program(train, kind, logdir, str(tmp_path / "procsv-end.txt"), **how)
    return theirs, ours


RUNS = [("should_stop", False), ("run", 1), ("should_stop", False), ("run", 2)]


@pytest.mark.parametrize("kind", ["MonitoredTrainingSession", "SingularMonitoredSession"])
def test_a_tutorial_loop_whose_helper_thread_fails_ends_as_under_tensorflows_classes(tmp_path, logdir, kind):
    # before (procsv): should_stop() said True in a SingularMonitoredSession instead of raising, and no hook's
    # end() ran after the thread's error (no end file, no checkpoint of step 2 from the MonitoredTrainingSession)
    theirs, ours = _both(tmp_path, logdir, kind)
    error = "ValueError('the input thread failed')"
    if kind == "MonitoredTrainingSession":  # should_stop() True, the block left cleanly: end(), then the error
        assert theirs == {"calls": [*RUNS, ("should_stop", True), ("end", 2)], "raised": error, "over": None,
                          "checkpoint": "model.ckpt-2", "end_file": "ended at step 2\n"}
    else:  # should_stop() raises the thread's error: the block failed, no end(), no final checkpoint
        assert theirs == {"calls": [*RUNS, ("should_stop raised", error)], "raised": error, "over": None,
                          "checkpoint": "model.ckpt-0", "end_file": None}
    assert ours == theirs


CASES = {  # (kind, the block's end, the thread's error, end() raises): TF's end() and what leaves the block
    "clean-exit": ("MonitoredSession", "leave", "ValueError", False),
    "block-OutOfRangeError": ("SingularMonitoredSession", "OutOfRangeError", "ValueError", False),
    "block-StopIteration": ("MonitoredSession", "StopIteration", "ValueError", False),
    "thread-OutOfRangeError-should_stop": ("SingularMonitoredSession", "loop", "OutOfRangeError", False),
    "thread-OutOfRangeError-clean-exit": ("MonitoredSession", "leave", "OutOfRangeError", False),
    "end-raises": ("MonitoredSession", "leave", "ValueError", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_after_a_threads_error_end_and_the_error_at_the_close_are_tensorflows(tmp_path, logdir, case):
    # before (procsv): no end() after a thread's error; a thread's OutOfRangeError was a clean stop (nothing
    # raised); a SingularMonitoredSession's should_stop() said True
    kind, ending, thread_error, end_raises = CASES[case]
    theirs, ours = _both(tmp_path, logdir, kind, ending=ending, thread_error=thread_error, end_raises=end_raises)
    error = repr(_failure(__import__("tensorflow"), thread_error))
    # TF: every hook's end() (the block did not fail), then the thread's error
    assert (("end", 2) in theirs["calls"], theirs["raised"]) == (True, error)
    # TF's CheckpointSaverHook saves the last step at its end(), unless a hook before it raised
    assert theirs["checkpoint"] == ("model.ckpt-0" if end_raises else "model.ckpt-2")
    if end_raises:
        assert theirs["over"] == "KeyError('end failed')"  # the thread's error, over what end() raised
    assert ours == theirs


EAGER_CASES = [  # (kind, the block's end, the thread's error)
    ("MonitoredTrainingSession", "loop", "ValueError"),
    ("SingularMonitoredSession", "loop", "ValueError"),
    ("SingularMonitoredSession", "OutOfRangeError", "ValueError"),
    ("SingularMonitoredSession", "loop", "OutOfRangeError"),
]


@pytest.mark.parametrize("kind,ending,thread_error", EAGER_CASES)
def test_procsvs_eager_sessions_end_after_a_threads_error_as_tensorflows_graph_sessions(tmp_path, logdir, kind,
                                                                                         ending, thread_error):
    # eager (TF's classes have no eager mode): the same program with a step function, against TF's graph outcome;
    # before: as in graph mode (no end(), a thread's OutOfRangeError clean, should_stop() True)
    theirs, ours = _both(tmp_path, logdir, kind, ending=ending, thread_error=thread_error, eager=True)
    if theirs["checkpoint"] == "model.ckpt-0":  # the block failed: TF's only checkpoint is the one at creation,
        # saved synchronously; procsv's eager one is committed while the steps go on, and a failed block's stop
        # abandons a commit still in flight (docs/parity.md), so it may be missing, never of a later step
        assert ours.pop("checkpoint") in ("model.ckpt-0", None)
        theirs.pop("checkpoint")
    assert ours == theirs
