"""The seeds' MonitoredSession examples, ported to TF2 with ``procsv.train`` (the digits MLP).

Runs in the trainer process: ``procsv launch procsv.examples.monitored --logdir DIR -- --steps N``
(or ``python -m procsv.examples.monitored --logdir DIR``). ``--mode`` picks the seed's example:

* ``training`` (default): ``MonitoredTrainingSession(checkpoint_dir=..., hooks=[StopAtStepHook])``
  with TF's standard hooks (step counter, summaries, checkpoints);
* ``session``: ``MonitoredSession(session_creator=ChiefSessionCreator(...), hooks=[saver_hook,
  summary_hook])`` with an explicit ``CheckpointSaverHook`` and ``SummarySaverHook``;
* ``step_fn``: ``session.run_step_fn(step_fn)``, the step function reading a value through
  ``step_context.session`` (no hooks) and training through ``step_context.run_with_hooks``.

The TF1 ``sess.run(train_op)`` becomes ``sess.run(train_step, x, y)``. The batch of global step
``s`` is a pure function of (seed, s), so a run killed and resumed ends with the same weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Optional, Sequence


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.monitored", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["training", "session", "step_fn"], default="training")
    p.add_argument("--steps", type=int, default=1000, help="stop at this global step (StopAtStepHook)")
    p.add_argument("--save-checkpoint-secs", type=float, default=None)
    p.add_argument("--save-checkpoint-steps", type=int, default=100)
    p.add_argument("--save-summaries-steps", type=int, default=50)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    import time

    import keras
    import tensorflow as tf

    from procsv import train
    from procsv.examples.digits import batch_indices, build_model, load_data

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    x_train, y_train, _, _ = load_data(args.seed)
    model, optimizer, loss_fn = build_model()
    global_step = train.get_or_create_global_step()

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def batch() -> tuple[Any, Any]:
        idx = batch_indices(args.seed, int(global_step.numpy()) + 1, len(x_train), args.batch_size)
        return x_train[idx], y_train[idx]

    def step(x: Any, y: Any) -> Any:
        loss = train_step(x, y)
        if args.step_delay:
            time.sleep(args.step_delay)
        return loss

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    scaffold = train.Scaffold(checkpoint=checkpoint,
                              summary_op=lambda: {"kernel_norm": tf.norm(model.trainable_variables[0])})
    stop_hook = train.StopAtStepHook(last_step=args.steps)
    nan_hook = train.NanTensorHook(None)  # None: the step's return value (the loss)
    secs, steps = (args.save_checkpoint_secs, None) if args.save_checkpoint_secs else (None, args.save_checkpoint_steps)
    if args.mode == "training":
        sess = train.MonitoredTrainingSession(checkpoint_dir=args.logdir, scaffold=scaffold,
                                              hooks=[stop_hook, nan_hook], save_checkpoint_secs=secs,
                                              save_checkpoint_steps=steps,
                                              save_summaries_steps=args.save_summaries_steps,
                                              log_step_count_steps=args.save_summaries_steps)
    else:
        logdir = args.logdir or os.environ.get("PROCSV_LOGDIR", "")
        saver_hook = train.CheckpointSaverHook(logdir, save_secs=secs, save_steps=steps, scaffold=scaffold)
        summary_hook = train.SummarySaverHook(save_steps=args.save_summaries_steps, output_dir=logdir,
                                              scaffold=scaffold)
        sess = train.MonitoredSession(session_creator=train.ChiefSessionCreator(scaffold=scaffold,
                                                                                checkpoint_dir=args.logdir),
                                      hooks=[saver_hook, summary_hook, stop_hook, nan_hook])

    def step_fn(step_context: Any) -> Any:
        before = step_context.session.run(global_step)  # a read, no hooks, not a step
        loss = step_context.run_with_hooks(step, *batch())
        if before + 1 >= args.steps:
            step_context.request_stop()  # StopIteration: ends the loop; the with block exits cleanly
        return loss

    with sess:
        print(f"monitored: starting at step {int(global_step.numpy())}", flush=True)
        while not sess.should_stop():
            if args.mode == "step_fn":
                loss = sess.run_step_fn(step_fn)
            else:
                loss = sess.run(step, *batch())
            if int(global_step.numpy()) % 100 == 0:
                print(f"monitored: step {int(global_step.numpy())} loss {float(loss):.4f}", flush=True)
    print(f"monitored: finished at step {int(global_step.numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
