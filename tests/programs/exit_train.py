"""A tiny training module that ends itself with ``sys.exit`` inside its ``managed_session`` block.

    --exit-at-step K       call sys.exit once step K is reached
    --exit-code C          the argument of sys.exit: an integer, or "none" for a bare sys.exit()
    --exit-from WHERE      block: in the loop body after step K completed; step: at the start of the
                           step function of step K (before it changes anything); loop: in an sv.loop
                           thread that sees step K
    --steps N              the loop's own end (never reached by the tests: it must not be the reason the run ends)
    --at-exit FILE         what a program's end runs, as the interpreter's end: at its sys.exit, a non-daemon
                           thread that waits for the main thread's end, then appends "thread" to FILE; an
                           atexit handler appends "atexit" (after it, if non-daemon threads are joined first)
    --logdir DIR           for a plain `python exit_train.py` run

Every step adds one to each weight, so a checkpoint's weights equal the steps it holds. The line
after the block is printed only if the program went on past its sys.exit (it must not).
"""

import argparse
import sys
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--exit-at-step", type=int, required=True)
p.add_argument("--exit-code", default="0")
p.add_argument("--exit-from", choices=["block", "step", "loop"], default="block")
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--step-delay", type=float, default=0.005)
p.add_argument("--at-exit", default=None)
p.add_argument("--logdir", default=None)
args = p.parse_args()
code = None if args.exit_code == "none" else int(args.exit_code)


def note(what: str) -> None:
    with open(args.at_exit, "a") as fh:
        fh.write(what + "\n")


def leave() -> None:
    """sys.exit(code), with --at-exit's thread outliving the main thread and its atexit handler."""
    if args.at_exit:
        import atexit
        import threading

        atexit.register(note, "atexit")
        main = threading.main_thread()
        threading.Thread(target=lambda: (main.join(), time.sleep(0.2), note("thread"))).start()
    sys.exit(code)

weights = tf.Variable(tf.zeros([4]))
sv = procsv.Supervisor(logdir=args.logdir, checkpoint={"weights": weights}, save_model_secs=600)


def step() -> None:
    if args.exit_from == "step" and sv.step == args.exit_at_step:
        print(f"exit_train: sys.exit({code}) inside step {sv.step}", flush=True)
        leave()
    weights.assign_add(tf.ones([4]))
    time.sleep(args.step_delay)


def watch() -> None:
    if sv.step >= args.exit_at_step:
        print(f"exit_train: sys.exit({code}) in an sv.loop thread at step {sv.step}", flush=True)
        sys.exit(code)


with sv.managed_session() as sess:
    if args.exit_from == "loop":
        sv.loop(0.01, watch)
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(step)
        if args.exit_from == "block" and sv.step == args.exit_at_step:
            print(f"exit_train: sys.exit({code}) after step {sv.step}", flush=True)
            leave()
print(f"exit_train: went on after the block at step {sv.step}", flush=True)
