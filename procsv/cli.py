"""The ``procsv`` command: ``launch`` (the watchdog), ``status``, ``logs``, ``report``, ``stacks``, ``stop`` and ``preempt``.

Runs in the user's shell; ``procsv launch`` becomes the watchdog process. Exit codes:
0 the run succeeded; 1 it failed (the trainer kept failing, or failed at start-up, or the logdir was
lost while live); 2 bad input (usage, a missing or uncompilable target, an unwritable, full or
locked logdir, a damaged status file for ``status``); 128+N it was stopped by signal N after an
orderly stop (130 for Ctrl-C, 143 for SIGTERM) -- resumable with the same command.

One concern: the ``procsv`` command line, its parser and each command's entry.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any, Optional, Sequence

from procsv.common import env
from procsv.common.errors import LogdirLocked, UsageError
from procsv.common.layout import Layout
from procsv.launch_args import add_host_flags

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="procsv", description="Fault-tolerant supervisor for TensorFlow training.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    la = sub.add_parser("launch", help="run a training module under the watchdog",
                        usage="procsv launch TARGET --logdir DIR [options] [-- ARGS...]")
    la.add_argument("target", metavar="TARGET", help="a module name (procsv.examples.digits) or a path to a .py file")
    la.add_argument("--logdir", required=True, help="where checkpoints, event files and logs go")
    la.add_argument("--max-restarts", type=int, default=10,
                    help="restart a failing trainer at most this many times in a row without a new checkpoint "
                         "(default 10)")
    la.add_argument("--stop-grace-secs", type=float, default=120.0,
                    help="on SIGTERM/SIGINT, how long the trainer may take to checkpoint and exit (default 120)")
    la.add_argument("--preempt-signal", default="USR2", metavar="SIG",
                    help="a signal that asks the run to checkpoint its last completed step and stop in order, "
                         "like SIGTERM, handled by the watchdog only: every other procsv process ignores it "
                         "(default USR2, e.g. from sbatch --signal=B:USR2@120; exit code 128+SIG)")
    la.add_argument("--requeue-on-preempt", action="store_true",
                    help="after a stop on --preempt-signal, run `scontrol requeue $SLURM_JOB_ID` once (logged) so "
                         "Slurm starts the job again, resuming at the saved step")
    la.add_argument("--quiet", action="store_true", help="do not echo the trainer's output")
    la.add_argument("--hang-timeout", type=float, default=600.0,
                    help="restart a trainer that completes no step for this long (default 600 s; 0 = off)")
    la.add_argument("--startup-timeout", type=float, default=1800.0,
                    help="longer limit for the first step: import, restore, tracing (default 1800 s; 0 = off)")
    la.add_argument("--hang-grace-secs", type=float, default=10.0,
                    help="after SIGTERM to a hung trainer, SIGKILL it after this long (default 10 s)")
    la.add_argument("--stuck-secs", type=float, default=10.0,
                    help="a trainer past its first step that completes no step, uses almost no CPU, reads and writes "
                         "nothing and whose main thread never runs for this long is hung, whatever --hang-timeout "
                         "says (default 10 s; 0 = off)")
    la.add_argument("--on-checkpoint-failure", choices=["stop", "continue"], default="stop",
                    help="after 3 checkpoints in a row fail to commit: stop the run in order and exit 3 "
                         "(default), or continue training without checkpoints")
    la.add_argument("--on-nonfinite", choices=["rollback", "stop", "continue"], default=None,
                    help="when a step's loss (or a snapshot's weights) is NaN or infinite: restore the newest "
                         "finite checkpoint in place, replay, retry the bad step and skip it if it is non-finite "
                         "again (rollback; a --nproc group rolls back as one, in place at its K-th steps where every member "
                         "can, else restarted, every member skipping it), stop in order "
                         "and exit 4 (stop), or train on (continue); never is a "
                         "poisoned checkpoint committed (default: the Supervisor's on_nonfinite, else rollback)")
    la.add_argument("--on-spike", choices=["rollback", "stop", "warn", "off"], default=None,
                    help="when a step's loss spikes (finite, far above the losses before it): say so (warn), also "
                         "restore the newest snapshot before its onset and skip the steps from its onset to its "
                         "detection (rollback: an eager loop or Keras fit; a --nproc group rolls back as one, in place or "
                         "restarted, every member skipping "
                         "them), stop in order and exit 4 (stop), or "
                         "do not look (off) (default: the Supervisor's on_spike, else warn)")
    la.add_argument("--max-skips", type=int, default=3, metavar="K",
                    help="with --on-nonfinite or --on-spike rollback: more than K skipped steps within --skip-window "
                         "steps stop the run with exit code 4 (default 3)")
    la.add_argument("--skip-window", type=int, default=1000, metavar="W",
                    help="the window of steps --max-skips counts in (default 1000)")
    la.add_argument("--suspect-after", type=int, default=3, metavar="N",
                    help="with --on-spike rollback: a host whose loss spikes did not come again when replayed "
                         "(transient faults of the machine) N times in this launch is reported as suspect (a line, "
                         "a host_suspect record, status, metrics); nothing is excluded or stopped (default 3)")
    la.add_argument("--audit", choices=["off", "sampled", "every"], default="off",
                    help="replay committed checkpoint intervals in an idle-priority auditor process and compare its "
                         "result with the trainer's next checkpoint, tensor by tensor (silent data corruption); a "
                         "mismatch two replays agree on rolls the trainer back to the interval's start and names its "
                         "host: every interval, or one in 16 (sampled); a single trainer's eager program only in "
                         "this release (default off)")
    la.add_argument("--no-prewarm", action="store_true",
                    help="start every trainer as a fresh process instead of forking it from a pre-warmed one")
    la.add_argument("--fork-prewarm", action="store_true", help="grow the pre-warmed trainer from a fork of this "
                    "process (a Python harness that imported TensorFlow and ran nothing): no second import")
    la.add_argument("--standby", choices=["auto", "hot", "fork", "off"], default="auto",
                    help="how a crashed trainer is replaced: hot = promote a standby trainer that already ran "
                         "the program up to restoring; fork = fork one from the pre-warmed trainer; off = start a "
                         "fresh process (as --no-prewarm); auto = hot if memory allows (twice the "
                         "trainer's size plus 1 GiB available), else fork (the default; with --nnodes: fork, and "
                         "hot prepares a standby group over the hosts, each host's members forked by its agent)")
    la.add_argument("--nproc", type=int, default=1, metavar="N",
                    help="run N trainer processes as one tf.distribute worker group (TF_CONFIG on free ports, "
                         "task 0 the chief, which saves): any member's death or hang restarts the whole group "
                         "from the latest checkpoint (default 1)")
    la.add_argument("--ps", type=int, default=0, metavar="N",
                    help="TF1 between-graph replication: run N parameter-server tasks (tf.distribute.Server "
                         "each) and --workers M tasks of TARGET (worker 0 the chief), each restarted alone")
    la.add_argument("--workers", type=int, default=0, metavar="M", help="with --ps: the worker tasks (see --ps)")
    la.add_argument("--coordinator", action="store_true",
                    help="with --ps: TF2 ParameterServerStrategy: the M workers are servers too, TARGET runs once "
                         "as the chief (the coordinator, TF_CONFIG task chief/0)")
    la.add_argument("--on-worker-give-up", choices=["stop", "continue"], default=None,
                    help="with --ps: a non-chief worker (a --coordinator worker server) given up on "
                         "(--max-restarts) stops the run (stop: it fails, exit 1), or the others train on "
                         "without it (continue, the default)")
    la.add_argument("--group-grace-secs", type=float, default=0.5, metavar="SECS",
                    help="with --nproc: once a member of the group ended, the others get SIGTERM and are "
                         "SIGKILLed after this many seconds (default 0.5)")
    add_host_flags(la)
    la.add_argument("--logdir-timeout", type=float, default=60.0, metavar="SECS",
                    help="a look at the logdir that fails (EIO, ESTALE: a network filesystem's blip) is counted; "
                         "the run stops as 'logdir lost' only after this many seconds in which every look failed "
                         "(default 60). A logdir that is gone or replaced stops it at once")
    la.add_argument("--preload", default="", metavar="MODULES",
                    help="comma-separated modules the pre-warmed trainer imports too (never ones that run TF ops)")
    la.add_argument("--allow-reinit", action="store_true",
                    help="if every committed checkpoint is corrupt, start from step 0 (moving them to "
                         ".procsv/quarantine/) instead of failing; never for an unreadable one")
    la.add_argument("--keep-logs", type=int, default=10, metavar="N",
                    help="per-attempt log files kept for each role: the first attempt's and the last N "
                         "(default 10, >= 1)")
    la.add_argument("--on-failure", metavar="CMD", default=None,
                    help="a shell command run once if the run fails or gives up (PROCSV_ROOT_CAUSE, "
                         "PROCSV_EXIT_CODE, PROCSV_LOGDIR in its environment), e.g. to send a message")
    la.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                    help="serve Prometheus metrics of the run (step, steps/s, restarts by cause, last checkpoint "
                         "step and age, goodput, up) over HTTP on this port of --metrics-host")
    la.add_argument("--metrics-host", default=None, metavar="HOST",
                    help="the address the metrics endpoint listens on (default 127.0.0.1: this machine only)")
    la.add_argument("--chaos", metavar="SPEC", default=None,
                    help="kill on a schedule for crash testing: every=SECS or random=MIN:MAX, "
                         "[,target=trainer|checkpoint|summary][,signal=KILL|TERM][,seed=N]")
    st = sub.add_parser("status", help="show the state of a run (live or finished)")
    st.add_argument("logdir")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--watch", action="store_true",
                    help="redraw whenever the run's status changes, until the run ends")
    pp = sub.add_parser("preempt", help="simulate a preemption or a crash: signal one process of a live run")
    pp.add_argument("logdir")
    pp.add_argument("--signal", default="TERM", choices=["TERM", "KILL", "INT"], help="default TERM")
    pp.add_argument("--target", default="watchdog", choices=["watchdog", "trainer", "checkpoint", "summary"],
                    help="default watchdog (the whole job is preempted)")
    lg = sub.add_parser("logs", help="print or follow one process's log across its attempts")
    lg.add_argument("logdir")
    lg.add_argument("--role", default="trainer", type=_log_role, metavar="ROLE",
                    help="whose log: trainer (default), checkpoint, summary, zygote, watchdog (its lifecycle "
                         "events), a trainer group's workerN (--nproc/--nnodes, --workers) or a parameter "
                         "server's psN (--ps)")
    lg.add_argument("--attempt", default="all", metavar="N|last|all", help="which attempt(s) (default all)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    lg.add_argument("--launch", default="newest", metavar="N|newest|list",
                    help="which launch of the logdir (default the newest; an earlier one's logs are in "
                         "logs/launch-N/; 'list' lists them)")
    rp = sub.add_parser("report", help="the recovery report of a run's last launch; --plot draws its timeline")
    rp.add_argument("logdir")
    rp.add_argument("--plot", metavar="OUT.png", default=None,
                    help="also draw the timeline (step over time, restarts, checkpoints) into this PNG; "
                         "needs matplotlib: pip install 'procsv[plot]'")
    sk = sub.add_parser("stacks", help="print every thread's stack of a live run's trainers (py-spy), without stopping them")
    sk.add_argument("logdir")
    sk.add_argument("--native", action="store_true",
                    help="also the native frames (TensorFlow's ops, collectives): this pauses each process for a "
                         "second or more while it is read")
    sk.add_argument("--all", action="store_true", help="every process of the run, not only its trainers")
    sk.add_argument("--json", action="store_true", help="one JSON document instead of the text")
    sp = sub.add_parser("stop", help="ask a live run to checkpoint and stop (like SIGTERM to the launch)")
    sp.add_argument("logdir")
    sp.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the run to end")
    return p


def _report(layout: Layout, plot: Optional[str]) -> str:
    """The text of ``procsv report``; with ``plot``, the timeline is drawn into that PNG too."""
    from procsv.report import gather, render

    rep = gather(layout)
    if rep is None:
        raise UsageError(f"no procsv run found in {layout.logdir!r} (no logs/lifecycle.jsonl, no .procsv/status.json)")
    text = render(rep)
    if plot is not None:
        from procsv.reportplot import draw

        draw(rep, plot)
        text += f"\n  timeline: {os.path.abspath(plot)}"
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    target_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, target_args = argv[:cut], argv[cut + 1:]
    args = _parser().parse_args(argv)  # unknown flags: usage and exit 2
    try:
        if args.command == "launch":
            return _launch(args, target_args)
        if target_args:
            raise UsageError(f"`procsv {args.command}` takes no arguments after --")
        if args.command == "status":
            return _status(args)
        if args.command == "preempt":
            return _preempt(args)
        if args.command == "stacks":
            return _stacks(args)
        if args.command == "logs":
            from procsv.common.layout import Layout
            from procsv.logs import show

            return show(Layout(os.path.abspath(args.logdir)), args.role, args.attempt, sys.stdout, args.follow,
                        launch=args.launch)
        if args.command == "report":
            from procsv.common.layout import Layout

            print(_report(Layout(os.path.abspath(args.logdir)), args.plot), flush=True)
            return EXIT_OK
        return _stop(args)
    except (UsageError, LogdirLocked) as exc:
        print(f"procsv: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionError as exc:
        if args.command == "launch":
            raise  # the launch checks its logdir first: one here is procsv's own failure, with its traceback
        print(f"procsv: error: cannot read {exc.filename or args.logdir} ({exc.strerror}): `procsv {args.command}` "
              "reads the run's files under its logdir and .procsv/; ask the run's owner for read access (or for "
              "its --metrics-port endpoint)", file=sys.stderr)
        return EXIT_USAGE


def _launch(args: argparse.Namespace, target_args: list[str]) -> int:
    from procsv.launch_args import check_coordinator, check_min_nodes, check_numbers, group_snapshot_steps
    from procsv.watchdog.config import TrainerSettings, check_ps
    from procsv.watchdog.config import HangSettings
    from procsv.watchdog.launcher import LaunchConfig, Watchdog

    check_numbers(args)
    # the launch's own environment is read here, handed to pure functions: its PROCSV_MEMORY_SNAPSHOTS and
    # PROCSV_GROUP_SNAPSHOT_STEPS (a group's K), its scheduler's variables and PROCSV_MASTER_ADDR (placement)
    snapshot_steps = group_snapshot_steps(os.environ)
    from procsv.watchdog.multihost.placement import place

    placed = place(os.environ, args.nnodes, args.node_rank, args.master_addr)
    args.nnodes, args.node_rank, args.master_addr = placed.nnodes, placed.node_rank, placed.master_addr
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise UsageError(f"--node-rank must be from 0 to --nnodes - 1 ({args.nnodes - 1}), not {args.node_rank}")
    if args.on_spike == "rollback" and args.ps > 0:
        # (refused here, before anything starts: each trainer refused it with a traceback, then the run ended)
        from procsv.trainer.nonfinite.spike import OnSpike, refusal

        raise UsageError(refusal(OnSpike.ROLLBACK, ps=True))
    if args.nnodes > 1:
        host, _, port = (args.master_addr or "").rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UsageError(f"--nnodes {args.nnodes} needs --master-addr HOST:PORT (node 0's address the other "
                             f"hosts reach), not {args.master_addr!r}")
    agent_host = ""  # a node agent's address on its route to node 0: none is one line, before anything starts
    if args.nnodes > 1 and args.node_rank > 0:
        from procsv.watchdog.multihost.nodes import host_ip

        agent_host = host_ip(args.master_addr, args.node_rank)
    check_ps(args.ps, args.workers, args.nproc, args.nnodes, args.standby, args.on_worker_give_up)
    check_coordinator(args.coordinator, args.ps, args.nnodes)
    check_min_nodes(args.min_nodes, args.nnodes, args.ps)
    from procsv.watchdog.multihost.slurm import after_run, parse_preempt_signal, warn_grace

    preempt_signal = parse_preempt_signal(args.preempt_signal, args.requeue_on_preempt, placed.job_id)
    if args.chaos:
        from procsv.watchdog.rules.chaos import parse_chaos

        parse_chaos(args.chaos)  # a bad SPEC is a usage error before anything starts
    cfg = LaunchConfig(target=args.target, args=target_args, logdir=args.logdir, max_restarts=args.max_restarts,
                       stop_grace_secs=args.stop_grace_secs, quiet=args.quiet,
                       hang=HangSettings(args.hang_timeout, args.startup_timeout, args.hang_grace_secs, args.stuck_secs),
                       chaos=args.chaos, prewarm=not args.no_prewarm and args.standby != "off",
                       standby="off" if args.no_prewarm else "fork"  # hosts, --ps: no hot standby unless asked
                       if (args.nnodes > 1 or args.ps) and args.standby == "auto" else args.standby,
                       nproc=args.workers if args.ps else args.nproc, ps=args.ps, coordinator=args.coordinator,
                       worker_give_up=args.on_worker_give_up or "continue",
                       group_grace_secs=args.group_grace_secs, nnodes=args.nnodes,
                       node_rank=args.node_rank, master_addr=args.master_addr, rejoin_timeout=args.rejoin_timeout,
                       min_nodes=args.min_nodes or 0,
                       logdir_timeout=args.logdir_timeout, node_timeout=args.node_timeout,
                       on_checkpoint_failure=args.on_checkpoint_failure,
                       trainer=TrainerSettings(args.on_nonfinite, args.max_skips, args.skip_window, snapshot_steps,
                                               args.on_spike, args.suspect_after, args.audit),
                       allow_reinit=args.allow_reinit, keep_logs=args.keep_logs, on_failure=args.on_failure,
                       metrics_port=args.metrics_port, metrics_host=args.metrics_host or "127.0.0.1",
                       preload=[m.strip() for m in args.preload.split(",") if m.strip()], job_id=placed.job_id,
                       preempt_signal=preempt_signal)
    if placed.taken_from:
        print(placed.taken_from, file=sys.stderr, flush=True)
    os.environ[env.PREEMPT_SIGNAL] = str(preempt_signal)  # every child inherits it and ignores that signal
    # SIGUSR1 is the watchdog's to send (a hot standby's promotion, which reads it with its sender): one
    # from anyone else (kill -USR1, scancel --signal=USR1, to every process) ends nothing. Ignored here,
    # and so by every child (an ignored signal stays ignored across fork and exec; a standby keeps it
    # blocked, and a blocked signal is queued even when ignored, so its promotion still arrives)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    warn_grace(cfg.stop_grace_secs, placed.job_id)
    from procsv.common.spawn import import_defaults
    from procsv.watchdog.prewarm import ZygoteSeed
    from procsv.zygote.seed import plant, unfit

    seed: Optional[ZygoteSeed] = None  # --fork-prewarm: forked before any thread, the first zygote's seed
    if args.fork_prewarm and cfg.prewarm and (why := unfit()) is not None:
        print(f"procsv: --fork-prewarm: {why}; the pre-warmed trainer starts as a fresh process", file=sys.stderr)
    elif args.fork_prewarm and cfg.prewarm:
        seed = ZygoteSeed(*plant(preempt_signal), import_env=import_defaults(os.environ))
    if cfg.node_rank > 0:
        from procsv.watchdog.multihost.agent import NodeAgent
        from procsv.watchdog.publish.metrics import MetricsServer
        from procsv.watchdog.publish.probes import LoopPulse

        signal.signal(preempt_signal, signal.SIG_IGN)  # node 0 decides the stop; it reaches this host from there
        from procsv.common.clock.watched import WatchedClock

        clock = WatchedClock()  # the agent's: without the time it was stopped (its probes answer from it too)
        pulse = LoopPulse(clock)  # what the agent's loop stamps; its probes answer from it
        # bound before anything starts (a port in use: exit 2); the probes only: the metrics are node 0's
        probes = None if cfg.metrics_port is None else MetricsServer(cfg.metrics_host, cfg.metrics_port, None, pulse)
        try:
            return NodeAgent(cfg, clock=clock, pulse=pulse, host=agent_host).run(seed)
        finally:
            if probes is not None:
                probes.close()
    from procsv.common.bootstrap import process_age

    watchdog = Watchdog(cfg, born=time.time() - process_age(), seed=seed)  # the launch began with this process
    code = watchdog.run()
    return after_run(code, preempt_signal, args.requeue_on_preempt, placed.job_id, lambda: watchdog.view.stop_signal)


def _log_role(value: str) -> str:
    """``procsv logs --role``: a fixed role, ``worker<N>`` (a group's task N >= 1; with --coordinator
    N >= 0) or ``ps<N>`` (--ps)."""
    if value in ("trainer", "checkpoint", "summary", "zygote", "watchdog") or \
            (value.startswith("worker") and value[6:].isdigit()) or \
            (value.startswith("ps") and value[2:].isdigit()):
        return value
    raise argparse.ArgumentTypeError(f"invalid role {value!r} (trainer, checkpoint, summary, zygote, watchdog, "
                                     "workerN or psN)")


def _status(args: argparse.Namespace) -> int:
    from procsv.status import read_status, render, watch

    layout = Layout(os.path.abspath(args.logdir))
    status = read_status(layout)
    if status is None and os.path.lexists(layout.status):
        from procsv.common.layout import LogdirLock

        live = LogdirLock.held_by(layout)
        then = (f"the live launch (pid {live.pid} on {live.hostname}) rewrites it within a second: try again"
                if live is not None
                else "the next `procsv launch` replaces it; its checkpoints are not affected")
        raise UsageError(f"{layout.status} is damaged (truncated or not a status record); {then}")
    if status is None:
        raise UsageError(f"no procsv run found in {args.logdir!r} (no .procsv/status.json)")
    if args.watch:
        if args.json:
            raise UsageError("--watch shows the human view; use --json without it")
        watch(layout, sys.stdout)
        return EXIT_OK
    if args.json:
        print(json.dumps(status, indent=1, sort_keys=True))
    else:
        print(render(status, args.logdir))
    return EXIT_OK


def _elsewhere(command: str, logdir: str, hostname: str, pid: int) -> UsageError:
    """The one line of a command that would have to signal a process of another host."""
    return UsageError(f"the run in {logdir!r} is led by the watchdog on host {hostname} (pid {pid} there: another "
                      f"host or PID namespace, where no signal from here can reach it); run `procsv {command} "
                      f"{logdir}` on that host")


def _live_status(command: str, logdir: str) -> dict[str, Any]:
    """The status of the live run in ``logdir`` whose pids mean something here (``procsv preempt``,
    ``procsv stacks``); a usage error if no live run holds it, or it is led from another host."""
    from procsv.common.layout import Layout, LogdirLock
    from procsv.status import read_status

    layout = Layout(os.path.abspath(logdir))
    holder = LogdirLock.held_by(layout)
    if holder is None:
        raise UsageError(f"no live procsv run holds {logdir!r}")
    status = read_status(layout) or {}
    if not holder.here() or not status.get("here", True):
        raise _elsewhere(command, logdir, holder.hostname, holder.pid)
    return status


def _preempt(args: argparse.Namespace) -> int:
    from procsv.common import pidfd as pidfds

    status = _live_status("preempt", args.logdir)
    proc = next((p for p in status.get("processes", []) if p.get("role") == args.target and p.get("alive")), None)
    fd = None if proc is None else pidfds.open_recorded(int(proc["pid"]), create_time=proc.get("create_time"))
    if proc is None or fd is None:  # (not the process recorded: a reused pid is never signalled)
        raise UsageError(f"the run in {args.logdir!r} has no live {args.target} process right now")
    try:
        pidfds.send(fd, getattr(signal, "SIG" + args.signal))
    finally:
        os.close(fd)
    print(f"procsv: sent SIG{args.signal} to the {args.target} (pid {proc['pid']})", flush=True)
    return EXIT_OK


def _stacks(args: argparse.Namespace) -> int:
    from procsv.stacks_command import show

    return EXIT_OK if show(_live_status("stacks", args.logdir), args.logdir, args.all, args.native, args.json) \
        else EXIT_FAILED


def _stop(args: argparse.Namespace) -> int:
    from procsv.common import pidfd as pidfds
    from procsv.common.layout import Layout, LogdirLock

    layout = Layout(os.path.abspath(args.logdir))
    holder = LogdirLock.held_by(layout)
    if holder is None:
        raise UsageError(f"no live procsv run holds {args.logdir!r}")
    if holder.pid <= 0 or holder.host is None:
        raise UsageError(f"the lock of {args.logdir!r} is held but does not say by which process of which host "
                         "(an older procsv?): send SIGTERM to its `procsv launch` yourself")
    if not holder.here():
        raise _elsewhere("stop", args.logdir, holder.hostname, holder.pid)
    fd = holder.open()
    if fd is None:  # the lock outlived the process it names (inherited by a fork): that pid is not the run's
        raise UsageError(f"the lock of {args.logdir!r} is held, but pid {holder.pid} is not the process that took it "
                         "(it ended, and the lock is held by a process it passed it to); nothing was signalled")
    try:
        pidfds.send(fd, signal.SIGTERM)
    finally:
        os.close(fd)
    pid = holder.pid
    print(f"procsv: asked pid {pid} to checkpoint and stop", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if LogdirLock.holder(layout) is None:
            print("procsv: run stopped", flush=True)
            return EXIT_OK
        time.sleep(0.2)
    print(f"procsv: error: the run did not stop within {args.timeout:g} s", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
