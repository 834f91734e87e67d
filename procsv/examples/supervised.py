"""The seeds' ``tf.train.Supervisor`` examples, ported to TF2 with ``procsv.Supervisor`` (the digits MLP).

The one-file-per-example ports, each a few lines away from its seed, are in
:mod:`procsv.examples.seeds`; this multi-mode program on a real model stays for
``tests/test_checkpoint_reconnect.py`` (its ``retry`` mode with in-memory snapshots).

Runs in the trainer process: ``procsv launch procsv.examples.supervised --logdir DIR -- --mode M``
(or ``python -m procsv.examples.supervised --logdir DIR --mode M``). ``--mode`` picks the example
of the Supervisor page:

* ``basic``: ``with sv.managed_session() as sess: while not sv.should_stop(): sess.run(train_op)``;
* ``loop``: the same, plus ``sv.loop(60, print_loss, (sess,))``, a thread that reads the last loss
  (``sess.run(variable)`` from another thread only reads: it is no step);
* ``summaries``: ``Supervisor(summary_op=None)`` and a summary computed by hand every 100 steps
  with ``sv.summary_computed(sess, ...)``;
* ``retry``: the "retry on preemption" loop, ``while True: try: with sv.managed_session() ...
  except tf.errors.AbortedError: continue; break``; ``--abort-at-step K`` raises AbortedError in
  step K once, and the reused Supervisor restores the newest checkpoint and goes on.

TF1's ``sess.run(train_op)`` becomes ``sess.run(train_step, x, y)``, and each loop also ends at
``--steps``. The batch of global step ``s`` is a pure function of (seed, s), so a run killed and
resumed ends with the same weights.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional, Sequence


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="procsv.examples.supervised", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["basic", "loop", "summaries", "retry"], default="basic")
    p.add_argument("--steps", type=int, default=1000, help="end at this global step")
    p.add_argument("--save-model-secs", type=float, default=600)
    p.add_argument("--save-checkpoint-steps", type=int, default=100)
    p.add_argument("--loop-secs", type=float, default=60, help="sv.loop's interval (the seed's 60)")
    p.add_argument("--summary-every", type=int, default=100, help="summaries mode: every N steps")
    p.add_argument("--abort-at-step", type=int, default=0, help="retry mode: AbortedError in this step, once")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--logdir", default=None, help="only when run without `procsv launch`")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import time

    import keras
    import tensorflow as tf

    import procsv
    from procsv.examples.digits import batch_indices, build_model, load_data

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    x_train, y_train, _, _ = load_data(args.seed)
    model, optimizer, loss_fn = build_model()
    last_loss = tf.Variable(0.0, trainable=False)
    aborted: list[int] = []

    @tf.function  # type: ignore[untyped-decorator]  # TensorFlow ships no type information
    def train_op(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        last_loss.assign(loss)
        return loss

    def my_train_op(sv: Any) -> Any:  # one step's arguments: the batch of the step about to run
        idx = batch_indices(args.seed, sv.step + 1, len(x_train), args.batch_size)
        if args.mode == "retry" and sv.step + 1 == args.abort_at_step and not aborted:
            aborted.append(sv.step + 1)
            raise tf.errors.AbortedError(None, None, "preempted (simulated)")
        if args.step_delay:
            time.sleep(args.step_delay)
        return train_op(x_train[idx], y_train[idx])

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    is_chief = True
    if args.mode == "basic":
        sv = procsv.Supervisor(logdir=args.logdir, checkpoint=checkpoint, save_model_secs=args.save_model_secs,
                               save_checkpoint_steps=args.save_checkpoint_steps)
        with sv.managed_session() as sess:
            while not sv.should_stop() and sv.step < args.steps:
                sess.run(my_train_op, sv)
    elif args.mode == "loop":
        def print_loss(sess: Any) -> None:
            print(f"supervised: loss {float(sess.run(last_loss)):.4f}", flush=True)

        sv = procsv.Supervisor(logdir=args.logdir, checkpoint=checkpoint, save_model_secs=args.save_model_secs,
                               save_checkpoint_steps=args.save_checkpoint_steps)
        with sv.managed_session() as sess:
            sv.loop(args.loop_secs, print_loss, (sess,))
            while not sv.should_stop() and sv.step < args.steps:
                sess.run(my_train_op, sv)
    elif args.mode == "summaries":
        # Create a Supervisor with no automatic summaries.
        sv = procsv.Supervisor(logdir=args.logdir, is_chief=is_chief, summary_op=None, checkpoint=checkpoint,
                               save_model_secs=args.save_model_secs, save_checkpoint_steps=args.save_checkpoint_steps)
        with sv.managed_session() as sess:
            for step in range(sv.step, args.steps):  # TF: xrange(1000000), from 0; here from the restored step
                if sv.should_stop():
                    break
                if is_chief and step % args.summary_every == 0:
                    # Create the summary every 100 chief steps (TF: sess.run(my_summary_op)).
                    sv.summary_computed(sess, {"loss": float(sess.run(last_loss))})
                # Train normally (TF trained in the else branch: here every iteration is a step)
                sess.run(my_train_op, sv)
    else:
        sv = procsv.Supervisor(logdir=args.logdir, checkpoint=checkpoint, save_model_secs=args.save_model_secs,
                               save_checkpoint_steps=args.save_checkpoint_steps)
        while True:
            try:
                with sv.managed_session() as sess:
                    while not sv.should_stop() and sv.step < args.steps:
                        sess.run(my_train_op, sv)
            except tf.errors.AbortedError:
                print(f"supervised: aborted at step {aborted[-1]}; retrying", flush=True)
                continue
            break
    print(f"supervised: finished at step {int(sv.global_step.numpy())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
