"""A TF1 graph program whose loss spikes at given steps (issue 68's loss spikes, in graph mode).

    --mode M              supervisor: ``procsv.Supervisor(...).managed_session()``, each run
                          ``sess.run([train_op, loss])``; monitored: ``procsv.train.MonitoredTrainingSession``
                          (StopAtStepHook at --steps), each run ``mon.run([train_op, loss])``, as a TF1
                          tutorial's loop; plain: a ``tf.compat.v1.Session`` loop of the same graph, no procsv
                          (its --skip-at steps run only the global step's increment), saved at --steps
    --spike-at N          the batch of step N is scaled by 7 (inputs and targets): its loss jumps ~50x
    --transient-at N      as --spike-at, the first time this process runs step N only (a fault of the
                          machine: a replay of step N computes it right)
    --nan-at N            the batch of step N is NaN (its loss too)
    --skip-at N           (plain) step N trains nothing, only advances the global step: the plain run that
                          never applied step N
    --steps N             train to step N
    --runs N              (supervisor) a loop of N runs instead (one that counts its own runs: a rollback's
                          replay it ends inside is not run on)
    --feed-counter        (supervisor) the batch is fed (placeholders), the batch of the loop's own run count,
                          not of the global step: a rollback's replay trains other batches
    --save-steps K        a checkpoint every K steps
    --on-spike P          (supervisor) Supervisor(on_spike=P); the monitored mode takes --on-spike through
                          PROCSV_ON_SPIKE (it takes no on_spike argument)
    --window W, --min-history H
                          (supervisor) the spike rule's window and minimum history (procsv.SpikeThresholds);
                          the monitored mode uses the rule's defaults (200, 100)
    --step-delay S        seconds each step's batch takes to draw (default 0.01; none in the plain mode)
    --wait-commit N       (supervisor) once at step N, wait (at most 400 s, marked: ``sv.waiting()``) until a
                          checkpoint of step N is committed (``tf.train.latest_checkpoint``), running only the
                          global step meanwhile: no step runs, so a save due at N taken late is still of step N;
                          the checkpoint a later rollback restores is N's (a service that starts or commits
                          slowly at load ruled out, not left to chance)
    --kill-at N --kill-file F
                          when the run of step N comes after step --kill-after-skip's batch was drawn twice
                          (first run and its replay) and F does not exist: write this process's pid to F and
                          wait (at most 120 s) to be killed
    --kill-after-skip S   (with --kill-at) see above
    --logdir DIR          the checkpoint directory (a plain `python spike_graph.py` run: required)

The batch of step s is a function of s alone, drawn in the graph by a ``py_func`` from the global step
(32 examples of 4 features and a noisy linear target, from a NumPy generator seeded with s; the same as
spike_train.py's), so a rollback's restored global step replays the same batches. A linear model
trained with ``MomentumOptimizer``; the loss tensor is named ``loss`` (procsv watches fetched tensors
named so).
"""

import argparse
import os
import time

import numpy as np
import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("supervisor", "monitored", "plain"), default="supervisor")
p.add_argument("--spike-at", type=int, action="append", default=[])
p.add_argument("--transient-at", type=int, action="append", default=[])
p.add_argument("--nan-at", type=int, action="append", default=[])
p.add_argument("--skip-at", type=int, action="append", default=[])
p.add_argument("--steps", type=int, default=90)
p.add_argument("--runs", type=int, default=None)
p.add_argument("--feed-counter", action="store_true")
p.add_argument("--save-steps", type=int, default=10)
p.add_argument("--on-spike", default=None)
p.add_argument("--window", type=int, default=40)
p.add_argument("--min-history", type=int, default=30)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--kill-at", type=int, default=None)
p.add_argument("--kill-after-skip", type=int, default=None)
p.add_argument("--kill-file", default=None)
p.add_argument("--wait-commit", type=int, default=None)
p.add_argument("--logdir", default=None)
args = p.parse_args()

tf.compat.v1.disable_eager_execution()
TRUE_W = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
drawn: dict[int, int] = {}  # step -> how often this process drew its batch


