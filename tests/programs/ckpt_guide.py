"""TensorFlow's checkpoint guide's custom loop ("Training checkpoints", the manual checkpointing
example), under ``tf.train.CheckpointManager`` (``--tf``) or with only its manager swapped for
``procsv.Supervisor``: ``python ckpt_guide.py --dir DIR --steps N [--tf] [--step-delay S] [--out F.npz]``.

As in the guide: a subclassed ``keras.Model`` (``Dense(5)``), a toy ``tf.data`` dataset of 10
examples repeated and batched by 2, its iterator, ``Adam(0.1)``, and
``tf.train.Checkpoint(step=tf.Variable(1), optimizer=opt, net=net, iterator=iterator)``; each step
takes ``next(iterator)``, trains, and advances ``ckpt.step``. ``--tf``: the guide's
``CheckpointManager(ckpt, DIR, max_to_keep=3)``, ``ckpt.restore(manager.latest_checkpoint)`` and a
``manager.save()`` every 10 steps. Without it, the swap a user makes: ``procsv.Supervisor(logdir=DIR,
checkpoint=ckpt)`` restores and saves (``DIR`` is the launch's logdir under ``procsv launch``), and the
loop runs while ``ckpt.step`` is at most ``N`` (the guide's ``for _ in range(50)`` would train 50
more steps after every restart, under TensorFlow's manager too). Prints ``restored from <step>`` or
``initializing from scratch``; ``--out``: the net's weights, ``ckpt.step`` and the optimizer's
iteration count at the end (npz). ``--build``: the net is built before the restore (the guide's restores
into an unbuilt net: under Keras 3 its Dense kernel escapes TF's deferred restoration, under the guide's
own manager too, and keeps its initial value). ``--save-secs``: the Supervisor's ``save_model_secs``;
``--no-iterator``: the checkpoint without the iterator (whose state, a variant tensor, makes the
checkpoint service load TensorFlow).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default=None, help="the manager's directory or the Supervisor's logdir")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--tf", action="store_true", help="the guide's own CheckpointManager")
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--out", default=None)
    p.add_argument("--build", action="store_true", help="build the net before the restore")
    p.add_argument("--save-secs", type=float, default=600.0, help="the Supervisor's save_model_secs")
    p.add_argument("--no-iterator", action="store_true", help="leave the iterator out of the checkpoint")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()

    class Net(tf.keras.Model):
        """A simple linear model."""

        def __init__(self) -> None:
            super().__init__()
            self.l1 = tf.keras.layers.Dense(5, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))

        def call(self, x):  # type: ignore[no-untyped-def]
            return self.l1(x)

    def toy_dataset() -> tf.data.Dataset:
        inputs = tf.range(10.)[:, None]
        labels = inputs * 5. + tf.range(5.)[None, :]
        return tf.data.Dataset.from_tensor_slices(dict(x=inputs, y=labels)).repeat().batch(2)

    def train_step(net, example, optimizer):  # type: ignore[no-untyped-def]
        """Trains `net` on `example` using `optimizer`."""
        with tf.GradientTape() as tape:
            output = net(example["x"])
            loss = tf.reduce_mean(tf.abs(output - example["y"]))
        variables = net.trainable_variables
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        return loss

    net = Net()
    if args.build:
        net.build((None, 1))
    opt = tf.keras.optimizers.Adam(0.1)
    dataset = toy_dataset()
    iterator = iter(dataset)
    parts = {} if args.no_iterator else {"iterator": iterator}  # (a variant tensor: the service loads TensorFlow)
    ckpt = tf.train.Checkpoint(step=tf.Variable(1), optimizer=opt, net=net, **parts)

    def one_step(*_: object) -> float:
        example = next(iterator)
        loss = train_step(net, example, opt)
        ckpt.step.assign_add(1)
        if args.step_delay:
            time.sleep(args.step_delay)
        return float(loss)

    if args.tf:
        manager = tf.train.CheckpointManager(ckpt, args.dir, max_to_keep=3)
        ckpt.restore(manager.latest_checkpoint)
        if manager.latest_checkpoint:
            print(f"restored from {int(ckpt.step)}", flush=True)
        else:
            print("initializing from scratch", flush=True)
        while int(ckpt.step) <= args.steps:
            loss = one_step()
            if int(ckpt.step) % 10 == 0:
                save_path = manager.save()
                print(f"saved checkpoint for step {int(ckpt.step)}: {save_path}", flush=True)
                print(f"loss {loss:1.2f}", flush=True)
    else:
        import procsv

        sv = procsv.Supervisor(logdir=args.dir, checkpoint=ckpt, save_model_secs=args.save_secs)
        with sv.managed_session() as sess:
            print(f"restored from {int(ckpt.step)}" if int(ckpt.step) > 1 else "initializing from scratch",
                  flush=True)
            while not sv.should_stop() and int(ckpt.step) <= args.steps:
                loss = sess.run(one_step)
                if int(ckpt.step) % 10 == 0:
                    print(f"loss {loss:1.2f}", flush=True)
    if args.out:
        weights = {f"w{i}": v.numpy() for i, v in enumerate(net.weights)}
        np.savez(args.out, step=np.int64(int(ckpt.step)), iterations=np.int64(int(opt.iterations)), **weights)
    return 0


if __name__ == "__main__":
    main()  # (no sys.exit: tests/plain_runs.py runs several programs in one process)
