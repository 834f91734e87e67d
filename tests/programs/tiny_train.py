"""A tiny training module for watchdog tests: misbehaves on purpose, on chosen attempts.

    --steps N              total steps
    --step-delay S         sleep per step
    --hang-at-step K       sleep forever inside step K (on attempts listed by --bad-attempts)
    --hang-kind read       ... or read forever from a pipe nobody writes to (a read that never returns);
                           lock: take a lock it holds, again (a deadlock between its threads)
    --wait-at-step K       sleep --wait-secs S inside step K, on every attempt (a wait that ends: a remote
                           service slow today; quiet from outside)
    --marked-wait-at-step K  the same, inside ``with sv.waiting():`` (the program marks its wait)
    --compute-at-step K    compute for --compute-secs S inside step K (on bad attempts): slow work, not a hang
    --compute-every N      ... and again every N steps after it
    --child-compute-at-step K  wait inside step K for a child process that computes for --compute-secs S
                           (a data loader's worker: the trainer itself is quiet)
    --step-growth S        each step sleeps S more than the one before (a step that grows slower)
    --first-compute S      compute for S s inside the first step of every attempt (a first step that traces long)
    --crash-after-commit   on bad attempts: at the first --save-steps step after the start, commit that
                           step (waiting for the commit) and exit 1 right after it
    --bad-attempts A,B     which attempts misbehave (default: 1); "all" for every attempt
    --save-steps N         checkpoint every N steps
    --raise-at-step K      raise --raise-kind (outofrange|stopiteration|value) inside step K
    --chatty BYTES         print a line of BYTES characters every step
    --ballast-mb N         checkpoint N MB more (a variable of zeros): a commit that takes time to write
    --fork-in-init FILE    init_fn forks a child that lives as long as the trainer (a data loader's
                           worker); its pid goes to FILE
    --spawn-orphan FILE    start a helper in its own session (setsid: it escapes the process group and
                           the parent-death signal) on bad attempts; write "<pid> <runtime dir>" to FILE
"""

import argparse
import os
import subprocess
import sys
import threading
import time

import tensorflow as tf

import procsv

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--step-delay", type=float, default=0.01)
p.add_argument("--hang-at-step", type=int, default=0)
p.add_argument("--hang-until-stop", action="store_true",
               help="the hang of --hang-at-step ends when a stop is requested (SIGTERM), so the run saves")
p.add_argument("--hang-kind", choices=["sleep", "read", "lock"], default="sleep")
p.add_argument("--compute-every", type=int, default=0)
p.add_argument("--wait-at-step", type=int, default=0)
p.add_argument("--wait-secs", type=float, default=0.0)
p.add_argument("--marked-wait-at-step", type=int, default=0)
p.add_argument("--child-compute-at-step", type=int, default=0)
p.add_argument("--step-growth", type=float, default=0.0)
p.add_argument("--first-compute", type=float, default=0.0)
p.add_argument("--compute-at-step", type=int, default=0)
p.add_argument("--compute-secs", type=float, default=0.0)
p.add_argument("--crash-after-commit", action="store_true")
p.add_argument("--bad-attempts", default="1")
p.add_argument("--save-steps", type=int, default=None)
p.add_argument("--save-model-secs", type=float, default=600)
p.add_argument("--raise-at-step", type=int, default=0, help="raise --raise-kind inside this step")
p.add_argument("--raise-kind", choices=["outofrange", "stopiteration", "value"], default="value")
p.add_argument("--logdir", default=None, help="for a plain `python tiny_train.py` run")
p.add_argument("--spawn-orphan", default=None, metavar="FILE")
p.add_argument("--orphan-via-shell", action="store_true",
               help="the --spawn-orphan helper is a grandchild: a shell starts it with setsid and exits")
p.add_argument("--chatty", type=int, default=0, metavar="BYTES")
p.add_argument("--ballast-mb", type=int, default=0)
p.add_argument("--fork-in-init", default=None, metavar="FILE",
               help="init_fn forks a child that lives as long as this process; its pid is written to FILE")
p.add_argument("--linger", type=float, default=0.0, metavar="SECS",
               help="after the supervised block ends (its last checkpoint committed), sleep SECS (a slow teardown)")
args = p.parse_args()
if args.crash_after_commit and not args.save_steps:
    p.error("--crash-after-commit commits at the first --save-steps step: give --save-steps")

attempt = int(os.environ.get("PROCSV_ATTEMPT", "1"))
bad = args.bad_attempts == "all" or str(attempt) in args.bad_attempts.split(",")
weights = tf.Variable(tf.zeros([4]))
started = [0]  # the step this attempt started at (--first-compute: its first step computes)


def spawn_orphan() -> None:
    """Inside the supervised block: a plain run's trainer is the helper's subreaper from then on."""
    import shlex
    import subprocess

    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    if args.orphan_via_shell:  # its parent (the shell) is gone at once: the helper is an orphan
        shell = subprocess.run(["sh", "-c", f"setsid {shlex.join(sleeper)} >/dev/null 2>&1 & echo $!"],
                               capture_output=True, text=True, check=True)
        helper_pid = int(shell.stdout.split()[0])
    else:
        helper_pid = subprocess.Popen(sleeper, start_new_session=True).pid
    with open(args.spawn_orphan + ".tmp", "w") as fh:
        fh.write(f"{helper_pid} {os.environ.get('PROCSV_RUNTIME_DIR', '')}\n")
    os.replace(args.spawn_orphan + ".tmp", args.spawn_orphan)