def batch(s: np.int64) -> tuple[np.ndarray, np.ndarray]:
    s = int(s)
    rng = np.random.default_rng(s)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = (x @ TRUE_W + rng.normal(scale=0.5, size=32)).astype(np.float32)
    if s in args.spike_at or (s in args.transient_at and s not in drawn):
        x, y = x * 7.0, y * 7.0
    if s in args.nan_at:
        x = np.full_like(x, np.nan)
    drawn[s] = drawn.get(s, 0) + 1
    if (args.kill_at == s and drawn.get(args.kill_after_skip, 0) >= 2 and args.kill_file
            and not os.path.exists(args.kill_file)):
        with open(args.kill_file + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(args.kill_file + ".tmp", args.kill_file)
        time.sleep(120)
    if args.mode != "plain":
        time.sleep(args.step_delay)
    return x, y


def wait_for_commit(sv: procsv.Supervisor, sess: tf.compat.v1.Session, step: int) -> None:
    """Until the newest committed checkpoint is of ``step`` or later (at most 400 s), running only the global
    step meanwhile (a run that is no step: the step boundary's work, a save put off behind a commit in flight
    among it, goes on at it)."""
    def committed() -> int:
        path = tf.train.latest_checkpoint(sv.logdir)
        return int(path.rsplit("-", 1)[1]) if path else -1

    deadline = time.monotonic() + 400
    with sv.waiting():
        while committed() < step and time.monotonic() < deadline:
            time.sleep(0.05)
            if time.monotonic() > deadline - 390:  # (a save put off behind a commit in flight: a run that is no step
                sess.run(gs)                       # lets the boundary's work take it, still of this step's state)


graph = tf.Graph()
with graph.as_default():
    gs = tf.compat.v1.train.get_or_create_global_step()
    if args.feed_counter:
        x, y = tf.compat.v1.placeholder(tf.float32, [32, 4]), tf.compat.v1.placeholder(tf.float32, [32])
    else:
        x, y = tf.compat.v1.py_func(batch, [gs + 1], [tf.float32, tf.float32], stateful=True)
        x.set_shape([32, 4])
        y.set_shape([32])
    w = tf.compat.v1.get_variable("w", initializer=tf.zeros([4]))
    err = tf.linalg.matvec(x, w) - y
    loss = tf.reduce_mean(err * err, name="loss")
    train_op = tf.compat.v1.train.MomentumOptimizer(0.005, 0.9).minimize(loss, global_step=gs)
    if args.mode == "supervisor":
        sv = procsv.Supervisor(logdir=args.logdir, summary_op=None, save_model_secs=600,
                               save_checkpoint_steps=args.save_steps, on_spike=args.on_spike,
                               spike_thresholds=procsv.SpikeThresholds(window=args.window,
                                                                       min_history=args.min_history))
        with sv.managed_session() as sess:
            runs = 0
            while not sv.should_stop() and (sv.step < args.steps if args.runs is None else runs < args.runs):
                sess.run([train_op, loss], feed_dict=dict(zip((x, y), batch(runs + 1))) if args.feed_counter else None)
                runs += 1
                if args.wait_commit is not None and sv.step >= args.wait_commit:
                    wait_for_commit(sv, sess, args.wait_commit)
                    args.wait_commit = None  # (once)
        print(f"spike_graph: ended at step {sv.step}", flush=True)
    elif args.mode == "monitored":
        with procsv.train.MonitoredTrainingSession(
                checkpoint_dir=args.logdir, save_checkpoint_steps=args.save_steps, save_checkpoint_secs=None,
                save_summaries_steps=None, log_step_count_steps=None,
                hooks=[procsv.train.StopAtStepHook(last_step=args.steps)]) as mon:
            while not mon.should_stop():
                mon.run([train_op, loss])
        print("spike_graph: ended", flush=True)
    else:
        skip = tf.compat.v1.assign_add(gs, 1)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(1, args.steps + 1):
                sess.run(skip if s in args.skip_at else train_op)
            saver.save(sess, os.path.join(args.logdir, "model.ckpt"), global_step=args.steps)
        print(f"spike_graph: ended at step {args.steps}", flush=True)
