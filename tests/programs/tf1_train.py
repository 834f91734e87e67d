"""A TF1 graph program as written for ``tf.compat.v1.train.Supervisor``; ``--tf`` runs it under TF's own.

Under procsv only the Supervisor's import differs (``procsv.Supervisor``). The model is
``tf1_mlp``'s; each step feeds the batch of its global step. It prints one line per run of its
first steps with what ``sess.run`` returned for a fetch structure (``out <kind> <repr>``), so that a
test can compare with TF's own Supervisor, and ``start <step>`` with the step the session began at.

    --logdir DIR            the Supervisor's logdir (under procsv launch: the launch's)
    --steps N               train until the global step is N
    --step-delay S          sleep after each step
    --init-fn-log FILE      init_fn(sess) appends a line to FILE
    --out FILE.npz          every global variable at the end, by name
    --save-model-secs S / --save-summaries-secs S
    --no-summary-op         summary_op=None (TF's own Supervisor fails with its default merge_all on this
                            graph: the summaries need the placeholders)
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np

import tf1_mlp

p = argparse.ArgumentParser()
p.add_argument("--logdir", default=None)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--step-delay", type=float, default=0.0)
p.add_argument("--init-fn-log", default=None)
p.add_argument("--out", default=None)
p.add_argument("--save-model-secs", type=float, default=600)
p.add_argument("--save-summaries-secs", type=float, default=0.05)
p.add_argument("--tf", action="store_true", help="TensorFlow's own Supervisor")
p.add_argument("--no-summary-op", action="store_true", help="summary_op=None (TF's own fails with merge_all here)")
args = p.parse_args()
tf = tf1_mlp.setup_tf()
if args.tf:
    Supervisor = tf.compat.v1.train.Supervisor
else:
    from procsv import Supervisor

m = tf1_mlp.build(tf)
Pair = collections.namedtuple("Pair", ["loss", "logits"])


def init_fn(sess) -> None:
    if args.init_fn_log:
        with open(args.init_fn_log, "a") as fh:
            fh.write(f"init_fn at step {int(sess.run(m.gs))}\n")


def plain(value):
    """A printable form of what sess.run returned (floats exactly, by their bytes' repr)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, [plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [plain(v) for v in value])
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        return (str(value.dtype), np.asarray(value).tolist())
    return value


FETCHES = [
    ("op", lambda: m.train_op),
    ("list", lambda: [m.train_op, m.loss]),
    ("dict", lambda: {"train": m.train_op, "loss": m.loss}),
    ("tuple", lambda: (m.train_op, (m.loss, m.mean_logits))),
    ("nested", lambda: {"t": m.train_op, "more": [m.loss, {"b": m.mean_logits}], "pair": Pair(m.loss, m.mean_logits)}),
]

sv = Supervisor(logdir=args.logdir, init_fn=init_fn, save_model_secs=args.save_model_secs,
                save_summaries_secs=args.save_summaries_secs,
                **({"summary_op": None} if args.no_summary_op else {}))
with sv.managed_session() as sess:
    step = int(sess.run(m.gs))
    print(f"start {step}", flush=True)
    while not sv.should_stop() and step < args.steps:
        bx, by = tf1_mlp.batch(step)
        kind, fetches = FETCHES[step % len(FETCHES)]
        out = sess.run(fetches(), feed_dict={m.x: bx, m.y: by})
        if step < 10:
            print(f"out {step} {kind} {plain(out)!r}", flush=True)
        step += 1
        if args.step_delay:
            time.sleep(args.step_delay)
    if args.out:
        np.savez(args.out, **tf1_mlp.variables(tf, sess))
print(f"done {step}", flush=True)