state = {"weights": weights}
if args.ballast_mb:
    state["ballast"] = tf.Variable(tf.zeros([args.ballast_mb * 2**18]))


def fork_in_init(session) -> None:
    """A process forked inside init_fn (a data loader's worker): it lives as long as this one."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(0)
    with open(args.fork_in_init + ".tmp", "w") as fh:
        fh.write(f"{pid}\n")
    os.replace(args.fork_in_init + ".tmp", args.fork_in_init)


sv = procsv.Supervisor(logdir=args.logdir, checkpoint=state, save_model_secs=args.save_model_secs,
                       save_checkpoint_steps=args.save_steps, init_fn=fork_in_init if args.fork_in_init else None)


def step():
    if args.spawn_orphan and bad and not os.path.exists(args.spawn_orphan):
        spawn_orphan()
    if args.raise_at_step and sv.step == args.raise_at_step:
        if args.raise_kind == "outofrange":
            raise tf.errors.OutOfRangeError(None, None, "input exhausted")
        if args.raise_kind == "stopiteration":
            raise StopIteration
        raise ValueError(f"bad batch at step {sv.step}")
    weights.assign_add(tf.ones([4]))
    if bad and args.hang_at_step and sv.step == args.hang_at_step and args.hang_kind == "sleep":
        print(f"tiny: hanging in step {sv.step} at {time.time():.3f}", flush=True)
        while not (args.hang_until_stop and sv.should_stop()):
            time.sleep(0.05 if args.hang_until_stop else 3600)
    if args.wait_at_step and sv.step == args.wait_at_step:
        print(f"tiny: waiting in step {sv.step} for {args.wait_secs:g} s", flush=True)
        time.sleep(args.wait_secs)
    if args.marked_wait_at_step and sv.step == args.marked_wait_at_step:
        print(f"tiny: waiting in sv.waiting() in step {sv.step} for {args.wait_secs:g} s", flush=True)
        with sv.waiting():
            time.sleep(args.wait_secs)
    computing = bad and args.compute_at_step and (sv.step == args.compute_at_step or (
        args.compute_every and sv.step > args.compute_at_step and (sv.step - args.compute_at_step) % args.compute_every == 0))
    first = args.first_compute and sv.step == started[0] + 1  # (sv.step: the step in flight)
    if computing or first:
        secs = args.first_compute if first else args.compute_secs
        print(f"tiny: computing in step {sv.step} for {secs:g} s", flush=True)
        until, x = time.monotonic() + secs, 0
        while time.monotonic() < until:
            x = (x * 31 + 7) % 1000003  # a step's computation, in Python: CPU, no step, no I/O
    if bad and args.child_compute_at_step and sv.step == args.child_compute_at_step:
        print(f"tiny: a child computes in step {sv.step} for {args.compute_secs:g} s", flush=True)
        subprocess.run([sys.executable, "-c", f"import time\nu = time.monotonic() + {args.compute_secs}\nx = 0\n"
                        "while time.monotonic() < u:\n    x = (x * 31 + 7) % 1000003\n"], check=True)
    if bad and args.hang_at_step and sv.step == args.hang_at_step and args.hang_kind == "read":
        print(f"tiny: reading forever in step {sv.step} at {time.time():.3f}", flush=True)
        r, w = os.pipe()  # (w stays open: no end of file ever comes)
        os.read(r, 1)
    if bad and args.hang_at_step and sv.step == args.hang_at_step and args.hang_kind == "lock":
        print(f"tiny: deadlocked in step {sv.step} at {time.time():.3f}", flush=True)
        held = threading.Lock()
        held.acquire()
        held.acquire()  # never returns
    time.sleep(args.step_delay + args.step_growth * sv.step)
    if args.chatty:
        print(f"tiny: step {sv.step} " + "x" * args.chatty, flush=True)


with sv.managed_session() as sess:
    start = sv.step
    started[0] = start
    print(f"tiny: attempt {attempt} starts at step {start}", flush=True)
    while not sv.should_stop() and sv.step < args.steps:
        sess.run(step)
        if bad and args.crash_after_commit and sv.step > start and sv.step % args.save_steps == 0:
            # wait for this step's commit: on a loaded machine the checkpoint service may still be
            # importing TensorFlow, and an asynchronous commit may not land before the run ends
            deadline = time.monotonic() + 300
            while sv._keeper.agent.last_committed < sv.step and time.monotonic() < deadline:
                sv.commit_checkpoint()
            if sv._keeper.agent.last_committed < sv.step:
                sys.exit("tiny: no checkpoint committed within 300 s")
            print(f"tiny: crashing after the commit of step {sv._keeper.agent.last_committed}", flush=True)
            sys.stdout.flush()
            os._exit(1)
print(f"tiny: done at step {sv.step}, weights {weights.numpy()[0]:g}", flush=True)
if args.linger:
    print(f"tiny: lingering {args.linger:g} s after the supervised block", flush=True)
    deadline = time.monotonic() + args.linger
    while time.monotonic() < deadline:  # (a SIGTERM here is the bootstrap's: remembered, not an exit)
        time.sleep(0.05)
